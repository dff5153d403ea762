//! `status.result`: what the agent reported when it finished, and `status.cancellation`: who
//! cancelled the task and when.
//!
//! The agent container writes its result as one JSON object (the [`TaskResult`] wire form, at
//! most [`MESSAGE_BYTES`]) to its termination message (`/dev/termination-log`); the default agent
//! script builds it from Claude Code's own `--output-format json` result. The operator reads the
//! message from the finished container's status and copies it into `status.result` through
//! [`TaskResult::from_termination_message`]. The agent writes that file, so everything in it is
//! the agent's claim: it is parsed with bounds (every string clipped, every number checked) and
//! shown as "reported by the agent", never trusted for a decision.
//!
//! Cancelling: `orchestrator-cli task cancel` sets the [`CANCEL_ANNOTATION`] (`{"user":"alice"}`,
//! the caller as the API server authenticated them; the chart's admission policy refuses any
//! other user). The operator stops the Job and writes [`Cancellation`] with the time it acted.
//!
//! Creating: `orchestrator-cli task submit` sets the [`CREATED_BY_ANNOTATION`] in the same form;
//! the chart's admission policy refuses any user but the creator and any later change, and the
//! operator shows it as `status.createdBy` ([`created_by`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most bytes of a termination message the kubelet keeps (it keeps the last 4096).
pub const MESSAGE_BYTES: usize = 4096;
/// The most characters of `status.result.text` (the final message, clipped).
pub const TEXT_CHARS: usize = 3072;
/// The most characters of any other string of the result (`subtype`, `sessionId`, `error`).
pub const SHORT_CHARS: usize = 256;

/// The annotation that asks the operator to cancel a task: JSON `{"user":"NAME"}`.
pub const CANCEL_ANNOTATION: &str = "orchestrator.io/cancel";

/// The annotation naming who created the TaskRun: JSON `{"user":"NAME"}`, the form of
/// [`CancelRequest`]. Set with the create only; the chart's admission policy makes NAME the
/// requester and keeps the annotation as it was written.
pub const CREATED_BY_ANNOTATION: &str = "orchestrator.io/created-by";

/// Who the [`CREATED_BY_ANNOTATION`] value names, clipped to [`SHORT_CHARS`]; `None` for a
/// value that names nobody (not `{"user":"..."}`, or an empty user).
pub fn created_by(value: &str) -> Option<String> {
    let user = serde_json::from_str::<CancelRequest>(value).ok()?.user;
    let user = clip(user.trim(), SHORT_CHARS);
    (!user.is_empty()).then_some(user)
}

/// The agent's report of its run, as it wrote it to its termination message. Every field is the
/// agent's claim; absent when it did not say.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct TaskResult {
    /// How the agent's run ended, in its own words: Claude Code's `subtype` (`success`,
    /// `error_max_turns`, `error_during_execution`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub subtype: Option<String>,
    /// Whether the agent reported its run as an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// The agent's final message (its first [`TEXT_CHARS`] characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 3072))]
    pub text: Option<String>,
    /// True when `text` was cut (by the agent script or here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub text_truncated: bool,
    /// Model turns taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub turns: Option<i64>,
    /// Input tokens the model API reported (not counting cache reads and writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub input_tokens: Option<i64>,
    /// Output tokens the model API reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub output_tokens: Option<i64>,
    /// Input tokens read from the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cache_read_input_tokens: Option<i64>,
    /// Input tokens written to the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cache_creation_input_tokens: Option<i64>,
    /// The cost the agent computed, in US dollars, as a decimal string (`"0.0123"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub cost_usd: Option<String>,
    /// How long the agent says its run took, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub duration_ms: Option<i64>,
    /// The agent's session id (Claude Code's `session_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub session_id: Option<String>,
    /// Why no result could be read: set by the operator when the container's termination message
    /// was empty or not a result (the message's start, clipped, is in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub error: Option<String>,
}

/// Who cancelled the task and when the operator acted on it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancellation {
    /// The user the cancel annotation names (the admission policy makes it the caller).
    #[schemars(length(max = 256))]
    pub requested_by: String,
    /// When the operator stopped the Job.
    pub time: Time,
}

/// The annotation's value: `{"user":"alice"}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CancelRequest {
    pub user: String,
}

impl CancelRequest {
    /// The annotation's value for `user`.
    pub fn annotation_value(user: &str) -> String {
        serde_json::json!({ "user": user }).to_string()
    }

    /// Reads the annotation's value; a value that is not `{"user":"..."}` names nobody
    /// (`"unknown"`), and the user is clipped to [`SHORT_CHARS`].
    pub fn parse(value: &str) -> Self {
        let user = serde_json::from_str::<CancelRequest>(value)
            .map(|r| r.user)
            .unwrap_or_default();
        let user = clip(user.trim(), SHORT_CHARS);
        Self {
            user: if user.is_empty() {
                "unknown".into()
            } else {
                user
            },
        }
    }
}

/// The wire form, as read: lenient in types (a number may come as a float), strict in nothing
/// else. Unknown fields are ignored.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Wire {
    subtype: Option<serde_json::Value>,
    is_error: Option<bool>,
    text: Option<serde_json::Value>,
    #[serde(default)]
    text_truncated: bool,
    turns: Option<serde_json::Value>,
    input_tokens: Option<serde_json::Value>,
    output_tokens: Option<serde_json::Value>,
    cache_read_input_tokens: Option<serde_json::Value>,
    cache_creation_input_tokens: Option<serde_json::Value>,
    cost_usd: Option<serde_json::Value>,
    duration_ms: Option<serde_json::Value>,
    session_id: Option<serde_json::Value>,
}

impl TaskResult {
    /// Reads a container's termination message. `Ok(None)` for an empty message (the agent
    /// reported nothing); `Err` with a clipped reason for one that is not a result object.
    /// Strings are clipped; a number that is negative, not an integer or out of range is left
    /// out; `costUsd` must be a finite non-negative number (written back as a decimal string).
    pub fn from_termination_message(message: &str) -> Result<Option<Self>, String> {
        let message = message.trim();
        if message.is_empty() {
            return Ok(None);
        }
        let wire: Wire = match serde_json::from_str(message) {
            Ok(w) => w,
            Err(e) => {
                return Err(clip(
                    &format!(
                        "the agent's termination message is not a result object ({e}): {}",
                        message.escape_debug()
                    ),
                    SHORT_CHARS,
                ));
            }
        };
        let text = string(wire.text, usize::MAX);
        let (text, cut) = match text {
            Some(t) if t.chars().count() > TEXT_CHARS => (Some(clip(&t, TEXT_CHARS)), true),
            t => (t, false),
        };
        Ok(Some(Self {
            subtype: string(wire.subtype, SHORT_CHARS),
            is_error: wire.is_error,
            text,
            text_truncated: wire.text_truncated || cut,
            turns: count(wire.turns),
            input_tokens: count(wire.input_tokens),
            output_tokens: count(wire.output_tokens),
            cache_read_input_tokens: count(wire.cache_read_input_tokens),
            cache_creation_input_tokens: count(wire.cache_creation_input_tokens),
            cost_usd: cost(wire.cost_usd),
            duration_ms: count(wire.duration_ms),
            session_id: string(wire.session_id, SHORT_CHARS),
            error: None,
        }))
    }

    /// The result recorded when the message could not be read.
    pub fn unreadable(reason: String) -> Self {
        Self {
            error: Some(clip(&reason, SHORT_CHARS)),
            ..Self::default()
        }
    }
}

fn clip(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        Some((at, _)) => s[..at].to_string(),
        None => s.to_string(),
    }
}

fn string(v: Option<serde_json::Value>, chars: usize) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(clip(&s, chars)),
        _ => None,
    }
}

/// A non-negative integer up to 2^53 (exact in every JSON reader).
fn count(v: Option<serde_json::Value>) -> Option<i64> {
    const MAX: i64 = 1 << 53;
    let n = v?.as_number()?.clone();
    let n = match n.as_i64() {
        Some(i) => i,
        None => {
            let f = n.as_f64()?;
            if f.fract() != 0.0 || !(0.0..=MAX as f64).contains(&f) {
                return None;
            }
            f as i64
        }
    };
    (0..=MAX).contains(&n).then_some(n)
}

fn cost(v: Option<serde_json::Value>) -> Option<String> {
    let f = match v? {
        serde_json::Value::Number(n) => n.as_f64()?,
        serde_json::Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    (f.is_finite() && (0.0..1e12).contains(&f)).then(|| {
        let s = format!("{f:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s.is_empty() { "0".into() } else { s.into() }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claude_code_result_is_read_whole() {
        let m = r#"{"subtype":"success","isError":false,"text":"done","turns":3,
            "inputTokens":1200,"outputTokens":45,"costUsd":0.0123,"durationMs":5400,
            "sessionId":"abc","unknown":1}"#;
        let r = TaskResult::from_termination_message(m)
            .expect("a result")
            .expect("not empty");
        assert_eq!(r.subtype.as_deref(), Some("success"));
        assert_eq!(r.is_error, Some(false));
        assert_eq!(r.text.as_deref(), Some("done"));
        assert_eq!(
            (r.turns, r.input_tokens, r.output_tokens),
            (Some(3), Some(1200), Some(45))
        );
        assert_eq!(r.cost_usd.as_deref(), Some("0.0123"));
        assert_eq!(r.duration_ms, Some(5400));
        assert!(!r.text_truncated);
    }

    #[test]
    fn an_empty_message_is_no_result_and_garbage_is_an_error() {
        assert_eq!(TaskResult::from_termination_message("  \n"), Ok(None));
        let e = TaskResult::from_termination_message("Error: boom\u{1b}[31m")
            .expect_err("not a result");
        assert!(
            e.starts_with("the agent's termination message is not a result"),
            "{e}"
        );
        assert!(!e.contains('\u{1b}'), "control characters are escaped: {e}");
        let long = "x".repeat(10_000);
        assert!(
            TaskResult::from_termination_message(&long)
                .expect_err("not a result")
                .chars()
                .count()
                <= SHORT_CHARS
        );
    }

    #[test]
    fn hostile_values_are_clipped_or_left_out() {
        let m = serde_json::json!({
            "text": "y".repeat(TEXT_CHARS + 10), "subtype": "s".repeat(1000),
            "turns": -1, "inputTokens": 1.5, "outputTokens": 1e300, "durationMs": "12",
            "costUsd": -3, "sessionId": 7,
        })
        .to_string();
        let r = TaskResult::from_termination_message(&m)
            .expect("a result")
            .expect("not empty");
        assert_eq!(r.text.as_ref().map(|t| t.chars().count()), Some(TEXT_CHARS));
        assert!(r.text_truncated);
        assert_eq!(
            r.subtype.as_ref().map(|t| t.chars().count()),
            Some(SHORT_CHARS)
        );
        assert_eq!(
            (r.turns, r.input_tokens, r.output_tokens, r.duration_ms),
            (None, None, None, None)
        );
        assert_eq!((r.cost_usd, r.session_id), (None, None));
        let r = TaskResult::from_termination_message(r#"{"costUsd":"1e400"}"#)
            .expect("a result")
            .expect("not empty");
        assert_eq!(r.cost_usd, None);
        let r = TaskResult::from_termination_message(r#"{"costUsd":2}"#)
            .expect("a result")
            .expect("not empty");
        assert_eq!(r.cost_usd.as_deref(), Some("2"));
    }

    #[test]
    fn the_cancel_annotation_names_its_user_or_nobody() {
        let v = CancelRequest::annotation_value("alice@example.com");
        assert_eq!(CancelRequest::parse(&v).user, "alice@example.com");
        assert_eq!(CancelRequest::parse("yes please").user, "unknown");
        assert_eq!(CancelRequest::parse(r#"{"user":"  "}"#).user, "unknown");
        let long = CancelRequest::annotation_value(&"u".repeat(1000));
        assert_eq!(CancelRequest::parse(&long).user.len(), SHORT_CHARS);
    }

    #[test]
    fn the_created_by_annotation_names_its_user_or_nobody() {
        let v = CancelRequest::annotation_value("system:serviceaccount:team-a:ci");
        assert_eq!(v, r#"{"user":"system:serviceaccount:team-a:ci"}"#);
        assert_eq!(
            created_by(&v).as_deref(),
            Some("system:serviceaccount:team-a:ci")
        );
        assert_eq!(created_by("alice"), None);
        assert_eq!(created_by(r#"{"user":" "}"#), None);
        let long = CancelRequest::annotation_value(&"u".repeat(1000));
        assert_eq!(created_by(&long).map(|u| u.len()), Some(SHORT_CHARS));
    }
}
