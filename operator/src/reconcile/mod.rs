//! The reconciler: renders a TaskRun (pure, [`crate::render`]) and applies the result with
//! server-side apply under one field manager; writes the status the same way; emits events
//! through the events API. No finalizers: children carry a controller owner reference, so the
//! garbage collector removes them with the TaskRun, and `.owns()` brings back a deleted child.
//!
//! The Job is created once and never written again (its pod template is immutable); a change of
//! `toolConfig` only re-renders the ConfigMap and bumps `status.contextVersion`.

pub mod approvals;
mod cached_job;
pub mod children;
mod events;
mod finished;
mod history;
mod inputs;
mod nudge;
pub mod retention;
pub mod served;
pub mod status;
mod trim;
mod ttl;
mod version;

#[cfg(test)]
mod tests;

pub use cached_job::CachedJob;
pub use children::{ConfigMapFacts, Index, JobFacts};
pub use trim::trim_taskrun;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskRun, TaskRunStatus, conditions as ct};
use serde_json::json;
use tracing::{Instrument, field};

use crate::catalog::CatalogStore;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::render::{self, Problem, RenderSettings};
use status::{Cond, JobState};
use ttl::Ttl;

/// The field manager of every write the operator makes.
pub const MANAGER: &str = "orchestrator-operator";

/// How often an unfinished TaskRun is looked at again without any event: a safety net so a
/// missed or reordered watch event can delay a status update by a minute at most.
const RESYNC: Duration = Duration::from_secs(60);
/// How soon a TaskRun waiting for a Secret (which the operator does not watch) is looked at again.
const SECRET_RETRY: Duration = Duration::from_secs(10);

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    /// What reconcile reads of the operator's Jobs (see `children.rs`).
    pub jobs: Index<JobFacts>,
    /// What reconcile reads of the operator's ConfigMaps.
    pub config_maps: Index<ConfigMapFacts>,
    /// What each task's proxy reports on its Lease: the version it serves (see `served.rs`)
    /// and the calls it holds for approval (see `approvals.rs`).
    pub leases: Index<served::LeaseFacts>,
    /// The ToolApprovals: people's decisions on held calls (see `approvals.rs`).
    pub decisions: Index<approvals::DecisionFacts>,
    pub render: RenderSettings,
    pub catalog: CatalogStore,
    pub metrics: Arc<Metrics>,
    /// Who publishes the events (see `events.rs`).
    pub reporter: Reporter,
    /// Seconds a finished TaskRun is kept when its spec says nothing
    /// (`--retention-seconds-after-finished`); `None`: kept.
    pub retention_seconds: Option<u32>,
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
    let result = reconcile_inner(&tr, &ctx).instrument(span.clone()).await;
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

async fn reconcile_inner(tr: &TaskRun, ctx: &Context) -> Result<Action> {
    let ns = tr.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = tr.name_any();
    let previous = tr.status.clone().unwrap_or_default();
    let recorded_finished = previous.phase.is_some_and(Phase::is_terminal);
    if recorded_finished && tr.metadata.generation == previous.observed_generation {
        return finished::reconcile(tr, ctx, &previous).await;
    }
    // A finished task's spec changed: rendered as before, from a fresh read when the cache
    // dropped its task text.
    let fresh;
    let tr = if recorded_finished && trim::task_text_dropped(tr) {
        let api: Api<TaskRun> = Api::namespaced(ctx.client.clone(), &ns);
        fresh = api.get(&name).await?;
        &fresh
    } else {
        tr
    };
    let jobs: Api<CachedJob> = Api::namespaced(ctx.client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);

    // The cache first; a miss is confirmed by a read so a Job that the cache has not seen yet
    // is never applied twice.
    let job = match ctx.jobs.get(&ns, &name) {
        Some(job) => Some(job),
        None => jobs
            .get_opt(&name)
            .await?
            .map(|j| Arc::new(JobFacts::of(&j))),
    };
    let mut job_state = job.as_ref().map(|j| j.state.clone());
    if let Some(state) = job_state.as_mut()
        && state.phase == Phase::Failed
    {
        explain_failure(state, &previous, &ns, &name, ctx).await;
    }
    // A finished task is never run again, even when its Job is gone (deleted after its TTL).
    let finished = job_state
        .as_ref()
        .map(|s| s.phase.is_terminal())
        .unwrap_or(false)
        || previous.phase.is_some_and(Phase::is_terminal);

    let Some(catalog) = ctx.catalog.get() else {
        let problem = Problem {
            reason: "CatalogUnavailable",
            message: "no valid catalog loaded yet (see the operator's log for the catalog ConfigMap's problems)".into(),
        };
        blocked(tr, ctx, &previous, job_state.as_ref(), vec![problem]).await?;
        return Ok(Action::requeue(SECRET_RETRY));
    };
    let plan = match render::render(tr, &catalog, &ctx.render) {
        Ok(plan) => plan,
        Err(problems) => {
            blocked(tr, ctx, &previous, job_state.as_ref(), problems).await?;
            return Ok(Action::await_change());
        }
    };

    if !finished {
        let problems = match &job {
            // Nothing may start before everything it needs exists: a pod with a missing
            // Secret key would hang in CreateContainerConfigError.
            None => inputs::missing_inputs(tr, &plan, &ctx.client, &ns).await?,
            // A running pod's containers and env cannot change: a server added since, or a
            // newly enabled one needing a Secret the pod was created without, cannot start.
            Some(job) => inputs::not_in_pod(job, &plan),
        };
        if !problems.is_empty() {
            blocked(tr, ctx, &previous, job_state.as_ref(), problems).await?;
            return Ok(Action::requeue(SECRET_RETRY));
        }
    }

    // The context version: kept while the rendered config is the one already applied, else one
    // more than any version seen. When the cached ConfigMap is not already the rendered one, the
    // ConfigMap is read afresh so a lagging cache or status never yields the same version for two
    // different configs.
    let cm_name = plan.config_map_name();
    let cached = ctx
        .config_maps
        .get(&ns, &cm_name)
        .filter(|c| c.config_hash.as_deref() == Some(plan.config_hash()));
    let existing = match cached {
        Some(c) => Some(c),
        // Never rendered before (no version in the status): the ConfigMap can only be missing,
        // or left by a reconcile that crashed before writing the status, at version 1.
        None if previous.context_version.is_none() => ctx.config_maps.get(&ns, &cm_name),
        None => cms
            .get_opt(&cm_name)
            .await?
            .map(|c| Arc::new(ConfigMapFacts::of(&c))),
    };
    let versions = version::context_version(existing.as_deref(), &previous, plan.config_hash());
    let version = versions.current;
    let desired = plan.config_map(version);
    let up_to_date = existing.as_ref().is_some_and(|c| c.is(&desired));
    if !up_to_date {
        apply(&cms, &desired).await?;
        // Tell the kubelet now rather than at its next periodic sync (see nudge.rs).
        if job.is_some() && !finished {
            let annotated = nudge::pods(&ctx.client, &ns, &name, version).await;
            tracing::debug!(annotated, version, "running pods told of the new config");
        }
    }
    // Until the status records the version: its history entry (and the event) first.
    if previous.context_version != i64::try_from(version).ok() {
        history::record(ctx, tr, version, &plan).await?;
    }

    let (job, job_state) = match job {
        Some(job) => (Some(job), job_state),
        None if finished => (None, job_state),
        None => {
            // The pod's identity first: a pod naming a ServiceAccount that does not exist is
            // refused by admission, and the Job controller would only retry with backoff.
            apply_identity(&ctx.client, &ns, plan.identity()).await?;
            let created = JobFacts::of(&apply(&jobs, plan.job()).await?);
            let note = format!(
                "created Job {} (agent image {}, proxy image {})",
                plan.job_name(),
                events::agent_image(plan.job()),
                ctx.render.sidecar_image
            );
            events::publish(ctx, tr, EventType::Normal, "JobCreated", "CreateJob", note).await;
            let state = created.state.clone();
            (Some(Arc::new(created)), Some(state))
        }
    };

    let (ttl_wait, ttl_deleted) = expire_job(
        tr,
        ctx,
        &jobs,
        job_state.as_ref(),
        &previous,
        &status::now(),
    )
    .await?;
    let requeue = if finished { ttl_wait } else { Some(RESYNC) };

    let mut status = TaskRunStatus {
        observed_generation: tr.metadata.generation,
        context_version: Some(version as i64),
        config_hash: Some(plan.config_hash().to_string()),
        config_map_name: Some(plan.config_map_name()),
        job_name: Some(plan.job_name().to_string()),
        tools: plan.tools.clone(),
        enabled_tool_count: Some(plan.enabled_tool_count),
        ..Default::default()
    };
    let state = job_state.clone().or_else(|| status::remembered(&previous));
    status::fill_phase(&mut status, &previous, state.as_ref());
    let synced = ctx.render.sidecar_api_watch.then(|| {
        status.served_context_version =
            served::reported(&ctx.leases, &ns, &name).or(previous.served_context_version);
        served::condition(version, status.served_context_version)
    });
    let rendered = format!(
        "contextVersion {version} rendered into ConfigMap {}",
        plan.config_map_name()
    );
    let job_cond = job_created_cond(&name, job.is_some() && !ttl_deleted, finished);
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
    conds.extend(synced);
    status.conditions = status::conditions(
        conds,
        &previous.conditions,
        tr.metadata.generation,
        &status::now(),
    );
    tracing::Span::current().record("phase", field::debug(status.phase));
    tracing::Span::current().record("context_version", version);
    write_status(tr, ctx, &previous, status, Tools::Rendered).await?;
    let verdicts = existing.as_ref().and_then(|c| c.verdicts.clone());
    let expiry =
        approvals::reconcile(ctx, tr, &previous, &cm_name, verdicts.as_deref(), !finished).await?;
    let requeue = match (requeue, expiry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// `ttlSecondsAfterFinished` (see ttl.rs): deletes the finished Job when it is due. Returns when
/// to look again for it, and whether it was deleted now.
async fn expire_job(
    tr: &TaskRun,
    ctx: &Context,
    jobs: &Api<CachedJob>,
    job: Option<&JobState>,
    previous: &TaskRunStatus,
    now: &Time,
) -> Result<(Option<Duration>, bool)> {
    let ttl = tr.spec.ttl_seconds_after_finished;
    match ttl::decide(ttl, job, previous.phase, now.0) {
        Ttl::NotDue => Ok((None, false)),
        Ttl::Wait(left) => Ok((Some(left), false)),
        Ttl::Delete => {
            let name = tr.name_any();
            match jobs.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                // Gone already (the cache lags behind a deletion).
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok((None, true)),
                Err(e) => return Err(e.into()),
            }
            let note = format!(
                "deleted Job {name} {}s after the task finished (ttlSecondsAfterFinished)",
                ttl.unwrap_or_default()
            );
            events::publish(ctx, tr, EventType::Normal, "JobDeleted", "DeleteJob", note).await;
            Ok((None, true))
        }
    }
}

/// `JobCreated`: the Job exists, or it ran and is gone (deleted after its TTL), or it does not
/// exist yet.
fn job_created_cond(name: &str, exists: bool, finished: bool) -> Cond {
    match (exists, finished) {
        (false, true) => Cond::yes(
            ct::JOB_CREATED,
            "DeletedAfterTTL",
            format!("Job {name} ran and was deleted after ttlSecondsAfterFinished"),
        ),
        (true, _) => Cond::yes(ct::JOB_CREATED, "Created", format!("Job {name} exists")),
        (false, false) => Cond::no(ct::JOB_CREATED, "NotCreated", "the Job does not exist yet"),
    }
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

/// A failed Job says only that it failed (e.g. BackoffLimitExceeded); when the agent container
/// exited non-zero, the TaskRun says so: reason `AgentFailed`, its exit code, reason and
/// termination message. Read from the Job's pods once, when the failure is first recorded;
/// afterwards the recorded explanation is kept. A failed read keeps the Job's own reason.
async fn explain_failure(
    state: &mut JobState,
    previous: &TaskRunStatus,
    ns: &str,
    job: &str,
    ctx: &Context,
) {
    if previous.phase == Some(Phase::Failed) {
        if let Some(recorded) = status::remembered(previous) {
            state.reason = recorded.reason;
            state.message = recorded.message;
        }
        return;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => {
            if let Some(agent) = status::agent_failure(&list.items) {
                state.message = format!("{agent}; Job {job}: {}", state.message);
                state.reason = ct::AGENT_FAILED.to_string();
            }
        }
        Err(e) => {
            tracing::warn!(job, error = %e, "could not read the failed Job's pods; the TaskRun keeps the Job's reason");
        }
    }
}

/// Where a status's `tools` come from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tools {
    /// Rendered now.
    Rendered,
    /// Carried over from the TaskRun as reconcile got it: only their digest when the cache
    /// dropped them (`trim.rs`), in which case they are read afresh if the status is written.
    Carried,
}

/// Applies the status when it differs from what the TaskRun shows, and reports phase changes.
async fn write_status(
    tr: &TaskRun,
    ctx: &Context,
    previous: &TaskRunStatus,
    mut status: TaskRunStatus,
    tools: Tools,
) -> Result<()> {
    let api: Api<TaskRun> =
        Api::namespaced(ctx.client.clone(), &tr.namespace().unwrap_or_default());
    if tools == Tools::Carried && trim::tools_dropped(tr) {
        // Both with the cache's digest of the tools in force: the rest decides.
        if tr.status.as_ref() == Some(&status) {
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
    Ok(())
}

/// The task pod's ServiceAccount (unless the TaskRun names its own), Role and RoleBinding.
async fn apply_identity(
    client: &Client,
    ns: &str,
    identity: &render::identity::Identity,
) -> Result<()> {
    if let Some(sa) = &identity.service_account {
        apply(&Api::<ServiceAccount>::namespaced(client.clone(), ns), sa).await?;
    }
    apply(&Api::<Role>::namespaced(client.clone(), ns), &identity.role).await?;
    apply(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        &identity.role_binding,
    )
    .await?;
    if let Some(lease) = &identity.lease {
        apply(&Api::<Lease>::namespaced(client.clone(), ns), lease).await?;
    }
    Ok(())
}

/// Server-side apply of a rendered object under [`MANAGER`]; the answer is read as `K` (for a
/// Job, only what the operator reads of it).
async fn apply<K, P>(api: &Api<K>, obj: &P) -> Result<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    P: Resource + serde::Serialize + std::fmt::Debug,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingField("metadata.name"))?;
    Ok(api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await?)
}
