//! `task add-context`: change a running task's tools, safely under concurrent writers.
//!
//! Each attempt reads the TaskRun, computes the new `spec.toolConfig.mcpServers` from what it
//! read, and writes it with a JSON Patch whose first operation *tests* that the list is still
//! exactly what was read. The API server applies the patch atomically: if another writer
//! changed the server list in between (a concurrent add-context, a `kubectl edit`), the test
//! fails (422), and the attempt starts over from a fresh read. Nothing is ever computed from a
//! stale read, so concurrent add-context calls never undo each other.
//!
//! Why not a `resourceVersion` precondition: that fails on *any* write to the object, and the
//! operator writes status all the time; under a busy writer the CLI starved (seen in the
//! concurrency test). The test operation is a precondition on exactly what the computation
//! used. Why not server-side apply: add-context also *removes* entries (an allow pattern, a
//! deny pattern lifted by an enable), and apply can only remove what its own field manager
//! applied before; entries written by `kubectl apply` or another user would stay.
//!
//! Only the server list is replaced, and each existing entry is rewritten from its raw JSON with
//! only `enabled`, `tools.allow` and `tools.deny` changed, so fields this CLI version does not
//! know (a newer CRD) survive.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::condition::CallCondition;
use orchestrator_crds::taskrun::{McpServer, TaskRun};
use serde::Serialize;
use serde_json::{Value, json};

use crate::args::{AddContextArgs, Global};
use crate::catalog;
use crate::conditions::{CONDITIONS, conditions_ops, read_conditions};
use crate::connect::{Cluster, connect};
use crate::effective::{ServerChange, ServerTools, diff};
use crate::error::{Error, Result, is_not_found};
use crate::identity;
use crate::merge::{self, Request};
use crate::output::{self, Format};
use crate::toolspec::{catalog_notes, check_servers, parse_specs};
use crate::wait;

/// The CLI's field manager (shows in managedFields).
pub const FIELD_MANAGER: &str = "orchestrator-cli";

/// Attempts before giving up on a hot object (with the backoff below, about 8 s in all).
const MAX_ATTEMPTS: u32 = 12;

/// What add-context did, as printed with `-o json|yaml`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub name: String,
    pub namespace: String,
    /// Whether the tool config changed (false: already as asked, nothing written).
    pub changed: bool,
    pub dry_run: bool,
    /// `metadata.generation` after the write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Writes tried (more than 1: someone else wrote concurrently and we retried).
    pub attempts: u32,
    /// Per server, the tools before and after.
    pub servers: Vec<ServerChange>,
    /// With --budget: `spec.budget` before and after (null: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<FieldChange>,
    /// With --conditions: `spec.toolConfig.policy.conditions` before and after (null: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<FieldChange>,
    /// With --wait-synced: the context version the operator rendered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_version: Option<i64>,
    /// With --wait-synced: the context version the task pod's proxy serves, when it reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_context_version: Option<i64>,
    /// What a person should know about the change (a finished task, every tool revoked, a
    /// pattern that matches nothing); the CLI prints them on stderr.
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// A field (`spec.budget`, the conditions) before and after an add-context.
#[derive(Clone, Debug, Serialize)]
pub struct FieldChange {
    pub before: Value,
    pub after: Value,
}

/// Runs `task add-context`.
pub async fn run(global: &Global, args: &AddContextArgs) -> Result<()> {
    let request = Request {
        enable: parse_specs("--enable-tools", &args.enable_tools)?,
        disable: parse_specs("--disable-tools", &args.disable_tools)?,
    };
    let conditions = args
        .conditions
        .as_deref()
        .map(read_conditions)
        .transpose()?;
    if request.enable.is_empty()
        && request.disable.is_empty()
        && args.budget.is_empty()
        && conditions.is_none()
    {
        return Err(Error::Usage(
            "nothing to change: give --enable-tools, --disable-tools, --budget and/or --conditions"
                .into(),
        ));
    }
    merge::check_contradictions(&request)?;

    // A catalog file is checked before connecting; the ConfigMap needs the connection.
    let local = catalog::load_local(global)?;
    if let Some(catalog) = &local {
        print_notes(&check_request(catalog, &request)?);
    }
    let cluster = connect(global).await?;
    let catalog = match local {
        Some(c) => c,
        None => {
            let c = catalog::load(global, Some(&cluster)).await?;
            print_notes(&check_request(&c, &request)?);
            c
        }
    };
    let name = match &args.task.name {
        Some(name) => name.clone(),
        None => super::resolve(&cluster, &args.task)
            .await?
            .metadata
            .name
            .unwrap_or_default(),
    };

    let user = match args.dry_run {
        true => None,
        false => identity::whoami(&cluster.client).await,
    };
    let change = Change {
        request: &request,
        budget: &args.budget,
        conditions: conditions.as_deref(),
    };
    let mut report = update_all(
        &cluster,
        &name,
        &change,
        &catalog,
        args.dry_run,
        user.as_deref(),
    )
    .await?;
    print_notes(&report.notes);

    if args.wait_synced {
        let generation = report.generation.unwrap_or(0);
        let synced =
            wait::until_synced(&super::api(&cluster), &name, generation, args.timeout).await?;
        report.context_version = synced.context_version;
        report.served_context_version = synced.served;
    }
    let text = match &global.output {
        Format::Table | Format::Wide => render_report(&report),
        f => output::render(f, &report)?,
    };
    output::print(&text)
}

fn print_notes(notes: &[String]) {
    for n in notes {
        output::note(n);
    }
}

/// Every server must be in the catalog; tool names it does not list get a note (returned).
pub fn check_request(catalog: &Catalog, request: &Request) -> Result<Vec<String>> {
    check_servers(
        catalog,
        request
            .enable
            .iter()
            .map(|s| ("--enable-tools", s))
            .chain(request.disable.iter().map(|s| ("--disable-tools", s))),
    )?;
    Ok(catalog_notes(catalog, &request.enable))
}

/// The read-compute-write loop, guarded by a JSON Patch `test` of the server list; `user` (who
/// the API server says we are) goes into the `orchestrator.io/requested-by` annotation.
pub async fn update(
    cluster: &Cluster,
    name: &str,
    request: &Request,
    catalog: &Catalog,
    dry_run: bool,
    user: Option<&str>,
) -> Result<Report> {
    let change = Change {
        request,
        budget: &[],
        conditions: None,
    };
    update_all(cluster, name, &change, catalog, dry_run, user).await
}

/// What one add-context changes: the tools, `spec.budget` (`--budget`,
/// [`crate::budget::parse`]) and the conditions, each tested as the server list is.
pub struct Change<'a> {
    pub request: &'a Request,
    /// `--budget`.
    pub budget: &'a [(String, Value)],
    /// `--conditions`: the new list, checked.
    pub conditions: Option<&'a [CallCondition]>,
}

/// [`update`] with every change one add-context may make.
pub async fn update_all(
    cluster: &Cluster,
    name: &str,
    change: &Change<'_>,
    catalog: &Catalog,
    dry_run: bool,
    user: Option<&str>,
) -> Result<Report> {
    let (request, budget) = (change.request, change.budget);
    let resource = ApiResource::erase::<TaskRun>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), &cluster.namespace, &resource);
    let ns = &cluster.namespace;
    let mut notes = Vec::new();
    for attempt in 1..=MAX_ATTEMPTS {
        let raw = api.get(name).await.map_err(|e| {
            if is_not_found(&e) {
                Error::NotFound(format!("TaskRun {name} not found in namespace {ns}"))
            } else {
                Error::kube(format!("getting TaskRun {name}"), e)
            }
        })?;
        let current: TaskRun = serde_json::to_value(&raw)
            .and_then(serde_json::from_value)
            .map_err(|e| Error::Cluster(format!("TaskRun {name} does not parse: {e}")))?;
        if attempt == 1
            && let Some(phase) = current.status.as_ref().and_then(|s| s.phase)
            && phase.is_terminal()
        {
            notes.push(format!(
                "TaskRun {name} has finished ({}); the change is recorded but no agent will see it",
                phase.as_str()
            ));
        }
        let before = &current.spec.tool_config;
        let outcome = merge::apply(before, request, catalog)?;
        let tools_changed = outcome.config != *before;
        let budget_before = raw
            .data
            .pointer("/spec/budget")
            .cloned()
            .unwrap_or(Value::Null);
        let budget_after = crate::budget::apply(raw.data.pointer("/spec/budget"), budget);
        let budget_changed = !budget.is_empty() && budget_after != budget_before;
        let conditions_before = raw.data.pointer(CONDITIONS).cloned().unwrap_or(Value::Null);
        let conditions_after = match change.conditions {
            Some([]) => Value::Null,
            Some(list) => serde_json::to_value(list).unwrap_or(Value::Null),
            None => conditions_before.clone(),
        };
        let conditions_changed = conditions_after != conditions_before;
        let changed = tools_changed || budget_changed || conditions_changed;
        if tools_changed {
            check_servers_in_pod(&current, &outcome.config.mcp_servers, catalog)?;
            if merge::nothing_enabled(&outcome.config) {
                notes.push(format!(
                    "TaskRun {name} is offered no MCP tool now (every tool revoked); its agent keeps \
                     its built-in tools"
                ));
            }
        }
        let mut generation = raw.metadata.generation;
        if changed && !dry_run {
            let mut patch = guarded_patch(&raw, &outcome.config.mcp_servers, user);
            if budget_changed {
                patch.0.extend(budget_ops(&budget_before, &budget_after));
            }
            if conditions_changed {
                patch.0.extend(conditions_ops(
                    &raw.data,
                    &conditions_before,
                    &conditions_after,
                ));
            }
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..Default::default()
            };
            match api.patch(name, &params, &Patch::<()>::Json(patch)).await {
                Ok(written) => generation = written.metadata.generation,
                Err(e) if lost_race(&api, name, &e, &raw).await => {
                    tracing::info!(
                        attempt,
                        "the tools of TaskRun {name} changed since they were read; retrying"
                    );
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                Err(e) => {
                    return Err(Error::kube(
                        format!("updating the tools of TaskRun {name}"),
                        e,
                    ));
                }
            }
        }
        notes.extend(outcome.notes.iter().cloned());
        return Ok(Report {
            name: name.to_string(),
            namespace: ns.clone(),
            changed,
            dry_run,
            generation,
            attempts: attempt,
            servers: diff(before, &outcome.config, Some(catalog)),
            budget: (!budget.is_empty()).then_some(FieldChange {
                before: budget_before,
                after: budget_after,
            }),
            conditions: change.conditions.map(|_| FieldChange {
                before: conditions_before,
                after: conditions_after,
            }),
            context_version: None,
            served_context_version: None,
            notes,
        });
    }
    Err(Error::Cluster(format!(
        "TaskRun {name} kept changing under us: gave up after {MAX_ATTEMPTS} conflicting writes; try again"
    )))
}

/// Each stdio server runs in its own container of the task's pod, made with the pod: once the
/// operator has created the Job (`status.jobName`), a stdio server the TaskRun did not list
/// cannot be added (the operator would report `ServerNotInPod`), so nothing is written.
pub fn check_servers_in_pod(tr: &TaskRun, after: &[McpServer], catalog: &Catalog) -> Result<()> {
    if tr.status.as_ref().is_none_or(|s| s.job_name.is_none()) {
        return Ok(());
    }
    let listed = &tr.spec.tool_config.mcp_servers;
    let added: Vec<&str> = after
        .iter()
        .filter(|s| !listed.iter().any(|l| l.name == s.name))
        .filter(|s| catalog.get(&s.name).is_some_and(|c| c.stdio.is_some()))
        .map(|s| s.name.as_str())
        .collect();
    let Some(first) = added.first() else {
        return Ok(());
    };
    let name = tr.metadata.name.as_deref().unwrap_or("the task");
    let has: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    Err(Error::Usage(format!(
        "cannot add server {} to TaskRun {name}: its pod was created with the servers it lists ({}), \
         and each runs in its own container, which cannot be added to a running pod. Nothing was \
         changed. To use {first}, submit a new task that lists it: `orchestrator-cli task submit \
         ... --tools {first}:<tool>`, or `--with-servers {first}` to enable its tools later with \
         add-context (in a TaskRun: `{{name: {first}, enabled: false}}` in spec.toolConfig.mcpServers)",
        added.join(", "),
        has.join(", ")
    )))
}

/// The JSON Patch: test that the server list is still what was read, then replace it. With a
/// `user`, also test that the generation is still the one read and write the requested-by
/// annotation naming the next one (the generation this write makes: no other spec write can
/// come between).
pub fn guarded_patch(
    read: &DynamicObject,
    servers: &[McpServer],
    user: Option<&str>,
) -> json_patch::Patch {
    let data = &read.data;
    let new = patched_servers(data, servers);
    let mut ops = match data.pointer("/spec/toolConfig") {
        // A missing list tests as null (RFC 6902 leaves this open; the API server's
        // json-patch treats a missing member as null).
        Some(tc) if tc.is_object() => vec![
            json!({"op": "test", "path": "/spec/toolConfig/mcpServers",
             "value": tc.get("mcpServers").cloned().unwrap_or(Value::Null)}),
            json!({"op": "add", "path": "/spec/toolConfig/mcpServers", "value": new}),
        ],
        _ => vec![
            json!({"op": "test", "path": "/spec/toolConfig", "value": Value::Null}),
            json!({"op": "add", "path": "/spec/toolConfig", "value": {"mcpServers": new}}),
        ],
    };
    if let (Some(user), Some(generation)) = (user, read.metadata.generation) {
        ops.insert(
            1,
            json!({"op": "test", "path": "/metadata/generation", "value": generation}),
        );
        let meta = json!({"metadata": {"annotations": read.metadata.annotations}});
        ops.extend(identity::annotation_ops(&meta, user, generation + 1));
    }
    // The ops are built above from known shapes; they always deserialize.
    serde_json::from_value(Value::Array(ops)).unwrap_or_else(|_| json_patch::Patch(Vec::new()))
}

/// The JSON Patch operations that test `spec.budget` is still `before` (a missing one tests as
/// null) and write `after` (null: remove it).
pub fn budget_ops(before: &Value, after: &Value) -> Vec<json_patch::PatchOperation> {
    let mut ops = vec![json!({"op": "test", "path": "/spec/budget", "value": before})];
    match (before.is_null(), after.is_null()) {
        (_, false) => ops.push(json!({"op": "add", "path": "/spec/budget", "value": after})),
        (false, true) => ops.push(json!({"op": "remove", "path": "/spec/budget"})),
        (true, true) => {}
    }
    // Built above from known shapes: they always deserialize.
    ops.into_iter()
        .filter_map(|op| serde_json::from_value(op).ok())
        .collect()
}

/// Whether a refused write lost a race: a 409 (a conflict the API server did not retry
/// itself), or a 422 while what the patch tested is no longer what was read. The API server
/// reports a failed test operation only as a generic 422 "Invalid" without details, so the
/// object is read again to tell a lost race from a real refusal (a CEL rule, say), which is
/// reported.
async fn lost_race(
    api: &Api<DynamicObject>,
    name: &str,
    e: &kube::Error,
    read: &DynamicObject,
) -> bool {
    match e {
        kube::Error::Api(s) if s.code == 409 => true,
        kube::Error::Api(s) if s.code == 422 => match api.get(name).await {
            Ok(now) => tested(&now) != tested(read),
            Err(_) => false,
        },
        _ => false,
    }
}

/// What the patch tests: the server list, the budget, the conditions, the generation, whether
/// there are annotations.
fn tested(
    obj: &DynamicObject,
) -> (
    Option<&Value>,
    Option<&Value>,
    Option<&Value>,
    Option<i64>,
    bool,
) {
    (
        obj.data.pointer("/spec/toolConfig/mcpServers"),
        obj.data.pointer("/spec/budget"),
        obj.data.pointer(CONDITIONS),
        obj.metadata.generation,
        obj.metadata.annotations.is_some(),
    )
}

/// Doubles from 20 ms up to 1 s, plus up to 20 ms of jitter so that two retrying writers do
/// not collide again in lockstep.
fn backoff(attempt: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 20_000_000)
        .unwrap_or(0);
    let base = (20u64 << attempt.saturating_sub(1).min(6)).min(1000);
    Duration::from_millis(base) + Duration::from_nanos(u64::from(jitter))
}

/// The new `mcpServers` array: existing entries keep their raw JSON (unknown fields included)
/// with `enabled`, `tools.allow` and `tools.deny` replaced; new entries are serialized whole.
pub fn patched_servers(data: &Value, servers: &[McpServer]) -> Value {
    let existing = data
        .pointer("/spec/toolConfig/mcpServers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let out = servers
        .iter()
        .map(|s| {
            let old = existing
                .iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(s.name.as_str()));
            match old {
                Some(old) => {
                    let mut entry = old.clone();
                    entry["enabled"] = json!(s.enabled);
                    if !entry.get("tools").is_some_and(Value::is_object) {
                        entry["tools"] = json!({});
                    }
                    for (key, list) in [("allow", &s.tools.allow), ("deny", &s.tools.deny)] {
                        if let Some(tools) = entry["tools"].as_object_mut() {
                            if list.is_empty() {
                                tools.remove(key);
                            } else {
                                tools.insert(key.to_string(), json!(list));
                            }
                        }
                    }
                    entry
                }
                None => serde_json::to_value(s).unwrap_or(Value::Null),
            }
        })
        .collect();
    Value::Array(out)
}

/// The before → after text: per server a summary line, then its tools marked `+` (added),
/// `-` (removed) or unmarked (kept).
pub fn render_report(r: &Report) -> String {
    let mut out = format!(
        "TaskRun {} in namespace {}: tools before → after\n",
        r.name, r.namespace
    );
    if r.servers.is_empty() {
        out.push_str("  (no MCP servers)\n");
    }
    for c in &r.servers {
        if c.changed() {
            out.push_str(&format!(
                "{}: {} → {}\n",
                c.server,
                c.before.summary(),
                c.after.summary()
            ));
        } else {
            out.push_str(&format!(
                "{}: {} (unchanged)\n",
                c.server,
                c.after.summary()
            ));
        }
        let names = |t: &ServerTools| match t {
            ServerTools::Tools { tools } => tools.iter().cloned().collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let mut all: Vec<String> = names(&c.before);
        all.extend(names(&c.after));
        all.sort();
        all.dedup();
        for tool in all {
            let mark = if c.added.contains(&tool) {
                '+'
            } else if c.removed.contains(&tool) {
                '-'
            } else {
                ' '
            };
            out.push_str(&format!("  {mark} {tool}\n"));
        }
    }
    if let Some(c) = &r.conditions {
        out.push_str(&format!(
            "conditions: {}\n",
            crate::conditions::describe(&c.before, &c.after)
        ));
    }
    if let Some(b) = &r.budget {
        out.push_str(&format!(
            "budget: {}\n",
            crate::budget::describe(&b.before, &b.after)
        ));
    }
    let retried = if r.attempts > 1 {
        format!(" after {} attempts (concurrent writers)", r.attempts)
    } else {
        String::new()
    };
    match (r.dry_run, r.changed) {
        (true, true) => out.push_str("dry run: nothing written\n"),
        (_, false) if r.budget.is_some() => {
            out.push_str("no change: the task already has these tools and this budget\n")
        }
        (_, false) => out.push_str("no change: the task already has these tools\n"),
        (false, true) => out.push_str(&format!(
            "updated: generation {}{retried}\n",
            r.generation.unwrap_or_default()
        )),
    }
    if let Some(v) = r.context_version {
        out.push_str(&format!(
            "synced: the operator rendered context version {v}\n"
        ));
    }
    if let Some(v) = r.served_context_version {
        out.push_str(&format!(
            "served: the task pod's proxy serves context version {v}\n"
        ));
    }
    out
}
