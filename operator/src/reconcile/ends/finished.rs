//! A task whose outcome is recorded in its status (and whose spec has not changed since): its pod
//! is done, so its config is not rendered or written again; what is left is its retention: the
//! Job's `ttlSecondsAfterFinished`, the TaskRun's own retention, and `JobCreated` saying when the
//! Job is gone. Reads only the cache (the task text is not even cached for it, see `trim.rs`).

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use orchestrator_crds::approval::ApprovalState;
use orchestrator_crds::taskrun::{Phase, TaskRun, TaskRunStatus, conditions as ct};

use super::retention;
use crate::error::{Error, Result};
use crate::reconcile::context::Context;
use crate::reconcile::placement::shared;
use crate::reconcile::steps::job::expire_job;
use crate::reconcile::steps::status_write::{Tools, write_status};
use crate::reconcile::ttl::{self, Ttl};
use crate::reconcile::{approvals, status};

/// Whether the TaskRun's outcome is recorded and its spec has not changed since (a changed
/// spec is rendered again, as an unfinished task's).
pub fn recorded(tr: &TaskRun, previous: &TaskRunStatus) -> bool {
    previous.phase.is_some_and(Phase::is_terminal)
        && tr.metadata.generation == previous.observed_generation
}

/// Reconciles a TaskRun whose recorded phase is terminal and whose `observedGeneration` is its
/// generation.
pub async fn tidy(tr: &TaskRun, ctx: &Context, previous: &TaskRunStatus) -> Result<Action> {
    let ns = tr.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = tr.name_any();
    let now = status::now();

    let retention = tr
        .spec
        .retention_seconds_after_finished
        .map(i64::from)
        .or(ctx.retention_seconds.map(i64::from));
    let kept = ttl::decide_taskrun(retention, previous, now.0);
    if kept == Ttl::Delete {
        retention::delete(&ctx.client, tr, retention::RETENTION, &ctx.metrics).await?;
        return Ok(Action::await_change());
    }

    // No read on a cache miss: nothing is created for a finished task. But when the operator
    // starts, the TaskRun cache fills before the Job cache: a miss says the Job is gone only
    // once the Job cache holds its first list.
    if ctx.jobs.wait_until_ready().await.is_err() {
        return Ok(Action::await_change()); // shutting down: the Job watch is gone
    }
    let uid = tr.uid().unwrap_or_default();
    // A shared task's ConfigMap still there (the operator stopped between recording the outcome
    // and deleting it): it goes now.
    shared::delete_left_over(ctx, &ns, &name).await?;
    let job = ctx.jobs.get(&ns, &name).filter(|j| j.controlled_by(&uid));
    let state = job.as_ref().map(|j| j.state.clone());
    let (wait, deleted) = expire_job(tr, ctx, &ns, state.as_ref(), previous, &now).await?;

    // Only JobCreated can change: the Job goes after its TTL (or was deleted). A cancelled
    // task's says so already (`cancel.rs`), while the deleted Job may still be in the cache.
    let mut conditions = previous.conditions.clone();
    let exists = job.is_some() && !deleted;
    let wanted = status::job_created_cond(&name, exists, true, previous.phase);
    let generation = tr.metadata.generation;
    let cancelled = previous.phase == Some(Phase::Cancelled);
    if let Some(cond) = status::conditions(vec![wanted], &conditions, generation, &now)
        .pop()
        .filter(|_| !cancelled)
    {
        match conditions.iter_mut().find(|c| c.type_ == ct::JOB_CREATED) {
            Some(old) => *old = cond,
            None => conditions.push(cond),
        }
    }
    let status = TaskRunStatus {
        conditions,
        // Written on their own, under their own field manager (`approvals.rs`).
        approvals: Vec::new(),
        ..previous.clone()
    };
    write_status(tr, ctx, previous, status, Tools::Carried).await?;
    // A call still listed pending (the operator stopped between recording the outcome and
    // withdrawing it, or an older one never did): nobody can decide it any more. Its ConfigMap
    // is not written: the pod is done.
    if previous
        .approvals
        .iter()
        .any(|a| a.state == ApprovalState::Pending)
    {
        approvals::sync(ctx, tr, previous, None, false).await?;
    }

    let next = [wait, kept.wait()].into_iter().flatten().min();
    Ok(next.map_or_else(Action::await_change, |d: Duration| Action::requeue(d)))
}
