//! Dynamic shell completion: TaskRun names (the TASK and NAME arguments) and approval ids
//! (`task approve|reject TASK ID`, `task approvals TASK --show ID`) come from the cluster, read
//! with the kubeconfig, context and namespace typed so far on the line (`--kubeconfig`,
//! `--context`, `-n`, `--as`), within a few seconds; anything that fails completes nothing.
//! Wired by `clap_complete`'s `CompleteEnv` (`COMPLETE=bash orchestrator-cli`; see
//! [`crate::invocation`]).

use std::ffi::OsStr;
use std::time::Duration;

use clap_complete::CompletionCandidate;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use orchestrator_crds::approval::ApprovalState;
use orchestrator_crds::taskrun::{Phase, TaskRun};

/// How long a completion may take before it gives up (a shell waits for it).
const LIMIT: Duration = Duration::from_secs(5);

/// Flags that take a value, so the word after them is not a positional argument.
const VALUED: &[&str] = &[
    "--kubeconfig",
    "--context",
    "-n",
    "--namespace",
    "--as",
    "--as-group",
    "-o",
    "--output",
    "--catalog",
    "--catalog-namespace",
    "--catalog-name",
    "--reason",
    "--digest",
    "--show",
    "--task-id",
    "-l",
    "--selector",
];

/// The words of the line being completed: what the shell passes after `--` (the program's
/// name first).
fn words() -> Vec<String> {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match args.iter().position(|a| a == "--") {
        Some(i) => args[i + 1..].to_vec(),
        None => args,
    }
}

/// The value of flag `long` (or `short`) typed on the line: `--flag V`, `--flag=V`, `-nV`.
fn flag(words: &[String], long: &str, short: Option<&str>) -> Option<String> {
    let mut found = None;
    let mut iter = words.iter();
    while let Some(w) = iter.next() {
        if w == long || Some(w.as_str()) == short {
            found = iter.next().cloned();
        } else if let Some(v) = w.strip_prefix(&format!("{long}=")) {
            found = Some(v.to_string());
        } else if let Some(v) = short
            .and_then(|s| w.strip_prefix(s))
            .filter(|v| !v.is_empty())
        {
            found = Some(v.trim_start_matches('=').to_string());
        }
    }
    found
}

/// The connection settings typed so far (this module does not use `crate::args`, which names
/// its functions: the command line and its completers would import each other).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Target {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
    pub as_user: Option<String>,
}

/// The connection settings typed so far.
pub fn target_from(words: &[String]) -> Target {
    Target {
        kubeconfig: flag(words, "--kubeconfig", None).map(Into::into),
        context: flag(words, "--context", None),
        namespace: flag(words, "--namespace", Some("-n")),
        as_user: flag(words, "--as", None),
    }
}

/// A client and namespace as `crate::connect` makes them (kubeconfig, context, `--as`),
/// without its messages: a completion that cannot connect offers nothing.
async fn connect(target: &Target) -> Option<(Client, String)> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let mut config = match &target.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).ok()?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .ok()?
        }
        None => Config::from_kubeconfig(&options).await.ok()?,
    };
    if let Some(user) = &target.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Some((Client::try_from(config).ok()?, namespace))
}

/// The first positional word after `command` (e.g. the TASK of `approve TASK ID`), skipping
/// flags and their values; not the word being completed (the last).
pub fn positional_after(words: &[String], command: &[&str]) -> Option<String> {
    let start = words.iter().position(|w| command.contains(&w.as_str()))? + 1;
    let done = &words[start..words.len().saturating_sub(1)];
    let mut iter = done.iter();
    while let Some(w) = iter.next() {
        if VALUED.contains(&w.as_str()) {
            iter.next();
        } else if !w.starts_with('-') {
            return Some(w.clone());
        }
    }
    None
}

/// Runs `f` on a small runtime of its own, within [`LIMIT`]; `None` on any failure.
fn block_on<T>(f: impl std::future::Future<Output = Option<T>>) -> Option<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    runtime
        .block_on(async { tokio::time::timeout(LIMIT, f).await.ok() })
        .flatten()
}

async fn taskruns(target: &Target) -> Option<Vec<TaskRun>> {
    let (client, namespace) = connect(target).await?;
    let api: Api<TaskRun> = Api::namespaced(client, &namespace);
    api.list(&ListParams::default()).await.ok().map(|l| l.items)
}

/// TaskRun names of the namespace that start with what is typed, with their phase as help.
pub fn task_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let prefix = current.to_string_lossy();
    let target = target_from(&words());
    let items = block_on(taskruns(&target)).unwrap_or_default();
    items
        .iter()
        .filter(|t| t.name_any().starts_with(prefix.as_ref()))
        .map(|t| {
            CompletionCandidate::new(t.name_any()).help(Some(
                format!(
                    "task {} ({})",
                    t.spec.task_id,
                    Phase::label(t.status.as_ref().and_then(|s| s.phase))
                )
                .into(),
            ))
        })
        .collect()
}

/// The ids of the approvals of the TaskRun named on the line: for `approve`/`reject`, the
/// pending ones; for `approvals --show`, all.
pub fn approval_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let prefix = current.to_string_lossy();
    let words = words();
    let deciding = words.iter().any(|w| w == "approve" || w == "reject");
    let Some(task) = positional_after(&words, &["approve", "reject", "approvals"]) else {
        return Vec::new();
    };
    let target = target_from(&words);
    let tr = block_on(async {
        let (client, namespace) = connect(&target).await?;
        let api: Api<TaskRun> = Api::namespaced(client, &namespace);
        api.get(&task).await.ok()
    });
    let approvals = tr
        .and_then(|t| t.status)
        .map(|s| s.approvals)
        .unwrap_or_default();
    approvals
        .iter()
        .filter(|a| !deciding || a.state == ApprovalState::Pending)
        .filter(|a| a.id.starts_with(prefix.as_ref()))
        .map(|a| {
            CompletionCandidate::new(a.id.clone()).help(Some(
                format!("{}/{} ({})", a.server, a.tool, a.state.as_str()).into(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_connection_comes_from_the_flags_typed_so_far() {
        let g = target_from(&w(
            "orchestrator-cli --kubeconfig /k -n team-a --context=c task get ",
        ));
        assert_eq!(g.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(g.namespace.as_deref(), Some("team-a"));
        assert_eq!(g.context.as_deref(), Some("c"));
        assert_eq!(
            target_from(&w("x -nteam-b task")).namespace.as_deref(),
            Some("team-b")
        );
        assert_eq!(target_from(&w("x task get")).namespace, None);
    }

    #[test]
    fn the_task_is_the_first_positional_after_the_command() {
        let line = w("orchestrator-cli task approve -n a --reason x task-7 3f");
        assert_eq!(
            positional_after(&line, &["approve"]).as_deref(),
            Some("task-7")
        );
        let line = w("orchestrator-cli task approvals task-7 --show ");
        assert_eq!(
            positional_after(&line, &["approvals"]).as_deref(),
            Some("task-7")
        );
        let line = w("orchestrator-cli task approve task-");
        assert_eq!(
            positional_after(&line, &["approve"]),
            None,
            "still being typed"
        );
    }
}
