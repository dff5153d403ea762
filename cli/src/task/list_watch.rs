//! `task list --watch`: the list, then each TaskRun again whenever its row changes, as
//! `kubectl get -w` prints them (later rows under the first table's columns). A row that only
//! aged is not printed again; a TaskRun that goes is printed once more with phase `Deleted`.
//! The table is the API server's (the CRD's printer columns, as `task list` prints them): its
//! Table, then a watch of its Table, whose events are the rows that changed. A server that
//! answers without a Table gets the CLI's own columns from a watch of the objects, as
//! `-o json|yaml|name|jsonpath` does, which prints each new version of an object whole.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::core::WatchEvent;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;
use serde_json::Value;

use super::show::{filter, headers_of, row, shape};
use crate::api_table::{self, Answer, Query, Row, ServerTable, Shape};
use crate::args::{Global, ListArgs};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result};
use crate::output::{self, Format, Table, row_line};

/// How long a failed list or watch waits before it is made again, at most.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The server's rows as they change: what was printed per TaskRun.
pub struct TablePrinter {
    shape: Shape,
    phase: Option<String>,
    service: Option<String>,
    /// The first table, without its rows: its columns (a watch event's table has none).
    columns: Option<ServerTable>,
    widths: Vec<usize>,
    /// The printed cells that are not its age (the column named Age), and its phase's.
    age: Option<usize>,
    phase_at: Option<usize>,
    /// Per `namespace/name`: the row last printed, without its age.
    shown: HashMap<String, String>,
}

impl TablePrinter {
    pub fn new(shape: Shape, args: &ListArgs) -> Self {
        Self {
            shape,
            phase: args.phase.clone(),
            service: args.service.clone(),
            columns: None,
            widths: Vec::new(),
            age: None,
            phase_at: None,
            shown: HashMap::new(),
        }
    }

    fn key(row: &Row) -> String {
        let at = |p: &str| {
            row.object
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        format!("{}/{}", at("/metadata/namespace"), at("/metadata/name"))
    }

    /// Whether the row's TaskRun is one `--phase` and `--service` ask for.
    fn wanted(&self, row: &Row) -> bool {
        row.is(self.phase.as_deref(), self.service.as_deref())
    }

    fn without_age(&self, cells: &[String]) -> String {
        let kept: Vec<&str> = cells
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.age)
            .map(|(_, c)| c.as_str())
            .collect();
        kept.join("\u{0}")
    }

    /// A list: the first is printed whole (newest first); a later one (after the watch was
    /// cut off) prints the rows that changed meanwhile, and those that went as `Deleted`.
    pub fn listed(&mut self, mut table: ServerTable) -> String {
        table.select(None, None);
        if self.columns.is_none() {
            table.rows.retain(|r| self.wanted(r));
            let headers = table.headers(self.shape);
            let find = |name: &str| headers.iter().position(|h| h.eq_ignore_ascii_case(name));
            self.age = find("Age");
            self.phase_at = find("Phase");
            let t = table.to_table(self.shape);
            self.widths = t.widths_with(self.shape.headers);
            for row in &table.rows {
                let cells = table.cells(row, self.shape);
                self.shown.insert(Self::key(row), self.without_age(&cells));
            }
            let text = t.render_with(self.shape.headers);
            table.rows.clear();
            self.columns = Some(table);
            return text;
        }
        // Gone: not in the list at all (one that is there but no longer wanted, another phase
        // say, is dropped quietly by `changed`, as during the watch).
        let present: HashSet<String> = table.rows.iter().map(Self::key).collect();
        let mut gone: Vec<String> = self
            .shown
            .keys()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect();
        gone.sort();
        let mut out = String::new();
        for row in &table.rows {
            out.push_str(&self.changed(row));
        }
        for key in gone {
            if let Some(seen) = self.shown.remove(&key) {
                // Its last row, as printed (its age not known any more), marked Deleted.
                let mut cells: Vec<String> = seen.split('\u{0}').map(str::to_string).collect();
                if let Some(at) = self.age {
                    cells.insert(at.min(cells.len()), String::new());
                }
                out.push_str(&self.deleted_line(cells));
            }
        }
        out
    }

    /// A watch event's row: printed when it changed (not only aged) and is wanted.
    pub fn changed(&mut self, row: &Row) -> String {
        let Some(columns) = &self.columns else {
            return String::new();
        };
        let key = Self::key(row);
        if !self.wanted(row) {
            // No longer wanted (another phase): not printed, and printed again if it comes back.
            self.shown.remove(&key);
            return String::new();
        }
        let cells = columns.cells(row, self.shape);
        let seen = self.without_age(&cells);
        if self.shown.get(&key) == Some(&seen) {
            return String::new();
        }
        self.shown.insert(key, seen);
        row_line(&self.widths, &cells)
    }

    /// A deleted TaskRun's row, once more, with phase `Deleted` (if it was printed).
    pub fn deleted(&mut self, row: &Row) -> String {
        let Some(columns) = &self.columns else {
            return String::new();
        };
        if self.shown.remove(&Self::key(row)).is_none() {
            return String::new();
        }
        let cells = columns.cells(row, self.shape);
        self.deleted_line(cells)
    }

    fn deleted_line(&self, mut cells: Vec<String>) -> String {
        if let Some(cell) = self.phase_at.and_then(|at| cells.get_mut(at)) {
            *cell = "Deleted".into();
        }
        row_line(&self.widths, &cells)
    }
}

/// The watch of the server's table. It runs until it fails for good (the first list refused,
/// say: `Err`), or returns `Ok` at once when the server answers the first list without a Table.
async fn run_table(
    global: &Global,
    args: &ListArgs,
    cluster: &Cluster,
    where_: &str,
) -> Result<()> {
    let list = Query {
        namespace: Some(cluster.namespace.as_str()).filter(|_| !args.all_namespaces),
        labels: args.selector.as_deref(),
        ..Query::default()
    };
    let action = format!("watching TaskRuns in {where_}");
    let mut printer = TablePrinter::new(shape(global, args.all_namespaces), args);
    let mut from: Option<String> = None;
    let mut retry = Duration::from_millis(500);
    // A failed list or watch: said, then the next list after a wait that doubles each time.
    async fn back_off(retry: &mut Duration, e: Error) {
        tracing::warn!("{e}; listing again in {retry:?}");
        tokio::time::sleep(*retry).await;
        *retry = (*retry * 2).min(RETRY_MAX);
    }
    loop {
        let version = match from.take() {
            Some(v) => v,
            None => {
                let first = printer.columns.is_none();
                match api_table::fetch(&cluster.client, &list, &action).await {
                    Ok(Answer::Table(table)) => {
                        let version = table.metadata.resource_version.clone().unwrap_or_default();
                        let text = printer.listed(table);
                        if first && printer.shown.is_empty() {
                            eprintln!("No tasks found in {where_} yet; watching.");
                        }
                        if !text.is_empty() {
                            output::print(&text)?;
                        }
                        version
                    }
                    Ok(Answer::Objects(_)) if first => return Ok(()),
                    Ok(Answer::Objects(_)) => {
                        return Err(Error::Cluster(format!(
                            "{action}: the API server stopped answering with a Table"
                        )));
                    }
                    // A refusal (RBAC, a bad selector) is an answer, not something to retry.
                    Err(e) if first => return Err(e),
                    Err(e) => {
                        back_off(&mut retry, e).await;
                        continue;
                    }
                }
            }
        };
        let query = Query {
            watch_from: Some(&version),
            ..list
        };
        match watch_once(&cluster.client, &query, &action, &mut printer).await {
            // The server ended the request: watch again from where it was.
            Ok(Some(last)) => {
                retry = Duration::from_millis(500);
                from = Some(last);
            }
            // Too old a resourceVersion (410 Gone): list again.
            Ok(None) => {}
            Err(e) => back_off(&mut retry, e).await,
        }
    }
}

/// One watch request: prints each changed row. The resourceVersion to watch from next, or
/// `None` when the server says the one given is too old.
async fn watch_once(
    client: &kube::Client,
    query: &Query<'_>,
    action: &str,
    printer: &mut TablePrinter,
) -> Result<Option<String>> {
    let mut version = query.watch_from.unwrap_or_default().to_string();
    let events = api_table::watch(client, query, action).await?;
    futures::pin_mut!(events);
    while let Some(event) = events
        .try_next()
        .await
        .map_err(|e| Error::kube(action.to_string(), e))?
    {
        let (table, deleted) = match event {
            WatchEvent::Added(t) | WatchEvent::Modified(t) => (t, false),
            WatchEvent::Deleted(t) => (t, true),
            WatchEvent::Bookmark(b) => {
                version = b.metadata.resource_version;
                continue;
            }
            WatchEvent::Error(s) if s.code == 410 => return Ok(None),
            WatchEvent::Error(s) => {
                return Err(Error::Cluster(format!(
                    "{action}: {} ({})",
                    s.message, s.code
                )));
            }
        };
        let mut text = String::new();
        for row in &table.rows {
            if let Some(v) = row
                .object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                version = v.to_string();
            }
            text.push_str(&if deleted {
                printer.deleted(row)
            } else {
                printer.changed(row)
            });
        }
        if !text.is_empty() {
            output::print(&text)?;
        }
    }
    Ok(Some(version))
}

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
        self.widths = Some(t.widths_with(self.headers));
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
    let where_ = if args.all_namespaces {
        "all namespaces".to_string()
    } else {
        format!("namespace {}", cluster.namespace)
    };
    if global.output.is_table() {
        run_table(global, args, &cluster, &where_).await?;
        output::note(
            "the API server did not answer with a Table (its printer columns); \
             showing the CLI's own columns",
        );
    }
    let api: Api<TaskRun> = if args.all_namespaces {
        Api::all(cluster.client.clone())
    } else {
        super::api(&cluster)
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
