//! Writing a TaskRun's status (its parts are built purely in `status.rs`): the status of a
//! rendered TaskRun ([`write_rendered`]), and the one write every status goes through
//! ([`write_status`]): server-side applied under [`MANAGER`] when it differs from what the
//! TaskRun shows, with an event when the task's outcome is first recorded.

use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::result::{CREATED_BY_ANNOTATION, created_by};
use orchestrator_crds::taskrun::{Phase, TaskRun, TaskRunStatus, conditions as ct};
use serde_json::json;
use tracing::field;

use crate::error::Result;
use crate::reconcile::context::{Context, MANAGER};
use crate::reconcile::facts::{Observed, lease};
use crate::reconcile::status::{self, Cond};
use crate::reconcile::{events, trim};
use crate::render::Plan;

/// Where a status's `tools` come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tools {
    /// Rendered now.
    Rendered,
    /// Carried over from the TaskRun as reconcile got it: only their digest when the cache
    /// dropped them (`trim.rs`), in which case they are read afresh if the status is written.
    Carried,
}

/// The status of a TaskRun rendered at `version`: what was rendered, the phase from the Job (or
/// what was recorded once it is gone), the conditions `Ready`, `ConfigRendered`, `JobCreated`,
/// `Succeeded` and (with the proxy's API watch) `ToolsSynced`. `job_deleted`: the Job was deleted
/// by this reconcile (its TTL). Records the phase and version on the reconcile's span.
pub async fn write_rendered(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    plan: &Plan,
    version: u64,
    job_deleted: bool,
) -> Result<()> {
    let (name, previous) = (&seen.name, &seen.previous);
    let mut status = TaskRunStatus {
        observed_generation: tr.metadata.generation,
        context_version: Some(version as i64),
        config_hash: Some(plan.config_hash().to_string()),
        config_map_name: Some(plan.config_map_name()),
        job_name: Some(plan.job_name().to_string()),
        proxy_mode: Some(plan.mode()),
        tools: plan.tools.clone(),
        enabled_tool_count: Some(plan.enabled_tool_count),
        // Read once, when the outcome is first recorded (`observe.rs`), then kept.
        result: seen.result.clone().or_else(|| previous.result.clone()),
        cancellation: previous.cancellation.clone(),
        ..Default::default()
    };
    let state = status::outcome(seen.job_state.as_ref(), previous);
    status::fill_phase(&mut status, previous, state.as_ref());
    status.usage = lease::usage(&ctx.leases, &seen.ns, name).or_else(|| previous.usage.clone());
    let budget = status.usage.as_ref().map(status::budget_condition);
    let synced = ctx.render.sidecar_api_watch.then(|| {
        status.served_context_version =
            lease::reported(&ctx.leases, &seen.ns, name).or(previous.served_context_version);
        status::condition(version, status.served_context_version)
    });
    let rendered = format!(
        "contextVersion {version} rendered into ConfigMap {}",
        plan.config_map_name()
    );
    let exists = seen.job.is_some() && !job_deleted;
    let job_cond = status::job_created_cond(name, exists, seen.finished, previous.phase);
    let ready = Cond::yes(
        ct::READY,
        "Ready",
        format!("{rendered}; Job {name} created"),
    );
    let mut conds = vec![
        ready,
        Cond::yes(ct::CONFIG_RENDERED, "Rendered", rendered),
        job_cond,
        status::succeeded_cond(state.as_ref()),
    ];
    // A task that failed while its budget was spent failed for that.
    if let (Some(Phase::Failed), Some(limit)) = (
        status.phase,
        status.usage.as_ref().and_then(|u| u.exceeded.as_deref()),
    ) && let Some(succeeded) = conds.last_mut()
    {
        *succeeded = Cond::no(
            ct::SUCCEEDED,
            ct::BUDGET_EXCEEDED,
            format!(
                "the agent stopped after its model requests were refused: spec.budget.{limit} is spent"
            ),
        );
    }
    conds.extend(synced);
    conds.extend(budget);
    status.conditions = status::conditions(
        conds,
        &previous.conditions,
        tr.metadata.generation,
        &status::now(),
    );
    tracing::Span::current().record("phase", field::debug(status.phase));
    tracing::Span::current().record("context_version", version);
    write_status(tr, ctx, previous, status, Tools::Rendered).await
}

/// Applies the status when it differs from what the TaskRun shows, and reports phase changes: an
/// event when the outcome is first recorded, and `taskrun_phase_transitions_total` once per
/// write that changes the phase.
pub async fn write_status(
    tr: &TaskRun,
    ctx: &Context,
    previous: &TaskRunStatus,
    mut status: TaskRunStatus,
    tools: Tools,
) -> Result<()> {
    let api: Api<TaskRun> =
        Api::namespaced(ctx.client.clone(), &tr.namespace().unwrap_or_default());
    // Every status write carries who created the TaskRun (the annotation cannot change).
    status.created_by = tr
        .annotations()
        .get(CREATED_BY_ANNOTATION)
        .and_then(|v| created_by(v));
    if tools == Tools::Carried && trim::tools_dropped(tr) {
        // Both with the cache's digest of the tools in force: the rest decides (the history
        // and the approvals aside: each is written on its own).
        let same = |old: &TaskRunStatus| {
            *old == TaskRunStatus {
                context_history: old.context_history.clone(),
                approvals: old.approvals.clone(),
                ..status.clone()
            }
        };
        if tr.status.as_ref().is_some_and(same) {
            return Ok(());
        }
        let fresh = api.get(&tr.name_any()).await?;
        status.tools = fresh.status.map(|s| s.tools).unwrap_or_default();
    } else if trim::has_status(tr, &status) {
        return Ok(());
    }
    if status.phase != previous.phase
        && let Some(phase) = status.phase.filter(|p| p.is_terminal())
    {
        let (kind, reason) = match phase {
            Phase::Succeeded => (EventType::Normal, "TaskSucceeded"),
            Phase::Cancelled => (EventType::Normal, ct::CANCELLED),
            _ => (EventType::Warning, "TaskFailed"),
        };
        let note = status
            .conditions
            .iter()
            .find(|c| c.type_ == ct::SUCCEEDED)
            .map_or_else(String::new, |c| c.message.clone());
        events::publish(ctx, tr, kind, reason, "Observe", note).await;
    }
    let patch = json!({
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "status": status,
    });
    api.patch_status(
        &tr.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    if let Some(phase) = status.phase.filter(|p| previous.phase != Some(*p)) {
        ctx.metrics
            .phase_transition(&tr.namespace().unwrap_or_default(), phase.as_str());
    }
    Ok(())
}
