//! `task list --watch`'s printers: the server's rows, and the CLI's own (a server without Tables).

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use orchestrator_crds::taskrun::TaskRun;

use super::list_watch::{Printer, TablePrinter};
use crate::api_table::{self, Answer, ServerTable, Shape};
use crate::args::ListArgs;
use crate::args::{Cli, Command, TaskCommand};
use crate::output::Format;
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

/// A table as the API server sends it: the list's with its columns, a watch event's with
/// `columnDefinitions: null`.
fn server_table(columns: bool, rows: serde_json::Value) -> ServerTable {
    let columns = if columns {
        json!([
            {"name": "Name", "type": "string", "priority": 0},
            {"name": "Phase", "type": "string", "priority": 0},
            {"name": "Proxy", "type": "string", "priority": 1},
            {"name": "Age", "type": "date", "priority": 0}
        ])
    } else {
        json!(null)
    };
    let table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                       "metadata": {"resourceVersion": "41"},
                       "columnDefinitions": columns, "rows": rows});
    match api_table::parse(table).expect("a Table") {
        Answer::Table(t) => t,
        Answer::Objects(_) => panic!("a Table"),
    }
}

fn server_row(name: &str, phase: &str, age: &str, service: &str) -> serde_json::Value {
    json!({"cells": [name, phase, "sidecar", age],
           "object": {"metadata": {"name": name, "namespace": "team-a", "resourceVersion": "50",
                                   "creationTimestamp": "2025-01-01T00:00:00Z"},
                      "spec": {"serviceName": service}, "status": {"phase": phase}}})
}

#[test]
fn the_servers_rows_follow_changes_under_its_first_tables_columns() {
    let (format, args) = list_args(&["o", "task", "list", "-w"]);
    assert!(format.is_table());
    let shape = Shape {
        headers: true,
        ..Shape::default()
    };
    let mut p = TablePrinter::new(shape, &args);
    let first = server_table(true, json!([server_row("task-7", "Pending", "5m", "web")]));
    assert_eq!(first.metadata.resource_version.as_deref(), Some("41"));
    assert_eq!(
        p.listed(first),
        "NAME     PHASE     AGE\ntask-7   Pending   5m\n"
    );
    // A watch event's table has no columns: its row is shown under the first table's.
    let event = server_table(false, json!([server_row("task-7", "Pending", "6m", "web")]));
    assert!(event.column_definitions.is_empty());
    assert_eq!(p.changed(&event.rows[0]), "", "only aged: not printed");
    let running = server_table(false, json!([server_row("task-7", "Running", "6m", "web")]));
    assert_eq!(p.changed(&running.rows[0]), "task-7   Running   6m\n");
    let new = server_table(false, json!([server_row("task-8", "Pending", "0s", "web")]));
    assert_eq!(p.changed(&new.rows[0]), "task-8   Pending   0s\n");
    assert_eq!(p.deleted(&running.rows[0]), "task-7   Deleted   6m\n");
    assert_eq!(p.deleted(&running.rows[0]), "", "once");
    // A cell with a terminal escape (a phase, a result: text others wrote): printed escaped.
    let hostile = server_table(
        false,
        json!([server_row(
            "task-8",
            "Failed\u{1b}]0;owned\u{7}",
            "1s",
            "web"
        )]),
    );
    assert_eq!(
        p.changed(&hostile.rows[0]),
        "task-8   Failed\\u{1b}]0;owned\\u{7}   1s\n"
    );
    // A list after the watch was cut off: what changed, and what went meanwhile.
    let relisted = server_table(true, json!([server_row("task-9", "Running", "1s", "web")]));
    assert_eq!(
        p.listed(relisted),
        "task-9   Running   1s\ntask-8   Deleted\n"
    );
}

#[test]
fn the_servers_rows_keep_to_phase_and_service() {
    let (_, args) = list_args(&[
        "o",
        "task",
        "list",
        "-w",
        "--phase",
        "running",
        "--service",
        "web",
    ]);
    let mut p = TablePrinter::new(Shape::default(), &args);
    let first = server_table(
        true,
        json!([
            server_row("a", "Running", "1m", "web"),
            server_row("b", "Running", "1m", "api"),
            server_row("c", "Pending", "1m", "web")
        ]),
    );
    assert_eq!(p.listed(first), "a   Running   1m\n");
    let c = server_table(false, json!([server_row("c", "Running", "2m", "web")]));
    assert_eq!(p.changed(&c.rows[0]), "c   Running   2m\n");
    let done = server_table(false, json!([server_row("c", "Succeeded", "3m", "web")]));
    assert_eq!(p.changed(&done.rows[0]), "", "no longer wanted");
    assert_eq!(p.deleted(&done.rows[0]), "", "not shown any more");
    // A list after a cut-off watch: a TaskRun now in another phase is dropped quietly, one that
    // went is Deleted.
    let relisted = server_table(
        true,
        json!([
            server_row("a", "Succeeded", "4m", "web"),
            server_row("b", "Running", "4m", "api")
        ]),
    );
    assert_eq!(p.listed(relisted), "");
    let c = server_table(false, json!([server_row("c", "Running", "5m", "web")]));
    assert_eq!(p.changed(&c.rows[0]), "c   Running   5m\n");
    let relisted = server_table(true, json!([]));
    assert_eq!(p.listed(relisted), "c   Deleted\n");
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
