//! What stops a TaskRun from being (fully) reconciled: no valid catalog, a TaskRun that does not
//! render, a child's name taken by an object that is not the TaskRun's (`taken.rs`), a
//! ConfigMap over the API server's limit, a pod's missing inputs. Each writes a status saying
//! why (`Ready=False`, see [`blocked`]) and leaves the children as they are (approvals are still
//! merged), and the reconcile ends with the returned action.

use std::ops::ControlFlow;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus, conditions as ct};

use super::config::Config;
use super::status_write::{Tools, write_status};
use crate::error::Result;
use crate::reconcile::context::{Context, SECRET_RETRY, soonest};
use crate::reconcile::facts::Observed;
use crate::reconcile::placement::{Placement, mode};
use crate::reconcile::status::{self, Cond};
use crate::reconcile::{approvals, events, inputs, taken};
use crate::render::files::CONFIG_TOO_LARGE;
use crate::render::{self, Plan, Problem};

/// Where the task's proxy runs (`placement/mode.rs`), recorded in `seen`; a Namespace label
/// naming no mode blocks the TaskRun (looked at again soon: the operator does not watch
/// Namespaces).
pub async fn placement(
    tr: &TaskRun,
    ctx: &Context,
    seen: &mut Observed,
) -> Result<ControlFlow<Action, Placement>> {
    match mode::resolve(ctx, tr, &seen.previous, seen.job.as_deref()).await? {
        Ok(mode) => {
            seen.mode = Some(mode);
            Ok(ControlFlow::Continue(Placement::of(mode)))
        }
        Err(problem) => Ok(ControlFlow::Break(
            blocked(tr, ctx, seen, vec![problem], Some(SECRET_RETRY)).await?,
        )),
    }
}

/// Renders the TaskRun with the last valid catalog, its proxy at `placement`. Without a catalog
/// (looked at again soon) or with problems (looked at again when the TaskRun changes; in shared
/// mode without a shared proxy, when the operator restarts with one), the TaskRun is blocked
/// instead.
pub async fn render(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    placement: Placement,
) -> Result<ControlFlow<Action, Plan>> {
    let Some(catalog) = ctx.catalog.get() else {
        let problem = Problem {
            reason: "CatalogUnavailable",
            message: "no valid catalog loaded yet (see the operator's log for the catalog ConfigMap's problems)".into(),
        };
        let action = blocked(tr, ctx, seen, vec![problem], Some(SECRET_RETRY)).await?;
        return Ok(ControlFlow::Break(action));
    };
    match render::render_mode(tr, &catalog, &ctx.render, placement.mode()) {
        Ok(plan) => Ok(ControlFlow::Continue(plan)),
        Err(problems) => Ok(ControlFlow::Break(
            blocked(tr, ctx, seen, problems, None).await?,
        )),
    }
}

/// Blocks the TaskRun, before any child is applied, when a child's name is taken (the Job's,
/// found by `observe.rs`; the ConfigMap's, by `config.rs`; the pod's identity's, read here when
/// the Job is about to be created), when its ConfigMap is too large, or when an unfinished
/// task's pod lacks what the plan needs. Every problem at once; looked at again soon, since the
/// operator watches neither Secrets nor other owners' objects, except when only the config is
/// too large (only a change of the TaskRun or the catalog, both watched, can fix that). A
/// finished task's pod is not checked: it never runs again.
pub async fn check(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    plan: &Plan,
    config: &Config,
    placement: Placement,
) -> Result<ControlFlow<Action>> {
    let mut problems: Vec<Problem> = seen.job_taken.iter().cloned().collect();
    let mut inputs = Vec::new();
    if !seen.finished {
        match &seen.job {
            // Nothing may start before everything it needs exists: a pod with a missing
            // Secret key would hang in CreateContainerConfigError.
            None => {
                problems.extend(taken::identity(&ctx.client, &seen.ns, tr, plan.identity()).await?);
                problems.extend(placement.job_problems(ctx, &seen.ns, tr, plan).await?);
                inputs = inputs::missing_inputs(tr, plan, &ctx.client, &seen.ns).await?;
            }
            // A running pod's containers and env cannot change: a server added since, or a
            // newly enabled one needing a Secret the pod was created without, cannot start.
            Some(job) => inputs = inputs::not_in_pod(job, plan),
        }
    }
    // The names taken first (the ConfigMap's is in the config's problems), then the rest.
    problems.extend(config.problems.iter().cloned());
    problems.sort_by_key(|p| p.reason != taken::NAME_TAKEN);
    problems.extend(inputs);
    if problems.is_empty() {
        return Ok(ControlFlow::Continue(()));
    }
    let retry = problems
        .iter()
        .any(|p| p.reason != CONFIG_TOO_LARGE)
        .then_some(SECRET_RETRY);
    Ok(ControlFlow::Break(
        blocked(tr, ctx, seen, problems, retry).await?,
    ))
}

/// Writes the status of a TaskRun that cannot be (fully) reconciled: `Ready=False` with the
/// first problem's reason and every problem in the message. Children are left as they are (the
/// last good config stays in force), and a warning event is emitted when the problem is new.
/// The approvals are still merged (the proxy of a running task keeps serving, and holding
/// calls, with the last good config); a finished task's pending ones are withdrawn. Returns
/// when to look again: after `retry`, or at an approval's expiry, whichever comes first.
async fn blocked(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    problems: Vec<Problem>,
    retry: Option<Duration>,
) -> Result<Action> {
    let (previous, job) = (&seen.previous, seen.job_state.as_ref());
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
        proxy_mode: seen.mode.or(previous.proxy_mode),
        conditions: Vec::new(),
        // Written on their own, under their own field manager (`approvals.rs`): never here,
        // where a lagging cache could put a decided approval back to pending.
        approvals: Vec::new(),
        ..previous.clone()
    };
    let state = status::outcome(job, previous);
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
    write_status(tr, ctx, previous, status, Tools::Carried).await?;
    // The verdicts go to the ConfigMap only when it is this TaskRun's (its name may be taken).
    let uid = tr.uid().unwrap_or_default();
    let own = ctx
        .config_maps
        .get(&seen.ns, &render::config_map_name(&seen.name))
        .filter(|c| c.controlled_by(&uid));
    let own = own.as_ref().map(|c| c.verdicts.as_deref());
    let target = Placement::of_seen(seen).verdicts_target(ctx, seen, own);
    let expiry = approvals::sync(ctx, tr, previous, target, !seen.finished).await?;
    Ok(soonest(retry, expiry).map_or_else(Action::await_change, Action::requeue))
}
