//! What the gateway needs to know of a model API, one small part per provider
//! ([`super::anthropic`], [`super::openai`], [`super::gemini`]): which requests are forwarded,
//! which of their headers and queries pass, where the key goes, what the gateway reads of a
//! request (the model, streamed or not, the output cap), how it lowers that cap, how it reads
//! what an answer used, and how the API says an error. `forward()` only calls these.

use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use orchestrator_crds::gateway::Provider;
use serde_json::Value;

use super::ledger::Tokens;

/// The largest tool input kept for the audit (larger ones are recorded as truncated).
pub const MAX_TOOL_INPUT: usize = 64 * 1024;
/// Tool uses of one answer kept with their input; past it, only their names and sizes.
const MAX_TOOL_INPUTS: usize = 128;
/// Tool uses of one answer recorded at all (a real answer has a handful).
pub const MAX_TOOL_USES: usize = 1024;

/// What a forwarded request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// A model request: admitted under the budget, its answer measured.
    Generate,
    /// Counts tokens: no budget, nothing measured.
    Count,
    /// Lists the models (a GET without a body): no budget, nothing measured.
    Catalog,
}

/// A request the provider forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    /// The path sent to the endpoint (after its base URL), rebuilt from what was checked.
    pub path: String,
    /// The API path for the audit and the logs (`/v1/responses`; a Gemini model as `{model}`).
    pub endpoint: &'static str,
    pub call: Call,
    /// The model, when the path names it (Gemini).
    pub model: Option<String>,
    /// The answer streams because the path says so (Gemini's `:streamGenerateContent`).
    pub streams: bool,
}

/// What the gateway reads of a request body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ask {
    pub model: String,
    pub stream: bool,
    /// The output cap the request sets (`max_tokens`, `max_output_tokens`,
    /// `generationConfig.maxOutputTokens`).
    pub max_output: Option<u64>,
}

/// Why the gateway refuses, in words every API has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    InvalidRequest,
    Authentication,
    Permission,
    NotFound,
    TooLarge,
    /// Over the task's budget.
    Budget,
    /// The gateway or the endpoint failed.
    Api,
    /// Busy: retry.
    Overloaded,
}

impl Kind {
    /// From the Messages API's error types, which name a refusal made before the task's provider
    /// is known (`super::refuse`).
    pub fn from_anthropic(kind: &str) -> Self {
        match kind {
            "invalid_request_error" => Self::InvalidRequest,
            "authentication_error" => Self::Authentication,
            "permission_error" => Self::Permission,
            "not_found_error" => Self::NotFound,
            "request_too_large" => Self::TooLarge,
            "rate_limit_error" => Self::Budget,
            "overloaded_error" => Self::Overloaded,
            _ => Self::Api,
        }
    }
}

/// One model API as the gateway forwards it.
pub trait Api: Send + Sync {
    fn provider(&self) -> Provider;

    /// The route of `method path` (the part after `/model`); `None`: not forwarded.
    fn route(&self, method: &Method, path: &str) -> Option<Route>;

    /// What is forwarded, for the refusal of anything else.
    fn forwarded(&self) -> &'static str;

    /// Whether `query` may go to the endpoint with `route`; `Err`: what may.
    fn query(&self, route: &Route, query: &str) -> Result<(), &'static str>;

    /// Whether a request header is passed on. Never a credential, a cookie, a hop's header or
    /// `accept-encoding` (the gateway reads the answers it passes on).
    fn forwards_header(&self, name: &str) -> bool;

    /// The header carrying `key` to the endpoint.
    fn key_header(&self, key: &HeaderValue) -> Result<(HeaderName, HeaderValue), String>;

    /// What the gateway reads of the body of `route` (not for [`Call::Catalog`]).
    fn ask(&self, route: &Route, body: &[u8]) -> Result<Ask, String>;

    /// The most output one answer may have when the request sets no cap (the API's largest);
    /// 0: the API requires a cap.
    fn output_ceiling(&self) -> u64;

    /// `body` asking for at most `output` tokens (`None`: it cannot be changed).
    fn clamp(&self, body: &[u8], output: u64) -> Option<Vec<u8>>;

    /// Reads one server-sent event of an answer.
    fn event(&self, tally: &mut Tally, data: &str);

    /// Reads a whole (non-streamed) answer.
    fn message(&self, tally: &mut Tally, body: &Value);

    /// An error body in the API's own shape, which its clients show as they would the API's.
    fn error_body(&self, status: StatusCode, kind: Kind, message: &str) -> Value;
}

/// A tool use of the agent's own tools the model asked for (MCP tools are left out: the proxy
/// records those when the agent calls them).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    /// `None` when it was over [`MAX_TOOL_INPUT`], not a JSON object, or past
    /// [`MAX_TOOL_INPUTS`].
    pub input: Option<serde_json::Map<String, Value>>,
    pub input_bytes: usize,
}

/// A tool use being streamed (the Messages API sends its input in parts).
#[derive(Debug, Default)]
pub struct Open {
    pub index: u64,
    pub id: String,
    pub name: String,
    pub json: String,
    pub over: bool,
}

/// What an answer used and said, as far as it was read.
#[derive(Debug, Default)]
pub struct Tally {
    pub model: Option<String>,
    pub tokens: Tokens,
    /// A usage was read.
    pub usage_seen: bool,
    /// The answer reached its end (the stream's last event, or the whole message was read).
    pub complete: bool,
    pub stop_reason: Option<String>,
    pub tool_uses: Vec<ToolUse>,
    /// Tool uses past [`MAX_TOOL_USES`], not recorded.
    pub tool_uses_dropped: u64,
    /// An error event's type.
    pub error: Option<String>,
    /// Tool uses being streamed.
    pub open: Vec<Open>,
}

impl Tally {
    /// Records a tool use, its input an object of at most [`MAX_TOOL_INPUT`] bytes (serialized).
    pub fn tool_use(&mut self, id: &str, name: &str, input: Option<Value>, input_bytes: usize) {
        if self.tool_uses.len() >= MAX_TOOL_USES {
            self.tool_uses_dropped += 1;
            return;
        }
        let keep = self.tool_uses.len() < MAX_TOOL_INPUTS && input_bytes <= MAX_TOOL_INPUT;
        self.tool_uses.push(ToolUse {
            id: crate::names::clip(id).into_owned(),
            name: crate::names::clip(name).into_owned(),
            input: match input {
                Some(Value::Object(map)) if keep => Some(map),
                _ => None,
            },
            input_bytes,
        });
    }

    /// Records a tool use whose input is a JSON value.
    pub fn tool_use_value(&mut self, id: &str, name: &str, input: Option<&Value>) {
        let input = input.cloned().unwrap_or(Value::Null);
        let bytes = serde_json::to_vec(&input).map(|v| v.len()).unwrap_or(0);
        self.tool_use(id, name, Some(input), bytes);
    }

    /// Records a tool use whose input is JSON text (`arguments` of a call).
    pub fn tool_use_json(&mut self, id: &str, name: &str, json: &str) {
        let input = if json.len() > MAX_TOOL_INPUT {
            None
        } else if json.trim().is_empty() {
            Some(Value::Object(serde_json::Map::new()))
        } else {
            serde_json::from_str(json).ok()
        };
        self.tool_use(id, name, input, json.len());
    }

    /// Takes `usage`'s counts.
    pub fn usage(&mut self, tokens: Tokens) {
        self.usage_seen = true;
        self.tokens = tokens;
    }
}

/// A count in `v` at `key`.
pub fn count(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// A string in `v` at `key` ("" when none).
pub fn text<'v>(v: &'v Value, key: &str) -> &'v str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A JSON object body (the APIs' requests all are), or why not.
pub fn object(body: &[u8], what: &str) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(format!("the body is not {what}: not a JSON object")),
        Err(e) => Err(format!("the body is not {what}: {e}")),
    }
}

/// What a body that names its model, `stream` and output cap (`cap`) at its top level asks
/// (Messages, Responses); `what` names the request in errors.
pub fn top_level_ask(body: &[u8], what: &str, cap: &str) -> Result<Ask, String> {
    let map = object(body, what)?;
    let model = match map.get("model") {
        Some(Value::String(model)) => model.clone(),
        _ => return Err(format!("the body is not {what}: no model")),
    };
    Ok(Ask {
        model,
        stream: map.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_output: optional_count(&map, cap)?,
    })
}

/// An optional count at `key` of `map`; a value of another type is an error naming the field.
pub fn optional_count(
    map: &serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<u64>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} is not a non-negative integer")),
    }
}

/// `body` with `path` (object keys, created when missing) set to `value`.
pub fn set(body: &[u8], path: &[&str], value: u64) -> Option<Vec<u8>> {
    let mut root: Value = serde_json::from_slice(body).ok()?;
    let mut at = &mut root;
    let (last, parents) = path.split_last()?;
    for key in parents {
        let map = at.as_object_mut()?;
        at = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
    at.as_object_mut()?.insert(last.to_string(), value.into());
    serde_json::to_vec(&root).ok()
}

/// The key as a bearer token (`Authorization: Bearer <key>`), never logged.
pub fn bearer(key: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
    let mut value = b"Bearer ".to_vec();
    value.extend_from_slice(key.as_bytes());
    let mut value = HeaderValue::from_bytes(&value)
        .map_err(|_| "the API key is not one header value".to_string())?;
    value.set_sensitive(true);
    Ok((axum::http::header::AUTHORIZATION, value))
}

/// Request headers no API's part passes on, whatever its own rule says.
pub fn never_forwarded(name: &str) -> bool {
    matches!(
        name,
        "authorization"
            | "proxy-authorization"
            | "x-api-key"
            | "x-goog-api-key"
            | "cookie"
            | "host"
            | "accept-encoding"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "content-length"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_is_set_where_the_api_keeps_it_and_created_when_missing() {
        let body = br#"{"model":"m","generationConfig":{"temperature":0}}"#;
        let set_ = set(body, &["generationConfig", "maxOutputTokens"], 36).expect("set");
        let v: Value = serde_json::from_slice(&set_).expect("json");
        assert_eq!(v["generationConfig"]["maxOutputTokens"], 36);
        assert_eq!(v["generationConfig"]["temperature"], 0);
        let v: Value =
            serde_json::from_slice(&set(br#"{"model":"m"}"#, &["a", "b"], 1).expect("created"))
                .expect("json");
        assert_eq!(v["a"]["b"], 1);
        // A field of another type is not made an object.
        assert_eq!(set(br#"{"a":3}"#, &["a", "b"], 1), None);
        assert_eq!(set(b"[1]", &["a"], 1), None);
    }

    #[test]
    fn a_hostile_answer_costs_bounded_memory_in_tool_uses() {
        let mut tally = Tally::default();
        let big = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_TOOL_INPUT));
        tally.tool_use_json("1", "Bash", &big);
        assert_eq!(tally.tool_uses[0].input, None);
        assert!(tally.tool_uses[0].input_bytes > MAX_TOOL_INPUT);
        for i in 0..MAX_TOOL_USES + 5 {
            tally.tool_use_json(&i.to_string(), "Bash", r#"{"command":"ls"}"#);
        }
        assert_eq!(tally.tool_uses.len(), MAX_TOOL_USES);
        assert_eq!(tally.tool_uses_dropped, 6);
        assert!(tally.tool_uses[1].input.is_some());
        assert!(tally.tool_uses[MAX_TOOL_INPUTS].input.is_none());
        let long = "n".repeat(10_000);
        tally.tool_uses.clear();
        tally.tool_use_json(&long, &long, "{}");
        assert!(tally.tool_uses[0].name.len() < 1000);
    }
}
