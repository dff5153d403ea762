//! The reconciler: renders a TaskRun (pure, [`crate::render`]) and applies the result with
//! server-side apply under one field manager; writes the status the same way; emits events
//! through the events API. No finalizers: children carry a controller owner reference, so the
//! garbage collector removes them with the TaskRun, and `.owns()` brings back a deleted child.
//!
//! The Job is created once and never written again (its pod template is immutable); a change of
//! `toolConfig` only re-renders the ConfigMap and bumps `status.contextVersion`.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! `facts` (what the reconciler reads of the world, kept between reconciles), `context` (what
//! every step shares: the client, the facts' indexes, `apply`, when to look again), `trim`
//! (the TaskRun as cached), `status` (its parts, pure), `events` (on a TaskRun), `taken` (a
//! child's name taken by an object that is not the TaskRun's: the operator adopts nothing),
//! `ttl`, `version`, `inputs` (what a pod needs), `approvals` (`status.approvals` and the
//! verdicts), `placement` (where the task's proxy runs, and everything that differs by it);
//! `steps` (the steps [`run_steps`] takes in turn), `ends` (a cancel, a finished task, the
//! retention); `tests`.

pub mod approvals;
pub mod context;
pub mod ends;
mod events;
pub mod facts;
mod inputs;
pub mod placement;
pub mod status;
pub mod steps;
mod taken;
mod trim;
mod ttl;
mod version;

#[cfg(test)]
mod tests;

pub use context::{Context, MANAGER};
pub use ends::retention;
pub use facts::{CachedJob, ConfigMapFacts, Index, JobFacts};
pub use trim::trim_taskrun;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;
use orchestrator_crds::taskrun::TaskRun;
use tracing::{Instrument, field};

use crate::error::{Error, Result};
use context::soonest;
use ends::{cancel, finished};
use steps::{config, history, job, observe, refuse, status_write};

/// The value of a step that may refuse the TaskRun (`steps/refuse.rs`), else the reconcile
/// ends with the action the refusal chose.
macro_rules! unless_refused {
    ($step:expr) => {
        match $step? {
            ControlFlow::Continue(value) => value,
            ControlFlow::Break(action) => return Ok(action),
        }
    };
}

/// Reconciles one TaskRun; a span per call (exported over OTLP when configured).
pub async fn reconcile(tr: Arc<TaskRun>, ctx: Arc<Context>) -> Result<Action> {
    let span = tracing::info_span!(
        "reconcile",
        taskrun = %format!("{}/{}", tr.namespace().unwrap_or_default(), tr.name_any()),
        generation = tr.metadata.generation.unwrap_or_default(),
        phase = field::Empty,
        context_version = field::Empty,
    );
    let started = Instant::now();
    let result = run_steps(&tr, &ctx).instrument(span.clone()).await;
    ctx.metrics.reconciled(
        started.elapsed(),
        result.as_ref().err().map(Error::metric_label),
    );
    result
}

/// Retries a failed reconcile with a short delay (the API server was unreachable or refused).
pub fn error_policy(tr: Arc<TaskRun>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(taskrun = %tr.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles a TaskRun that is not finished, or whose spec changed since (else
/// `ends/finished.rs`), step by step (`steps/`): read what it starts from; act on a cancel
/// before anything is rendered or applied (`ends/cancel.rs`); resolve where its proxy runs
/// (`placement/`), render, prepare the ConfigMap, and refuse when it cannot run, before
/// anything is applied; apply the ConfigMap and record its version in the history; create the
/// Job once and delete the finished Job after its TTL; write the status; what the placement
/// does after the status; the approvals (a blocked TaskRun's too, `steps/refuse.rs`).
async fn run_steps(tr: &TaskRun, ctx: &Context) -> Result<Action> {
    let ns = tr.namespace().ok_or(Error::MissingField("namespace"))?;
    let previous = tr.status.clone().unwrap_or_default();
    if finished::recorded(tr, &previous) {
        return finished::tidy(tr, ctx, &previous).await;
    }
    let fresh = observe::fresh_taskrun(tr, ctx, &ns, &previous).await?;
    let tr = fresh.as_ref().unwrap_or(tr);
    let mut seen = observe::observe(ctx, tr, ns, previous).await?;
    if let Some(request) = cancel::requested(tr).filter(|_| !seen.finished) {
        return cancel::carry_out(tr, ctx, &seen, request).await;
    }
    let placement = unless_refused!(refuse::placement(tr, ctx, &mut seen).await);
    let plan = unless_refused!(refuse::render(tr, ctx, &seen, placement).await);
    // Nothing is applied before every child's name is known to be free or this TaskRun's.
    let config = config::prepare(tr, ctx, &seen, &plan, placement).await?;
    unless_refused!(refuse::check(tr, ctx, &seen, &plan, &config, placement).await);
    let version = config.version;
    if config::apply_config(ctx, &seen, &config).await? {
        placement.after_config(ctx, &seen, &plan, version).await?;
    }
    // Until the status records the version: its history entry (and the event) first.
    if seen.previous.context_version != i64::try_from(version).ok() {
        history::record(ctx, tr, version, &plan).await?;
    }
    job::create_if_missing(tr, ctx, &mut seen, &plan, placement).await?;
    let (ttl_wait, ttl_deleted) = job::expire(tr, ctx, &seen).await?;
    if seen.finished {
        placement.end(ctx, &seen, false).await?;
    }
    status_write::write_rendered(tr, ctx, &seen, &plan, version, ttl_deleted).await?;
    let pod = placement.serve(ctx, tr, &seen, &plan, version).await?;
    let target = placement.verdicts_target(ctx, &seen, Some(config.written_verdicts()));
    let expiry = approvals::sync(ctx, tr, &seen.previous, target, !seen.finished).await?;
    let requeue = match seen.finished {
        true => ttl_wait,
        false => Some(placement.resync(&seen, pod.as_ref())),
    };
    Ok(soonest(requeue, expiry).map_or_else(Action::await_change, Action::requeue))
}
