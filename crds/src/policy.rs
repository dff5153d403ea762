//! The per-call policy a TaskRun sets for its tools (`toolConfig.policy`, a server's
//! `rateLimit`, the catalog's definition pins) and the proxy enforces: the riskiest class
//! offered, argument validation, what a changed tool definition does, rate limits.

use std::{collections::BTreeMap, fmt};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    approval::RequireApproval, condition::CallCondition, decision::DecisionPoint, tools::Risk,
};

/// Rules the proxy holds every MCP tool call to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ToolPolicy {
    /// How the agent is offered the tools: `direct` (the default: each enabled tool as itself)
    /// or `intent` (four fixed tools: `retrieve_tools` finds the enabled tools, and
    /// `call_tool_read`, `call_tool_write` and `call_tool_destructive` call one with a declared
    /// intent that must match both the variant and what the tool's server says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_mode: Option<ToolMode>,
    /// The riskiest tools the agent may see and call: `read`, `write` or `destructive`. A tool's
    /// class comes from the server's annotations for it (`readOnlyHint` -> read,
    /// `destructiveHint` -> destructive, neither -> write) unless the catalog or the server's
    /// `risk` here names it. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_risk: Option<Risk>,
    /// Check each call's arguments against the tool's `inputSchema` before it leaves the pod
    /// (default true): invalid arguments come back as a tool error naming the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validate_arguments: Option<bool>,
    /// What a tool whose definition (name, description, input schema, annotations) changes
    /// during the task, or differs from its catalog pin, does: `block` (the default: hidden and
    /// refused) or `alert` (still offered; reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_change: Option<OnChange>,
    /// Calls that wait for a person's decision (`orchestrator-cli task approve|reject`): by
    /// class and/or `server/glob` pattern, with how long they wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_approval: Option<RequireApproval>,
    /// CEL conditions on calls: each names the calls it applies to (`server/glob`), an
    /// expression over the call (`args`, `tool`, `server`, `task`, `time`) and what a true one
    /// does (`deny` with its message, or `requireApproval`). Checked in order after the
    /// arguments; the first `deny` that holds refuses the call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"]
    ))]
    pub conditions: Vec<CallCondition>,
    /// A policy service the proxy asks about each call (Open Policy Agent's data API), after
    /// the conditions: only an explicit allow lets the call go; a timeout, an error or an
    /// unreachable service refuses it. The chart's (`policy.decisionPoint`), when set, is asked
    /// too, first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_point: Option<DecisionPoint>,
}

impl ToolPolicy {
    /// Whether a tool of class `risk` may be offered; `None` (a class only the server's
    /// annotations give, which only the proxy sees) is admitted.
    pub fn admits(&self, risk: Option<Risk>) -> bool {
        self.max_risk
            .zip(risk)
            .is_none_or(|(max, risk)| risk <= max)
    }
}

/// How the proxy offers the enabled tools to the agent: `direct` (the default: each as itself)
/// or `intent` (`retrieve_tools` finds them; `call_tool_read`, `call_tool_write` and
/// `call_tool_destructive` call one, with a declared intent that must match).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ToolMode {
    /// Each enabled tool is in `tools/list` as itself (`server__tool`).
    #[default]
    Direct,
    /// `tools/list` holds four fixed tools: `retrieve_tools` (search the enabled tools) and
    /// `call_tool_read` / `call_tool_write` / `call_tool_destructive` (call one, declaring the
    /// intent), so a client can approve reads and ask about the rest.
    Intent,
}

impl ToolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolMode::Direct => "direct",
            ToolMode::Intent => "intent",
        }
    }
}

impl fmt::Display for ToolMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the proxy does with a tool whose definition changed while the task ran, or differs from
/// its catalog pin: `block` (the default: hidden and refused) or `alert` (offered, reported).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default, Hash)]
#[serde(rename_all = "camelCase")]
pub enum OnChange {
    /// Quarantine it: hidden from tools/list and refused, until a pin names the new definition
    /// (or the server's command changes).
    #[default]
    Block,
    /// Keep offering it; record the change (audit, metric, log).
    Alert,
}

impl OnChange {
    pub fn as_str(self) -> &'static str {
        match self {
            OnChange::Block => "block",
            OnChange::Alert => "alert",
        }
    }
}

impl fmt::Display for OnChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token bucket: `perMinute` calls per minute on average, at most `burst` at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimit {
    /// Calls per minute (at least 1).
    #[schemars(range(min = 1))]
    pub per_minute: u32,
    /// Calls allowed at once before the rate applies (default: `perMinute`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub burst: Option<u32>,
}

impl RateLimit {
    /// The burst in force (`perMinute` when unset).
    pub fn burst(&self) -> u32 {
        self.burst.unwrap_or(self.per_minute)
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/min, burst {}", self.per_minute, self.burst())
    }
}

/// A server's rate limits: one bucket for all its tools together, and one per named tool.
/// A call must fit both.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimits {
    /// Calls per minute to any of the server's tools (unset: no server-wide limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub per_minute: Option<u32>,
    /// The server-wide burst (default: `perMinute`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub burst: Option<u32>,
    /// Upstream tool name -> its own limit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 128))]
    pub tools: BTreeMap<String, RateLimit>,
}

impl RateLimits {
    /// The server-wide limit, when set.
    pub fn server(&self) -> Option<RateLimit> {
        self.per_minute.map(|per_minute| RateLimit {
            per_minute,
            burst: self.burst,
        })
    }

    pub fn is_empty(&self) -> bool {
        *self == RateLimits::default()
    }
}

pub use crate::digest::{PIN_PREFIX, definition_hash, is_pin, sha256_jcs, short_pin};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_without_burst_bursts_its_rate() {
        let limits: RateLimits = serde_json::from_str(
            r#"{"perMinute": 30, "tools": {"write_file": {"perMinute": 6, "burst": 2}}}"#,
        )
        .expect("json");
        assert_eq!(limits.server().map(|l| l.burst()), Some(30));
        assert_eq!(limits.tools["write_file"].burst(), 2);
        assert_eq!(limits.tools["write_file"].to_string(), "6/min, burst 2");
    }
}
