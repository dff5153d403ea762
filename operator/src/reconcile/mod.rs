//! The reconciler: renders a TaskRun (pure, [`crate::render`]) and applies the result with
//! server-side apply under one field manager; writes the status the same way; emits events
//! through the events API. No finalizers: children carry a controller owner reference, so the
//! garbage collector removes them with the TaskRun, and `.owns()` brings back a deleted child.
//!
//! The Job is created once and never written again (its pod template is immutable); a change of
//! `toolConfig` only re-renders the ConfigMap and bumps `status.contextVersion`.

pub mod status;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskRun, TaskRunStatus, conditions as ct};
use serde_json::json;
use tracing::{Instrument, field};

use crate::catalog::CatalogStore;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::render::{
    self, CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION, Plan, Problem, RenderSettings, job,
};
use status::{Cond, JobState};

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
    /// The operator's Jobs, trimmed by [`trim_job`].
    pub jobs: Store<Job>,
    /// The operator's ConfigMaps, trimmed by [`trim_config_map`].
    pub config_maps: Store<ConfigMap>,
    pub render: RenderSettings,
    pub catalog: CatalogStore,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
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
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let previous = tr.status.clone().unwrap_or_default();

    // The cache first; a miss is confirmed by a read so a Job that the cache has not seen yet
    // is never applied twice.
    let job = match ctx.jobs.get(&ObjectRef::new(&name).within(&ns)) {
        Some(job) => Some(Job::clone(&job)),
        None => jobs.get_opt(&name).await?,
    };
    let mut job_state = job.as_ref().map(status::job_state);
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
            None => missing_inputs(tr, &plan, &ctx.client, &ns).await?,
            // A running pod's env cannot change: a newly enabled server that needs a Secret the
            // pod was created without cannot be started.
            Some(job) => env_not_in_pod(job, &plan),
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
    let cm_ref = ObjectRef::new(&plan.config_map_name()).within(&ns);
    let cached = ctx.config_maps.get(&cm_ref).filter(|c| {
        c.annotations()
            .get(CONFIG_HASH_ANNOTATION)
            .map(String::as_str)
            == Some(plan.config_hash())
    });
    let existing = match cached {
        Some(c) => Some(ConfigMap::clone(&c)),
        // Never rendered before (no version in the status): the ConfigMap can only be missing,
        // or left by a reconcile that crashed before writing the status, at version 1.
        None if previous.context_version.is_none() => {
            ctx.config_maps.get(&cm_ref).map(|c| ConfigMap::clone(&c))
        }
        None => cms.get_opt(&plan.config_map_name()).await?,
    };
    let annotation = |key: &str| {
        existing
            .as_ref()
            .and_then(|c| c.annotations().get(key).cloned())
    };
    let cm_version: u64 = annotation(CONTEXT_VERSION_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let status_version = previous.context_version.unwrap_or(0).max(0) as u64;
    let version = if annotation(CONFIG_HASH_ANNOTATION).as_deref() == Some(plan.config_hash())
        && cm_version > 0
    {
        cm_version
    } else if previous.config_hash.as_deref() == Some(plan.config_hash()) && status_version > 0 {
        status_version
    } else {
        cm_version.max(status_version) + 1
    };
    let desired = plan.config_map(version);
    let up_to_date = existing.as_ref().is_some_and(|c| {
        c.data == desired.data
            && c.annotations().get(CONTEXT_VERSION_ANNOTATION)
                == desired.annotations().get(CONTEXT_VERSION_ANNOTATION)
            && c.metadata.owner_references == desired.metadata.owner_references
    });
    if !up_to_date {
        apply(&cms, &desired).await?;
        if version > 1 && version > cm_version.max(status_version) {
            let note = format!("contextVersion {version}: {}", describe_tools(&plan));
            publish(
                ctx,
                tr,
                EventType::Normal,
                "ToolsUpdated",
                "UpdateConfig",
                note,
            )
            .await;
        }
    }

    let (job, job_state) = match job {
        Some(job) => (Some(job), job_state),
        None if finished => (None, job_state),
        None => {
            let created = apply(&jobs, plan.job()).await?;
            let note = format!(
                "created Job {} (agent image {}, proxy image {})",
                plan.job_name(),
                agent_image(plan.job()),
                ctx.render.sidecar_image
            );
            publish(ctx, tr, EventType::Normal, "JobCreated", "CreateJob", note).await;
            let state = status::job_state(&created);
            (Some(created), Some(state))
        }
    };

    // ttlSecondsAfterFinished: the operator deletes the finished Job itself, after recording
    // the outcome, so the deletion can never be mistaken for a Job to recreate.
    let mut requeue = if finished { None } else { Some(RESYNC) };
    let mut ttl_deleted = false;
    if let (Some(ttl), Some(state)) = (tr.spec.ttl_seconds_after_finished, &job_state)
        && state.phase.is_terminal()
        && previous.phase == Some(state.phase)
    {
        let done = state
            .completion_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(|| status::now().0);
        let due = done + k8s_openapi::jiff::SignedDuration::from_secs(i64::from(ttl));
        let left = due.duration_since(status::now().0);
        if left.is_positive() {
            requeue = Some(left.unsigned_abs());
        } else {
            jobs.delete(&name, &DeleteParams::background()).await?;
            ttl_deleted = true;
            let note = format!(
                "deleted Job {name} {ttl}s after the task finished (ttlSecondsAfterFinished)"
            );
            publish(ctx, tr, EventType::Normal, "JobDeleted", "DeleteJob", note).await;
        }
    }

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
    let state = job_state.clone().or_else(|| remembered(&previous));
    fill_phase(&mut status, &previous, state.as_ref());
    let rendered = format!(
        "contextVersion {version} rendered into ConfigMap {}",
        plan.config_map_name()
    );
    let job_cond = match (&job, ttl_deleted || (job.is_none() && finished)) {
        (_, true) => Cond::yes(
            ct::JOB_CREATED,
            "DeletedAfterTTL",
            format!("Job {name} ran and was deleted after ttlSecondsAfterFinished"),
        ),
        (Some(_), false) => Cond::yes(ct::JOB_CREATED, "Created", format!("Job {name} exists")),
        (None, false) => Cond::no(ct::JOB_CREATED, "NotCreated", "the Job does not exist yet"),
    };
    let ready = Cond::yes(
        ct::READY,
        "Ready",
        format!("{rendered}; Job {name} created"),
    );
    status.conditions = status::conditions(
        vec![
            ready,
            Cond::yes(ct::CONFIG_RENDERED, "Rendered", rendered),
            job_cond,
            succeeded_cond(state.as_ref()),
        ],
        &previous.conditions,
        tr.metadata.generation,
        &status::now(),
    );
    tracing::Span::current().record("phase", field::debug(status.phase));
    tracing::Span::current().record("context_version", version);
    write_status(tr, ctx, &previous, status).await?;
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
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
        publish(
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
        ..previous.clone()
    };
    let state = job.cloned().or_else(|| remembered(previous));
    fill_phase(&mut status, previous, state.as_ref());
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
            succeeded_cond(state.as_ref()),
        ],
        &previous.conditions,
        tr.metadata.generation,
        &status::now(),
    );
    write_status(tr, ctx, previous, status).await
}

/// Sets phase and times from the Job (or what was recorded once the Job is gone), and emits an
/// event when the task finishes.
fn fill_phase(status: &mut TaskRunStatus, previous: &TaskRunStatus, state: Option<&JobState>) {
    status.phase = Some(state.map_or(Phase::Pending, |s| s.phase));
    status.start_time = state
        .and_then(|s| s.start_time.clone())
        .or_else(|| previous.start_time.clone());
    status.completion_time = state
        .and_then(|s| s.completion_time.clone())
        .or_else(|| previous.completion_time.clone());
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
        if let Some(recorded) = remembered(previous) {
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

/// The outcome recorded in the status when the Job no longer exists.
fn remembered(previous: &TaskRunStatus) -> Option<JobState> {
    let phase = previous.phase.filter(|p| p.is_terminal())?;
    let cond = previous
        .conditions
        .iter()
        .find(|c| c.type_ == ct::SUCCEEDED);
    Some(JobState {
        phase,
        reason: cond.map_or_else(|| phase.as_str().to_string(), |c| c.reason.clone()),
        message: cond.map_or_else(String::new, |c| c.message.clone()),
        start_time: previous.start_time.clone(),
        completion_time: previous.completion_time.clone(),
    })
}

fn succeeded_cond(state: Option<&JobState>) -> Cond {
    match state {
        Some(s) if s.phase == Phase::Succeeded => {
            Cond::yes(ct::SUCCEEDED, s.reason.clone(), s.message.clone())
        }
        Some(s) if s.phase == Phase::Failed => {
            Cond::no(ct::SUCCEEDED, s.reason.clone(), s.message.clone())
        }
        Some(s) => Cond::unknown(ct::SUCCEEDED, s.reason.clone(), s.message.clone()),
        None => Cond::unknown(ct::SUCCEEDED, "Pending", "the Job does not exist yet"),
    }
}

/// Applies the status when it differs from what the TaskRun shows, and reports phase changes.
async fn write_status(
    tr: &TaskRun,
    ctx: &Context,
    previous: &TaskRunStatus,
    status: TaskRunStatus,
) -> Result<()> {
    if !status::changed(tr.status.as_ref(), &status) {
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
        publish(ctx, tr, kind, reason, "Observe", note).await;
    }
    let api: Api<TaskRun> =
        Api::namespaced(ctx.client.clone(), &tr.namespace().unwrap_or_default());
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

/// Secrets and task sources a new pod needs, checked before the Job is created.
async fn missing_inputs(
    tr: &TaskRun,
    plan: &Plan,
    client: &Client,
    ns: &str,
) -> Result<Vec<Problem>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut problems = Vec::new();
    for b in plan.required_secret_env() {
        let needed_by = format!("env {} of server {}", b.env, b.servers.join(", "));
        match secrets.get_opt(&b.secret).await? {
            None => problems.push(Problem {
                reason: "SecretNotFound",
                message: format!(
                    "Secret {ns}/{} (key {}) for {needed_by} does not exist; create it, e.g. kubectl -n {ns} create secret generic {} --from-literal={}=...",
                    b.secret, b.key, b.secret, b.key
                ),
            }),
            Some(s) if !has_key(&s, &b.key) => problems.push(Problem {
                reason: "SecretKeyNotFound",
                message: format!(
                    "Secret {ns}/{} has no key {} (needed for {needed_by}); it has: {}",
                    b.secret,
                    b.key,
                    keys(&s).join(", ")
                ),
            }),
            Some(_) => {}
        }
    }
    let task = &tr.spec.task;
    if let Some(r) = &task.secret_key_ref {
        match secrets.get_opt(&r.name).await? {
            Some(s) if has_key(&s, &r.key) => {}
            _ => problems.push(Problem {
                reason: "TaskSourceNotFound",
                message: format!(
                    "spec.task.secretKeyRef: Secret {ns}/{} with key {} not found",
                    r.name, r.key
                ),
            }),
        }
    }
    if let Some(r) = &task.config_map_key_ref {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let found = cms.get_opt(&r.name).await?.is_some_and(|c| {
            c.data.as_ref().is_some_and(|d| d.contains_key(&r.key))
                || c.binary_data
                    .as_ref()
                    .is_some_and(|d| d.contains_key(&r.key))
        });
        if !found {
            problems.push(Problem {
                reason: "TaskSourceNotFound",
                message: format!(
                    "spec.task.configMapKeyRef: ConfigMap {ns}/{} with key {} not found",
                    r.name, r.key
                ),
            });
        }
    }
    Ok(problems)
}

fn has_key(s: &Secret, key: &str) -> bool {
    s.data.as_ref().is_some_and(|d| d.contains_key(key))
        || s.string_data.as_ref().is_some_and(|d| d.contains_key(key))
}

/// Key names only: values are never read into messages.
fn keys(s: &Secret) -> Vec<String> {
    s.data.iter().flat_map(|d| d.keys().cloned()).collect()
}

/// Secret env the current config needs that the existing pod's proxy container lacks.
fn env_not_in_pod(job: &Job, plan: &Plan) -> Vec<Problem> {
    let have: BTreeSet<&str> = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == job::PROXY_CONTAINER)
        .flat_map(|c| c.env.iter().flatten().map(|e| e.name.as_str()))
        .collect();
    plan.required_secret_env()
        .filter(|b| !have.contains(b.env.as_str()))
        .map(|b| Problem {
            reason: "SecretEnvNotInPod",
            message: format!(
                "server {} needs env {} from a Secret, but the running pod was created without it (a pod's env cannot change); \
                 list the server (enabled: false, with its secretRefs) when creating a TaskRun to enable it later",
                b.servers.join(", "),
                b.env
            ),
        })
        .collect()
}

/// Keeps of a Job what reconcile reads: identity, owners, status and the proxy container's env
/// names (to know which Secrets the running pod has).
pub fn trim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    job.metadata.annotations = None;
    job.metadata.labels = None;
    if let Some(spec) = job.spec.as_mut() {
        spec.selector = None;
        spec.template.metadata = None;
        if let Some(pod) = spec.template.spec.as_mut() {
            let proxy_env = pod
                .init_containers
                .iter()
                .flatten()
                .find(|c| c.name == job::PROXY_CONTAINER)
                .map(|c| {
                    c.env
                        .iter()
                        .flatten()
                        .map(|e| k8s_openapi::api::core::v1::EnvVar {
                            name: e.name.clone(),
                            ..Default::default()
                        })
                        .collect()
                });
            *pod = k8s_openapi::api::core::v1::PodSpec {
                init_containers: Some(vec![k8s_openapi::api::core::v1::Container {
                    name: job::PROXY_CONTAINER.into(),
                    env: proxy_env,
                    ..Default::default()
                }]),
                ..Default::default()
            };
        }
    }
    if let Some(status) = job.status.as_mut() {
        status.uncounted_terminated_pods = None;
    }
}

/// Keeps of a ConfigMap what reconcile reads (data, annotations, owners).
pub fn trim_config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
    cm.metadata.labels = None;
}

/// Server-side apply of a rendered object under [`MANAGER`].
async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
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

/// Emits an event on the TaskRun; a failure is logged, never fails the reconcile.
async fn publish(
    ctx: &Context,
    tr: &TaskRun,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    // The events API limits a note to 1 kB.
    let mut note = note;
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tr.object_ref(&())).await {
        tracing::warn!(error = %e, reason, "publishing an event");
    }
}

fn describe_tools(plan: &Plan) -> String {
    plan.tools
        .iter()
        .map(|t| {
            let mut s = format!("{} allow [{}]", t.server, t.allow.join(", "));
            if !t.deny.is_empty() {
                s += &format!(" deny [{}]", t.deny.join(", "));
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn agent_image(job: &Job) -> String {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}
