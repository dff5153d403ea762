//! The Anthropic Messages API as the gateway forwards it: its paths, the request headers it
//! defines, where the key goes, and what a response used (its `usage`, `stop_reason` and the
//! `tool_use` blocks the model asked the agent to run), from a whole JSON message or from the
//! stream's events.

use serde::Deserialize;
use serde_json::Value;

use super::ledger::Tokens;

/// The header the key goes in.
pub const KEY_HEADER: &str = "x-api-key";

/// The largest tool input kept for the audit (larger ones are recorded as truncated).
pub const MAX_TOOL_INPUT: usize = 64 * 1024;

/// The paths forwarded (after the gateway's prefix), POST only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    CountTokens,
}

impl Endpoint {
    pub fn route(path: &str) -> Option<Self> {
        match path {
            "/v1/messages" => Some(Self::Messages),
            "/v1/messages/count_tokens" => Some(Self::CountTokens),
            _ => None,
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Self::Messages => "/v1/messages",
            Self::CountTokens => "/v1/messages/count_tokens",
        }
    }
}

/// The only query the API's clients send (`?beta=true`, the SDK's beta namespace).
pub fn query_allowed(query: &str) -> bool {
    query.is_empty() || query == "beta=true"
}

/// Whether a request header is passed on: the API's own (`anthropic-version`, `anthropic-beta`,
/// ...), the SDK's descriptive ones, and the body's type. Never a credential, a cookie, a hop's
/// header or `accept-encoding` (the gateway reads the responses it passes on).
pub fn forwards_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "content-type" | "accept" | "user-agent" | "x-app" | "x-claude-code-session-id"
    ) || name.starts_with("anthropic-") && name != "anthropic-admin-key"
        || name.starts_with("x-stainless-")
}

/// What the gateway reads of a request body.
#[derive(Debug, Deserialize)]
pub struct Ask {
    pub model: String,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stream: Option<bool>,
}

/// A `tool_use` block the model sent.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    /// `None` when it was over [`MAX_TOOL_INPUT`] or not JSON.
    pub input: Option<serde_json::Map<String, Value>>,
    pub input_bytes: usize,
}

/// What a response used and said, as far as it was read.
#[derive(Debug, Default)]
pub struct Tally {
    pub model: Option<String>,
    pub tokens: Tokens,
    /// A `usage` was read (from `message_start` or the whole message).
    pub usage_seen: bool,
    /// The stream reached `message_stop` (or the whole message was read).
    pub complete: bool,
    pub stop_reason: Option<String>,
    pub tool_uses: Vec<ToolUse>,
    /// An `error` event's type.
    pub error: Option<String>,
    /// Tool uses being streamed: (content index, id, name, input so far, over the cap).
    open: Vec<(u64, String, String, String, bool)>,
}

fn count(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

impl Tally {
    fn usage(&mut self, usage: &Value) {
        self.usage_seen = true;
        let t = &mut self.tokens;
        for (key, field) in [
            ("input_tokens", &mut t.input_tokens),
            ("output_tokens", &mut t.output_tokens),
            (
                "cache_creation_input_tokens",
                &mut t.cache_creation_input_tokens,
            ),
            ("cache_read_input_tokens", &mut t.cache_read_input_tokens),
        ] {
            // Counts in a later event are cumulative: they replace the earlier ones.
            if let Some(n) = count(usage, key) {
                *field = n;
            }
        }
    }

    /// A whole (non-streamed) message.
    pub fn message(&mut self, message: &Value) {
        if let Some(model) = message.get("model").and_then(Value::as_str) {
            self.model = Some(model.to_string());
        }
        if let Some(usage) = message.get("usage") {
            self.usage(usage);
        }
        if let Some(reason) = message.get("stop_reason").and_then(Value::as_str) {
            self.stop_reason = Some(reason.to_string());
        }
        for block in message
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                let input = block.get("input").cloned().unwrap_or(Value::Null);
                let input_bytes = serde_json::to_vec(&input).map(|v| v.len()).unwrap_or(0);
                self.tool_uses.push(ToolUse {
                    id: text(block, "id"),
                    name: text(block, "name"),
                    input: match input {
                        Value::Object(map) if input_bytes <= MAX_TOOL_INPUT => Some(map),
                        _ => None,
                    },
                    input_bytes,
                });
            }
        }
        self.complete = true;
    }

    /// One event of a stream.
    pub fn event(&mut self, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(message) = event.get("message") {
                    if let Some(model) = message.get("model").and_then(Value::as_str) {
                        self.model = Some(model.to_string());
                    }
                    if let Some(usage) = message.get("usage") {
                        self.usage(usage);
                    }
                }
            }
            Some("content_block_start") => {
                let block = event.get("content_block").unwrap_or(&Value::Null);
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    let index = count(&event, "index").unwrap_or(0);
                    self.open.push((
                        index,
                        text(block, "id"),
                        text(block, "name"),
                        String::new(),
                        false,
                    ));
                }
            }
            Some("content_block_delta") => {
                let index = count(&event, "index").unwrap_or(0);
                let delta = event.get("delta").unwrap_or(&Value::Null);
                if let Some(part) = delta.get("partial_json").and_then(Value::as_str)
                    && let Some(open) = self.open.iter_mut().find(|o| o.0 == index)
                {
                    if open.3.len() + part.len() > MAX_TOOL_INPUT {
                        open.4 = true;
                    } else {
                        open.3.push_str(part);
                    }
                }
            }
            Some("content_block_stop") => {
                let index = count(&event, "index").unwrap_or(0);
                if let Some(at) = self.open.iter().position(|o| o.0 == index) {
                    let (_, id, name, json, over) = self.open.remove(at);
                    let input = if over {
                        None
                    } else if json.trim().is_empty() {
                        Some(serde_json::Map::new())
                    } else {
                        serde_json::from_str(&json).ok()
                    };
                    self.tool_uses.push(ToolUse {
                        id,
                        name,
                        input_bytes: if over { MAX_TOOL_INPUT + 1 } else { json.len() },
                        input,
                    });
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = event.get("usage") {
                    self.usage(usage);
                }
            }
            Some("message_stop") => self.complete = true,
            Some("error") => {
                self.error = Some(
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
}

fn text(v: &Value, key: &str) -> String {
    crate::names::clip(v.get(key).and_then(Value::as_str).unwrap_or_default()).into_owned()
}

/// An error body in the API's own shape, which its clients show as they would the API's.
pub fn error_body(kind: &str, message: &str) -> Value {
    serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
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
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":34}}"#,
        r#"{"type":"message_stop"}"#,
    ];

    #[test]
    fn a_streamed_message_gives_its_usage_stop_reason_and_tool_uses() {
        let mut tally = Tally::default();
        for event in STREAM {
            tally.event(event);
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
        assert_eq!(tally.tool_uses.len(), 1);
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
                "content":[{"type":"text","text":"x"},{"type":"tool_use","id":"t","name":"Edit","input":{"file_path":"a"}}]}"#,
        )
        .expect("json");
        let mut tally = Tally::default();
        tally.message(&message);
        assert_eq!(
            (tally.tokens.input_tokens, tally.tokens.output_tokens),
            (5, 7)
        );
        assert_eq!(tally.tool_uses[0].name, "Edit");
        assert!(tally.tool_uses[0].input.is_some());
    }

    #[test]
    fn only_the_apis_paths_and_headers_pass() {
        assert_eq!(Endpoint::route("/v1/messages"), Some(Endpoint::Messages));
        for path in [
            "/v1/messages/",
            "/v1/models",
            "/v1/messages/../complete",
            "//v1/messages",
            "",
        ] {
            assert_eq!(Endpoint::route(path), None, "{path}");
        }
        for ok in [
            "anthropic-version",
            "Anthropic-Beta",
            "x-stainless-os",
            "content-type",
        ] {
            assert!(forwards_header(ok), "{ok}");
        }
        for no in [
            "authorization",
            "x-api-key",
            "cookie",
            "host",
            "accept-encoding",
            "anthropic-admin-key",
            "connection",
            "x-forwarded-for",
        ] {
            assert!(!forwards_header(no), "{no}");
        }
        assert!(query_allowed("beta=true") && query_allowed(""));
        assert!(!query_allowed("beta=true&x=1"));
    }
}
