//! `orchestrator-cli`: submit tasks as TaskRuns, change their tools while they run
//! (add-context), inspect them, and browse the catalog of MCP servers.
//!
//! Modules: [`args`] and [`args_ops`] (the command line), [`budget`] and [`conditions`]
//! (add-context's `--budget` and `--conditions`), [`connect`] (kubeconfig handling like kubectl),
//! [`toolspec`] (`server:tool` parsing), [`merge`] (enable/disable → allow/deny lists, pure),
//! [`effective`] (the tools an agent sees, and before → after), [`catalog`], [`catalog_docs`]
//! (the markdown reference), [`discover`] (a server's real tools against the catalog), [`task`]
//! (one module per command), [`wait`], [`duration`] (the one grammar of `--timeout` and
//! `--since`), [`output`] (table/wide/json/yaml/name/jsonpath),
//! [`jsonpath`] (kubectl's `-o jsonpath=` templates), [`api_table`] (TaskRuns as the API
//! server's table of the CRD's printer columns), [`error`] (exit codes),
//! [`identity`] (who the API server says we are), [`portforward`] (one HTTP request to a port
//! inside a pod, through the API server), [`console`] (the web console: a page served on
//! 127.0.0.1 that does what the task commands do), [`version`] (the CLI's, the operator's and
//! the CRDs' versions), [`invocation`] (as `orchestrator-cli` or the kubectl plugin
//! `kubectl-orchestrator`; shell completion) and [`complete`] (task names and approval ids for
//! it, from the cluster).

pub mod api_table;
pub mod args;
pub mod args_ops;
#[cfg(test)]
mod args_tests;
pub mod budget;
pub mod catalog;
pub mod catalog_docs;
pub mod catalog_write;
pub mod complete;
pub mod conditions;
pub mod connect;
pub mod console;
pub mod discover;
pub mod duration;
pub mod effective;
pub mod error;
pub mod identity;
pub mod invocation;
pub mod jsonpath;
pub mod merge;
pub mod output;
pub mod placement;
pub mod portforward;
pub mod task;
pub mod toolspec;
pub mod version;
pub mod wait;

use clap::CommandFactory;

use orchestrator_crds::approval::Decision;

use crate::args::{CatalogCommand, Cli, Command, TaskCommand};
pub use crate::error::{Error, Result};

/// Runs one command line.
pub async fn run(cli: Cli) -> Result<()> {
    let global = &cli.global;
    output::set_headers(!cli.printing.no_headers);
    match &cli.command {
        Command::Task(task) => run_task(global, task).await,
        Command::Catalog(CatalogCommand::List) => catalog::list(global).await,
        Command::Catalog(CatalogCommand::Show { server }) => catalog::show(global, server).await,
        Command::Catalog(CatalogCommand::Docs { check }) => {
            catalog_docs::run(global, check.as_deref()).await
        }
        Command::Catalog(CatalogCommand::Discover {
            server,
            workspace,
            check,
            write,
        }) => {
            let write = write.as_deref();
            discover::discover(global, server, workspace.as_deref(), *check, write).await
        }
        Command::Catalog(CatalogCommand::Pin {
            server,
            workspace,
            write,
        }) => discover::pin(global, server, workspace.as_deref(), write.as_deref()).await,
        Command::Console(a) => console::run(global, a).await,
        Command::Version(a) => version::run(global, a).await,
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "orchestrator-cli", &mut out);
            output::print(&String::from_utf8_lossy(&out))
        }
    }
}

async fn run_task(global: &args::Global, command: &TaskCommand) -> Result<()> {
    match command {
        TaskCommand::Submit(a) => task::submit::run(global, a).await,
        TaskCommand::AddContext(a) => task::add_context::run(global, a).await,
        TaskCommand::Get(a) => task::show::get(global, a).await,
        TaskCommand::List(a) if a.watch => task::list_watch::run(global, a).await,
        TaskCommand::List(a) => task::show::list(global, a).await,
        TaskCommand::Describe(a) => task::show::describe(global, a).await,
        TaskCommand::Audit(a) => task::audit::run(global, a).await,
        TaskCommand::Approvals(a) if a.all_namespaces => task::inbox::run(global, a).await,
        TaskCommand::Approvals(a) => task::approve::list(global, a).await,
        TaskCommand::Approve(a) => task::approve::decide(global, a, Decision::Approve).await,
        TaskCommand::Reject(a) => task::approve::decide(global, a, Decision::Reject).await,
        TaskCommand::Logs(a) => task::logs::run(global, a).await,
        TaskCommand::Cancel(a) => task::lifecycle::cancel(global, a).await,
        TaskCommand::Delete(a) => task::lifecycle::delete(global, a).await,
        TaskCommand::Validate(a) => task::validate::run(global, a).await,
    }
}
