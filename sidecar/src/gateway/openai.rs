//! The OpenAI Responses API (Codex CLI): `POST /v1/responses`, streamed or not, and
//! `GET /v1/models` (Codex asks for the model catalog at start, `?client_version=...`). The key
//! goes as `Authorization: Bearer`. An answer's usage is `response.usage` of
//! `response.completed` (or of the whole response); its tool uses are its output items of the
//! agent's own tools: `function_call` (not MCP ones), `custom_tool_call` (`apply_patch`),
//! `local_shell_call`, `web_search_call`, and any other `*_call` item.

use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use orchestrator_crds::gateway::Provider;
use serde_json::Value;

use super::{
    api::{self, Api, Ask, Call, Kind, Route, Tally, count, text},
    ledger::Tokens,
};

/// The Responses API.
pub struct OpenAi;

/// The most output tokens one answer of the API's models may have (GPT-5: 128,000).
const OUTPUT_CEILING: u64 = 128_000;

/// MCP tools as Codex offers them: in the namespace `mcp__<server>`, or named `mcp__...`.
fn is_mcp(item: &Value) -> bool {
    text(item, "namespace").starts_with("mcp__") || text(item, "name").starts_with("mcp__")
}

/// Codex's `client_version` (its own version, `0.171.0`).
fn is_version(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'_'))
}

impl Api for OpenAi {
    fn provider(&self) -> Provider {
        Provider::OpenAi
    }

    fn route(&self, method: &Method, path: &str) -> Option<Route> {
        let (endpoint, call, expected) = match path {
            "/v1/responses" => ("/v1/responses", Call::Generate, Method::POST),
            "/v1/models" => ("/v1/models", Call::Catalog, Method::GET),
            _ => return None,
        };
        (*method == expected).then(|| Route {
            method: expected,
            path: endpoint.to_string(),
            endpoint,
            call,
            model: None,
            streams: false,
        })
    }

    fn forwarded(&self) -> &'static str {
        "POST /model/v1/responses and GET /model/v1/models"
    }

    fn query(&self, route: &Route, query: &str) -> Result<(), &'static str> {
        let ok = match route.call {
            Call::Catalog => {
                query.is_empty()
                    || query
                        .strip_prefix("client_version=")
                        .is_some_and(is_version)
            }
            _ => query.is_empty(),
        };
        if ok {
            Ok(())
        } else if route.call == Call::Catalog {
            Err("the only query forwarded is ?client_version=<version> on GET /v1/models")
        } else {
            Err("no query is forwarded with POST /v1/responses")
        }
    }

    /// The body's type, what the client is and which session a request belongs to (the API
    /// keeps a session's prompt cache). Never `openai-organization` or `openai-project` (they
    /// choose whose account the key bills), nor Codex's `x-codex-*` (its installation id and the
    /// workspace's paths).
    fn forwards_header(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        !api::never_forwarded(&name)
            && (matches!(
                name.as_str(),
                "content-type"
                    | "accept"
                    | "user-agent"
                    | "openai-beta"
                    | "originator"
                    | "session-id"
                    | "session_id"
                    | "x-client-request-id"
            ) || name.starts_with("x-stainless-"))
    }

    fn key_header(&self, key: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
        api::bearer(key)
    }

    fn ask(&self, _: &Route, body: &[u8]) -> Result<Ask, String> {
        api::top_level_ask(body, "a Responses request", "max_output_tokens")
    }

    fn output_ceiling(&self) -> u64 {
        OUTPUT_CEILING
    }

    fn clamp(&self, body: &[u8], output: u64) -> Option<Vec<u8>> {
        api::set(body, &["max_output_tokens"], output)
    }

    fn event(&self, tally: &mut Tally, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match text(&event, "type") {
            "response.created" | "response.in_progress" => {
                if let Some(model) = event.get("response").and_then(|r| r.get("model")) {
                    tally.model = model.as_str().map(str::to_string);
                }
            }
            "response.output_item.done" => {
                if let Some(item) = event.get("item") {
                    read_item(tally, item);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(response) = event.get("response") {
                    self.message(tally, response);
                }
            }
            "error" => {
                let code = event.get("code").and_then(Value::as_str);
                tally.error = Some(code.unwrap_or("error").to_string());
            }
            _ => {}
        }
    }

    /// A whole response, or the last event's: its model, usage, status and output items.
    fn message(&self, tally: &mut Tally, response: &Value) {
        if let Some(model) = response.get("model").and_then(Value::as_str) {
            tally.model = Some(model.to_string());
        }
        if let Some(usage) = response.get("usage").filter(|u| u.is_object()) {
            let cached = usage
                .get("input_tokens_details")
                .and_then(|d| count(d, "cached_tokens"))
                .unwrap_or(0);
            let input = count(usage, "input_tokens").unwrap_or(0);
            tally.usage(Tokens {
                // `input_tokens` counts the cached ones too.
                input_tokens: input.saturating_sub(cached),
                cache_read_input_tokens: cached.min(input),
                cache_creation_input_tokens: 0,
                // Reasoning included.
                output_tokens: count(usage, "output_tokens").unwrap_or(0),
            });
        }
        let status = text(response, "status");
        let incomplete = response
            .get("incomplete_details")
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str);
        if let Some(reason) = incomplete.or((!status.is_empty()).then_some(status)) {
            tally.stop_reason = Some(reason.to_string());
        }
        if status == "failed" {
            let code = response
                .get("error")
                .and_then(|e| e.get("code"))
                .and_then(Value::as_str);
            tally.error = Some(code.unwrap_or("failed").to_string());
        }
        for item in response
            .get("output")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            read_item(tally, item);
        }
        tally.complete = true;
    }

    /// `{"error":{"message":...,"type":...,"param":null,"code":...}}`.
    fn error_body(&self, _: StatusCode, kind: Kind, message: &str) -> Value {
        let (kind, code) = match kind {
            Kind::InvalidRequest => ("invalid_request_error", Value::Null),
            Kind::Authentication => ("invalid_request_error", "invalid_api_key".into()),
            Kind::Permission => ("invalid_request_error", "permission_denied".into()),
            Kind::NotFound => ("invalid_request_error", "unknown_url".into()),
            Kind::TooLarge => ("invalid_request_error", "request_too_large".into()),
            // The API's answer when an account has nothing left: clients stop rather than
            // retry.
            Kind::Budget => ("insufficient_quota", "insufficient_quota".into()),
            Kind::Api => ("server_error", Value::Null),
            Kind::Overloaded => ("server_error", "server_is_overloaded".into()),
        };
        serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    }
}

/// An output item: a tool use of the agent's own tools, once (the stream's
/// `response.output_item.done` and the final response both carry it).
fn read_item(tally: &mut Tally, item: &Value) {
    let kind = text(item, "type");
    if !kind.ends_with("_call") || kind == "function_call" && is_mcp(item) {
        return;
    }
    if tally.tool_uses.len() >= api::MAX_TOOL_USES {
        tally.tool_uses_dropped += 1;
        return;
    }
    let id = match text(item, "call_id") {
        "" => text(item, "id"),
        id => id,
    };
    if !id.is_empty() && tally.tool_uses.iter().any(|t| t.id == id) {
        return;
    }
    match kind {
        "function_call" => {
            let name = match text(item, "namespace") {
                "" => text(item, "name").to_string(),
                namespace => format!("{namespace}.{}", text(item, "name")),
            };
            tally.tool_use_json(id, &name, text(item, "arguments"));
        }
        "custom_tool_call" => {
            let input = text(item, "input");
            let wrapped = serde_json::json!({ "input": input });
            tally.tool_use(id, text(item, "name"), Some(wrapped), input.len());
        }
        _ => {
            let name = kind.trim_end_matches("_call");
            match item.get("arguments").and_then(Value::as_str) {
                Some(arguments) => tally.tool_use_json(id, name, arguments),
                None => tally.tool_use_value(id, name, item.get("action")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the Responses API streams an answer that calls the shell, an MCP tool and
    /// `apply_patch` (the shape Codex 0.171.0 accepted, docs/design/agent-runtimes.md 1.4).
    const STREAM: &[&str] = &[
        r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-5-2025-08-07","output":[],"usage":null}}"#,
        r#"{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-5-2025-08-07","output":[],"usage":null}}"#,
        r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}"#,
        r#"{"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}"#,
        r#"{"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_shell","name":"exec_command"}}"#,
        r#"{"type":"response.function_call_arguments.delta","sequence_number":5,"item_id":"fc_1","output_index":1,"delta":"{\"cmd\":\"git status\"}"}"#,
        r#"{"type":"response.function_call_arguments.done","sequence_number":6,"item_id":"fc_1","output_index":1,"arguments":"{\"cmd\":\"git status\"}"}"#,
        r#"{"type":"response.output_item.done","sequence_number":7,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"cmd\":\"git status\"}","call_id":"call_shell","name":"exec_command"}}"#,
        r#"{"type":"response.output_item.done","sequence_number":8,"output_index":2,"item":{"id":"fc_2","type":"function_call","status":"completed","arguments":"{\"text\":\"hi\"}","call_id":"call_mcp","name":"echo","namespace":"mcp__orchestrator"}}"#,
        r#"{"type":"response.output_item.done","sequence_number":9,"output_index":3,"item":{"id":"ctc_1","type":"custom_tool_call","status":"completed","call_id":"call_patch","name":"apply_patch","input":"*** Begin Patch\n*** End Patch"}}"#,
        r#"{"type":"response.output_item.done","sequence_number":10,"output_index":4,"item":{"id":"ws_1","type":"web_search_call","status":"completed","action":{"type":"search","query":"rust"}}}"#,
        r#"{"type":"response.completed","sequence_number":11,"response":{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-5-2025-08-07","output":[{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"cmd\":\"git status\"}","call_id":"call_shell","name":"exec_command"},{"id":"fc_2","type":"function_call","arguments":"{}","call_id":"call_mcp","name":"echo","namespace":"mcp__orchestrator"},{"id":"ctc_1","type":"custom_tool_call","call_id":"call_patch","name":"apply_patch","input":"*** Begin Patch\n*** End Patch"},{"id":"ws_1","type":"web_search_call","status":"completed","action":{"type":"search","query":"rust"}}],"usage":{"input_tokens":5200,"input_tokens_details":{"cached_tokens":4096},"output_tokens":310,"output_tokens_details":{"reasoning_tokens":256},"total_tokens":5510}}}"#,
    ];

    #[test]
    fn a_streamed_response_gives_its_usage_and_the_agents_own_tool_uses_once() {
        let mut tally = Tally::default();
        for event in STREAM {
            OpenAi.event(&mut tally, event);
        }
        assert!(tally.complete && tally.usage_seen);
        assert_eq!(tally.model.as_deref(), Some("gpt-5-2025-08-07"));
        assert_eq!(
            tally.tokens,
            Tokens {
                input_tokens: 1104,
                cache_read_input_tokens: 4096,
                output_tokens: 310,
                cache_creation_input_tokens: 0,
            }
        );
        assert_eq!(tally.stop_reason.as_deref(), Some("completed"));
        let uses: Vec<(&str, &str)> = tally
            .tool_uses
            .iter()
            .map(|t| (t.id.as_str(), t.name.as_str()))
            .collect();
        assert_eq!(
            uses,
            [
                ("call_shell", "exec_command"),
                ("call_patch", "apply_patch"),
                ("ws_1", "web_search")
            ]
        );
        let input = |i: usize, key: &str| tally.tool_uses[i].input.as_ref().map(|m| m[key].clone());
        assert_eq!(input(0, "cmd"), Some("git status".into()));
        assert_eq!(
            input(1, "input"),
            Some("*** Begin Patch\n*** End Patch".into())
        );
        assert_eq!(input(2, "query"), Some("rust".into()));
    }

    #[test]
    fn a_whole_response_gives_the_same_and_an_incomplete_one_its_reason() {
        let whole: Value = serde_json::from_str(
            r#"{"id":"resp_2","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"model":"gpt-5-mini",
                "output":[{"type":"local_shell_call","call_id":"c1","action":{"type":"exec","command":["ls"]}},
                {"type":"function_call","call_id":"c2","name":"mcp__orchestrator__echo","arguments":"{}"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}],
                "usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":36}}"#,
        )
        .expect("json");
        let mut tally = Tally::default();
        OpenAi.message(&mut tally, &whole);
        assert!(tally.complete);
        assert_eq!(
            (tally.tokens.input_tokens, tally.tokens.output_tokens),
            (10, 36)
        );
        assert_eq!(tally.stop_reason.as_deref(), Some("max_output_tokens"));
        assert_eq!(tally.tool_uses.len(), 1);
        assert_eq!(tally.tool_uses[0].name, "local_shell");
        // A cut stream: no usage, not complete.
        let mut cut = Tally::default();
        for event in &STREAM[..8] {
            OpenAi.event(&mut cut, event);
        }
        assert!(!cut.complete && !cut.usage_seen);
        assert_eq!(cut.tool_uses.len(), 1);
    }

    #[test]
    fn only_the_apis_paths_queries_and_headers_pass() {
        let post = Method::POST;
        let responses = OpenAi.route(&post, "/v1/responses").expect("responses");
        assert_eq!(responses.call, Call::Generate);
        let models = OpenAi.route(&Method::GET, "/v1/models").expect("models");
        assert_eq!(
            (models.call, models.method.clone()),
            (Call::Catalog, Method::GET)
        );
        for (method, path) in [
            (Method::GET, "/v1/responses"),
            (Method::POST, "/v1/models"),
            (Method::DELETE, "/v1/responses"),
            (Method::POST, "/v1/responses/resp_1/cancel"),
            (Method::GET, "/v1/responses/resp_1"),
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/messages"),
            (Method::GET, "/v1/models/gpt-5"),
            (Method::POST, "/v1/responses/../files"),
            (Method::POST, "//v1/responses"),
            (Method::POST, "/v1/responses/"),
        ] {
            assert_eq!(OpenAi.route(&method, path), None, "{method} {path}");
        }
        assert!(OpenAi.query(&models, "client_version=0.171.0").is_ok());
        assert!(OpenAi.query(&models, "").is_ok());
        for bad in [
            "client_version=0.171.0&x=1",
            "client_version=",
            "client_version=a%2Fb",
            "url=https://evil.example",
        ] {
            assert!(OpenAi.query(&models, bad).is_err(), "{bad}");
        }
        assert!(OpenAi.query(&responses, "").is_ok());
        assert!(OpenAi.query(&responses, "stream=true").is_err());
        for ok in [
            "content-type",
            "originator",
            "Session-Id",
            "x-client-request-id",
            "x-stainless-lang",
        ] {
            assert!(OpenAi.forwards_header(ok), "{ok}");
        }
        for no in [
            "authorization",
            "x-api-key",
            "openai-organization",
            "openai-project",
            "cookie",
            "accept-encoding",
            "x-codex-turn-metadata",
            "x-forwarded-for",
        ] {
            assert!(!OpenAi.forwards_header(no), "{no}");
        }
        let key = HeaderValue::from_static("sk-proj-key");
        let (name, value) = OpenAi.key_header(&key).expect("header");
        assert_eq!(
            (name.as_str(), value.to_str().ok()),
            ("authorization", Some("Bearer sk-proj-key"))
        );
        assert!(value.is_sensitive());
    }

    #[test]
    fn the_request_is_read_and_a_cap_added_when_the_budget_needs_one() {
        let route = OpenAi.route(&Method::POST, "/v1/responses").expect("route");
        let body = br#"{"model":"gpt-5","stream":true,"input":[],"tools":[],"store":false}"#;
        let ask = OpenAi.ask(&route, body).expect("ask");
        assert_eq!(
            ask,
            Ask {
                model: "gpt-5".into(),
                stream: true,
                max_output: None
            }
        );
        let capped: Value =
            serde_json::from_slice(&OpenAi.clamp(body, 100).expect("capped")).expect("json");
        assert_eq!(capped["max_output_tokens"], 100);
        assert_eq!(capped["store"], false);
        let asked = br#"{"model":"gpt-5","max_output_tokens":4000}"#;
        assert_eq!(
            OpenAi.ask(&route, asked).map(|a| a.max_output),
            Ok(Some(4000))
        );
        for bad in [
            &b"[]"[..],
            br#"{"input":[]}"#,
            br#"{"model":5}"#,
            br#"{"model":"m","max_output_tokens":-1}"#,
        ] {
            assert!(
                OpenAi.ask(&route, bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn refusals_come_in_the_apis_error_shape() {
        let error = OpenAi.error_body(StatusCode::TOO_MANY_REQUESTS, Kind::Budget, "over");
        assert_eq!(
            error,
            serde_json::json!({"error":{"message":"over","type":"insufficient_quota","param":null,"code":"insufficient_quota"}})
        );
        let error = OpenAi.error_body(StatusCode::NOT_FOUND, Kind::NotFound, "no");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
}
