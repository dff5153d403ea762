//! `task get`, `task list`, `task describe`: reading TaskRuns and printing them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::ApprovalState;
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::{ProxyMode, TaskRun, TaskRunStatus};
use serde_json::json;

use crate::api_table::{self, Answer, Query, Shape};
use crate::args::{DescribeArgs, GetArgs, Global, ListArgs};
use crate::catalog::{self, indent};
use crate::connect::connect;
use crate::effective::{ServerTools, effective, patterns_summary};
use crate::error::{Error, Result};
use crate::output::{self, Format, Table, age, or_none};

/// How many events `describe` shows.
const EVENTS_SHOWN: usize = 10;

/// `task get`.
pub async fn get(global: &Global, args: &GetArgs) -> Result<()> {
    let cluster = connect(global).await?;
    if global.output.is_table() {
        let id = args.task.task_id.map(|id| format!("spec.taskId={id}"));
        let query = Query {
            namespace: Some(&cluster.namespace),
            name: args.task.name.as_deref(),
            fields: id.as_deref().filter(|_| args.task.name.is_none()),
            ..Query::default()
        };
        let action = match &args.task.name {
            Some(n) => format!("getting TaskRun {n}"),
            None => format!("listing TaskRuns in namespace {}", cluster.namespace),
        };
        let answer = api_table::fetch(&cluster.client, &query, &action).await;
        // A missing name or task id is said as the typed path says it (exit 3).
        let found = match &answer {
            Ok(Answer::Table(t)) => !t.rows.is_empty(),
            _ => false,
        };
        if found && let Ok(Answer::Table(mut t)) = answer {
            t.select(None, None);
            return output::print(&t.render(shape(global, false)));
        }
    }
    let items = match (&args.task.name, args.task.task_id) {
        (Some(name), _) => vec![super::get_named(&cluster, name).await?],
        (None, Some(id)) => {
            let found = super::find_by_id(&cluster, id).await?;
            if found.is_empty() {
                return Err(Error::NotFound(format!(
                    "no TaskRun with task id {id} in namespace {}",
                    cluster.namespace
                )));
            }
            found
        }
        (None, None) => return Err(Error::Usage("name a TaskRun, or pass --task-id".into())),
    };
    let text = match &global.output {
        Format::Table | Format::Wide => table(&items, false, Timestamp::now(), output::headers()),
        f if items.len() == 1 => output::render(f, &items[0])?,
        f => output::render(f, &as_list(&items))?,
    };
    output::print(&text)
}

/// `task list`.
pub async fn list(global: &Global, args: &ListArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let api: Api<TaskRun> = if args.all_namespaces {
        Api::all(cluster.client.clone())
    } else {
        super::api(&cluster)
    };
    let mut params = ListParams::default();
    let selector = args
        .service
        .as_ref()
        .map(|s| format!("spec.serviceName={s}"));
    if let Some(s) = &selector {
        params = params.fields(s);
    }
    let mut unfiltered = ListParams::default();
    if let Some(labels) = &args.selector {
        params = params.labels(labels);
        unfiltered = unfiltered.labels(labels);
    }
    let where_ = if args.all_namespaces {
        "all namespaces".to_string()
    } else {
        format!("namespace {}", cluster.namespace)
    };
    if global.output.is_table() {
        let mut query = Query {
            namespace: Some(cluster.namespace.as_str()).filter(|_| !args.all_namespaces),
            labels: args.selector.as_deref(),
            fields: selector.as_deref(),
            ..Query::default()
        };
        let action = format!("listing TaskRuns in {where_}");
        let answer = match api_table::fetch(&cluster.client, &query, &action).await {
            // A CRD without selectableFields refuses the selector: filter here instead.
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 400 && selector.is_some() => {
                query.fields = None;
                api_table::fetch(&cluster.client, &query, &action).await?
            }
            other => other?,
        };
        match answer {
            Answer::Table(mut t) => {
                t.select(args.phase.as_deref(), args.service.as_deref());
                if t.rows.is_empty() {
                    eprintln!("No tasks found in {where_}.");
                    return Ok(());
                }
                return output::print(&t.render(shape(global, args.all_namespaces)));
            }
            Answer::Objects(_) => output::note(
                "the API server did not answer with a Table (its printer columns); \
                 showing the CLI's own columns",
            ),
        }
    }
    let items = match api.list(&params).await {
        Ok(l) => l.items,
        // A CRD without selectableFields refuses the selector: filter here instead.
        Err(kube::Error::Api(s)) if s.code == 400 && selector.is_some() => {
            api.list(&unfiltered)
                .await
                .map_err(|e| Error::kube(format!("listing TaskRuns in {where_}"), e))?
                .items
        }
        Err(e) => return Err(Error::kube(format!("listing TaskRuns in {where_}"), e)),
    };
    let mut items = filter(items, args.phase.as_deref(), args.service.as_deref());
    newest_first(&mut items);
    let text = match &global.output {
        Format::Table | Format::Wide if items.is_empty() => {
            eprintln!("No tasks found in {where_}.");
            String::new()
        }
        Format::Table | Format::Wide => table(
            &items,
            args.all_namespaces,
            Timestamp::now(),
            output::headers(),
        ),
        f => output::render(f, &as_list(&items))?,
    };
    output::print(&text)
}

/// Newest first (the task just submitted is on top); by name within the same second.
pub fn newest_first(items: &mut [TaskRun]) {
    items.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&a.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
}

/// Keeps the TaskRuns in `phase` (case-insensitive) of `service`.
pub fn filter(items: Vec<TaskRun>, phase: Option<&str>, service: Option<&str>) -> Vec<TaskRun> {
    items
        .into_iter()
        .filter(|t| {
            phase.is_none_or(|p| phase_of(t).is_some_and(|have| have.eq_ignore_ascii_case(p)))
        })
        .filter(|t| service.is_none_or(|s| t.spec.service_name == s))
        .collect()
}

fn phase_of(t: &TaskRun) -> Option<&'static str> {
    t.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str())
}

/// A kubectl-style `List` for -o json|yaml.
fn as_list(items: &[TaskRun]) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// How `-o table|wide`, `-A` and `--no-headers` print the API server's table.
pub fn shape(global: &Global, namespaces: bool) -> Shape {
    Shape {
        wide: global.output == Format::Wide,
        namespaces,
        headers: output::headers(),
    }
}

/// The CLI's own list table (when the API server gives no Table; and `--watch`'s then): the
/// CRD's main printer columns, plus NAMESPACE with -A.
pub fn table(items: &[TaskRun], namespaces: bool, now: Timestamp, headers: bool) -> String {
    let mut t = Table::new(&headers_of(namespaces));
    for tr in items {
        t.row(row(tr, namespaces, now));
    }
    t.render_with(headers)
}

/// The list table's header.
pub fn headers_of(namespaces: bool) -> Vec<&'static str> {
    let mut headers = vec![
        "NAME", "TASK", "SERVICE", "PHASE", "TOOLS", "CONTEXT", "RESULT", "TURNS", "COST", "AGE",
    ];
    if namespaces {
        headers.insert(0, "NAMESPACE");
    }
    headers
}

/// One TaskRun's row of the list table.
pub fn row(tr: &TaskRun, namespaces: bool, now: Timestamp) -> Vec<String> {
    let status = tr.status.clone().unwrap_or_default();
    let [result, turns, cost] = super::result_view::cells(tr);
    let mut row = vec![
        tr.name_any(),
        tr.spec.task_id.to_string(),
        tr.spec.service_name.clone(),
        or_none(phase_of(tr).map(String::from)),
        or_none(status.enabled_tool_count.map(|n| n.to_string())),
        or_none(status.context_version.map(|n| n.to_string())),
        result,
        turns,
        cost,
        or_none(
            tr.metadata
                .creation_timestamp
                .as_ref()
                .map(|c| age(c.0, now)),
        ),
    ];
    if namespaces {
        row.insert(0, tr.namespace().unwrap_or_default());
    }
    row
}

/// `task describe`.
pub async fn describe(global: &Global, args: &DescribeArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task).await?;
    // The catalog only improves the tool listing; describe works without it.
    let catalog = match catalog::load(global, Some(&cluster)).await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::info!("catalog unavailable, showing patterns only: {e}");
            None
        }
    };
    let events = events(&cluster.client, &tr).await;
    let text = match &global.output {
        Format::Table | Format::Wide => {
            describe_text(&tr, catalog.as_ref(), &events, Timestamp::now())
        }
        f => output::render(f, &json!({"taskRun": tr, "events": events}))?,
    };
    output::print(&text)
}

/// Recent events about the TaskRun and its Job, oldest first (failures to read them are not
/// worth failing describe for).
async fn events(client: &kube::Client, tr: &TaskRun) -> Vec<Event> {
    let ns = tr.namespace().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    let mut selectors = vec![format!(
        "involvedObject.kind=TaskRun,involvedObject.name={}",
        tr.name_any()
    )];
    if let Some(job) = tr.status.as_ref().and_then(|s| s.job_name.as_ref()) {
        selectors.push(format!("involvedObject.kind=Job,involvedObject.name={job}"));
    }
    let mut out = Vec::new();
    for s in selectors {
        match api.list(&ListParams::default().fields(&s)).await {
            Ok(l) => out.extend(l.items),
            Err(e) => tracing::info!("listing events ({s}): {e}"),
        }
    }
    out.sort_by_key(event_time);
    let skip = out.len().saturating_sub(EVENTS_SHOWN);
    out.into_iter().skip(skip).collect()
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The describe text.
pub fn describe_text(
    tr: &TaskRun,
    catalog: Option<&Catalog>,
    events: &[Event],
    now: Timestamp,
) -> String {
    let status = tr.status.clone().unwrap_or_default();
    let spec = &tr.spec;
    let mut fields: Vec<(&str, String)> = vec![
        ("Name", tr.name_any()),
        ("Namespace", tr.namespace().unwrap_or_default()),
        ("Task ID", spec.task_id.to_string()),
        ("Service", spec.service_name.clone()),
        ("Phase", or_none(phase_of(tr).map(String::from))),
    ];
    if let Some(c) = &tr.metadata.creation_timestamp {
        fields.push(("Created", format!("{} ({} ago)", c.0, age(c.0, now))));
    }
    if let Some(by) = &status.created_by {
        fields.push(("Created by", crate::output::visible(by)));
    }
    fields.push(("Task", task_summary(tr)));
    let agent = spec.agent.as_ref();
    fields.push((
        "Agent image",
        agent
            .and_then(|a| a.image.clone())
            .unwrap_or_else(|| "(the operator's default)".into()),
    ));
    if let Some(d) = spec.active_deadline_seconds {
        fields.push(("Deadline", format!("{d}s")));
    }
    fields.push((
        "Generation",
        format!(
            "{} (observed by the operator: {})",
            tr.metadata.generation.unwrap_or_default(),
            or_none(status.observed_generation.map(|g| g.to_string()))
        ),
    ));
    fields.push((
        "Context",
        or_none(status.context_version.map(|v| format!("version {v}"))),
    ));
    let shared = status.proxy_mode == Some(ProxyMode::Shared);
    if let Some(mode) = status.proxy_mode {
        fields.push((
            "Proxy",
            match mode {
                ProxyMode::Shared => "shared (the shared proxy Deployment serves this task)".into(),
                ProxyMode::Sidecar => "sidecar (in the task's pod)".into(),
            },
        ));
    }
    if let Some(v) = status.served_context_version {
        let by = if shared {
            "the shared proxy"
        } else {
            "the task pod's proxy"
        };
        fields.push(("Served", format!("version {v} ({by})")));
    }
    fields.push(("Job", or_none(status.job_name.clone())));
    fields.push(("ConfigMap", or_none(status.config_map_name.clone())));
    if let Some(t) = &status.start_time {
        fields.push(("Started", format!("{} ({} ago)", t.0, age(t.0, now))));
    }
    if let Some(t) = &status.completion_time {
        fields.push(("Completed", format!("{} ({} ago)", t.0, age(t.0, now))));
    }
    if let Some(c) = super::result_view::cancellation_line(tr, now) {
        fields.push(("Cancelled", c));
    }
    let mut out = String::new();
    for (k, v) in fields {
        out.push_str(&format!("{:<13}{v}\n", format!("{k}:")));
    }
    out.push_str(&super::result_view::result_section(tr));
    out.push_str(&super::result_view::usage_section(tr));

    out.push_str("Conditions:\n");
    if status.conditions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]);
        for c in &status.conditions {
            t.row(vec![
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(c.last_transition_time.0, now),
                c.message.clone(),
            ]);
        }
        out.push_str(&indent(&t.render()));
    }

    let perms = &spec.tool_config.internal_tools.permissions;
    out.push_str("Tool config:\n");
    out.push_str(&format!(
        "  agent built-in tools: {}\n",
        patterns_summary(&perms.allow, &perms.deny).replace("allow *", "allow all")
    ));
    if spec.tool_config.mcp_servers.is_empty() {
        out.push_str("  MCP servers: <none>\n");
    } else {
        let mut t = Table::new(&["SERVER", "ENABLED", "ALLOW", "DENY"]);
        for s in &spec.tool_config.mcp_servers {
            t.row(vec![
                s.name.clone(),
                if s.enabled { "yes" } else { "no" }.into(),
                if s.tools.allow.is_empty() {
                    "(all)".into()
                } else {
                    s.tools.allow.join(", ")
                },
                s.tools.deny.join(", "),
            ]);
        }
        out.push_str(&indent(&t.render()));
    }

    out.push_str(&effective_text(tr, catalog));
    out.push_str(&history_text(&status));
    if !status.approvals.is_empty() {
        let approvals: Vec<_> = status.approvals.iter().collect();
        out.push_str("Approvals:\n");
        out.push_str(&indent(&super::approve::table(&approvals, now)));
        // What waits for a decision, whole: what a person approves is what they read here.
        for a in approvals
            .iter()
            .filter(|a| a.state == ApprovalState::Pending)
        {
            let ns = tr.namespace().unwrap_or_default();
            out.push_str(&indent(&super::approve::show(a, &ns, &tr.name_any(), now)));
        }
    }

    out.push_str("Events:\n");
    if events.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"]);
        for e in events {
            t.row(vec![
                event_time(e).map(|t| age(t, now)).unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                format!(
                    "{}/{}",
                    e.involved_object
                        .kind
                        .clone()
                        .unwrap_or_default()
                        .to_lowercase(),
                    e.involved_object.name.clone().unwrap_or_default()
                ),
                e.message.clone().unwrap_or_default().trim().to_string(),
            ]);
        }
        out.push_str(&indent(&t.render()));
    }
    out
}

/// Who changed the tools and when: `status.contextHistory`, oldest first.
fn history_text(status: &TaskRunStatus) -> String {
    let mut out = String::from("Context history:\n");
    if status.context_history.is_empty() {
        out.push_str("  <none>\n");
        return out;
    }
    let mut t = Table::new(&["VERSION", "TIME", "BY", "CHANGES"]);
    for e in &status.context_history {
        t.row(vec![
            e.context_version.to_string(),
            e.time.0.to_string(),
            e.who(),
            e.changes(),
        ]);
    }
    out.push_str(&indent(&t.render()));
    out
}

/// Effective tools: the operator's view (status) when it is current, else computed from the
/// spec and the catalog, saying which.
fn effective_text(tr: &TaskRun, catalog: Option<&Catalog>) -> String {
    let (source, lines) = effective_lines(tr, catalog);
    let mut out = format!("Effective tools ({source}):\n");
    for line in lines {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

/// Where the effective tools come from, and one line per server (`server: tools`); what
/// `task describe` and the console show.
pub fn effective_lines(tr: &TaskRun, catalog: Option<&Catalog>) -> (&'static str, Vec<String>) {
    let status = tr.status.clone().unwrap_or_default();
    let current = status.observed_generation.is_some()
        && status.observed_generation == tr.metadata.generation;
    if current && !status.tools.is_empty() {
        let lines = status
            .tools
            .iter()
            .map(|t| {
                let line = match &t.exposed {
                    Some(names) if names.is_empty() => "none".to_string(),
                    Some(names) => names.join(", "),
                    None => patterns_summary(&t.allow, &t.deny),
                };
                format!("{}: {line}", t.server)
            })
            .collect();
        return ("reported by the operator", lines);
    }
    let source = match (current, catalog.is_some()) {
        (false, true) => "computed from the spec and the catalog; the operator has not caught up",
        (true, true) => "computed from the spec and the catalog",
        (_, false) => "from the spec; catalog unavailable",
    };
    let view = effective(&tr.spec.tool_config, catalog, &BTreeMap::new());
    if view.is_empty() {
        return (source, vec!["<none>".into()]);
    }
    let lines = view
        .into_iter()
        .map(|(server, tools)| {
            let line = match tools {
                ServerTools::Off => "off".to_string(),
                ServerTools::Tools { tools } if tools.is_empty() => "none".to_string(),
                ServerTools::Tools { tools } => tools.into_iter().collect::<Vec<_>>().join(", "),
                p @ ServerTools::Patterns { .. } => p.summary(),
            };
            format!("{server}: {line}")
        })
        .collect();
    (source, lines)
}

/// The task line of `task describe`: where the prompt is, and its first line.
pub fn task_summary(tr: &TaskRun) -> String {
    let task = &tr.spec.task;
    if let Some(p) = &task.prompt {
        let first = p
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let first: String = if first.chars().count() > 60 {
            first.chars().take(57).collect::<String>() + "..."
        } else {
            first.to_string()
        };
        let lines = p.lines().count();
        format!(
            "inline, {lines} line{}: {first:?}",
            if lines == 1 { "" } else { "s" }
        )
    } else if let Some(r) = &task.config_map_key_ref {
        format!("ConfigMap {} key {}", r.name, r.key)
    } else if let Some(r) = &task.secret_key_ref {
        format!("Secret {} key {}", r.name, r.key)
    } else {
        "<none>".into()
    }
}
