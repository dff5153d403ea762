//! `status`: what the operator observed and did (phase, conditions, the rendered and served
//! `contextVersion`, the effective tools, the context history, approvals), and the
//! [`conditions`] it writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::history::ContextChange;
use super::result::{Cancellation, TaskResult};
use super::tool_config::EffectiveTools;
use crate::approval::Approval;

/// What the operator observed and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunStatus {
    /// Pending, Running, Succeeded or Failed (from the Job), or Cancelled (`task cancel`).
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
    /// Where the task's MCP proxy runs, as the operator resolved it before creating the Job
    /// (`spec.proxy.mode`, else the Namespace's label, else the operator's default). Written
    /// once; never changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_mode: Option<super::ProxyMode>,
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
    /// What the agent reported when it finished (its container's termination message): final
    /// text, turns, tokens, cost, duration. The agent's claim, read with bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<TaskResult>,
    /// Who cancelled the task (`task cancel`) and when the operator stopped its Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<Cancellation>,
    /// Who created the TaskRun, as the annotation `orchestrator.io/created-by` names them
    /// (`task submit` writes it; the chart's admission policy makes it the requester and keeps
    /// it unchanged). Absent when the TaskRun was created without it (e.g. `kubectl apply`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub created_by: Option<String>,
    /// What the task's model requests used, counted by its proxy's model gateway from the
    /// endpoint's answers (independent of `result`, the agent's own report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::gateway::ModelUsage>,
}

/// The lifecycle phase of a task run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    /// Stopped on request (`task cancel`): see `status.cancellation`.
    Cancelled,
}

impl Phase {
    /// Whether the task has finished.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Cancelled)
    }

    /// A task's phase as a person reads it: "no phase yet" before the operator's first status.
    pub fn label(phase: Option<Phase>) -> &'static str {
        phase.map_or("no phase yet", Phase::as_str)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Cancelled => "Cancelled",
        }
    }
}

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
    /// `Succeeded=False` reason when the task was cancelled (`task cancel`); the message names
    /// who asked.
    pub const CANCELLED: &str = "Cancelled";
    /// True while the task's model gateway refuses its requests for its budget
    /// (`status.usage.exceeded` names the limit); also the `Succeeded=False` reason of a task
    /// that failed so.
    pub const BUDGET_EXCEEDED: &str = "BudgetExceeded";
}
