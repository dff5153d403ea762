//! An external decision point (`toolConfig.policy.decisionPoint`, the chart's for every task):
//! a policy service the proxy asks about each call, Open Policy Agent's data API as the contract.
//! The proxy POSTs `{"input": ...}` (the call: `tool`, `server`, `args`, `task`, `time`) to `url`
//! and forwards the call only on an explicit allow: `{"result": true}` or
//! `{"result": {"allow": true}}`; `false`, `{"allow": false, "reason": ...}`, no result, an
//! error, a timeout or an unreachable service refuse it (fail closed).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where and how the proxy asks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecisionPoint {
    /// The decision's URL: OPA's data API for the rule that decides, e.g.
    /// `http://opa.policy.svc:8181/v1/data/orchestrator/decision`. `http` or `https`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// How long a decision may take (default 500, 10..=5000 ms); then the call is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 5000))]
    pub timeout_milliseconds: Option<u32>,
    /// Decisions kept, by their exact input without `time`: unset, no cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<DecisionCache>,
}

/// The decision cache: at most `entries` decisions, each kept `ttlSeconds`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecisionCache {
    /// At most this many decisions (1..=10000); the oldest goes first.
    #[schemars(range(min = 1, max = 10000))]
    pub entries: u32,
    /// How long one is kept (default 10, 1..=3600 s). A policy that reads `input.time` sees the
    /// time of the call that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub ttl_seconds: Option<u32>,
}

/// The default wait for a decision.
pub const DEFAULT_TIMEOUT_MILLISECONDS: u32 = 500;
/// The default time a cached decision is kept.
pub const DEFAULT_TTL_SECONDS: u32 = 10;

impl DecisionPoint {
    /// What is wrong with it, as (field, message) under `at`.
    pub fn problems(&self, at: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let url = self.url.trim();
        let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
        let host = url
            .split_once("://")
            .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
            .unwrap_or_default();
        if !scheme_ok || host.is_empty() || url.contains(char::is_whitespace) {
            out.push((
                format!("{at}.url"),
                format!(
                    "{:?} is not an absolute http(s) URL; write the data API's URL of the rule \
                     that decides, e.g. http://opa.policy.svc:8181/v1/data/orchestrator/decision",
                    self.url
                ),
            ));
        }
        if let Some(ms) = self.timeout_milliseconds
            && !(10..=5000).contains(&ms)
        {
            out.push((
                format!("{at}.timeoutMilliseconds"),
                format!("{ms} is outside 10..=5000"),
            ));
        }
        if let Some(cache) = self.cache {
            if !(1..=10000).contains(&cache.entries) {
                out.push((
                    format!("{at}.cache.entries"),
                    format!("{} is outside 1..=10000", cache.entries),
                ));
            }
            if let Some(ttl) = cache.ttl_seconds
                && !(1..=3600).contains(&ttl)
            {
                out.push((
                    format!("{at}.cache.ttlSeconds"),
                    format!("{ttl} is outside 1..=3600"),
                ));
            }
        }
        out
    }

    pub fn timeout_milliseconds(&self) -> u32 {
        self.timeout_milliseconds
            .unwrap_or(DEFAULT_TIMEOUT_MILLISECONDS)
    }
}
