//! The Gemini API (Gemini CLI): `POST /v1beta/models/{model}:streamGenerateContent`
//! (`?alt=sse`), `:generateContent` and `:countTokens`. The model is the path's segment, checked
//! before anything else. The key goes as `x-goog-api-key`. An answer's usage is its last
//! `usageMetadata` (the stream's counts are cumulative); its tool uses are the `functionCall`
//! parts of the agent's own tools (Gemini CLI names MCP tools `mcp_<server>_<tool>`).

use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use orchestrator_crds::gateway::Provider;
use serde_json::Value;

use super::{
    api::{self, Api, Ask, Call, Kind, Route, Tally, count, text},
    ledger::Tokens,
};

/// The header the key goes in (and the agent's credential comes in: Gemini CLI has no other).
pub const KEY_HEADER: &str = "x-goog-api-key";

/// The longest model name taken from a path.
const MAX_MODEL: usize = 128;

/// The most output tokens one answer of the API's models may have (Gemini 2.5 and 3: 65,536).
const OUTPUT_CEILING: u64 = 65_536;

/// The Gemini API.
pub struct Gemini;

/// A model name as a path segment: letters, digits, `.`, `-`, `_`, not `.`/`..`.
fn is_model(name: &str) -> bool {
    (1..=MAX_MODEL).contains(&name.len())
        && !name.starts_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

impl Api for Gemini {
    fn provider(&self) -> Provider {
        Provider::Gemini
    }

    fn route(&self, method: &Method, path: &str) -> Option<Route> {
        if *method != Method::POST {
            return None;
        }
        let (model, verb) = path.strip_prefix("/v1beta/models/")?.split_once(':')?;
        let (endpoint, call, streams) = match verb {
            "streamGenerateContent" => (
                "/v1beta/models/{model}:streamGenerateContent",
                Call::Generate,
                true,
            ),
            "generateContent" => (
                "/v1beta/models/{model}:generateContent",
                Call::Generate,
                false,
            ),
            "countTokens" => ("/v1beta/models/{model}:countTokens", Call::Count, false),
            _ => return None,
        };
        is_model(model).then(|| Route {
            method: Method::POST,
            path: format!("/v1beta/models/{model}:{verb}"),
            endpoint,
            call,
            model: Some(model.to_string()),
            streams,
        })
    }

    fn forwarded(&self) -> &'static str {
        "POST /model/v1beta/models/{model}:streamGenerateContent, :generateContent and \
         :countTokens"
    }

    /// `alt=sse` on a stream (server-sent events); nothing else.
    fn query(&self, route: &Route, query: &str) -> Result<(), &'static str> {
        if query.is_empty() || route.streams && query == "alt=sse" {
            Ok(())
        } else {
            Err("the only query forwarded is ?alt=sse on :streamGenerateContent")
        }
    }

    /// The body's type and what the client is. Never `x-goog-api-key` (the agent's credential)
    /// or `x-goog-user-project` (it chooses whose project is billed).
    fn forwards_header(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        !api::never_forwarded(&name)
            && matches!(
                name.as_str(),
                "content-type" | "accept" | "user-agent" | "x-goog-api-client"
            )
    }

    fn key_header(&self, key: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
        Ok((HeaderName::from_static(KEY_HEADER), key.clone()))
    }

    fn ask(&self, route: &Route, body: &[u8]) -> Result<Ask, String> {
        let map = api::object(body, "a Gemini API request")?;
        let max_output = match map.get("generationConfig") {
            None | Some(Value::Null) => None,
            Some(Value::Object(config)) => api::optional_count(config, "maxOutputTokens")
                .map_err(|e| format!("generationConfig.{e}"))?,
            Some(_) => return Err("generationConfig is not an object".into()),
        };
        Ok(Ask {
            model: route.model.clone().unwrap_or_default(),
            stream: route.streams,
            max_output,
        })
    }

    fn output_ceiling(&self) -> u64 {
        OUTPUT_CEILING
    }

    fn clamp(&self, body: &[u8], output: u64) -> Option<Vec<u8>> {
        api::set(body, &["generationConfig", "maxOutputTokens"], output)
    }

    /// A chunk of the stream (`data: {GenerateContentResponse}`, no event names).
    fn event(&self, tally: &mut Tally, data: &str) {
        if let Ok(chunk) = serde_json::from_str::<Value>(data) {
            read_chunk(tally, &chunk);
        }
    }

    /// A whole answer, or a stream without `alt=sse` (a JSON array of chunks).
    fn message(&self, tally: &mut Tally, body: &Value) {
        match body {
            Value::Array(chunks) => chunks.iter().for_each(|c| read_chunk(tally, c)),
            chunk => read_chunk(tally, chunk),
        }
        tally.complete = true;
    }

    /// `{"error":{"code":429,"message":...,"status":"RESOURCE_EXHAUSTED"}}`.
    fn error_body(&self, status: StatusCode, kind: Kind, message: &str) -> Value {
        let name = match kind {
            Kind::InvalidRequest | Kind::TooLarge => "INVALID_ARGUMENT",
            Kind::Authentication => "UNAUTHENTICATED",
            Kind::Permission => "PERMISSION_DENIED",
            Kind::NotFound => "NOT_FOUND",
            Kind::Budget => "RESOURCE_EXHAUSTED",
            Kind::Overloaded => "UNAVAILABLE",
            Kind::Api if status == StatusCode::REQUEST_TIMEOUT => "DEADLINE_EXCEEDED",
            Kind::Api if status.as_u16() >= 502 => "UNAVAILABLE",
            Kind::Api => "INTERNAL",
        };
        serde_json::json!({"error": {"code": status.as_u16(), "message": message, "status": name}})
    }
}

/// One `GenerateContentResponse`: its model, its usage (cumulative: the last one wins), why it
/// stopped, its function calls.
fn read_chunk(tally: &mut Tally, chunk: &Value) {
    if let Some(model) = chunk.get("modelVersion").and_then(Value::as_str) {
        tally.model = Some(model.to_string());
    }
    if let Some(usage) = chunk.get("usageMetadata").filter(|u| u.is_object()) {
        let n = |key| count(usage, key).unwrap_or(0);
        let cached = n("cachedContentTokenCount");
        tally.usage(Tokens {
            // The prompt counts the cached tokens too; a tool's prompt (search grounding) is
            // billed as input.
            input_tokens: n("promptTokenCount")
                .saturating_sub(cached)
                .saturating_add(n("toolUsePromptTokenCount")),
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
            // Thinking is billed as output.
            output_tokens: n("candidatesTokenCount").saturating_add(n("thoughtsTokenCount")),
        });
    }
    if let Some(blocked) = chunk
        .get("promptFeedback")
        .and_then(|f| f.get("blockReason"))
        .and_then(Value::as_str)
    {
        tally.stop_reason = Some(blocked.to_string());
        tally.complete = true;
    }
    if let Some(error) = chunk.get("error") {
        tally.error = Some(text(error, "status").to_string()).filter(|s| !s.is_empty());
        tally.error.get_or_insert_with(|| "error".to_string());
    }
    for candidate in chunk
        .get("candidates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for part in candidate
            .get("content")
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(call) = part.get("functionCall") else {
                continue;
            };
            let name = text(call, "name");
            if !name.starts_with("mcp_") {
                tally.tool_use_value(text(call, "id"), name, call.get("args"));
            }
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
            tally.stop_reason = Some(reason.to_string());
            tally.complete = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream as the Gemini API sends it: cumulative `usageMetadata` on every chunk, the last
    /// with the whole count; a built-in tool's call and an MCP tool's in one chunk.
    const STREAM: &[&str] = &[
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Let me look."}]},"index":0}],"usageMetadata":{"promptTokenCount":5000,"cachedContentTokenCount":4000,"totalTokenCount":5000},"modelVersion":"gemini-2.5-pro","responseId":"r1"}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"run_shell_command","args":{"command":"git status"}}},{"functionCall":{"name":"mcp_orchestrator_echo","args":{"text":"hi"}}}]},"index":0}],"usageMetadata":{"promptTokenCount":5000,"cachedContentTokenCount":4000,"candidatesTokenCount":20,"totalTokenCount":5020},"modelVersion":"gemini-2.5-pro","responseId":"r1"}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":5000,"cachedContentTokenCount":4000,"candidatesTokenCount":42,"thoughtsTokenCount":100,"totalTokenCount":5142},"modelVersion":"gemini-2.5-pro","responseId":"r1"}"#,
    ];

    #[test]
    fn a_stream_counts_its_last_usage_and_the_agents_own_function_calls() {
        let mut tally = Tally::default();
        for event in STREAM {
            Gemini.event(&mut tally, event);
        }
        assert!(tally.complete && tally.usage_seen);
        assert_eq!(tally.model.as_deref(), Some("gemini-2.5-pro"));
        assert_eq!(
            tally.tokens,
            Tokens {
                input_tokens: 1000,
                cache_read_input_tokens: 4000,
                output_tokens: 142,
                cache_creation_input_tokens: 0,
            }
        );
        assert_eq!(tally.stop_reason.as_deref(), Some("STOP"));
        assert_eq!(tally.tool_uses.len(), 1, "{:?}", tally.tool_uses);
        assert_eq!(tally.tool_uses[0].name, "run_shell_command");
        assert_eq!(
            tally.tool_uses[0]
                .input
                .as_ref()
                .map(|i| i["command"].clone()),
            Some("git status".into())
        );
        // Cut before the last chunk: not complete, so charged what it reserved.
        let mut cut = Tally::default();
        Gemini.event(&mut cut, STREAM[0]);
        assert!(!cut.complete);
    }

    #[test]
    fn a_whole_answer_or_a_json_array_stream_gives_the_same() {
        let whole: Value = serde_json::from_str(STREAM[2]).expect("json");
        let mut tally = Tally::default();
        Gemini.message(&mut tally, &whole);
        assert!(tally.complete);
        assert_eq!(tally.tokens.output_tokens, 142);
        let array: Value = serde_json::from_str(&format!("[{}]", STREAM.join(","))).expect("json");
        let mut tally = Tally::default();
        Gemini.message(&mut tally, &array);
        assert_eq!(
            (tally.tokens.input_tokens, tally.tool_uses.len()),
            (1000, 1)
        );
        let blocked: Value = serde_json::from_str(
            r#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":7,"totalTokenCount":7}}"#,
        )
        .expect("json");
        let mut tally = Tally::default();
        Gemini.message(&mut tally, &blocked);
        assert!(tally.complete);
        assert_eq!(
            (tally.stop_reason.as_deref(), tally.tokens.input_tokens),
            (Some("SAFETY"), 7)
        );
    }

    #[test]
    fn only_the_apis_paths_with_a_plain_model_name_pass() {
        let post = Method::POST;
        let stream = Gemini
            .route(&post, "/v1beta/models/gemini-2.5-pro:streamGenerateContent")
            .expect("stream");
        assert_eq!(
            (stream.call, stream.streams, stream.model.as_deref()),
            (Call::Generate, true, Some("gemini-2.5-pro"))
        );
        assert_eq!(
            stream.path,
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
        );
        let count = Gemini
            .route(&post, "/v1beta/models/gemini-2.5-flash:countTokens")
            .expect("count");
        assert_eq!(count.call, Call::Count);
        let whole = Gemini
            .route(&post, "/v1beta/models/gemini-3-pro-preview:generateContent")
            .expect("generate");
        assert!(!whole.streams);
        for path in [
            "/v1beta/models/gemini-2.5-pro:embedContent",
            "/v1beta/models/gemini-2.5-pro",
            "/v1beta/models",
            "/v1beta/models/:generateContent",
            "/v1beta/models/../files:generateContent",
            "/v1beta/models/..:generateContent",
            "/v1beta/models/a/b:generateContent",
            "/v1beta/models/a%2Fb:generateContent",
            "/v1beta/models/a b:generateContent",
            "/v1beta/models/gemini:generateContent:x",
            "/v1/models/gemini-2.5-pro:generateContent",
            "/v1beta/tunedModels/x:generateContent",
            "//v1beta/models/gemini-2.5-pro:generateContent",
            "/v1/messages",
        ] {
            assert_eq!(Gemini.route(&post, path), None, "{path}");
        }
        let long = format!(
            "/v1beta/models/{}:generateContent",
            "a".repeat(MAX_MODEL + 1)
        );
        assert_eq!(Gemini.route(&post, &long), None);
        assert_eq!(
            Gemini.route(
                &Method::GET,
                "/v1beta/models/gemini-2.5-pro:generateContent"
            ),
            None
        );
        assert!(Gemini.query(&stream, "alt=sse").is_ok());
        assert!(Gemini.query(&stream, "").is_ok());
        for bad in ["alt=sse&key=x", "key=AIza", "alt=json&alt=sse"] {
            assert!(Gemini.query(&stream, bad).is_err(), "{bad}");
        }
        assert!(Gemini.query(&whole, "alt=sse").is_err());
        for ok in ["content-type", "x-goog-api-client", "User-Agent"] {
            assert!(Gemini.forwards_header(ok), "{ok}");
        }
        for no in [
            "x-goog-api-key",
            "authorization",
            "x-goog-user-project",
            "cookie",
            "accept-encoding",
            "x-api-key",
        ] {
            assert!(!Gemini.forwards_header(no), "{no}");
        }
        let key = HeaderValue::from_static("AIza-key");
        let (name, _) = Gemini.key_header(&key).expect("header");
        assert_eq!(name.as_str(), "x-goog-api-key");
    }

    #[test]
    fn the_cap_is_read_and_added_under_generation_config() {
        let route = Gemini
            .route(
                &Method::POST,
                "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
            )
            .expect("route");
        let body = br#"{"contents":[],"generationConfig":{"temperature":0,"thinkingConfig":{"includeThoughts":true}}}"#;
        let ask = Gemini.ask(&route, body).expect("ask");
        assert_eq!(
            ask,
            Ask {
                model: "gemini-2.5-pro".into(),
                stream: true,
                max_output: None
            }
        );
        let capped: Value =
            serde_json::from_slice(&Gemini.clamp(body, 36).expect("capped")).expect("json");
        assert_eq!(capped["generationConfig"]["maxOutputTokens"], 36);
        assert_eq!(capped["generationConfig"]["temperature"], 0);
        let bare: Value =
            serde_json::from_slice(&Gemini.clamp(br#"{"contents":[]}"#, 7).expect("added"))
                .expect("json");
        assert_eq!(bare["generationConfig"]["maxOutputTokens"], 7);
        let asked = br#"{"contents":[],"generationConfig":{"maxOutputTokens":8192}}"#;
        assert_eq!(
            Gemini.ask(&route, asked).map(|a| a.max_output),
            Ok(Some(8192))
        );
        for bad in [
            &b"[]"[..],
            br#"{"generationConfig":3}"#,
            br#"{"generationConfig":{"maxOutputTokens":"x"}}"#,
        ] {
            let error = Gemini.ask(&route, bad).expect_err("refused");
            assert!(!error.is_empty());
        }
    }

    #[test]
    fn refusals_come_in_the_apis_error_shape() {
        let error = Gemini.error_body(StatusCode::TOO_MANY_REQUESTS, Kind::Budget, "over");
        assert_eq!(
            error,
            serde_json::json!({"error":{"code":429,"message":"over","status":"RESOURCE_EXHAUSTED"}})
        );
        let error = Gemini.error_body(StatusCode::UNAUTHORIZED, Kind::Authentication, "who");
        assert_eq!(error["error"]["status"], "UNAUTHENTICATED");
    }
}
