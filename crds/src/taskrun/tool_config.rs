//! `spec.toolConfig`: the tools the agent may use (its built-in tools' permission rules and the
//! catalog's MCP servers with their tool patterns, Secrets, risk classes and rate limits), and
//! [`EffectiveTools`], what an enabled server's patterns come to (`status.tools`, and what
//! [`history`](super::history) diffs).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{limits, permission_rules};
use crate::catalog::CatalogServer;
use crate::policy::{RateLimits, ToolPolicy};
use crate::tools::Risk;

/// The tools the agent may use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ToolConfig {
    /// The agent's own built-in tools (e.g. `WebFetch`, `Bash`).
    #[serde(default)]
    pub internal_tools: InternalTools,
    /// MCP servers from the catalog, reached through the proxy sidecar.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [
            {"rule": "self.all(s, self.exists_one(t, t.name == s.name))", "message": "server names must be unique"}
        ]
    ))]
    pub mcp_servers: Vec<McpServer>,
    /// Rules the proxy holds every MCP tool call to, beyond each server's patterns.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(transform = limits::policy)]
    pub policy: ToolPolicy,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// The agent's built-in tools.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct InternalTools {
    /// Which built-in tools the agent may use.
    #[serde(default)]
    pub permissions: Permissions,
}

/// Allow and deny rules for the agent's built-in tools, in the agent's own rule syntax (for
/// Claude Code: `WebFetch`, `Bash(npm test:*)`, `mcp__server__tool`). Deny wins; `*` in `allow`
/// allows all. A rule the agent could not parse is refused at admission
/// ([`permission_rules`]): the agent would skip it and leave the tool enabled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Permissions {
    /// Allowed tools; `["*"]` (the default) allows every tool not denied.
    #[serde(default = "allow_all")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "x-kubernetes-validations" = permission_rules::cel(permission_rules::List::Allow)
    ))]
    pub allow: Vec<String>,
    /// Denied tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "x-kubernetes-validations" = permission_rules::cel(permission_rules::List::Deny)
    ))]
    pub deny: Vec<String>,
}

impl Default for Permissions {
    fn default() -> Self {
        Self {
            allow: allow_all(),
            deny: Vec::new(),
        }
    }
}

fn allow_all() -> Vec<String> {
    vec!["*".to_string()]
}

/// One MCP server for the task: a catalog entry, switched on or off, with tool filters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServer {
    /// The catalog entry's name (a DNS-1123 label).
    #[schemars(length(min = 1, max = 63))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')", "message": "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"}
    ]))]
    pub name: String,
    /// A disabled server is never started and exposes nothing (its Secrets are still wired into
    /// the pod, so it can be enabled later by add-context).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Which of the server's tools the agent sees.
    #[serde(default)]
    pub tools: ToolPatterns,
    /// Where the env vars the catalog says this server needs come from, when not from the
    /// catalog's default Secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["env"]))]
    pub secret_refs: Vec<SecretEnvRef>,
    /// Tool name -> its risk class (`read`, `write`, `destructive`), instead of what the catalog
    /// or the server's annotations say.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 128), transform = limits::risk)]
    pub risk: BTreeMap<String, Risk>,
    /// Calls per minute to the server (`perMinute`, `burst`) and to single tools (`tools`).
    #[serde(default, skip_serializing_if = "RateLimits::is_empty")]
    #[schemars(transform = limits::rate_limits)]
    pub rate_limit: RateLimits,
}

impl McpServer {
    /// An enabled server with the given patterns and no Secret overrides.
    pub fn new(name: impl Into<String>, allow: &[&str], deny: &[&str]) -> Self {
        Self {
            name: name.into(),
            enabled: true,
            tools: ToolPatterns {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
            },
            secret_refs: Vec::new(),
            risk: BTreeMap::new(),
            rate_limit: RateLimits::default(),
        }
    }

    /// The risk class of `tool` as far as the TaskRun and the server's catalog `entry` say (the
    /// TaskRun's over the catalog's); `None` when only the server's annotations would.
    pub fn known_risk(&self, tool: &str, entry: Option<&CatalogServer>) -> Option<Risk> {
        self.risk
            .get(tool)
            .copied()
            .or_else(|| entry?.tools.iter().find(|t| t.name == tool)?.risk)
    }
}

fn default_true() -> bool {
    true
}

/// Glob patterns (`*`, `?`, `[abc]`, `{a,b}`) over a server's tool names. Deny wins; an empty
/// `allow` allows every tool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ToolPatterns {
    /// Tools to expose; empty exposes all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "x-kubernetes-validations" = [{"rule": "self.all(p, size(p) > 0)", "message": "patterns must not be empty"}]
    ))]
    pub allow: Vec<String>,
    /// Tools to hide even if allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "x-kubernetes-validations" = [{"rule": "self.all(p, size(p) > 0)", "message": "patterns must not be empty"}]
    ))]
    pub deny: Vec<String>,
}

/// The Secret key an env var of a server comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretEnvRef {
    /// The env var, as the catalog names it (e.g. `GITHUB_PERSONAL_ACCESS_TOKEN`).
    #[schemars(length(min = 1, max = 128))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[A-Za-z_][A-Za-z0-9_]*$')", "message": "must be an environment variable name: letters, digits and '_', not starting with a digit"}
    ]))]
    pub env: String,
    /// The Secret in the TaskRun's namespace.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')", "message": "must be a DNS-1123 subdomain"}
    ]))]
    pub name: String,
    /// The key in the Secret; the catalog's `secretKey` for this env var when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

/// The tools an enabled server exposes to the agent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveTools {
    /// The server.
    pub server: String,
    /// Its allow patterns (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Its deny patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// The catalog's known tools these patterns expose; unset when the catalog does not list
    /// the server's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use crate::taskrun::TaskRunSpec;

    #[test]
    fn defaults_allow_all_internal_tools_and_enable_servers() {
        let spec: TaskRunSpec = serde_json::from_value(serde_json::json!({
            "taskId": 1, "serviceName": "svc", "task": {"prompt": "x"},
            "toolConfig": {"mcpServers": [{"name": "time"}]}
        }))
        .expect("minimal spec parses");
        assert_eq!(spec.tool_config.internal_tools.permissions.allow, ["*"]);
        assert!(spec.tool_config.mcp_servers[0].enabled);
    }
}
