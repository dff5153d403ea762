//! `task cancel` and `task delete`.
//!
//! Cancel writes the annotation `orchestrator.io/cancel` = `{"user":"<caller>"}` (the caller as
//! a SelfSubjectReview names them; the chart's admission policy refuses any other user, and any
//! change once set) with a JSON Patch whose `test` operations make the write conditional: the
//! annotation is still absent (two cancels never overwrite each other, the first name stands)
//! and the phase is still the one read (a task that finished meanwhile is not annotated). A lost
//! race is read again and decided again. The operator does the rest (stops the Job, writes
//! `phase: Cancelled` and `status.cancellation`).

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::result::{CANCEL_ANNOTATION, CancelRequest};
use orchestrator_crds::taskrun::{Phase, TaskRun};
use serde_json::{Value, json};

use crate::args::{CancelArgs, DeleteArgs, Global};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result, is_not_found};
use crate::{identity, output, wait};

/// How often a cancel is read and tried again after losing a race.
const ATTEMPTS: usize = 5;

/// The field manager of the CLI's writes.
const FIELD_MANAGER: &str = "orchestrator-cli";

/// JSON Patch escaping of one path segment (RFC 6901).
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// The cancel patch for the object as read (`data`, its JSON): tests that the annotation is
/// absent (or, with no annotations at all, that there are none) and that `status.phase` is
/// still what was read, then adds the annotation naming `user`.
pub fn cancel_patch(data: &Value, user: &str) -> Vec<Value> {
    let value = CancelRequest::annotation_value(user);
    let mut ops = Vec::new();
    // The phase as read (null: none yet; with no status at all, that there is none).
    let phase = match data.pointer("/status") {
        Some(status) if status.is_object() => "/status/phase",
        _ => "/status",
    };
    let read = data
        .pointer("/status/phase")
        .cloned()
        .unwrap_or(Value::Null);
    ops.push(json!({"op": "test", "path": phase, "value": read}));
    match data.pointer("/metadata/annotations") {
        Some(a) if a.is_object() => {
            let path = format!(
                "/metadata/annotations/{}",
                pointer_segment(CANCEL_ANNOTATION)
            );
            // A test for null on a missing member succeeds (the API server's JSON Patch), and
            // fails once another cancel has written it.
            ops.push(json!({"op": "test", "path": path, "value": Value::Null}));
            ops.push(json!({"op": "add", "path": path, "value": value}));
        }
        _ => {
            ops.push(json!({"op": "test", "path": "/metadata/annotations", "value": Value::Null}));
            ops.push(json!({"op": "add", "path": "/metadata/annotations",
                "value": {CANCEL_ANNOTATION: value}}));
        }
    }
    ops
}

/// What to do with a TaskRun as read: `Ok(None)` write the cancel; `Ok(Some(who))` someone
/// asked already; `Err` it has finished.
pub fn check_cancellable(tr: &TaskRun) -> Result<Option<String>> {
    let name = tr.name_any();
    let phase = tr.status.as_ref().and_then(|s| s.phase);
    if let Some(p) = phase.filter(|p| p.is_terminal()) {
        let by = tr
            .status
            .as_ref()
            .and_then(|s| s.cancellation.as_ref())
            .map(|c| format!(" (by {})", c.requested_by))
            .unwrap_or_default();
        return Err(Error::Failed(format!(
            "TaskRun {name} has finished: its phase is {}{by}; there is nothing to cancel and nothing was written",
            p.as_str()
        )));
    }
    Ok(tr
        .annotations()
        .get(CANCEL_ANNOTATION)
        .map(|v| CancelRequest::parse(v).user))
}

/// `task cancel`.
pub async fn cancel(global: &Global, args: &CancelArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task).await?;
    let name = tr.name_any();
    let api = super::api(&cluster);
    match request_cancel(&cluster, &api, tr).await? {
        Asked::ByMe(me) => output::print(&format!(
            "cancel requested: TaskRun {name}, by {me}; the operator stops its Job\n"
        ))?,
        Asked::Already(who) => output::note(&format!(
            "TaskRun {name}: {who} asked to cancel it already; nothing was written"
        )),
    }
    if !args.wait {
        return Ok(());
    }
    let phase = wait::until_finished(&api, &name, args.timeout).await?;
    if phase != Phase::Cancelled {
        return Err(Error::Failed(format!(
            "TaskRun {name} finished {} before the operator cancelled it (see `orchestrator-cli task describe {name}`)",
            phase.as_str()
        )));
    }
    Ok(())
}

/// What a cancel request came to.
pub enum Asked {
    /// This caller wrote the annotation (their name).
    ByMe(String),
    /// Someone had asked already (their name); nothing was written.
    Already(String),
}

/// Writes the cancel annotation in the caller's name, unless the task has finished (an error)
/// or someone asked already.
pub async fn request_cancel(
    cluster: &Cluster,
    api: &Api<TaskRun>,
    first: TaskRun,
) -> Result<Asked> {
    let name = first.name_any();
    if let Some(who) = check_cancellable(&first)? {
        return Ok(Asked::Already(who));
    }
    let Some(me) = identity::whoami(&cluster.client).await else {
        return Err(Error::Cluster(format!(
            "the API server did not say who you are (SelfSubjectReview), which a cancel must name; nothing was written to TaskRun {name}"
        )));
    };
    let mut tr = first;
    for _ in 0..ATTEMPTS {
        let data = serde_json::to_value(&tr)
            .map_err(|e| Error::Cluster(format!("reading TaskRun {name}: {e}")))?;
        let patch = Patch::Json::<()>(
            serde_json::from_value(Value::Array(cancel_patch(&data, &me)))
                .map_err(|e| Error::Cluster(format!("building the cancel patch: {e}")))?,
        );
        let params = PatchParams::default();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..params
        };
        match api.patch(&name, &params, &patch).await {
            Ok(_) => return Ok(Asked::ByMe(me)),
            // A failed test: someone else wrote first. Read again and decide again.
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => {
                tr = super::get_named(cluster, &name).await?;
                if let Some(who) = check_cancellable(&tr)? {
                    return Ok(Asked::Already(who));
                }
            }
            Err(e) => {
                return Err(Error::kube(
                    format!(
                        "writing {CANCEL_ANNOTATION} to TaskRun {name} in namespace {} as {me}",
                        cluster.namespace
                    ),
                    e,
                ));
            }
        }
    }
    Err(Error::Cluster(format!(
        "TaskRun {name} kept changing while writing {CANCEL_ANNOTATION} ({ATTEMPTS} tries); try again"
    )))
}

/// `task delete`.
pub async fn delete(global: &Global, args: &DeleteArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task).await?;
    let name = tr.name_any();
    let api = super::api(&cluster);
    let action = format!("deleting TaskRun {name} in namespace {}", cluster.namespace);
    let deleted = api
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| Error::kube(action.clone(), e))?;
    output::print(&format!("taskrun {name} deleted\n"))?;
    if !args.wait {
        return Ok(());
    }
    let uid = deleted
        .left()
        .and_then(|o| o.metadata.uid)
        .or(tr.metadata.uid)
        .unwrap_or_default();
    let gone = kube::runtime::wait::await_condition(
        api.clone(),
        &name,
        kube::runtime::wait::conditions::is_deleted::<TaskRun>(&uid),
    );
    let gone = async {
        gone.await
            .map(|_| ())
            .map_err(|e| Error::Cluster(format!("waiting for TaskRun {name} to go: {e}")))
    };
    let Some(after) = args.timeout else {
        return gone.await;
    };
    match tokio::time::timeout(after, gone).await {
        Ok(done) => done,
        Err(_) => Err(Error::Timeout {
            what: format!(
                "TaskRun {name} to be gone (its finalizers: {})",
                finalizers(&api, &name).await
            ),
            after,
        }),
    }
}

async fn finalizers(api: &Api<TaskRun>, name: &str) -> String {
    match api.get(name).await {
        Ok(tr) if tr.finalizers().is_empty() => "none".into(),
        Ok(tr) => tr.finalizers().join(", "),
        Err(e) if is_not_found(&e) => "none; it is gone now".into(),
        Err(_) => "unknown".into(),
    }
}
