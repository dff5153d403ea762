//! The `TaskRun` custom resource (`orchestrator.io/v1`): one agent task, run as a Job whose pod
//! holds the agent and the MCP proxy sidecar, with the tools the task may use.
//!
//! What the API server can judge from the object alone is refused at apply time by CEL rules
//! (`x-kubernetes-validations`) declared here; what needs the catalog or other objects (unknown
//! servers, missing Secrets) the operator reports as status conditions.
//!
//! Unknown fields are not denied: the API server prunes them, and `kubectl apply` refuses them.
//!
//! Its children, in the order they may import each other (each uses only those above it;
//! `scripts/check-module-cycles` holds the code to this list):
//! - [`limits`]: the upper bounds on the spec's strings, lists and maps, and the transforms that
//!   set them on the Kubernetes types embedded in it.
//! - [`model`]: `spec.model` (the model credential the task's proxy holds) and `spec.budget`.
//! - [`permission_rules`]: the grammar of the agent's permission rules, as CEL and in Rust.
//! - `tool_config`: `spec.toolConfig` (built-in tools, MCP servers) and [`EffectiveTools`].
//! - [`history`]: `status.contextHistory`, one entry per `contextVersion`, and who asked.
//! - [`result`]: `status.result` (the agent's report, read from its termination message) and
//!   `status.cancellation`, and the cancel annotation.
//! - [`runtime`]: `spec.agent.runtime` and `spec.agent.model`: the agent CLI, its model API and
//!   default model.
//! - `status`: [`TaskRunStatus`], [`Phase`] and the [`conditions`] the operator writes.
//! - `tests`: the CRD's names, printer columns and status subresource.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::{
    approval::Approval,
    policy::{RateLimits, ToolPolicy},
    shared::ProxyMode,
    tools::Risk,
};
pub use history::ContextChange;
pub use result::{CancelRequest, Cancellation, TaskResult};
pub use runtime::AgentRuntime;
pub use status::{Phase, TaskRunStatus, conditions};
pub use tool_config::{
    EffectiveTools, InternalTools, McpServer, Permissions, SecretEnvRef, ToolConfig, ToolPatterns,
};

pub mod history;
pub mod limits;
pub mod model;
pub mod permission_rules;
pub mod result;
pub mod runtime;
mod status;
mod tool_config;

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
    // Not `tr`: Tekton's TaskRun (OpenShift Pipelines) has it, and kubectl would pick one of
    // the two silently. docs/api.md, "Names".
    shortname = "otr",
    category = "orchestrator",
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
    printcolumn(
        name = "Proxy",
        type_ = "string",
        description = "Where the task's MCP proxy runs (sidecar or shared)",
        json_path = ".status.proxyMode",
        priority = 1
    ),
    printcolumn(
        name = "Result",
        type_ = "string",
        description = "How the agent's run ended, as it reported (status.result.subtype)",
        json_path = ".status.result.subtype"
    ),
    printcolumn(
        name = "Turns",
        type_ = "integer",
        description = "Model turns the agent reported",
        json_path = ".status.result.turns"
    ),
    printcolumn(
        name = "Cost",
        type_ = "string",
        description = "Cost in USD the agent reported",
        json_path = ".status.result.costUsd"
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
    {"rule": "has(self.proxy) == has(oldSelf.proxy) && (!has(self.proxy) || self.proxy == oldSelf.proxy)", "message": "spec.proxy is immutable once the TaskRun exists (a Job's pod cannot change)", "fieldPath": ".proxy"},
    {"rule": "has(self.model) == has(oldSelf.model) && (!has(self.model) || self.model == oldSelf.model)", "message": "spec.model is immutable once the TaskRun exists (the proxy's container mounts its Secret); spec.budget may change", "fieldPath": ".model"}
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
    /// With `budget`, the only part of the spec that may change while the task runs
    /// (add-context).
    #[serde(default)]
    pub tool_config: ToolConfig,

    /// The model the agent talks to through the task's proxy: the Secret with its API key
    /// (only the proxy reads it), the endpoint, the models allowed. Unset: the operator's
    /// default credential, if one is configured (the chart's `model` values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<model::ModelSpec>,

    /// What the task may spend on its model: input and output tokens, cost in USD (by the
    /// gateway's price table), model requests. The proxy refuses a request that could pass a
    /// limit. May be raised (or lowered) while the task runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<model::Budget>,
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
    #[schemars(length(min = 1, max = limits::PROMPT_CHARS))]
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

impl KeyRef {
    /// `NAME/KEY` (how the CLI's and the operator's flags name a Secret key).
    pub fn parse_slash(text: &str) -> Result<Self, String> {
        match text.split_once('/') {
            Some((name, key)) if !name.is_empty() && !key.is_empty() && !key.contains('/') => {
                Ok(Self {
                    name: name.into(),
                    key: key.into(),
                })
            }
            _ => Err(format!(
                "{text:?} is not SECRET/KEY of a Secret (e.g. anthropic/api-key)"
            )),
        }
    }
}

/// The agent container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = runtime::cel()))]
pub struct AgentSpec {
    /// The agent CLI (see [`runtime::AgentRuntime`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<runtime::AgentRuntime>,
    /// The model the runtime asks for (`gpt-5.5`, `gemini-2.5-pro`, `claude-sonnet-4-5`).
    /// Unset: the runtime's default (Claude Code picks its own). Must match `spec.model.models`
    /// when that lists globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = runtime::MODEL_CHARS))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": runtime::MODEL_RULE, "message": runtime::MODEL_MESSAGE}
    ]))]
    pub model: Option<String>,
    /// Container image; the operator's image for the runtime when unset (`--agent-image`,
    /// `--agent-image-codex`, `--agent-image-gemini-cli`, `--agent-image-opencode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
    /// Entrypoint, for `runtime: custom`. When neither `command` nor `args` is set the operator
    /// runs the runtime's default command with the config it renders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = limits::COMMAND_ITEM_CHARS)))]
    pub command: Option<Vec<String>>,
    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = limits::ARG_CHARS)))]
    pub args: Option<Vec<String>>,
    /// Extra environment (e.g. an API key from a Secret via `valueFrom.secretKeyRef`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), transform = limits::env)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<EnvVar>,
    /// Compute resources of the agent container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = limits::resources)]
    pub resources: Option<ResourceRequirements>,
}

impl TaskRunSpec {
    /// The runtime that runs the task: `spec.agent`'s, else Claude Code.
    pub fn runtime(&self) -> runtime::AgentRuntime {
        self.agent
            .as_ref()
            .map_or(runtime::AgentRuntime::ClaudeCode, AgentSpec::runtime)
    }

    /// The model the runtime asks for: `spec.agent.model`, else the runtime's default.
    pub fn agent_model(&self) -> Option<&str> {
        match &self.agent {
            Some(agent) => agent.model(),
            None => runtime::AgentRuntime::ClaudeCode.default_model(),
        }
    }
}

impl AgentSpec {
    /// The runtime that runs the task (see [`runtime::AgentRuntime::effective`]).
    pub fn runtime(&self) -> runtime::AgentRuntime {
        runtime::AgentRuntime::effective(
            self.runtime,
            self.command.is_some() || self.args.is_some(),
        )
    }

    /// The model the runtime asks for: `model`, else the runtime's default.
    pub fn model(&self) -> Option<&str> {
        self.model
            .as_deref()
            .or_else(|| self.runtime().default_model())
    }
}

/// The task's MCP proxy: where it runs, and the sidecar container's size.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.mode) && self.mode == 'shared' && has(self.resources))", "message": "spec.proxy.resources sizes the sidecar; in shared mode the proxy is the chart's Deployment (sharedProxy.resources)", "fieldPath": ".resources"}
]))]
pub struct ProxyContainerSpec {
    /// `sidecar` (a proxy in the task's pod) or `shared` (the chart's shared proxy Deployment,
    /// docs/proxy.md "Shared mode"). Unset: the label `orchestrator.io/proxy-mode` on the
    /// TaskRun's Namespace, else the operator's `--default-proxy-mode`. The operator records
    /// the mode it chose in `status.proxyMode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ProxyMode>,
    /// Compute resources of the proxy container, which also runs the task's stdio MCP servers
    /// (node, python). Replaces the operator's default as a whole (requests cpu 100m, memory
    /// 128Mi; limit memory 1Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = limits::resources)]
    pub resources: Option<ResourceRequirements>,
}

/// Scheduling and pull settings of the task's pod (the fields of a Pod's spec of the same names).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels a node must have for the pod to run there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64), transform = limits::labels)]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pod tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), transform = limits::tolerations)]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(t, !has(t.operator) || t.operator in ['Exists', 'Equal'])", "message": "a toleration's operator must be Exists or Equal"},
        {"rule": "self.all(t, !has(t.effect) || t.effect in ['', 'NoSchedule', 'PreferNoSchedule', 'NoExecute'])", "message": "a toleration's effect must be NoSchedule, PreferNoSchedule or NoExecute (or empty for all)"},
        {"rule": "self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')", "message": "a toleration with operator Exists must not have a value"},
        {"rule": "self.all(t, has(t.key) && t.key != '' || has(t.operator) && t.operator == 'Exists')", "message": "a toleration without a key must have operator Exists (it then tolerates every taint)"}
    ]))]
    pub tolerations: Vec<Toleration>,
    /// Node and pod affinity and anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = limits::affinity)]
    pub affinity: Option<Affinity>,
    /// Secrets in the TaskRun's namespace holding registry credentials for the pod's images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = limits::names)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_has_the_names_columns_and_subresources() {
        let crd = TaskRun::crd();
        assert_eq!(crd.spec.group, "orchestrator.io");
        assert_eq!(crd.spec.names.short_names, Some(vec!["otr".to_string()]));
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["orchestrator".to_string()])
        );
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
                "Task", "Service", "Phase", "Tools", "Context", "Served", "Proxy", "Result",
                "Turns", "Cost", "Age"
            ]
        );
    }

    /// Every string of the spec has a `maxLength` (or is an enum), every list a `maxItems`,
    /// every map a `maxProperties` (docs/api.md, "Size limits").
    #[test]
    fn crd_bounds_every_string_list_and_map_of_the_spec() {
        fn walk(s: &serde_json::Value, path: &str, unbounded: &mut Vec<String>) {
            let has = |k: &str| s.get(k).is_some();
            let type_ = s.get("type").and_then(|t| t.as_str());
            let int_or_string = s.get("x-kubernetes-int-or-string") == Some(&true.into());
            if (type_ == Some("string") || int_or_string) && !has("maxLength") && !has("enum") {
                unbounded.push(format!("{path}: maxLength"));
            }
            if type_ == Some("array") && !has("maxItems") {
                unbounded.push(format!("{path}: maxItems"));
            }
            if s.get("additionalProperties").is_some_and(|a| a.is_object()) {
                if !has("maxProperties") {
                    unbounded.push(format!("{path}: maxProperties"));
                }
                walk(
                    &s["additionalProperties"],
                    &format!("{path}{{}}"),
                    unbounded,
                );
            }
            if let Some(items) = s.get("items") {
                walk(items, &format!("{path}[]"), unbounded);
            }
            for (name, sub) in s
                .get("properties")
                .and_then(|p| p.as_object())
                .into_iter()
                .flatten()
            {
                walk(sub, &format!("{path}.{name}"), unbounded);
            }
        }
        let crd = serde_json::to_value(TaskRun::crd()).expect("the CRD as JSON");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut unbounded = Vec::new();
        walk(spec, "spec", &mut unbounded);
        assert!(unbounded.is_empty(), "unbounded: {unbounded:#?}");
    }
}
