//! The command line of the task lifecycle commands (`task logs`, `task cancel`, `task delete`),
//! of `task approve`/`reject`, `task validate` and `console`,
//! and [`TaskRef`], which every task command uses (parsing only; no behaviour here).

use std::time::Duration;

use clap::{Args, ValueEnum};
use clap_complete::ArgValueCompleter;

/// Which task: a TaskRun name, or --task-id.
#[derive(Debug, Clone, Args)]
pub struct TaskRef {
    /// The TaskRun's name.
    #[arg(
        value_name = "NAME",
        required_unless_present = "task_id",
        conflicts_with = "task_id",
        add = ArgValueCompleter::new(crate::complete::task_names)
    )]
    pub name: Option<String>,

    /// Find the TaskRun by its spec.taskId instead of by name.
    #[arg(long, value_name = "ID")]
    pub task_id: Option<i64>,
}

/// The containers of a task's pod whose logs `task logs` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogContainer {
    /// The agent (its final answer, and what it printed).
    #[default]
    Agent,
    /// The MCP proxy sidecar (container `mcp-proxy`): its logs, and its audit lines on stdout.
    #[value(alias = "mcp-proxy")]
    Proxy,
}

impl LogContainer {
    /// The container's name in the pod the operator renders.
    pub fn container_name(self) -> &'static str {
        match self {
            LogContainer::Agent => "agent",
            LogContainer::Proxy => "mcp-proxy",
        }
    }
}

/// Print the logs of a task's pod (the agent's by default).
///
/// Finds the pod of the TaskRun's Job (status.jobName) and prints its container's log; with -f
/// follows it until the container ends, waiting first for a pod that has not started. The pod
/// is gone once the Job finished and was cleaned up (its TTL): then the agent's report is in
/// status.result (`task describe`). Needs RBAC: get and list pods, get pods/log.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task logs task-1001
  orchestrator-cli task logs --task-id 1001 -f
  orchestrator-cli task logs task-1001 -c proxy --tail 50")]
pub struct LogsArgs {
    #[command(flatten)]
    pub task: TaskRef,

    /// Keep printing as the container writes, until it ends (waits for a pod not started yet).
    #[arg(short, long)]
    pub follow: bool,

    /// Which container: agent or proxy.
    #[arg(short, long, value_enum, default_value_t = LogContainer::Agent)]
    pub container: LogContainer,

    /// Only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<i64>,

    /// The log of the container's previous run (after a restart).
    #[arg(short, long, conflicts_with = "follow")]
    pub previous: bool,
}

/// Cancel a task: its Job is stopped and the TaskRun ends Cancelled, naming you.
///
/// Writes the annotation orchestrator.io/cancel naming you as the API server knows you (a
/// SelfSubjectReview; the chart's admission policy refuses any other name) with a JSON Patch that
/// tests the annotation is not there yet, so two cancels never overwrite each other. The
/// operator deletes the Job (its pod stops) and writes phase Cancelled and status.cancellation.
/// A task that has finished is left as it is (exit 5, nothing written).
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task cancel task-1001
  orchestrator-cli task cancel --task-id 1001 --wait --timeout 2m")]
pub struct CancelArgs {
    #[command(flatten)]
    pub task: TaskRef,

    /// Wait until the operator has stopped the task (phase Cancelled).
    #[arg(long)]
    pub wait: bool,

    /// Give up waiting after this long (exit 4).
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = crate::duration::parse)]
    pub timeout: Option<Duration>,
}

/// Delete a TaskRun, and with it its Job, pod, ConfigMap and decisions (owned by it).
///
/// A running task stops when its pod goes. Its status (result, history, approvals) goes too:
/// `task describe` it first when you need that.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task delete task-1001
  orchestrator-cli task delete --task-id 1001 --wait")]
pub struct DeleteArgs {
    #[command(flatten)]
    pub task: TaskRef,

    /// Wait until the TaskRun is gone from the API server.
    #[arg(long)]
    pub wait: bool,

    /// Give up waiting after this long (exit 4).
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = crate::duration::parse)]
    pub timeout: Option<Duration>,
}

/// Serve the web console on 127.0.0.1: live tasks, their tools, audit and approvals.
///
/// Everything the page shows and does is done with your own credentials (kubeconfig, --as):
/// RBAC decides what you see and which buttons work. The printed URL carries a session token;
/// the page refuses other hosts (DNS rebinding) and cross-site requests.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli console -n team-a
  orchestrator-cli console -A --port 8765 --no-open
  ssh -L 8765:127.0.0.1:8765 jumphost   # then open the printed URL with port 8765 locally")]
pub struct ConsoleArgs {
    /// The port on 127.0.0.1 (0: any free port, printed).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub port: u16,

    /// Show the TaskRuns of every namespace your RBAC lets you list.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Do not open a browser; only print the URL.
    #[arg(long)]
    pub no_open: bool,

    /// Also answer to this Host name (repeatable), e.g. behind a tunnel or proxy that keeps
    /// its own name in the Host header; loopback names always work.
    #[arg(long, value_name = "NAME")]
    pub allow_host: Vec<String>,
}

/// Check TaskRun manifests before applying them, as the operator and the API server would.
///
/// Each TaskRun in the files (YAML, several documents allowed, or JSON) gets the operator's own
/// checks against the catalog (servers, tool patterns, Secret env, permission rules, CEL
/// conditions, the decision point: what would otherwise come back as the TaskRun's condition
/// after it was applied) and the API server's dry run of its create (the CRD's schema and rules,
/// the chart's admission policy for you: the Secrets you may use, your quota). Nothing is
/// written. Exit 2 when any TaskRun has a problem, each one named by its field.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task validate taskrun.yaml
  kustomize build overlays/prod | orchestrator-cli task validate - -o json
  orchestrator-cli task validate --offline --catalog config/catalog.yaml taskrun.yaml")]
pub struct ValidateArgs {
    /// The manifests (- for stdin).
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<std::path::PathBuf>,

    /// Connect to no cluster: no dry run, and the catalog from --catalog (without it, only the
    /// checks that need no catalog: permission rules, conditions, the decision point).
    #[arg(long)]
    pub offline: bool,
}

/// Approve (or reject) a tool call the task's proxy holds: the call then proceeds (or is
/// refused with the reason).
///
/// Creates a ToolApproval that names you (as the API server knows you) and the digest of the
/// call as the request lists it: the proxy forwards only the call with that digest, once. The
/// first decision on a request is final. Needs RBAC to create toolapprovals, e.g. the chart's
/// ClusterRole `orchestrator-approver` bound in the task's namespace.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task approvals task-1001 --show a1b2c3d4
  orchestrator-cli task approve task-1001 a1b2c3d4 --digest sha256:3f2a9c81d0e4
  orchestrator-cli task reject task-1001 a1b2c3d4 --reason 'not that branch'")]
pub struct DecideArgs {
    /// The TaskRun's name.
    #[arg(value_name = "TASK", add = ArgValueCompleter::new(crate::complete::task_names))]
    pub task_name: String,

    /// The request's id (from `task approvals`).
    #[arg(value_name = "ID", add = ArgValueCompleter::new(crate::complete::approval_ids))]
    pub id: String,

    /// Why (at most 512 characters); a rejection's reason is shown to the agent.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// The digest of the call you looked at (`task approvals TASK --show ID`): the whole value
    /// or `sha256:` and at least 12 of its hex digits. Nothing is decided when the request
    /// names another call.
    #[arg(long, value_name = "DIGEST")]
    pub digest: Option<String>,
}

impl DecideArgs {
    pub fn task(&self) -> TaskRef {
        TaskRef {
            name: Some(self.task_name.clone()),
            task_id: None,
        }
    }
}

/// Show this CLI's version and what the cluster runs: Kubernetes, the operator (its
/// Deployment, found by the chart's labels in --catalog-namespace, else in any namespace you may
/// list) and the TaskRun and ToolApproval CRDs (served and storage versions, the chart that
/// installed them). A part you may not read, or that is not installed, is said so.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli version
  orchestrator-cli version --client
  orchestrator-cli version -o json
  kubectl orchestrator version")]
pub struct VersionArgs {
    /// Only this CLI's version (connects to nothing).
    #[arg(long)]
    pub client: bool,
}

/// How tables are printed (kept out of [`Global`], which the commands take, because it only
/// shapes the printing: `run` hands it to `output`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct Printing {
    /// Print tables without their header line (as kubectl's --no-headers).
    #[arg(long, global = true)]
    pub no_headers: bool,
}
