//! Cancelling a task (docs/api.md, "Cancelling a task"): `orchestrator-cli task cancel` sets the
//! [`CANCEL_ANNOTATION`] (`{"user":"alice"}`; the chart's admission policy makes the user the
//! caller). On an unfinished TaskRun the operator deletes its Job (propagation Background: the
//! pod is stopped) and records `phase: Cancelled`, `completionTime`, `status.cancellation` and
//! `Succeeded=False` (reason `Cancelled`, "cancelled by USER"); the status write publishes the
//! event `Cancelled`. The recorded phase is terminal, so no Job is ever created for it again,
//! and retention counts from its completion time. A task that already finished (its Job says
//! so, or its status) is left as it is. A shared task's ConfigMap in the shared proxy's
//! namespace is marked `Terminating` and deleted first (see `shared.rs`).

use kube::api::{DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::{
    CancelRequest, Cancellation, Phase, TaskRun, TaskRunStatus, conditions as ct,
    result::CANCEL_ANNOTATION,
};

use crate::error::Result;
use crate::reconcile::context::Context;
use crate::reconcile::facts::{CachedJob, Observed};
use crate::reconcile::placement::Placement;
use crate::reconcile::status::{self, Cond};
use crate::reconcile::steps::status_write::{Tools, write_status};

/// Who asked to cancel the task, when its annotation is set.
pub fn requested(tr: &TaskRun) -> Option<CancelRequest> {
    tr.annotations()
        .get(CANCEL_ANNOTATION)
        .map(|v| CancelRequest::parse(v))
}

/// Cancels an unfinished task: its Job (when it has one) is deleted first, then the outcome is
/// recorded; a failed write is retried with the Job already gone (never created again: the
/// cancel is looked at before anything is applied).
pub async fn carry_out(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    request: CancelRequest,
) -> Result<Action> {
    let job_existed = seen.job.is_some();
    // A shared task: the shared proxy stops serving its token first (its ConfigMap says
    // `Terminating`, then goes), before the pod is stopped.
    if let Some(placement) = Placement::recorded(&seen.previous, seen.job.as_deref()) {
        placement.end(ctx, seen, true).await?;
    }
    if let Some(job) = &seen.job {
        let jobs: Api<CachedJob> = Api::namespaced(ctx.client.clone(), &seen.ns);
        let mut params = DeleteParams::background();
        // Only the TaskRun's own Job (a Job of the same name made since is not touched).
        params.preconditions = job.uid.as_deref().map(|uid| Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        });
        match jobs.delete(&seen.name, &params).await {
            Ok(_) => {}
            // Gone already (the cache lags behind a deletion), or replaced (409 on the uid).
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(taskrun = %seen.name, user = %request.user, "cancelled: deleted the task's Job");
    }
    let now = status::now();
    let previous = &seen.previous;
    let start = seen
        .job_state
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .or_else(|| previous.start_time.clone());
    let message = format!("cancelled by {}", request.user);
    let mut wanted = vec![Cond::no(ct::SUCCEEDED, ct::CANCELLED, message)];
    if job_existed || previous.job_name.is_some() {
        wanted.push(status::job_created_cond(
            &seen.name,
            false,
            true,
            Some(Phase::Cancelled),
        ));
    }
    let generation = tr.metadata.generation;
    let mut conditions = previous.conditions.clone();
    for cond in status::conditions(wanted, &previous.conditions, generation, &now) {
        match conditions.iter_mut().find(|c| c.type_ == cond.type_) {
            Some(old) => *old = cond,
            None => conditions.push(cond),
        }
    }
    let status = TaskRunStatus {
        observed_generation: generation,
        phase: Some(Phase::Cancelled),
        start_time: start,
        completion_time: Some(now.clone()),
        cancellation: Some(Cancellation {
            requested_by: request.user,
            time: now,
        }),
        conditions,
        // Written on their own, under their own field manager (`approvals.rs`).
        approvals: Vec::new(),
        ..previous.clone()
    };
    write_status(tr, ctx, previous, status, Tools::Carried).await?;
    // The outcome is recorded: the status write brings the next reconcile, a finished task's
    // (its retention).
    Ok(Action::await_change())
}
