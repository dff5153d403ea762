//! The proxy config: what the operator renders into the task's ConfigMap (`proxy.yaml`) and the
//! MCP proxy sidecar reads. This module holds the wire types only; the sidecar's `config` module
//! parses them strictly (every problem at once, each with a stable code) and normalizes them.
//!
//! Secrets never travel in this file: a stdio server names the env vars the sidecar passes
//! through from its own environment (`passEnv`), an HTTP server names the env vars its headers
//! come from (`headersFromEnv`); the values arrive in the pod as env from Secret references.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::{
    approval::RequireApproval,
    condition::{CallCondition, ConditionEffect},
    decision::{DecisionCache, DecisionPoint},
    policy::{OnChange, RateLimit, RateLimits, ToolMode},
    tools::Risk,
};

/// The default address the proxy serves MCP on.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The separator between server name and tool name in exposed tool names (`github__create_issue`).
pub const PREFIX_SEPARATOR: &str = "__";

/// The file name of the proxy config inside the mounted ConfigMap directory.
pub const PROXY_CONFIG_FILE: &str = "proxy.yaml";

/// The whole proxy config file.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyConfig {
    /// Increments each time the task's tool configuration changes (add-context).
    #[serde(default)]
    pub context_version: u64,
    /// The task this proxy serves (for logs, audit records and metrics).
    pub task: TaskRef,
    /// Address to serve MCP (streamable HTTP at `/mcp`) and the HTTP endpoints on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// How exposed tool names are formed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub tool_prefix: ToolPrefix,
    /// Extra `Host` header values accepted besides loopback names (e.g. the pod IP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Per-call timeout for `tools/call` on an upstream, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_seconds: Option<u64>,
    /// Audit log settings.
    #[serde(default, skip_serializing_if = "is_default")]
    pub audit: AuditSpec,
    /// Rules every call is held to, beyond the servers' tool patterns.
    #[serde(default, skip_serializing_if = "is_default")]
    pub policy: PolicySpec,
    /// The upstream MCP servers.
    #[serde(default)]
    pub servers: Vec<ServerSpec>,
    /// The model API served to the agent at `/model` (see [`crate::gateway`]); unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<crate::gateway::GatewaySpec>,
}

/// Which task a proxy belongs to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The TaskRun's uid. Set by the shared-mode render only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Who created the TaskRun (its `orchestrator.io/created-by` annotation, which the chart's
    /// admission policy makes the creator's identity): the proxy writes it in every audit record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// The TaskRun's labels: conditions read them (`task.labels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// How the proxy names the tools it exposes.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum ToolPrefix {
    /// `<server>__<tool>` (the default).
    #[default]
    Server,
    /// The upstream tool name as is; any two servers exposing the same name is a load error.
    None,
}

/// Audit log settings.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditSpec {
    /// Where to write one JSON line per `tools/call`; stderr when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Record argument values too (off by default: only their size is recorded).
    #[serde(default, skip_serializing_if = "is_default")]
    pub include_arguments: bool,
}

/// Rules every call is held to, beyond the servers' tool patterns.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    /// `direct` (each enabled tool offered as itself) or `intent` (`retrieve_tools` and the
    /// three `call_tool_*` variants, each call declaring its intent).
    #[serde(default, skip_serializing_if = "is_default")]
    pub tool_mode: ToolMode,
    /// Tools whose risk class is above this are hidden and refused, whatever the patterns say.
    /// A tool's class comes from its annotations (`readOnlyHint` -> read, `destructiveHint` ->
    /// destructive, neither -> write) unless its server's `risk` names it. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_risk: Option<Risk>,
    /// Check each call's arguments against the tool's `inputSchema` before forwarding it
    /// (default true); invalid ones come back as a tool error naming the field.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub validate_arguments: bool,
    /// What a tool whose definition changes while the proxy runs, or differs from its server's
    /// `pins` entry, does: `block` (hidden and refused) or `alert` (offered, reported).
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_change: OnChange,
    /// Calls that wait for a person's decision, passed on through the task's Lease and
    /// ConfigMap (see `crate::approval`); unset: none wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_approval: Option<RequireApproval>,
    /// CEL conditions on calls (see `crate::condition`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<CallCondition>,
    /// Policy services asked about each call (see `crate::decision`), in order (the chart's,
    /// then the TaskRun's): every one must allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decision_points: Vec<DecisionPoint>,
}

impl Default for PolicySpec {
    fn default() -> Self {
        Self {
            tool_mode: ToolMode::default(),
            max_risk: None,
            validate_arguments: true,
            on_change: OnChange::default(),
            require_approval: None,
            conditions: Vec::new(),
            decision_points: Vec::new(),
        }
    }
}

/// One upstream MCP server.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerSpec {
    /// Unique name; the prefix of its exposed tools.
    pub name: String,
    /// A disabled server is never started and exposes nothing.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Start the server as a child process speaking MCP over stdio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdio: Option<StdioSpec>,
    /// Reach the server over streamable HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSpec>,
    /// Which of the server's tools are exposed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub tools: ToolFilter,
    /// Tool name -> its risk class, instead of what the server's annotations say.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub risk: BTreeMap<String, Risk>,
    /// Calls per minute to the server (`perMinute`, `burst`) and to single tools (`tools`);
    /// a call over a limit is refused with a retryable error.
    #[serde(default, skip_serializing_if = "RateLimits::is_empty")]
    pub rate_limit: RateLimits,
    /// Tool name -> the hash its definition must have (`sha256:<hex>`, see `GET /tools`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pins: BTreeMap<String, String>,
    /// The server's tools as pinned in the catalog (MCP `Tool` objects, each hashing to its
    /// pin): the proxy lists these without starting the server, and holds the server's own list
    /// to them (a tool not among them is a changed definition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub definitions: Vec<serde_json::Value>,
}

/// A stdio upstream: a child process.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StdioSpec {
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Literal environment for the child (no secrets here: use `passEnv`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of variables the child gets from the proxy's own environment (how Secrets arrive).
    /// The child gets nothing else from the proxy's environment except a minimal base
    /// (`PATH`, `HOME`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
    /// Working directory of the child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The server runs in its own container of the pod (its zone), where
    /// `orchestrator-mcp-proxy zone` starts it; the proxy starts each process through this unix
    /// socket. With `socket`, `env`, `passEnv` and `cwd` must be empty: they are the zone
    /// container's (its env, its Secrets, its working directory); `command` and `args` are what
    /// the zone runs, kept for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// With `socket` (required there): the uid the server's zone runs as. The proxy starts the
    /// server only when `socket` is a socket (not a symbolic link) owned by this uid and the
    /// peer that answers on it is of this uid (`SO_PEERCRED`), and only when the zone's first
    /// line names this server: a server whose process can write its socket's directory cannot
    /// send the proxy to another server's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_uid: Option<u32>,
    /// Shared mode: the zone listens on the task pod's IP at this port
    /// (`orchestrator-mcp-proxy zone --listen`); the shared proxy connects to it there, with the
    /// key in `zoneKey`. Like `socket`, `env`, `passEnv` and `cwd` must then be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_port: Option<u16>,
    /// Shared mode: the task's Secret key holding the zone's key (64 hex digits), which the
    /// shared proxy reads through the API and proves to the zone at `zonePort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_key: Option<SecretKey>,
}

/// A key of a Secret in the task's namespace.
pub use crate::gateway::ObjectKey as SecretKey;

/// A streamable-HTTP upstream.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpSpec {
    pub url: String,
    /// Shared mode: the catalog marks the server's tool list as independent of the credential
    /// (tasks share the tool-list cache).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shareable: bool,
    /// Shared mode: header name -> the Secret key in the task's namespace holding its value
    /// (read by the shared proxy through the task's Role; never in its environment).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers_from_secret: BTreeMap<String, SecretKey>,
    /// Header name -> name of the env var in the proxy's environment holding its value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers_from_env: BTreeMap<String, String>,
}

/// Glob patterns over the upstream's tool names. Deny wins; an empty `allow` allows all.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

fn default_listen() -> String {
    DEFAULT_LISTEN.to_string()
}

fn default_true() -> bool {
    true
}

fn is_true(v: &bool) -> bool {
    *v
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
