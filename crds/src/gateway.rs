//! The model gateway's part of the proxy config (`proxy.yaml`'s `gateway`): the task's proxy
//! serves the model API to the agent at `/model` on the pod's loopback (the Anthropic Messages
//! API, the OpenAI Responses API or the Gemini API, as `provider` says), forwards each request to
//! `endpoint` with the key it alone reads (`keyFile`, a Secret's key mounted in the proxy's
//! container only), counts what every response used, and holds the task to its budget.
//!
//! No secret travels here: `keyFile` is a path, `keySecret` a Secret's name and key. Prices are in USD per million tokens, as
//! providers publish them, written as decimal strings (`"3"`, `"0.30"`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the gateway serves the model API on the proxy's listener: the agent's runtime points
/// its base URL here (`http://127.0.0.1:8080/model`).
pub const PATH_PREFIX: &str = "/model";

/// The model API a gateway forwards: the one the agent's runtime speaks.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum Provider {
    /// The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`):
    /// Claude Code, and OpenCode with its `anthropic` provider.
    #[default]
    Anthropic,
    /// The OpenAI Responses API (`POST /v1/responses`, `GET /v1/models`): Codex CLI. The key
    /// goes to the endpoint as `Authorization: Bearer`.
    #[serde(rename = "openai")]
    OpenAi,
    /// The Gemini API (`POST /v1beta/models/{model}:generateContent`,
    /// `:streamGenerateContent`, `:countTokens`): Gemini CLI. The key goes to the endpoint as
    /// `x-goog-api-key`, the header the agent's credential comes in too.
    Gemini,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
            Provider::Gemini => "gemini",
        }
    }
}

/// A key of a Secret or ConfigMap in the task's namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectKey {
    pub name: String,
    pub key: String,
}

/// The gateway of one task.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySpec {
    #[serde(default)]
    pub provider: Provider,
    /// The API's base URL without its version (`https://api.anthropic.com`,
    /// `https://api.openai.com`, `https://generativelanguage.googleapis.com`): the gateway
    /// appends the API's paths. `http` only to a loopback address.
    pub endpoint: String,
    /// The file holding the API key (sidecar mode: the proxy's mount of the task's model
    /// Secret). Exactly one of `keyFile` and `keySecret`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_file: String,
    /// The Secret key in the task's namespace holding the API key, read through the API
    /// (shared mode: the task's Role lets the shared proxy `get` that Secret, by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<ObjectKey>,
    /// A PEM bundle of CAs trusted for `endpoint` besides the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The ConfigMap key in the task's namespace holding that bundle, read through the API
    /// (shared mode); at most one of `caFile` and `caConfigMap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map: Option<ObjectKey>,
    /// Globs over the model names the agent may ask for (the body's `model`; for Gemini the
    /// path's model segment); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// What the task may spend; unset fields have no limit.
    #[serde(default, skip_serializing_if = "Budget::is_empty")]
    pub budget: Budget,
    /// Model glob -> its price, over the built-in table (first matching glob in name order
    /// wins; the longest glob first when several match is not promised: keep them disjoint).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

/// A task's budget. The gateway admits a request only when its worst case fits what is left
/// (its body's bytes as input tokens, a token being at least one byte, and the output cap it
/// sets as output tokens: `max_tokens`, `max_output_tokens` or
/// `generationConfig.maxOutputTokens`, else the API's largest answer), reserves that, and
/// settles to the response's own count when it ends: parallel or streamed requests cannot take
/// a task past a limit. When less output is left than a request asks for, the gateway lowers
/// the request's cap to what is left (or sets one).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    /// Input tokens, cached ones included (`input_tokens` + `cache_creation_input_tokens` +
    /// `cache_read_input_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// USD, a decimal string (`"2.50"`), priced with the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9]{1,10}(\.[0-9]{1,9})?$"), length(max = 20))]
    pub cost_usd: Option<String>,
    /// Model requests (counting tokens and listing models are not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Seconds of wall time, counted from when the task's gateway started (its proxy's first
    /// start; a restarted proxy keeps the first start, `status.usage.startedAt`): past it, model
    /// requests are refused. Unlike `activeDeadlineSeconds`, which kills the Job, it stops the
    /// agent's model and can be raised while the task runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_seconds: Option<u64>,
}

impl Budget {
    pub fn is_empty(&self) -> bool {
        *self == Budget::default()
    }
}

/// A model's price in USD per million tokens (decimal strings). Unset cache prices follow the
/// providers' rule: writes 1.25 times input, reads 0.1 times input.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Price {
    pub input: String,
    pub output: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<String>,
}

/// The annotation on the task's Lease where its proxy reports what the model gateway counted
/// (JSON [`ModelUsage`]); the operator copies it to `status.usage`.
pub const USAGE_ANNOTATION: &str = "orchestrator.io/model-usage";

/// What a task's model requests used, as its proxy counted them from the endpoint's answers
/// (not the agent's own claim). `status.usage`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    /// USD by the gateway's price table (absent while no request was priced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub cost_usd: Option<String>,
    /// Model requests forwarded.
    pub requests: u64,
    /// Requests the budget refused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused: u64,
    /// The `spec.budget` field the last request was refused on, until a request is admitted
    /// again (a raised budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub exceeded: Option<String>,
    /// When the task's gateway started counting (RFC 3339): `budget.wallTimeSeconds` counts
    /// from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 40))]
    pub started_at: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A decimal string of USD (`"2.50"`, `"0.000003"`) in nano-dollars, exactly; `None` when it is
/// not a non-negative decimal with at most nine fractional digits or is too large.
pub fn parse_usd_nanos(text: &str) -> Option<u64> {
    let text = text.trim();
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > 9
        || whole.len() > 10
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let nanos = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    whole.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Nano-dollars as a decimal USD string with the fraction it needs (`2500000000` -> `"2.5"`).
pub fn format_usd_nanos(nanos: u64) -> String {
    let (whole, fraction) = (nanos / 1_000_000_000, nanos % 1_000_000_000);
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:09}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_strings_are_exact_nano_dollars_and_bad_ones_are_refused() {
        assert_eq!(parse_usd_nanos("2.50"), Some(2_500_000_000));
        assert_eq!(parse_usd_nanos("3"), Some(3_000_000_000));
        assert_eq!(parse_usd_nanos(".3"), Some(300_000_000));
        assert_eq!(parse_usd_nanos("0.000000001"), Some(1));
        for bad in [
            "",
            ".",
            "-1",
            "1e3",
            "0.0000000001",
            "1.2.3",
            "abc",
            "99999999999",
        ] {
            assert_eq!(parse_usd_nanos(bad), None, "{bad}");
        }
        assert_eq!(format_usd_nanos(2_500_000_000), "2.5");
        assert_eq!(format_usd_nanos(1), "0.000000001");
        assert_eq!(format_usd_nanos(7_000_000_000), "7");
    }
}
