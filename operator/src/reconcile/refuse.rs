//! What stops a TaskRun from being (fully) reconciled: no valid catalog, a TaskRun that does not
//! render, a pod's missing inputs. Each writes a status saying why (`Ready=False`, see
//! [`blocked`]) and leaves the children as they are, and the reconcile ends with the returned
//! action.

use std::ops::ControlFlow;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus, conditions as ct};

use super::observe::Observed;
use super::status::{self, Cond, JobState};
use super::status_write::{Tools, write_status};
use super::{Context, SECRET_RETRY, events, inputs};
use crate::error::Result;
use crate::render::{self, Plan, Problem};

/// Renders the TaskRun with the last valid catalog. Without a catalog (looked at again soon) or
/// with problems (looked at again when the TaskRun changes), the TaskRun is blocked instead.
pub async fn render(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
) -> Result<ControlFlow<Action, Plan>> {
    let job_state = seen.job_state.as_ref();
    let Some(catalog) = ctx.catalog.get() else {
        let problem = Problem {
            reason: "CatalogUnavailable",
            message: "no valid catalog loaded yet (see the operator's log for the catalog ConfigMap's problems)".into(),
        };
        blocked(tr, ctx, &seen.previous, job_state, vec![problem]).await?;
        return Ok(ControlFlow::Break(Action::requeue(SECRET_RETRY)));
    };
    match render::render(tr, &catalog, &ctx.render) {
        Ok(plan) => Ok(ControlFlow::Continue(plan)),
        Err(problems) => {
            blocked(tr, ctx, &seen.previous, job_state, problems).await?;
            Ok(ControlFlow::Break(Action::await_change()))
        }
    }
}

/// Blocks an unfinished task whose pod lacks what the plan needs (looked at again soon: the
/// operator does not watch Secrets). A finished task is not checked: it never runs again.
pub async fn check_inputs(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    plan: &Plan,
) -> Result<ControlFlow<Action>> {
    if seen.finished {
        return Ok(ControlFlow::Continue(()));
    }
    let problems = match &seen.job {
        // Nothing may start before everything it needs exists: a pod with a missing
        // Secret key would hang in CreateContainerConfigError.
        None => inputs::missing_inputs(tr, plan, &ctx.client, &seen.ns).await?,
        // A running pod's containers and env cannot change: a server added since, or a
        // newly enabled one needing a Secret the pod was created without, cannot start.
        Some(job) => inputs::not_in_pod(job, plan),
    };
    if problems.is_empty() {
        return Ok(ControlFlow::Continue(()));
    }
    let job_state = seen.job_state.as_ref();
    blocked(tr, ctx, &seen.previous, job_state, problems).await?;
    Ok(ControlFlow::Break(Action::requeue(SECRET_RETRY)))
}

/// Writes the status of a TaskRun that cannot be (fully) reconciled: `Ready=False` with the
/// first problem's reason and every problem in the message. Children are left as they are (the
/// last good config stays in force), and a warning event is emitted when the problem is new.
async fn blocked(
    tr: &TaskRun,
    ctx: &Context,
    previous: &TaskRunStatus,
    job: Option<&JobState>,
    problems: Vec<Problem>,
) -> Result<()> {
    let reason = problems.first().map_or("Invalid", |p| p.reason);
    let message = problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let was = previous.conditions.iter().find(|c| c.type_ == ct::READY);
    if was.is_none_or(|c| c.reason != reason || c.message != message) {
        events::publish(
            ctx,
            tr,
            EventType::Warning,
            reason,
            "Reconcile",
            message.clone(),
        )
        .await;
    }
    tracing::info!(taskrun = %tr.name_any(), reason, %message, "TaskRun blocked");
    // Keep what the last good reconcile recorded about the children.
    let mut status = TaskRunStatus {
        observed_generation: tr.metadata.generation,
        conditions: Vec::new(),
        // Written on their own, under their own field manager (`approvals.rs`): never here,
        // where a lagging cache could put a decided approval back to pending.
        approvals: Vec::new(),
        ..previous.clone()
    };
    let state = job.cloned().or_else(|| status::remembered(previous));
    status::fill_phase(&mut status, previous, state.as_ref());
    let job_cond = match job {
        Some(_) => Cond::yes(
            ct::JOB_CREATED,
            "Created",
            format!("Job {} exists", tr.name_any()),
        ),
        None => Cond::no(
            ct::JOB_CREATED,
            reason,
            "the Job is not created until the problems are fixed",
        ),
    };
    let kept = match previous.context_version {
        Some(v) => format!("; contextVersion {v} stays in force"),
        None => String::new(),
    };
    status.conditions = status::conditions(
        vec![
            Cond::no(ct::READY, reason, message.clone()),
            Cond::no(ct::CONFIG_RENDERED, reason, format!("{message}{kept}")),
            job_cond,
            status::succeeded_cond(state.as_ref()),
        ],
        &previous.conditions,
        tr.metadata.generation,
        &status::now(),
    );
    write_status(tr, ctx, previous, status, Tools::Carried).await
}
