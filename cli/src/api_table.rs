//! TaskRuns as the API server's table (`task list`, `task get`): the columns are the CRD's
//! `additionalPrinterColumns`, as `kubectl get` shows them, asked for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (`-o wide`: also those of priority
//! above 0). The rows carry their objects (`includeObject=Object`), which the phase filter, the
//! order (newest first) and `-A`'s NAMESPACE column read. A server that answers with objects
//! instead (no Table support) gets the CLI's own columns, with a note. `task list --watch` watches
//! the same table: each event a Table of the one row that changed (without the columns).

use futures::Stream;
use http::header::ACCEPT;
use kube::Client;
use kube::core::WatchEvent;
use orchestrator_crds::taskrun::{GROUP, TaskRun};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::output::{Table, visible};

/// What `task list` and `task get` ask the API server for.
pub const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// Which TaskRuns.
#[derive(Clone, Debug, Default)]
pub struct Query<'a> {
    /// `None`: every namespace.
    pub namespace: Option<&'a str>,
    /// One TaskRun by name (a GET), else a list.
    pub name: Option<&'a str>,
    pub labels: Option<&'a str>,
    pub fields: Option<&'a str>,
    /// A watch from this resourceVersion (the list's), else a GET.
    pub watch_from: Option<&'a str>,
}

/// How long one watch request lasts before it is made again (as kube's watcher).
const WATCH_SECONDS: &str = "290";

/// A column the server declares.
#[derive(Clone, Debug, Deserialize)]
pub struct Column {
    pub name: String,
    #[serde(default)]
    pub priority: i64,
}

/// One row: its cells (one per column) and the TaskRun it shows.
#[derive(Clone, Debug, Deserialize)]
pub struct Row {
    pub cells: Vec<Value>,
    #[serde(default)]
    pub object: Value,
}

impl Row {
    /// Whether the row's TaskRun is in `phase` (case-insensitive) and of `service`, each when
    /// given: `task list --phase --service`.
    pub fn is(&self, phase: Option<&str>, service: Option<&str>) -> bool {
        let at = |p: &str| self.object.pointer(p).and_then(Value::as_str);
        phase.is_none_or(|p| at("/status/phase").is_some_and(|have| have.eq_ignore_ascii_case(p)))
            && service.is_none_or(|s| at("/spec/serviceName") == Some(s))
    }
}

/// The API server's `meta.k8s.io/v1` Table. A watch event's has no columns (`null`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerTable {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub column_definitions: Vec<Column>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub rows: Vec<Row>,
    #[serde(default)]
    pub metadata: TableMeta,
}

/// A Table's list metadata.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableMeta {
    /// Where a watch of what the table lists starts.
    #[serde(default)]
    pub resource_version: Option<String>,
}

fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// What the server answered.
pub enum Answer {
    Table(ServerTable),
    /// Not a Table: the objects themselves.
    Objects(Vec<TaskRun>),
}

fn path(q: &Query) -> String {
    let mut path = format!("/apis/{GROUP}/v1");
    if let Some(ns) = q.namespace {
        path.push_str(&format!("/namespaces/{ns}"));
    }
    path.push_str("/taskruns");
    if let Some(name) = q.name {
        path.push('/');
        path.push_str(name);
    }
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("includeObject", "Object");
    if let Some(l) = q.labels {
        query.append_pair("labelSelector", l);
    }
    if let Some(f) = q.fields {
        query.append_pair("fieldSelector", f);
    }
    if let Some(from) = q.watch_from {
        query.append_pair("watch", "true");
        query.append_pair("resourceVersion", from);
        query.append_pair("timeoutSeconds", WATCH_SECONDS);
    }
    format!("{path}?{}", query.finish())
}

/// Asks the server for its table of the TaskRuns `q` names. Errors are the API server's
/// (`Error::Kube`, so a 404 is exit 3), with `action` saying what was asked.
pub async fn fetch(client: &Client, q: &Query<'_>, action: &str) -> Result<Answer> {
    let request = http::Request::get(path(q))
        .header(ACCEPT, TABLE_ACCEPT)
        .body(Vec::new())
        .map_err(|e| Error::Cluster(format!("{action}: {e}")))?;
    let value: Value = client
        .request(request)
        .await
        .map_err(|e| Error::kube(action.to_string(), e))?;
    parse(value).map_err(|e| Error::Cluster(format!("{action}: the API server's answer: {e}")))
}

/// Watches the table of the TaskRuns `q` names from `q.watch_from`: an event per changed row,
/// until the server ends the request (after `WATCH_SECONDS`) or the stream fails.
pub async fn watch(
    client: &Client,
    q: &Query<'_>,
    action: &str,
) -> Result<impl Stream<Item = std::result::Result<WatchEvent<ServerTable>, kube::Error>> + use<>> {
    let request = http::Request::get(path(q))
        .header(ACCEPT, TABLE_ACCEPT)
        .body(Vec::new())
        .map_err(|e| Error::Cluster(format!("{action}: {e}")))?;
    client
        .request_events::<ServerTable>(request)
        .await
        .map_err(|e| Error::kube(action.to_string(), e))
}

/// The answer as a Table, or as the objects when the server sent those.
pub fn parse(value: Value) -> std::result::Result<Answer, serde_json::Error> {
    match value.get("kind").and_then(Value::as_str) {
        Some("Table") => serde_json::from_value(value).map(Answer::Table),
        Some("TaskRun") => serde_json::from_value(value).map(|t| Answer::Objects(vec![t])),
        _ => {
            #[derive(Deserialize)]
            struct Items {
                #[serde(default)]
                items: Vec<TaskRun>,
            }
            serde_json::from_value::<Items>(value).map(|l| Answer::Objects(l.items))
        }
    }
}

/// How to print a server table.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    /// `-o wide`: the columns of priority > 0 too.
    pub wide: bool,
    /// `-A`: a NAMESPACE column first.
    pub namespaces: bool,
    pub headers: bool,
}

impl ServerTable {
    /// Keeps the rows whose TaskRun [`Row::is`] in `phase` and of `service`, and puts them
    /// newest first (by name within the same second).
    pub fn select(&mut self, phase: Option<&str>, service: Option<&str>) {
        self.rows.retain(|r| r.is(phase, service));
        let created = |r: &Row| {
            r.object
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        };
        let name = |r: &Row| {
            r.object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        self.rows.sort_by(|a, b| {
            created(b)
                .cmp(&created(a))
                .then_with(|| name(a).cmp(&name(b)))
        });
    }

    /// The indices of the columns `shape` shows.
    fn shown(&self, shape: Shape) -> Vec<usize> {
        (0..self.column_definitions.len())
            .filter(|&i| shape.wide || self.column_definitions[i].priority == 0)
            .collect()
    }

    /// The headers `shape` shows, upper-case as kubectl prints them.
    pub fn headers(&self, shape: Shape) -> Vec<String> {
        let mut headers: Vec<String> = self
            .shown(shape)
            .iter()
            .map(|&i| self.column_definitions[i].name.to_uppercase())
            .collect();
        if shape.namespaces {
            headers.insert(0, "NAMESPACE".into());
        }
        headers
    }

    /// `row`'s cells under this table's columns (a watch event's row: under the first
    /// table's), an absent value empty, each with the characters a terminal would act on
    /// escaped.
    pub fn cells(&self, row: &Row, shape: Shape) -> Vec<String> {
        let mut cells: Vec<String> = self
            .shown(shape)
            .iter()
            .map(|&i| cell(row.cells.get(i).unwrap_or(&Value::Null)))
            .collect();
        if shape.namespaces {
            let ns = row.object.pointer("/metadata/namespace");
            cells.insert(0, ns.map(cell).unwrap_or_else(|| "<none>".into()));
        }
        cells
    }

    /// The table as kubectl prints it.
    pub fn render(&self, shape: Shape) -> String {
        self.to_table(shape).render_with(shape.headers)
    }

    /// The table to print.
    pub fn to_table(&self, shape: Shape) -> Table {
        let headers = self.headers(shape);
        let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
        let mut t = Table::new(&header_refs);
        for row in &self.rows {
            t.row(self.cells(row, shape));
        }
        t
    }
}

/// A cell as kubectl prints it (an absent value: nothing).
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => visible(s),
        other => visible(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table() -> ServerTable {
        let answer = json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "columnDefinitions": [
                {"name": "Name", "type": "string", "priority": 0},
                {"name": "Phase", "type": "string", "priority": 0},
                {"name": "Proxy", "type": "string", "priority": 1},
                {"name": "Turns", "type": "integer", "priority": 0}
            ],
            "rows": [
                {"cells": ["old", "Running", "sidecar", null],
                 "object": {"metadata": {"name": "old", "namespace": "a", "creationTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}}},
                {"cells": ["new", "Succeeded", null, 3],
                 "object": {"metadata": {"name": "new", "namespace": "b", "creationTimestamp": "2026-01-02T00:00:00Z"}, "status": {"phase": "Succeeded"}}}
            ]
        });
        match parse(answer).expect("parses") {
            Answer::Table(t) => t,
            Answer::Objects(_) => panic!("a Table"),
        }
    }

    #[test]
    fn the_servers_columns_newest_first_wide_adds_priority_columns() {
        let mut t = table();
        t.select(None, None);
        let shape = Shape {
            headers: true,
            ..Shape::default()
        };
        assert_eq!(
            t.render(shape),
            "NAME   PHASE       TURNS\nnew    Succeeded   3\nold    Running\n"
        );
        let wide = Shape {
            wide: true,
            namespaces: true,
            headers: false,
        };
        assert_eq!(
            t.render(wide),
            "b   new   Succeeded             3\na   old   Running     sidecar\n"
        );
        t.select(Some("running"), None);
        assert_eq!(t.rows.len(), 1);
    }

    #[test]
    fn objects_instead_of_a_table_are_recognised() {
        let list = json!({"kind": "TaskRunList", "apiVersion": "orchestrator.io/v1", "items": []});
        assert!(matches!(parse(list), Ok(Answer::Objects(v)) if v.is_empty()));
    }

    #[test]
    fn the_query_names_the_namespace_selectors_and_objects() {
        let q = Query {
            namespace: Some("team-a"),
            labels: Some("a in (b,c)"),
            fields: Some("spec.serviceName=x"),
            ..Query::default()
        };
        assert_eq!(
            path(&q),
            "/apis/orchestrator.io/v1/namespaces/team-a/taskruns?includeObject=Object\
             &labelSelector=a+in+%28b%2Cc%29&fieldSelector=spec.serviceName%3Dx"
        );
        // A watch of the same table, from the list's resourceVersion, ended by the server
        // after WATCH_SECONDS.
        let watch = Query {
            watch_from: Some("41"),
            ..q
        };
        assert_eq!(
            path(&watch),
            "/apis/orchestrator.io/v1/namespaces/team-a/taskruns?includeObject=Object\
             &labelSelector=a+in+%28b%2Cc%29&fieldSelector=spec.serviceName%3Dx\
             &watch=true&resourceVersion=41&timeoutSeconds=290"
        );
    }
}
