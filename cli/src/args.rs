//! The command line: every command, flag and help text (parsing only; no behaviour here).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use clap_complete::{ArgValueCompleter, Shell};
use orchestrator_crds::catalog::{DEFAULT_CONFIG_MAP_NAME, DEFAULT_CONFIG_MAP_NAMESPACE};

pub use crate::args_ops::{
    CancelArgs, ConsoleArgs, DecideArgs, DeleteArgs, LogContainer, LogsArgs, Printing, TaskRef,
    ValidateArgs, VersionArgs,
};
use crate::output::Format;

const ROOT_AFTER_HELP: &str = "\
Examples:
  # Submit a task with two MCP servers and follow it until it finishes
  orchestrator-cli task submit --service todo-api --task-file task.md \\
      --tools 'github:*,filesystem:read_file' --wait

  # Give a running task more tools, take one away, and wait for the proxy config
  orchestrator-cli task add-context --task-id 1001 \\
      --enable-tools github:merge_pr --disable-tools filesystem:delete_file --wait-synced

  # See what is running and which servers exist
  orchestrator-cli task list --phase Running
  orchestrator-cli catalog list

  # Follow the agent's log, then read what it reported; stop a task
  orchestrator-cli task logs task-1001 -f
  orchestrator-cli task describe task-1001
  orchestrator-cli task cancel task-1001

  # Every call waiting for a person, in every namespace, as they come
  orchestrator-cli task approvals -A --watch

Exit codes: 0 ok, 1 API or network error, 2 bad input (nothing written), 3 not found,
4 timed out, 5 task failed or cancelled, or change refused.";

/// Submit AI-agent tasks as TaskRuns, change the tools they may use while they run, and
/// inspect them.
///
/// Connects like kubectl: --kubeconfig, else $KUBECONFIG, else ~/.kube/config (in a pod: its
/// service account); the namespace comes from -n, else the context.
#[derive(Debug, Parser)]
#[command(name = "orchestrator-cli", version, after_help = ROOT_AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(flatten)]
    pub printing: Printing,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,

    /// The namespace of the TaskRuns (default: the context's namespace, else "default").
    #[arg(short, long, global = true, value_name = "NAME")]
    pub namespace: Option<String>,

    /// Act as this user (impersonation, like kubectl's --as; needs the impersonate permission).
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,

    /// Act as a member of this group (repeatable; with --as).
    #[arg(
        long = "as-group",
        global = true,
        value_name = "GROUP",
        requires = "as_user"
    )]
    pub as_group: Vec<String>,

    /// Output format: table (for people), wide (more columns), json, yaml, name
    /// (kind.group/name of each object), jsonpath=TEMPLATE (kubectl's, e.g.
    /// '{.items[*].metadata.name}').
    #[arg(
        short,
        long,
        global = true,
        value_name = "FORMAT",
        default_value = "table",
        value_parser = Format::parse
    )]
    pub output: Format,

    /// Read the catalog from this file instead of the cluster's ConfigMap.
    #[arg(long, global = true, value_name = "FILE", env = "ORCH_CATALOG_FILE")]
    pub catalog: Option<PathBuf>,

    /// Namespace of the catalog ConfigMap (the operator's --catalog-namespace).
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        env = "ORCH_CATALOG_NAMESPACE",
        default_value = DEFAULT_CONFIG_MAP_NAMESPACE
    )]
    pub catalog_namespace: String,

    /// Name of the catalog ConfigMap, key catalog.yaml (the operator's --catalog-name).
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        env = "ORCH_CATALOG_NAME",
        default_value = DEFAULT_CONFIG_MAP_NAME
    )]
    pub catalog_name: String,

    /// More logging on stderr (-v: progress and retries, -vv: debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit, change and inspect tasks (TaskRuns).
    #[command(subcommand)]
    Task(Box<TaskCommand>),

    /// The MCP servers tasks may use, and their tools.
    #[command(subcommand)]
    Catalog(CatalogCommand),

    Console(ConsoleArgs),

    Version(VersionArgs),

    /// Print a shell completion script (commands and flags; for task names and approval ids
    /// from the cluster too, source `COMPLETE=<shell> orchestrator-cli` instead).
    #[command(after_help = "\
Examples:
  orchestrator-cli completions bash > /etc/bash_completion.d/orchestrator-cli
  orchestrator-cli completions zsh > \"${fpath[1]}/_orchestrator-cli\"
  orchestrator-cli completions fish > ~/.config/fish/completions/orchestrator-cli.fish

Completion that also offers the namespace's task names and a task's approval ids:
  echo 'source <(COMPLETE=bash orchestrator-cli)' >> ~/.bashrc")]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    // Boxed: the largest of the commands' arguments by far.
    Submit(Box<SubmitArgs>),
    AddContext(AddContextArgs),
    Get(GetArgs),
    List(ListArgs),
    Describe(DescribeArgs),
    Audit(AuditArgs),
    Approvals(ApprovalsArgs),
    Approve(DecideArgs),
    Reject(DecideArgs),
    Logs(LogsArgs),
    Cancel(CancelArgs),
    Delete(DeleteArgs),
    Validate(ValidateArgs),
}

/// Create a TaskRun: the agent runs the task with only the listed tools.
///
/// The task text comes from --task-file (or - for stdin) or --prompt and is stored inline in the
/// TaskRun. --tools lists SERVER:TOOL items (a tool name or a glob; SERVER:* for all its
/// tools); every server must be in the catalog. Prints the TaskRun's name.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task submit --service todo-api --task-file task.md \\
      --tools 'github:*,filesystem:read_file'
  echo 'List the open issues' | orchestrator-cli task submit --service todo-api \\
      --task-file - --task-id 1001 --tools 'github:list_*' --wait --timeout 30m
  orchestrator-cli task submit --service todo-api --prompt 'Fix the flaky test' \\
      --tools 'filesystem:*' --deny-tools filesystem:delete_file --dry-run -o yaml")]
pub struct SubmitArgs {
    /// The service the task works on (a DNS-1123 label).
    #[arg(long, value_name = "NAME")]
    pub service: String,

    /// File holding the task (Markdown); - reads stdin.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "prompt",
        conflicts_with = "prompt"
    )]
    pub task_file: Option<PathBuf>,

    /// The task text itself, instead of --task-file.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,

    /// MCP tools the agent may use: SERVER:TOOL items, comma-separated (repeatable).
    #[arg(long, value_name = "SERVER:TOOL,...", required = true)]
    pub tools: Vec<String>,

    /// Tools to hide even where --tools allows them, e.g. filesystem:delete_file.
    #[arg(long, value_name = "SERVER:TOOL,...")]
    pub deny_tools: Vec<String>,

    /// Servers to list without any tool yet, so `task add-context` can enable their tools while
    /// the task runs (a stdio server runs in its own container, made with the task's pod, so one
    /// not listed at submit cannot be added later), comma-separated.
    #[arg(long, value_name = "SERVER,...", value_delimiter = ',')]
    pub with_servers: Vec<String>,

    /// The agent's own built-in tools to deny (e.g. WebFetch), comma-separated.
    #[arg(long, value_name = "TOOL,...", value_delimiter = ',')]
    pub deny_internal_tools: Vec<String>,

    /// The task's id in the tracker (default: one more than the highest in the namespace).
    #[arg(long, value_name = "ID")]
    pub task_id: Option<i64>,

    /// The TaskRun's name (default: task-<ID>).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// The agent's container image (default: the operator's).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,

    /// Stop the task after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub active_deadline_seconds: Option<i64>,

    /// The model credential (spec.model): the Secret key with the API key, in the task's
    /// namespace, which only the task's proxy reads. Default: the operator's (the chart's
    /// model.secretName).
    #[arg(long, value_name = "SECRET/KEY", value_parser = orchestrator_crds::taskrun::KeyRef::parse_slash)]
    pub model_secret: Option<orchestrator_crds::taskrun::KeyRef>,

    /// The most output tokens the task's model may produce (spec.budget.outputTokens).
    #[arg(long, value_name = "TOKENS")]
    pub max_output_tokens: Option<u64>,

    /// A node label the task's pod must run on (spec.podTemplate.nodeSelector), repeatable.
    #[arg(long, value_name = "KEY=VALUE", value_parser = crate::placement::parse_node_selector)]
    pub node_selector: Vec<(String, String)>,

    /// A taint the task's pod tolerates (spec.podTemplate.tolerations): KEY (any value),
    /// KEY=VALUE, either with :EFFECT (NoSchedule, PreferNoSchedule, NoExecute), repeatable.
    #[arg(long, value_name = "KEY[=VALUE][:EFFECT]", value_parser = crate::placement::parse_toleration)]
    pub toleration: Vec<k8s_openapi::api::core::v1::Toleration>,

    /// Follow the task until it succeeds or fails (exit 5 if it fails).
    #[arg(long)]
    pub wait: bool,

    /// Give up waiting after this long (e.g. 90s, 30m, 1.5h, 1h30m; exit 4). Default: wait
    /// forever.
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = crate::duration::parse)]
    pub timeout: Option<std::time::Duration>,

    /// Where the task's MCP proxy runs: sidecar (in the task's pod) or shared (the shared
    /// proxy Deployment the chart installs with sharedProxy.enabled). Default: the namespace's
    /// label orchestrator.io/proxy-mode, else the operator's --default-proxy-mode.
    #[arg(long, value_name = "MODE", value_parser = parse_proxy_mode)]
    pub proxy_mode: Option<orchestrator_crds::shared::ProxyMode>,

    /// Print the TaskRun instead of creating it (with -o json|yaml: the whole object).
    #[arg(long)]
    pub dry_run: bool,
}

fn parse_proxy_mode(s: &str) -> Result<orchestrator_crds::shared::ProxyMode, String> {
    orchestrator_crds::shared::ProxyMode::parse(s)
        .ok_or_else(|| format!("{s:?} is not a proxy mode: use sidecar or shared"))
}

/// Change the tools (and the model budget) of a task while it runs.
///
/// Enabled tools become visible to the agent, disabled ones disappear; everything else stays as
/// it is. The change is written as a JSON Patch that first tests the server list is still what
/// was read, and is recomputed and retried when another writer got there first, so concurrent
/// add-context calls never undo each other. Prints the tools before → after.
///
/// Rules: SERVER:* enables a whole server (clearing its deny patterns) or switches it off;
/// enabling a tool on a server the task does not use adds the server; enabling a tool that a
/// deny glob hides is refused (deny wins) with the command that lifts the glob; enables apply
/// before disables, so 'git:*' with --disable-tools git:git_push means all but git_push.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task add-context --task-id 1001 \\
      --enable-tools 'github:merge_pr,github:close_issue' --disable-tools filesystem:delete_file
  orchestrator-cli task add-context task-1001 --enable-tools 'memory:*' --wait-synced
  orchestrator-cli task add-context task-1001 --disable-tools 'github:*' --dry-run
  orchestrator-cli task add-context task-1001 --budget outputTokens=200000 --budget costUsd=5")]
pub struct AddContextArgs {
    #[command(flatten)]
    pub task: TaskRef,

    /// Tools to make visible: SERVER:TOOL items, comma-separated (repeatable).
    #[arg(
        long,
        value_name = "SERVER:TOOL,...",
        required_unless_present_any = ["disable_tools", "budget", "conditions"]
    )]
    pub enable_tools: Vec<String>,

    /// Tools to hide: SERVER:TOOL items, comma-separated (repeatable).
    #[arg(long, value_name = "SERVER:TOOL,...")]
    pub disable_tools: Vec<String>,

    /// Change the task's model budget (spec.budget) while it runs: inputTokens, outputTokens,
    /// requests, wallTimeSeconds (whole numbers), costUsd (USD, 2.50), or FIELD=none for no
    /// limit (repeatable).
    /// A task the gateway stopped (BudgetExceeded) goes on once its budget allows.
    #[arg(long, value_name = "FIELD=VALUE", value_parser = crate::budget::parse)]
    pub budget: Vec<(String, serde_json::Value)>,

    /// Replace the task's CEL conditions on calls (spec.toolConfig.policy.conditions) with the
    /// YAML or JSON list in FILE (`-`: stdin; `[]` removes them). Each is checked as the operator
    /// checks it; nothing is written when one is wrong. The next call is held to the new list.
    #[arg(long, value_name = "FILE")]
    pub conditions: Option<std::path::PathBuf>,

    /// Wait until the change is live: rendered by the operator (status.contextVersion) and, for
    /// a running task whose proxy reports, served by that proxy (status.servedContextVersion).
    #[arg(long)]
    pub wait_synced: bool,

    /// Give up waiting after this long (exit 4).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = crate::duration::parse)]
    pub timeout: std::time::Duration,

    /// Show the change without writing it.
    #[arg(long, conflicts_with = "wait_synced")]
    pub dry_run: bool,
}

/// Show one task (or, with --task-id, every TaskRun of that task).
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task get task-1001
  orchestrator-cli task get --task-id 1001 -o yaml")]
pub struct GetArgs {
    #[command(flatten)]
    pub task: TaskRef,
}

/// List tasks, newest first; with --watch, then each change as it happens.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task list
  orchestrator-cli task list --phase Running --service todo-api
  orchestrator-cli task list -l team=payments --watch
  orchestrator-cli task list -A -o json")]
pub struct ListArgs {
    /// Only tasks in this phase.
    #[arg(long, value_name = "PHASE", value_parser = ["Pending", "Running", "Succeeded", "Failed", "Cancelled"], ignore_case = true)]
    pub phase: Option<String>,

    /// Only tasks of this service.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,

    /// List tasks in every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Only TaskRuns whose labels match (a label selector, as kubectl's -l: a=b,c!=d,e in (f,g)).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// After the list, print each TaskRun again whenever its row changes (and `Deleted` when it
    /// goes), until interrupted; with -o json|yaml, each changed object.
    #[arg(short, long)]
    pub watch: bool,
}

/// Show a task in detail: spec, status, conditions, effective tools, recent events.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task describe task-1001
  orchestrator-cli task describe --task-id 1001 -n team-a")]
pub struct DescribeArgs {
    #[command(flatten)]
    pub task: TaskRef,
}

/// Show the tool calls of a running task: the recent audit records its MCP proxy keeps.
///
/// Reads the proxy's GET /audit in the task's running pod through the API server
/// (pods/portforward), so it needs no network path to the pod; newest last. Filters combine:
/// every one given must hold. Needs RBAC: get and list pods, get and create pods/portforward.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task audit task-1001
  orchestrator-cli task audit --task-id 1001 --decision denied --since 10m
  orchestrator-cli task audit task-1001 --server github --tool create_issue -o json")]
pub struct AuditArgs {
    #[command(flatten)]
    pub task: TaskRef,

    /// Only calls with this decision: allowed, denied, or another the proxy records.
    #[arg(long, value_name = "DECISION")]
    pub decision: Option<String>,

    /// Only calls of tools of this risk class: read, write or destructive.
    #[arg(long, value_name = "RISK")]
    pub risk: Option<String>,

    /// Only calls to this MCP server.
    #[arg(long, value_name = "SERVER")]
    pub server: Option<String>,

    /// Only calls of this tool: the name the agent called or the server's name for it.
    #[arg(long, value_name = "TOOL")]
    pub tool: Option<String>,

    /// Only calls since then: a duration back from now (90s, 10m, 1.5h, 1h30m) or an RFC 3339
    /// time.
    #[arg(long, value_name = "DURATION|TIME", value_parser = crate::duration::parse_since)]
    pub since: Option<String>,

    /// At most this many calls, the newest (the proxy's default: 1000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
}

/// List the tool calls a task's proxy holds for a person's decision, and recent decisions.
///
/// From the TaskRun's status.approvals (pending ones, and the last 20 decided). `--show ID`
/// prints one call whole: every byte the proxy will forward (the values of the task's Secrets
/// masked) and its digest. Decide with `task approve` or `task reject`. With -A: the calls
/// waiting in every TaskRun of every namespace you may list (else of the current namespace).
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  orchestrator-cli task approvals task-1001
  orchestrator-cli task approvals task-1001 --show a1b2c3d4
  orchestrator-cli task approvals task-1001 --pending -o json
  orchestrator-cli task approvals -A --watch -l team=payments")]
pub struct ApprovalsArgs {
    /// The TaskRun's name.
    #[arg(
        value_name = "NAME",
        required_unless_present_any = ["task_id", "all_namespaces"],
        conflicts_with_all = ["task_id", "all_namespaces"],
        add = ArgValueCompleter::new(crate::complete::task_names)
    )]
    pub name: Option<String>,

    /// Find the TaskRun by its spec.taskId instead of by name.
    #[arg(long, value_name = "ID", conflicts_with = "all_namespaces")]
    pub task_id: Option<i64>,

    /// Only the calls still waiting.
    #[arg(long)]
    pub pending: bool,

    /// Show request ID whole: its params as forwarded, digest, definition, context version.
    #[arg(
        long,
        value_name = "ID",
        conflicts_with = "all_namespaces",
        add = ArgValueCompleter::new(crate::complete::approval_ids)
    )]
    pub show: Option<String>,

    /// The calls waiting in every TaskRun of every namespace (on 403: the current namespace).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// With -A: only TaskRuns whose labels match this selector.
    #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with_all = ["name", "task_id"])]
    pub selector: Option<String>,

    /// With -A: after the list, print each call as it starts waiting, and its decision.
    #[arg(short, long, conflicts_with_all = ["name", "task_id"])]
    pub watch: bool,
}

impl ApprovalsArgs {
    /// The one task named (without -A).
    pub fn task(&self) -> TaskRef {
        TaskRef {
            name: self.name.clone(),
            task_id: self.task_id,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// List the MCP servers of the catalog.
    #[command(after_help = "\
Examples:
  orchestrator-cli catalog list
  orchestrator-cli catalog list --catalog config/catalog.yaml -o yaml")]
    List,

    /// Show one server: how it starts, the secrets it needs, its tools.
    #[command(after_help = "\
Examples:
  orchestrator-cli catalog show filesystem
  orchestrator-cli catalog show github -o json")]
    Show {
        /// The server's name.
        #[arg(value_name = "SERVER")]
        server: String,
    },

    /// Print a markdown reference of every server and its tools (docs/catalog.md is this).
    #[command(after_help = "\
Examples:
  orchestrator-cli catalog docs --catalog config/catalog.yaml > docs/catalog.md
  orchestrator-cli catalog docs --catalog config/catalog.yaml --check docs/catalog.md")]
    Docs {
        /// Print nothing; fail (exit 1, naming the first differing line) when FILE is not what
        /// would be printed.
        #[arg(long, value_name = "FILE")]
        check: Option<std::path::PathBuf>,
    },

    /// Start a server the way the proxy would (here, with its catalog command, or at its URL),
    /// list its real tools (annotations, risk class, definition hash) and compare them with the
    /// catalog: tools it no longer has, tools the catalog does not list, pins that differ.
    #[command(after_help = "\
The server runs on this machine with this process's environment (a Secret it needs comes from
the variable of the same name) and the catalog's env; `/workspace` in its arguments is mapped to
--workspace (default: a fresh temporary directory).

Examples:
  orchestrator-cli catalog discover filesystem
  orchestrator-cli catalog discover github --check -o json
  orchestrator-cli --catalog config/catalog.yaml catalog discover memory --write config/catalog.yaml")]
    Discover {
        /// The server's name.
        #[arg(value_name = "SERVER")]
        server: String,
        /// The directory standing in for the pod's /workspace.
        #[arg(long, value_name = "DIR")]
        workspace: Option<std::path::PathBuf>,
        /// Fail (exit 5) when the catalog entry does not match the server.
        #[arg(long)]
        check: bool,
        /// Rewrite the server's `tools:` in this catalog file to what the server offers (tools
        /// kept keep their category, risk and pin; gone ones are dropped); other lines stay.
        #[arg(long, value_name = "FILE")]
        write: Option<std::path::PathBuf>,
    },

    /// Print each tool's definition hash as the server offers it now, as catalog `pin` entries
    /// (started like `catalog discover`).
    #[command(after_help = "\
A TaskRun's proxy quarantines (policy.onChange: block) or reports (alert) a tool whose
definition differs from its pin.

Examples:
  orchestrator-cli catalog pin filesystem
  orchestrator-cli catalog pin everything -o json
  orchestrator-cli --catalog config/catalog.yaml catalog pin time --write config/catalog.yaml")]
    Pin {
        /// The server's name.
        #[arg(value_name = "SERVER")]
        server: String,
        /// The directory standing in for the pod's /workspace.
        #[arg(long, value_name = "DIR")]
        workspace: Option<std::path::PathBuf>,
        /// Rewrite the server's `tools:` in this catalog file with every tool pinned to its
        /// definition now (as `catalog discover --write`, plus the pins); other lines stay.
        #[arg(long, value_name = "FILE")]
        write: Option<std::path::PathBuf>,
    },
}
