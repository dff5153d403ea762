//! `task approvals -A [--watch] [-l SELECTOR]`: the approvals inbox. The calls waiting for a
//! person in every TaskRun the caller may list in all namespaces (when listing TaskRuns
//! cluster-wide is forbidden, it says so and shows the current namespace), from their
//! `status.approvals`; with `--watch`, each call as it starts waiting and, later, what became of
//! it (approved or rejected and by whom, expired, withdrawn).
//!
//! Every string from a status is printed through [`visible`]: a tool name or a decision reason
//! cannot act on the approver's terminal.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::{Approval, ApprovalState};
use orchestrator_crds::taskrun::TaskRun;
use serde_json::json;

use super::approve::approvals_of;
use crate::args::{ApprovalsArgs, Global};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result};
use crate::output::{self, Format, Table, age, row_line, visible};

/// The table's columns; `--watch` adds STATE.
const COLUMNS: [&str; 6] = ["NAMESPACE", "TASK", "ID", "TOOL", "AGE", "EXPIRES"];

/// The TaskRuns to read: all namespaces, or (on 403) the current one, and in words.
async fn scope(cluster: &Cluster, params: &ListParams) -> Result<(Api<TaskRun>, String)> {
    Ok(match all_or_current(cluster, params).await? {
        None => (Api::all(cluster.client.clone()), "all namespaces".into()),
        Some(ns) => (super::api(cluster), format!("namespace {ns}")),
    })
}

/// `None` when the caller may list TaskRuns in all namespaces; else (the API server answered
/// 403, said on stderr) the current namespace. Also the console's `-A`.
pub async fn all_or_current(cluster: &Cluster, params: &ListParams) -> Result<Option<String>> {
    let all: Api<TaskRun> = Api::all(cluster.client.clone());
    match all.list(&params.clone().limit(1)).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            output::note(&format!(
                "you may not list TaskRuns in all namespaces (the API server answered 403: {}); showing namespace {} only",
                s.message, cluster.namespace
            ));
            Ok(Some(cluster.namespace.clone()))
        }
        Err(e) => Err(Error::kube("listing TaskRuns in all namespaces", e)),
    }
}

/// One call of one TaskRun.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub namespace: String,
    pub task: String,
    pub approval: Approval,
}

/// The pending calls of `items`, oldest request first.
pub fn pending(items: &[TaskRun]) -> Vec<Entry> {
    let mut out: Vec<Entry> = items
        .iter()
        .flat_map(|tr| {
            approvals_of(tr)
                .into_iter()
                .filter(|a| a.state == ApprovalState::Pending)
                .map(|approval| Entry {
                    namespace: tr.namespace().unwrap_or_default(),
                    task: tr.name_any(),
                    approval,
                })
        })
        .collect();
    out.sort_by(|a, b| a.approval.requested_at.cmp(&b.approval.requested_at));
    out
}

/// One entry's cells (with `state`: the STATE cell of `--watch`).
pub fn cells(e: &Entry, now: Timestamp, state: Option<String>) -> Vec<String> {
    let a = &e.approval;
    let requested = a
        .requested_at
        .parse::<Timestamp>()
        .map(|t| age(t, now))
        .unwrap_or_else(|_| visible(&a.requested_at));
    let expires = match a.state {
        ApprovalState::Pending => a
            .expires_at
            .parse::<Timestamp>()
            .map(|t| {
                if t > now {
                    format!("in {}", age(now, t))
                } else {
                    "now".into()
                }
            })
            .unwrap_or_else(|_| visible(&a.expires_at)),
        _ => "-".into(),
    };
    let mut row = vec![
        e.namespace.clone(),
        e.task.clone(),
        visible(&a.id),
        visible(&format!("{}/{}", a.server, a.tool)),
        requested,
        expires,
    ];
    row.extend(state);
    row
}

/// The STATE cell: `Pending`, or what became of the call and who decided.
pub fn state_cell(a: &Approval) -> String {
    match (&a.decided_by, &a.reason) {
        (Some(by), Some(r)) => format!("{} by {}: {}", a.state.as_str(), visible(by), visible(r)),
        (Some(by), None) => format!("{} by {}", a.state.as_str(), visible(by)),
        _ => a.state.as_str().into(),
    }
}

/// The command that shows a call whole, the first step of deciding it.
pub fn decide_hint(e: &Entry) -> String {
    format!(
        "orchestrator-cli -n {} task approvals {} --show {}",
        e.namespace,
        e.task,
        visible(&e.approval.id)
    )
}

/// `task approvals -A`.
pub async fn run(global: &Global, args: &ApprovalsArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let mut params = ListParams::default();
    if let Some(s) = &args.selector {
        params = params.labels(s);
    }
    let (api, where_) = scope(&cluster, &params).await?;
    if args.watch {
        return watch(api, &where_, args, global.output.clone()).await;
    }
    let items = api
        .list(&params)
        .await
        .map_err(|e| Error::kube(format!("listing TaskRuns in {where_}"), e))?
        .items;
    let entries = pending(&items);
    match &global.output {
        Format::Table | Format::Wide if entries.is_empty() => {
            eprintln!("No calls wait for approval in {where_}.");
            Ok(())
        }
        Format::Table | Format::Wide => {
            let now = Timestamp::now();
            let mut t = Table::new(&COLUMNS);
            for e in &entries {
                t.row(cells(e, now, None));
            }
            output::print(&t.render_with(output::headers()))?;
            eprintln!(
                "Decide: look at a call whole ({}), then `task approve` or `task reject` it.",
                decide_hint(&entries[0])
            );
            Ok(())
        }
        f => output::print(&output::render(
            f,
            &entries.iter().map(entry_json).collect::<Vec<_>>(),
        )?),
    }
}

fn entry_json(e: &Entry) -> serde_json::Value {
    json!({"namespace": e.namespace, "taskRun": e.task, "approval": e.approval})
}

/// What `--watch` has printed: the last state shown per (namespace, task, id).
#[derive(Default)]
pub struct Inbox {
    shown: BTreeMap<(String, String, String), ApprovalState>,
}

impl Inbox {
    /// The entries of a TaskRun's new version to print: calls now pending that were not shown
    /// pending, and calls shown pending that are decided (or gone) now.
    pub fn update(&mut self, tr: &TaskRun, deleted: bool) -> Vec<Entry> {
        let namespace = tr.namespace().unwrap_or_default();
        let task = tr.name_any();
        let approvals = if deleted {
            Vec::new()
        } else {
            approvals_of(tr)
        };
        let mut out = Vec::new();
        for a in &approvals {
            let key = (namespace.clone(), task.clone(), a.id.clone());
            let before = self.shown.get(&key).copied();
            let new = match (before, a.state) {
                (None, ApprovalState::Pending) => true,
                (Some(ApprovalState::Pending), s) => s != ApprovalState::Pending,
                _ => false,
            };
            if new {
                self.shown.insert(key, a.state);
                out.push(Entry {
                    namespace: namespace.clone(),
                    task: task.clone(),
                    approval: a.clone(),
                });
            }
        }
        // Pending calls that vanished (the TaskRun deleted): withdrawn.
        let gone: Vec<_> = self
            .shown
            .iter()
            .filter(|((ns, t, id), s)| {
                ns == &namespace
                    && t == &task
                    && **s == ApprovalState::Pending
                    && !approvals.iter().any(|a| &a.id == id)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.shown.insert(key.clone(), ApprovalState::Withdrawn);
            out.push(Entry {
                namespace: key.0,
                task: key.1,
                approval: Approval {
                    id: key.2,
                    state: ApprovalState::Withdrawn,
                    ..gone_placeholder()
                },
            });
        }
        out
    }
}

/// An approval that is no longer listed (its TaskRun gone): only its id is known.
fn gone_placeholder() -> Approval {
    serde_json::from_value(
        json!({"id": "", "server": "?", "tool": "?", "state": "Withdrawn",
        "requestedAt": "-", "expiresAt": "-", "contextVersion": 0}),
    )
    .unwrap_or_else(|e| unreachable!("a valid approval: {e}"))
}

async fn watch(
    api: Api<TaskRun>,
    where_: &str,
    args: &ApprovalsArgs,
    format: Format,
) -> Result<()> {
    let mut config = watcher::Config::default();
    if let Some(s) = &args.selector {
        config = config.labels(s);
    }
    let mut columns = COLUMNS.to_vec();
    columns.push("STATE");
    let mut widths: Option<Vec<usize>> = None;
    let mut inbox = Inbox::default();
    let mut listed = Vec::new();
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let entries = match event {
            Ok(watcher::Event::Init) => {
                listed.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(tr)) => {
                listed.push(tr);
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                let entries: Vec<Entry> = std::mem::take(&mut listed)
                    .iter()
                    .flat_map(|tr| inbox.update(tr, false))
                    .collect();
                if widths.is_none() && format.is_table() {
                    // The first list sets the columns, as `kubectl get -w` does.
                    let mut t = Table::new(&columns);
                    for e in &entries {
                        t.row(cells(e, now, Some(state_cell(&e.approval))));
                    }
                    widths = Some(t.widths_with(output::headers()));
                    output::print(&t.render_with(output::headers()))?;
                    eprintln!(
                        "Watching the calls that wait for approval in {where_} (Ctrl-C ends)."
                    );
                    continue;
                }
                widths.get_or_insert_with(Vec::new);
                entries
            }
            Ok(watcher::Event::Apply(tr)) => inbox.update(&tr, false),
            Ok(watcher::Event::Delete(tr)) => inbox.update(&tr, true),
            Err(e) => {
                tracing::warn!("watching TaskRuns in {where_}: {e}; retrying");
                continue;
            }
        };
        let mut text = String::new();
        for e in entries {
            text.push_str(&match &format {
                Format::JsonPath(_) => output::render(&format, &entry_json(&e))?,
                Format::Table | Format::Wide => row_line(
                    widths.as_deref().unwrap_or_default(),
                    &cells(&e, now, Some(state_cell(&e.approval))),
                ),
                _ => {
                    serde_json::to_string(&entry_json(&e))
                        .map_err(|e| Error::Output(e.to_string()))?
                        + "\n"
                }
            });
        }
        if !text.is_empty() {
            output::print(&text)?;
        }
    }
    Err(Error::Cluster(format!(
        "the watch on TaskRuns in {where_} ended"
    )))
}
