//! The `TaskRun` custom resource (`orchestrator.io/v1`): one agent task, run as a Job whose pod
//! holds the agent and the MCP proxy sidecar, with the tools the task may use.
//!
//! What the API server can judge from the object alone is refused at apply time by CEL rules
//! (`x-kubernetes-validations`) declared here; what needs the catalog or other objects (unknown
//! servers, missing Secrets) the operator reports as status conditions.
//!
//! Unknown fields are not denied: the API server prunes them, and `kubectl apply` refuses them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::CatalogServer;
pub use crate::{
    approval::Approval,
    policy::{RateLimits, ToolPolicy},
    tools::Risk,
};
pub use history::ContextChange;

/// API group of every orchestrator resource.
pub const GROUP: &str = "orchestrator.io";

/// The longest TaskRun name: its ConfigMap is `<name>-tools` and its Job `<name>`, and a Job's
/// name must fit a 63-character label value on its pods.
pub const MAX_NAME_LEN: usize = 57;

/// Suffix of the ConfigMap rendered for a TaskRun.
pub const CONFIG_MAP_SUFFIX: &str = "-tools";

/// The upper bound on MCP servers per task (keeps the CEL uniqueness check cheap).
pub const MAX_SERVERS: usize = 32;

/// The desired state of a task run.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "orchestrator.io",
    version = "v1",
    kind = "TaskRun",
    namespaced,
    shortname = "tr",
    status = "TaskRunStatus",
    doc = "An AI-agent task run as a Job, with an MCP proxy sidecar exposing only the tools the task may use.",
    printcolumn(name = "Task", type_ = "integer", description = "Task id", json_path = ".spec.taskId"),
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.serviceName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Tools",
        type_ = "integer",
        description = "Number of catalog tools the agent can call",
        json_path = ".status.enabledToolCount"
    ),
    printcolumn(
        name = "Context",
        type_ = "integer",
        description = "Version of the rendered tool configuration",
        json_path = ".status.contextVersion"
    ),
    printcolumn(
        name = "Served",
        type_ = "integer",
        description = "contextVersion the task pod's proxy serves",
        json_path = ".status.servedContextVersion"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.taskId",
    selectable = ".spec.serviceName",
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 57")
        .message("metadata.name must be a DNS-1123 label of at most 57 characters (the Job is named after it, the ConfigMap <name>-tools)"),
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.taskId == oldSelf.taskId", "message": "spec.taskId is immutable", "fieldPath": ".taskId"},
    {"rule": "self.serviceName == oldSelf.serviceName", "message": "spec.serviceName is immutable", "fieldPath": ".serviceName"},
    {"rule": "self.task == oldSelf.task", "message": "spec.task is immutable: the agent already runs this task; create a new TaskRun for a new task", "fieldPath": ".task"},
    {"rule": "has(self.agent) == has(oldSelf.agent) && (!has(self.agent) || self.agent == oldSelf.agent)", "message": "spec.agent is immutable once the TaskRun exists (a Job's pod cannot change)", "fieldPath": ".agent"},
    {"rule": "has(self.activeDeadlineSeconds) == has(oldSelf.activeDeadlineSeconds) && (!has(self.activeDeadlineSeconds) || self.activeDeadlineSeconds == oldSelf.activeDeadlineSeconds)", "message": "spec.activeDeadlineSeconds is immutable", "fieldPath": ".activeDeadlineSeconds"},
    {"rule": "has(self.serviceAccountName) == has(oldSelf.serviceAccountName) && (!has(self.serviceAccountName) || self.serviceAccountName == oldSelf.serviceAccountName)", "message": "spec.serviceAccountName is immutable once the TaskRun exists (a Job's pod cannot change)", "fieldPath": ".serviceAccountName"},
    {"rule": "has(self.podTemplate) == has(oldSelf.podTemplate) && (!has(self.podTemplate) || self.podTemplate == oldSelf.podTemplate)", "message": "spec.podTemplate is immutable once the TaskRun exists (a Job's pod cannot change)", "fieldPath": ".podTemplate"},
    {"rule": "has(self.proxy) == has(oldSelf.proxy) && (!has(self.proxy) || self.proxy == oldSelf.proxy)", "message": "spec.proxy is immutable once the TaskRun exists (a Job's pod cannot change)", "fieldPath": ".proxy"}
]))]
pub struct TaskRunSpec {
    /// The task's id in the tracker (e.g. 1001). Select by it with
    /// `--field-selector spec.taskId=1001`.
    #[schemars(range(min = 0))]
    pub task_id: i64,

    /// The service the task works on (a DNS-1123 label, e.g. `todo-api`).
    #[schemars(length(min = 1, max = 63))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')", "message": "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"}
    ]))]
    pub service_name: String,

    /// What the agent is asked to do: inline text or a key of a ConfigMap or Secret.
    pub task: TaskSource,

    /// The agent container; the operator's defaults apply to what is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,

    /// The MCP proxy sidecar container; the operator's defaults apply to what is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyContainerSpec>,

    /// The ServiceAccount the task's pod runs as (e.g. for image pull secrets attached to it).
    /// Its API token is never mounted into the agent. Unset: the namespace's `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')", "message": "must be a DNS-1123 subdomain (the name of a ServiceAccount)"}
    ]))]
    pub service_account_name: Option<String>,

    /// Where the task's pod may run and what it may pull: node selection, tolerations,
    /// affinity, image pull secrets, priority and runtime class. Copied into the Job's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplate>,

    /// Seconds the Job may run before it is stopped and marked failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,

    /// Seconds after the task finished when the operator deletes its Job (and so its pod); the
    /// TaskRun and its status stay. Unset: the Job stays until the TaskRun is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,

    /// Seconds after the task finished when the operator deletes the TaskRun itself; its
    /// ConfigMap and Job go with it (owner references). Unset: the operator's
    /// `--retention-seconds-after-finished`, and when that is unset too the TaskRun stays until
    /// it is deleted or its namespace holds more finished TaskRuns than the operator's
    /// `--max-finished-per-namespace` (the oldest go first). May change at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub retention_seconds_after_finished: Option<i32>,

    /// The tools the agent may use: its own built-in tools and MCP servers behind the proxy.
    /// The only part of the spec that may change while the task runs (add-context).
    #[serde(default)]
    pub tool_config: ToolConfig,
}

/// Where the task text comes from. Exactly one field is set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.prompt) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) + (has(self.secretKeyRef) ? 1 : 0) == 1", "message": "spec.task needs exactly one of prompt, configMapKeyRef, secretKeyRef"}
]))]
pub struct TaskSource {
    /// The task text itself (Markdown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 262144))]
    pub prompt: Option<String>,
    /// A key of a ConfigMap in the TaskRun's namespace holding the task file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
    /// A key of a Secret in the TaskRun's namespace holding the task file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
}

/// A key of a ConfigMap or Secret in the TaskRun's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Name of the ConfigMap or Secret.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')", "message": "must be a DNS-1123 subdomain"}
    ]))]
    pub name: String,
    /// The key inside it.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^[-._a-zA-Z0-9]+$')", "message": "must consist of letters, digits, '-', '_' or '.'"}
    ]))]
    pub key: String,
}

/// The agent container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Container image; the operator's `--agent-image` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
    /// Entrypoint. When neither `command` nor `args` is set the operator runs Claude Code with
    /// the rendered MCP config (`--strict-mcp-config`) and permission settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub command: Option<Vec<String>>,
    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Vec<String>>,
    /// Extra environment (e.g. an API key from a Secret via `valueFrom.secretKeyRef`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<EnvVar>,
    /// Compute resources of the agent container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// The MCP proxy sidecar container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProxyContainerSpec {
    /// Compute resources of the proxy container, which also runs the task's stdio MCP servers
    /// (node, python). Replaces the operator's default as a whole (requests cpu 100m, memory
    /// 128Mi; limit memory 1Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Scheduling and pull settings of the task's pod (the fields of a Pod's spec of the same names).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels a node must have for the pod to run there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pod tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(t, !has(t.operator) || t.operator in ['Exists', 'Equal'])", "message": "a toleration's operator must be Exists or Equal"},
        {"rule": "self.all(t, !has(t.effect) || t.effect in ['', 'NoSchedule', 'PreferNoSchedule', 'NoExecute'])", "message": "a toleration's effect must be NoSchedule, PreferNoSchedule or NoExecute (or empty for all)"},
        {"rule": "self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')", "message": "a toleration with operator Exists must not have a value"},
        {"rule": "self.all(t, has(t.key) && t.key != '' || has(t.operator) && t.operator == 'Exists')", "message": "a toleration without a key must have operator Exists (it then tolerates every taint)"}
    ]))]
    pub tolerations: Vec<Toleration>,
    /// Node and pod affinity and anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Secrets in the TaskRun's namespace holding registry credentials for the pod's images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The pod's PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// The pod's RuntimeClass (e.g. a sandboxed runtime such as gVisor or Kata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,
}

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
    #[schemars(extend("maxProperties" = 128))]
    pub risk: BTreeMap<String, Risk>,
    /// Calls per minute to the server (`perMinute`, `burst`) and to single tools (`tools`).
    #[serde(default, skip_serializing_if = "RateLimits::is_empty")]
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

/// What the operator observed and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunStatus {
    /// Pending, Running, Succeeded or Failed (from the Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// `Ready`, `ConfigRendered`, `JobCreated`, `Succeeded`, `ToolsSynced`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes. A change is applied once this reaches
    /// the generation of the write and `ConfigRendered` is True.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Version of the rendered tool configuration; increments on each change (add-context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_version: Option<i64>,
    /// The `contextVersion` the task pod's proxy reports it serves (from the task's Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_context_version: Option<i64>,
    /// Digest of the rendered tool configuration at `contextVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// The ConfigMap holding the proxy and agent configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    /// The Job running the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// The effective tool patterns of each enabled MCP server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["server"]))]
    pub tools: Vec<EffectiveTools>,
    /// How many of the catalog's known tools the agent can call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled_tool_count: Option<i64>,
    /// When the Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Job finished (succeeded or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The last 20 `contextVersion`s: when, tools added and removed, and who asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), extend("x-kubernetes-list-type" = "atomic"))]
    pub context_history: Vec<ContextChange>,
    /// Calls held for a person's decision, and the last 20 decided (`task approvals`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 36), extend("x-kubernetes-list-type" = "atomic"))]
    pub approvals: Vec<Approval>,
}

/// The lifecycle phase of a task run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    /// Whether the task has finished.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
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

pub mod history;
pub mod permission_rules;

/// Condition types and reasons the operator writes (stable: tools and tests match on them).
pub mod conditions {
    pub const READY: &str = "Ready";
    pub const CONFIG_RENDERED: &str = "ConfigRendered";
    pub const JOB_CREATED: &str = "JobCreated";
    pub const SUCCEEDED: &str = "Succeeded";
    /// Whether the task pod's proxy serves the rendered `contextVersion` (its report:
    /// `status.servedContextVersion`). Unknown until the proxy reports; absent for a task whose
    /// proxy does not report (the API watch disabled).
    pub const TOOLS_SYNCED: &str = "ToolsSynced";
    /// `Succeeded=False` reason when the agent container exited with a non-zero code (the
    /// message names the code, the container's reason and its termination message).
    pub const AGENT_FAILED: &str = "AgentFailed";
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_has_the_names_columns_and_subresources() {
        let crd = TaskRun::crd();
        assert_eq!(crd.spec.group, "orchestrator.io");
        assert_eq!(crd.spec.names.short_names, Some(vec!["tr".to_string()]));
        let v = &crd.spec.versions[0];
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Task", "Service", "Phase", "Tools", "Context", "Served", "Age"
            ]
        );
    }

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
