//! `task list --watch`: the list, then each TaskRun again whenever its row changes, as
//! `kubectl get -w` prints them (later rows under the first table's columns). A row that only
//! aged is not printed again; a TaskRun that goes is printed once more with phase `Deleted`.
//! With `-o json|yaml`, each new version of an object is printed whole.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;

use super::show::{filter, headers_of, row};
use crate::args::{Global, ListArgs};
use crate::connect::connect;
use crate::error::{Error, Result};
use crate::output::{self, Format, Table, row_line};

/// The column of the phase in a row without NAMESPACE.
const PHASE_COLUMN: usize = 3;

/// What is printed, and what was, per TaskRun.
pub struct Printer {
    format: Format,
    namespaces: bool,
    phase: Option<String>,
    service: Option<String>,
    widths: Option<Vec<usize>>,
    /// The first table's header line (`--no-headers`: none).
    headers: bool,
    /// Per `namespace/name`: the row last printed (without its age) or the resourceVersion.
    shown: HashMap<String, String>,
}

impl Printer {
    pub fn new(format: Format, args: &ListArgs) -> Self {
        Self {
            format,
            namespaces: args.all_namespaces,
            phase: args.phase.clone(),
            service: args.service.clone(),
            widths: None,
            headers: true,
            shown: HashMap::new(),
        }
    }

    fn key(tr: &TaskRun) -> String {
        format!("{}/{}", tr.namespace().unwrap_or_default(), tr.name_any())
    }

    /// The first list (newest first), as a table, or each object.
    pub fn initial(&mut self, items: Vec<TaskRun>, now: Timestamp) -> Result<String> {
        let mut items = filter(items, self.phase.as_deref(), self.service.as_deref());
        super::show::newest_first(&mut items);
        if self.widths.is_some() {
            // A re-list after the watch restarted: only what changed meanwhile.
            let mut out = String::new();
            for tr in &items {
                out.push_str(&self.changed(tr, now)?);
            }
            return Ok(out);
        }
        if !self.format.is_table() {
            let mut out = String::new();
            for tr in &items {
                out.push_str(&self.changed(tr, now)?);
            }
            self.widths = Some(Vec::new());
            return Ok(out);
        }
        let mut t = Table::new(&headers_of(self.namespaces));
        for tr in &items {
            let cells = row(tr, self.namespaces, now);
            self.shown.insert(Self::key(tr), Self::without_age(&cells));
            t.row(cells);
        }
        self.widths = Some(t.widths());
        Ok(t.render_with(self.headers))
    }

    fn without_age(cells: &[String]) -> String {
        cells[..cells.len().saturating_sub(1)].join("\u{0}")
    }

    /// The object's new version: its row when the row changed (or the object, -o json|yaml).
    pub fn changed(&mut self, tr: &TaskRun, now: Timestamp) -> Result<String> {
        if filter(
            vec![tr.clone()],
            self.phase.as_deref(),
            self.service.as_deref(),
        )
        .is_empty()
        {
            return Ok(String::new());
        }
        let key = Self::key(tr);
        if !self.format.is_table() {
            let version = tr.resource_version().unwrap_or_default();
            if self.shown.get(&key) == Some(&version) {
                return Ok(String::new());
            }
            self.shown.insert(key, version);
            return self.object(tr);
        }
        let cells = row(tr, self.namespaces, now);
        let seen = Self::without_age(&cells);
        if self.shown.get(&key) == Some(&seen) {
            return Ok(String::new());
        }
        self.shown.insert(key, seen);
        Ok(row_line(self.widths.as_deref().unwrap_or_default(), &cells))
    }

    /// The object went: its row once more with phase `Deleted` (if it was shown).
    pub fn deleted(&mut self, tr: &TaskRun, now: Timestamp) -> Result<String> {
        if self.shown.remove(&Self::key(tr)).is_none() {
            return Ok(String::new());
        }
        if !self.format.is_table() {
            return self.object(tr);
        }
        let mut cells = row(tr, self.namespaces, now);
        let column = PHASE_COLUMN + usize::from(self.namespaces);
        cells[column] = "Deleted".into();
        Ok(row_line(self.widths.as_deref().unwrap_or_default(), &cells))
    }

    fn object(&self, tr: &TaskRun) -> Result<String> {
        let text = output::render(&self.format, tr)?;
        Ok(match self.format {
            Format::Yaml => format!("---\n{text}"),
            _ => text,
        })
    }
}

/// `task list --watch`.
pub async fn run(global: &Global, args: &ListArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let (api, where_): (Api<TaskRun>, String) = if args.all_namespaces {
        (Api::all(cluster.client.clone()), "all namespaces".into())
    } else {
        (
            super::api(&cluster),
            format!("namespace {}", cluster.namespace),
        )
    };
    let mut params = ListParams::default().limit(1);
    let mut config = watcher::Config::default();
    if let Some(s) = &args.selector {
        params = params.labels(s);
        config = config.labels(s);
    }
    // A refusal (RBAC, a bad selector) is an answer, not something to retry.
    api.list(&params)
        .await
        .map_err(|e| Error::kube(format!("watching TaskRuns in {where_}"), e))?;
    let mut printer = Printer::new(global.output.clone(), args);
    printer.headers = output::headers();
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let mut listed = Vec::new();
    while let Some(event) = stream.next().await {
        let now = Timestamp::now();
        let text = match event {
            Ok(watcher::Event::Init) => {
                listed.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(tr)) => {
                listed.push(tr);
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                let first = printer.widths.is_none();
                let text = printer.initial(std::mem::take(&mut listed), now)?;
                if first && printer.shown.is_empty() {
                    eprintln!("No tasks found in {where_} yet; watching.");
                }
                text
            }
            Ok(watcher::Event::Apply(tr)) => printer.changed(&tr, now)?,
            Ok(watcher::Event::Delete(tr)) => printer.deleted(&tr, now)?,
            Err(e) => {
                tracing::warn!("watching TaskRuns in {where_}: {e}; retrying");
                continue;
            }
        };
        if !text.is_empty() {
            output::print(&text)?;
        }
    }
    Err(Error::Cluster(format!(
        "the watch on TaskRuns in {where_} ended"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command, TaskCommand};
    use clap::Parser;
    use serde_json::json;

    fn taskrun(name: &str, version: &str, status: serde_json::Value) -> TaskRun {
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": name, "namespace": "team-a", "resourceVersion": version,
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"taskId": 7, "serviceName": "web", "task": {"prompt": "x"}},
            "status": status,
        }))
        .expect("valid TaskRun")
    }

    fn list_args(args: &[&str]) -> (Format, ListArgs) {
        let cli = Cli::try_parse_from(args.iter().copied()).expect("valid");
        match cli.command {
            Command::Task(t) => match *t {
                TaskCommand::List(l) => (cli.global.output, l),
                other => panic!("not list: {other:?}"),
            },
            other => panic!("not task: {other:?}"),
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("valid")
    }

    #[test]
    fn watch_and_selector_parse() {
        let (_, a) = list_args(&["o", "task", "list", "-w", "-l", "team=a,tier!=x"]);
        assert!(a.watch);
        assert_eq!(a.selector.as_deref(), Some("team=a,tier!=x"));
        let (_, a) = list_args(&["o", "task", "list", "--watch", "--selector", "a=b"]);
        assert!(a.watch && a.selector.as_deref() == Some("a=b"));
    }

    #[test]
    fn rows_follow_changes_under_the_first_tables_columns() {
        let (format, args) = list_args(&["o", "task", "list", "-w"]);
        let mut p = Printer::new(format, &args);
        let now = at("2025-01-01T00:05:00Z");
        let first = p
            .initial(
                vec![taskrun("task-7", "1", json!({"phase": "Pending"}))],
                now,
            )
            .expect("table");
        assert_eq!(
            first,
            "NAME     TASK   SERVICE   PHASE     TOOLS    CONTEXT   RESULT   TURNS   COST   AGE\n\
             task-7   7      web       Pending   <none>   <none>                            5m\n"
        );
        // Only aged (and a new resourceVersion): nothing to print.
        let later = at("2025-01-01T00:06:00Z");
        let same = taskrun("task-7", "2", json!({"phase": "Pending"}));
        assert_eq!(p.changed(&same, later).expect("row"), "");
        let running = taskrun("task-7", "3", json!({"phase": "Running"}));
        assert_eq!(
            p.changed(&running, later).expect("row"),
            "task-7   7      web       Running   <none>   <none>                            6m\n"
        );
        // A new TaskRun appears as a row.
        let new = taskrun("task-8", "4", json!(null));
        assert!(p.changed(&new, later).expect("row").starts_with("task-8 "));
        let gone = p.deleted(&running, later).expect("row");
        assert!(gone.contains(" Deleted "), "{gone}");
        assert_eq!(p.deleted(&running, later).expect("once"), "");
    }

    #[test]
    fn filters_apply_to_changes_and_json_prints_each_version_once() {
        let (format, args) = list_args(&[
            "o", "task", "list", "-w", "--phase", "running", "-o", "json",
        ]);
        let mut p = Printer::new(format, &args);
        let now = at("2025-01-01T00:05:00Z");
        assert_eq!(p.initial(Vec::new(), now).expect("empty"), "");
        let pending = taskrun("a", "1", json!({"phase": "Pending"}));
        assert_eq!(p.changed(&pending, now).expect("filtered"), "");
        let running = taskrun("a", "2", json!({"phase": "Running"}));
        let text = p.changed(&running, now).expect("object");
        let back: TaskRun = serde_json::from_str(&text).expect("one JSON object");
        assert_eq!(back.resource_version().as_deref(), Some("2"));
        assert_eq!(p.changed(&running, now).expect("same version"), "");
    }
}
