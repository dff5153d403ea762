//! The Anthropic Messages API (Claude Code; OpenCode with its `anthropic` provider): its paths,
//! the request headers it defines, where the key goes, and what an answer used (its `usage`,
//! `stop_reason` and the `tool_use` blocks the model asked the agent to run), from a whole JSON
//! message or from the stream's events.

use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use orchestrator_crds::gateway::Provider;
use serde_json::Value;

use super::{
    api::{self, Api, Ask, Call, Kind, MAX_TOOL_INPUT, Open, Route, Tally, count, text},
    ledger::Tokens,
};

/// The header the key goes in (and the agent's credential may come in).
pub const KEY_HEADER: &str = "x-api-key";

/// The Messages API.
pub struct Anthropic;

/// MCP tools, as Claude Code names them (`mcp__<server>__<tool>`).
fn is_mcp(name: &str) -> bool {
    name.starts_with("mcp__")
}

impl Api for Anthropic {
    fn provider(&self) -> Provider {
        Provider::Anthropic
    }

    fn route(&self, method: &Method, path: &str) -> Option<Route> {
        let (endpoint, call) = match path {
            "/v1/messages" => ("/v1/messages", Call::Generate),
            "/v1/messages/count_tokens" => ("/v1/messages/count_tokens", Call::Count),
            _ => return None,
        };
        (*method == Method::POST).then(|| Route {
            method: Method::POST,
            path: endpoint.to_string(),
            endpoint,
            call,
            model: None,
            streams: false,
        })
    }

    fn forwarded(&self) -> &'static str {
        "POST /model/v1/messages and POST /model/v1/messages/count_tokens"
    }

    /// The only query the API's clients send (`?beta=true`, the SDK's beta namespace).
    fn query(&self, _: &Route, query: &str) -> Result<(), &'static str> {
        if query.is_empty() || query == "beta=true" {
            Ok(())
        } else {
            Err("the only query forwarded is ?beta=true")
        }
    }

    /// The API's own (`anthropic-version`, `anthropic-beta`, ...), the SDK's descriptive ones,
    /// and the body's type.
    fn forwards_header(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        !api::never_forwarded(&name)
            && (matches!(
                name.as_str(),
                "content-type" | "accept" | "user-agent" | "x-app" | "x-claude-code-session-id"
            ) || name.starts_with("anthropic-") && name != "anthropic-admin-key"
                || name.starts_with("x-stainless-"))
    }

    fn key_header(&self, key: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
        Ok((HeaderName::from_static(KEY_HEADER), key.clone()))
    }

    fn ask(&self, _: &Route, body: &[u8]) -> Result<Ask, String> {
        api::top_level_ask(body, "a Messages request", "max_tokens")
    }

    /// `max_tokens` is required: a request without it is the API's to refuse.
    fn output_ceiling(&self) -> u64 {
        0
    }

    fn clamp(&self, body: &[u8], output: u64) -> Option<Vec<u8>> {
        let mut value: Value = serde_json::from_slice(body).ok()?;
        *value.get_mut("max_tokens")? = output.into();
        serde_json::to_vec(&value).ok()
    }

    fn event(&self, tally: &mut Tally, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(message) = event.get("message") {
                    if let Some(model) = message.get("model").and_then(Value::as_str) {
                        tally.model = Some(model.to_string());
                    }
                    if let Some(usage) = message.get("usage") {
                        read_usage(tally, usage);
                    }
                }
            }
            Some("content_block_start") => {
                let block = event.get("content_block").unwrap_or(&Value::Null);
                if text(block, "type") == "tool_use" && !is_mcp(text(block, "name")) {
                    tally.open.push(Open {
                        index: count(&event, "index").unwrap_or(0),
                        id: text(block, "id").to_string(),
                        name: text(block, "name").to_string(),
                        ..Open::default()
                    });
                }
            }
            Some("content_block_delta") => {
                let index = count(&event, "index").unwrap_or(0);
                let delta = event.get("delta").unwrap_or(&Value::Null);
                if let Some(part) = delta.get("partial_json").and_then(Value::as_str)
                    && let Some(open) = tally.open.iter_mut().find(|o| o.index == index)
                {
                    if open.json.len() + part.len() > MAX_TOOL_INPUT {
                        open.over = true;
                    } else {
                        open.json.push_str(part);
                    }
                }
            }
            Some("content_block_stop") => {
                let index = count(&event, "index").unwrap_or(0);
                if let Some(at) = tally.open.iter().position(|o| o.index == index) {
                    let open = tally.open.remove(at);
                    if open.over {
                        tally.tool_use(&open.id, &open.name, None, MAX_TOOL_INPUT + 1);
                    } else {
                        tally.tool_use_json(&open.id, &open.name, &open.json);
                    }
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    tally.stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = event.get("usage") {
                    read_usage(tally, usage);
                }
            }
            Some("message_stop") => tally.complete = true,
            Some("error") => {
                tally.error = Some(
                    event
                        .get("error")
                        .and_then(|e| e.get("type"))
                        .and_then(Value::as_str)
                        .unwrap_or("error")
                        .to_string(),
                );
            }
            _ => {}
        }
    }

    fn message(&self, tally: &mut Tally, message: &Value) {
        if let Some(model) = message.get("model").and_then(Value::as_str) {
            tally.model = Some(model.to_string());
        }
        if let Some(usage) = message.get("usage") {
            read_usage(tally, usage);
        }
        if let Some(reason) = message.get("stop_reason").and_then(Value::as_str) {
            tally.stop_reason = Some(reason.to_string());
        }
        for block in message
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if text(block, "type") == "tool_use" && !is_mcp(text(block, "name")) {
                tally.tool_use_value(text(block, "id"), text(block, "name"), block.get("input"));
            }
        }
        tally.complete = true;
    }

    /// `{"type":"error","error":{"type":...,"message":...}}`.
    fn error_body(&self, _: StatusCode, kind: Kind, message: &str) -> Value {
        let kind = match kind {
            Kind::InvalidRequest => "invalid_request_error",
            Kind::Authentication => "authentication_error",
            Kind::Permission => "permission_error",
            Kind::NotFound => "not_found_error",
            Kind::TooLarge => "request_too_large",
            Kind::Budget => "rate_limit_error",
            Kind::Api => "api_error",
            Kind::Overloaded => "overloaded_error",
        };
        serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
    }
}

/// A `usage`: counts in a later event are cumulative, they replace the earlier ones.
fn read_usage(tally: &mut Tally, usage: &Value) {
    let mut tokens: Tokens = tally.tokens;
    for (key, field) in [
        ("input_tokens", &mut tokens.input_tokens),
        ("output_tokens", &mut tokens.output_tokens),
        (
            "cache_creation_input_tokens",
            &mut tokens.cache_creation_input_tokens,
        ),
        (
            "cache_read_input_tokens",
            &mut tokens.cache_read_input_tokens,
        ),
    ] {
        if let Some(n) = count(usage, key) {
            *field = n;
        }
    }
    tally.usage(tokens);
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[&str] = &[
        r#"{"type":"message_start","message":{"id":"m","model":"claude-sonnet-4-5","usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Running it."}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"command\": \"git st"}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"atus\"}"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_2","name":"mcp__orchestrator__echo","input":{}}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#,
        r#"{"type":"content_block_stop","index":2}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":34}}"#,
        r#"{"type":"message_stop"}"#,
    ];

    #[test]
    fn a_streamed_message_gives_its_usage_stop_reason_and_tool_uses() {
        let mut tally = Tally::default();
        for event in STREAM {
            Anthropic.event(&mut tally, event);
        }
        assert!(tally.complete && tally.usage_seen);
        assert_eq!(tally.model.as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(
            tally.tokens,
            Tokens {
                input_tokens: 12,
                output_tokens: 34,
                cache_creation_input_tokens: 100,
                cache_read_input_tokens: 2000
            }
        );
        assert_eq!(tally.stop_reason.as_deref(), Some("tool_use"));
        // The MCP tool is the proxy's to record.
        assert_eq!(tally.tool_uses.len(), 1, "{:?}", tally.tool_uses);
        let bash = &tally.tool_uses[0];
        assert_eq!((bash.id.as_str(), bash.name.as_str()), ("toolu_1", "Bash"));
        assert_eq!(
            bash.input.as_ref().and_then(|i| i.get("command")),
            Some(&Value::from("git status"))
        );
    }

    #[test]
    fn a_whole_message_gives_the_same() {
        let message: Value = serde_json::from_str(
            r#"{"model":"claude-haiku-4-5","stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":7},
                "content":[{"type":"text","text":"x"},{"type":"tool_use","id":"t","name":"Edit","input":{"file_path":"a"}},
                {"type":"tool_use","id":"u","name":"mcp__orchestrator__echo","input":{}}]}"#,
        )
        .expect("json");
        let mut tally = Tally::default();
        Anthropic.message(&mut tally, &message);
        assert_eq!(
            (tally.tokens.input_tokens, tally.tokens.output_tokens),
            (5, 7)
        );
        assert_eq!(tally.tool_uses.len(), 1);
        assert_eq!(tally.tool_uses[0].name, "Edit");
        assert!(tally.tool_uses[0].input.is_some());
    }

    #[test]
    fn only_the_apis_paths_and_headers_pass() {
        let post = Method::POST;
        let route = Anthropic.route(&post, "/v1/messages").expect("messages");
        assert_eq!(
            (route.call, route.path.as_str()),
            (Call::Generate, "/v1/messages")
        );
        assert_eq!(
            Anthropic
                .route(&post, "/v1/messages/count_tokens")
                .map(|r| r.call),
            Some(Call::Count)
        );
        assert_eq!(Anthropic.route(&Method::GET, "/v1/messages"), None);
        for path in [
            "/v1/messages/",
            "/v1/models",
            "/v1/responses",
            "/v1/messages/../complete",
            "//v1/messages",
            "",
        ] {
            assert_eq!(Anthropic.route(&post, path), None, "{path}");
        }
        for ok in [
            "anthropic-version",
            "Anthropic-Beta",
            "x-stainless-os",
            "content-type",
        ] {
            assert!(Anthropic.forwards_header(ok), "{ok}");
        }
        for no in [
            "authorization",
            "x-api-key",
            "x-goog-api-key",
            "cookie",
            "host",
            "accept-encoding",
            "anthropic-admin-key",
            "connection",
            "x-forwarded-for",
        ] {
            assert!(!Anthropic.forwards_header(no), "{no}");
        }
        assert!(
            Anthropic.query(&route, "beta=true").is_ok() && Anthropic.query(&route, "").is_ok()
        );
        assert!(Anthropic.query(&route, "beta=true&x=1").is_err());
    }

    #[test]
    fn the_request_is_read_and_its_max_tokens_lowered() {
        let route = Anthropic
            .route(&Method::POST, "/v1/messages")
            .expect("route");
        let body =
            br#"{"model":"claude-sonnet-4-5","max_tokens":32000,"stream":true,"messages":[]}"#;
        let ask = Anthropic.ask(&route, body).expect("ask");
        assert_eq!(
            ask,
            Ask {
                model: "claude-sonnet-4-5".into(),
                stream: true,
                max_output: Some(32000)
            }
        );
        let clamped: Value =
            serde_json::from_slice(&Anthropic.clamp(body, 36).expect("clamped")).expect("json");
        assert_eq!(clamped["max_tokens"], 36);
        assert_eq!(clamped["model"], "claude-sonnet-4-5");
        for bad in [
            &b"{not json"[..],
            b"[]",
            br#"{"max_tokens":1}"#,
            br#"{"model":"m","max_tokens":"many"}"#,
        ] {
            assert!(
                Anthropic.ask(&route, bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let error = Anthropic.error_body(StatusCode::TOO_MANY_REQUESTS, Kind::Budget, "over");
        assert_eq!(
            error,
            serde_json::json!({"type":"error","error":{"type":"rate_limit_error","message":"over"}})
        );
    }
}
