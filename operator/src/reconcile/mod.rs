//! The reconciler: renders a TaskRun (pure, [`crate::render`]) and applies the result with
//! server-side apply under one field manager; writes the status the same way; emits events
//! through the events API. No finalizers: children carry a controller owner reference, so the
//! garbage collector removes them with the TaskRun, and `.owns()` brings back a deleted child.
//!
//! The Job is created once and never written again (its pod template is immutable); a change of
//! `toolConfig` only re-renders the ConfigMap and bumps `status.contextVersion`.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! `cached_job` (the Job as read) and `trim` (the TaskRun as cached); `events` (on a TaskRun);
//! `nudge` (running pods told of a new config); `status` (its parts, pure); `children` (facts of
//! the children kept between reconciles); `taken` (a child's name taken by an object that is not
//! the TaskRun's: the operator adopts nothing); `ttl`, `version`, `inputs` (what a pod needs),
//! `mode` (where the task's proxy runs) and `served` (what the proxy reports on the Lease);
//! `approvals`, `binding` (which pod's proxy may write the Lease), `shared` (a shared task's
//! ConfigMap in the shared proxy's namespace), `history`
//! (`status.contextHistory`) and `retention`; the steps of a reconcile (`reconcile_inner` takes
//! them in another order): `observe` (the TaskRun, its recorded status and its Job), `config`
//! (the ConfigMap: prepared, checked, applied), `zone_keys` (a shared task's zone keys, before
//! its Job), `auditor` (a sidecar task's namespace's auditor token, before its Job), `job` (the pod's identity and the Job; its TTL),
//! `status_write` (the status), `refuse` (render, or say why not: also a name taken, a config
//! too large); `cancel` (a cancelled task: its Job deleted, its outcome recorded); `finished` (a
//! task whose outcome is recorded); `tests`.

pub mod approvals;
mod auditor;
mod binding;
mod cached_job;
mod cancel;
pub mod children;
mod config;
mod events;
mod finished;
mod history;
mod inputs;
mod job;
pub mod mode;
mod nudge;
mod observe;
mod refuse;
pub mod retention;
pub mod served;
pub mod shared;
pub mod status;
mod status_write;
mod taken;
mod trim;
mod ttl;
mod version;
mod zone_keys;

#[cfg(test)]
mod tests;

pub use cached_job::CachedJob;
pub use children::{ConfigMapFacts, Index, JobFacts};
pub use trim::trim_taskrun;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::{Api, Client, Resource, ResourceExt};
use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::{Phase, TaskRun};
use tracing::{Instrument, field};

use crate::catalog::CatalogStore;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::render::RenderSettings;

/// The field manager of every write the operator makes.
pub const MANAGER: &str = "orchestrator-operator";

/// How often an unfinished TaskRun is looked at again without any event: a safety net so a
/// missed or reordered watch event can delay a status update by a minute at most.
const RESYNC: Duration = Duration::from_secs(60);
/// How soon a TaskRun waiting for a Secret (which the operator does not watch) is looked at again.
const SECRET_RETRY: Duration = Duration::from_secs(10);
/// How soon a shared task whose pod the shared proxy's ConfigMap does not name yet (with its IP)
/// is looked at again: until then the shared proxy serves the agent nothing.
const POD_RETRY: Duration = Duration::from_secs(2);
/// For how long after its Job started a shared task's pod is looked for every [`POD_RETRY`].
const POD_POLL_SECONDS: i64 = 120;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    /// What reconcile reads of the operator's Jobs (see `children.rs`).
    pub jobs: Index<JobFacts>,
    /// What reconcile reads of the operator's ConfigMaps.
    pub config_maps: Index<ConfigMapFacts>,
    /// What reconcile reads of the shared tasks' ConfigMaps in the shared proxy's namespace
    /// (empty without a shared proxy; see `shared.rs`).
    pub shared_config_maps: Index<shared::SharedFacts>,
    /// The mode of a TaskRun whose spec and Namespace say none (`--default-proxy-mode`).
    pub default_proxy_mode: ProxyMode,
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
    /// Where a call newly waiting for approval is announced (`--approval-webhook-url`); `None`:
    /// off.
    pub notifier: Option<crate::notify::Notifier>,
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

/// Reconciles a TaskRun that is not finished, or whose spec changed since (else `finished.rs`),
/// step by step: read what it starts from (`observe.rs`); render it, or refuse it when it cannot
/// run (`refuse.rs`); prepare the ConfigMap (`config.rs`) and refuse it when a child's name is
/// taken, the ConfigMap is too large or the pod lacks an input (`refuse.rs`), before anything is
/// applied; apply the ConfigMap and record its version in the history (`history.rs`); create the
/// Job once (`job.rs`); delete the finished Job after its TTL (`job.rs`); write the status
/// (`status_write.rs`); bind the Lease to the task's pod (`binding.rs`); the approvals
/// (`approvals.rs`; a blocked TaskRun's too). A cancel (`cancel.rs`) is acted on right after
/// the observation, before anything is rendered or applied.
async fn reconcile_inner(tr: &TaskRun, ctx: &Context) -> Result<Action> {
    let ns = tr.namespace().ok_or(Error::MissingField("namespace"))?;
    let previous = tr.status.clone().unwrap_or_default();
    let recorded_finished = previous.phase.is_some_and(Phase::is_terminal);
    if recorded_finished && tr.metadata.generation == previous.observed_generation {
        return finished::reconcile(tr, ctx, &previous).await;
    }
    let fresh = observe::fresh_taskrun(tr, ctx, &ns, &previous).await?;
    let tr = fresh.as_ref().unwrap_or(tr);
    let mut seen = observe::observe(ctx, tr, ns, previous).await?;
    // Cancelled before anything is applied, so nothing is created for it again.
    if let Some(request) = cancel::requested(tr).filter(|_| !seen.finished) {
        return cancel::reconcile(tr, ctx, &seen, request).await;
    }

    let mode = match refuse::mode(tr, ctx, &mut seen).await? {
        ControlFlow::Continue(mode) => mode,
        ControlFlow::Break(action) => return Ok(action),
    };
    let plan = match refuse::render(tr, ctx, &seen, mode).await? {
        ControlFlow::Continue(plan) => plan,
        ControlFlow::Break(action) => return Ok(action),
    };
    // Nothing is applied before every child's name is known to be free or this TaskRun's.
    let config = config::prepare(tr, ctx, &seen, &plan).await?;
    if let ControlFlow::Break(action) = refuse::check(tr, ctx, &seen, &plan, &config).await? {
        return Ok(action);
    }

    config::apply_config(ctx, &seen, &config).await?;
    if !config.up_to_date() {
        job::refresh_shared_role(ctx, &seen, &plan).await?;
    }
    // Until the status records the version: its history entry (and the event) first.
    if seen.previous.context_version != i64::try_from(config.version).ok() {
        history::record(ctx, tr, config.version, &plan).await?;
    }
    job::create_if_missing(tr, ctx, &mut seen, &plan).await?;
    let job_state = seen.job_state.as_ref();
    let (ttl_wait, ttl_deleted) =
        job::expire_job(tr, ctx, &seen.ns, job_state, &seen.previous, &status::now()).await?;

    // A shared task's ConfigMap goes in the same reconcile that records its outcome.
    let shared = plan.mode() == ProxyMode::Shared;
    if shared && seen.finished {
        shared::delete(ctx, &seen.ns, &seen.name, false).await?;
    }
    status_write::write_rendered(tr, ctx, &seen, &plan, config.version, ttl_deleted).await?;
    let known = shared::known_pod(ctx, &plan);
    let mut pod = None;
    if let Some(job) = seen.job.as_deref().filter(|_| !seen.finished) {
        pod = binding::reconcile(ctx, tr, job, (shared, shared && known.is_none())).await;
    }
    let pod = pod.or(known);
    if shared && !seen.finished {
        let phase = seen.job_state.as_ref().map(|s| s.phase);
        shared::apply_config(ctx, &plan, config.version, phase, pod.as_ref()).await?;
    }
    let cm_name = plan.config_map_name();
    let shared_target = shared::verdicts_target(ctx, &seen.ns, &seen.name);
    let target = match (&shared_target, shared) {
        (_, false) => Some(approvals::Target {
            namespace: &seen.ns,
            config_map: &cm_name,
            written: config.existing.as_ref().and_then(|c| c.verdicts.as_deref()),
        }),
        // The ConfigMap applied above (the watch may not show it yet: no verdict is lost, the
        // next reconcile writes them), none once the task ended.
        (Some((namespace, name, written)), true) if !seen.finished => Some(approvals::Target {
            namespace,
            config_map: name,
            written: written.as_deref(),
        }),
        (_, true) => None,
    };
    let expiry = approvals::reconcile(ctx, tr, &seen.previous, target, !seen.finished).await?;
    // Polled while the Job is young (a pod that cannot be scheduled is looked at every minute
    // afterwards, like any task: its Job's changes bring a reconcile anyway).
    let young = seen
        .job_state
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .is_none_or(|t| status::now().0.duration_since(t.0).as_secs() < POD_POLL_SECONDS);
    let waiting_for_pod = shared
        && young
        && !seen.finished
        && seen.job.is_some()
        && pod.as_ref().is_none_or(|p| p.ip.is_none());
    let requeue = if seen.finished {
        ttl_wait
    } else if waiting_for_pod {
        Some(POD_RETRY)
    } else {
        Some(RESYNC)
    };
    Ok(soonest(requeue, expiry).map_or_else(Action::await_change, Action::requeue))
}

/// The sooner of two times to look again (`None`: no need).
fn soonest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
