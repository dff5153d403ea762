//! What a reconcile of an unfinished (or changed) TaskRun starts from: the TaskRun as it is to be
//! rendered, the status the last reconcile recorded, and the task's Job, with a failed agent
//! explained. Reads the cache first, the API server only where the cache cannot answer.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskResult, TaskRun, TaskRunStatus, conditions as ct};

use crate::error::Result;
use crate::reconcile::context::Context;
use crate::reconcile::facts::{CachedJob, JobFacts, JobState, Observed};
use crate::reconcile::{status, taken, trim};

/// A finished task whose spec changed is rendered as before, from a fresh read when the cache
/// dropped its task text (`trim.rs`). Returns that fresh TaskRun; `None`: the cached one serves.
pub async fn fresh_taskrun(
    tr: &TaskRun,
    ctx: &Context,
    ns: &str,
    previous: &TaskRunStatus,
) -> Result<Option<TaskRun>> {
    let recorded_finished = previous.phase.is_some_and(Phase::is_terminal);
    if recorded_finished && trim::task_text_dropped(tr) {
        let api: Api<TaskRun> = Api::namespaced(ctx.client.clone(), ns);
        return Ok(Some(api.get(&tr.name_any()).await?));
    }
    Ok(None)
}

/// Reads the task's Job: the cache first; a miss is confirmed by a read so a Job that the cache
/// has not seen yet is never applied twice, and so is a cached Job that is not this TaskRun's
/// (which then is not its Job). A failed Job's state is explained from its pods.
pub async fn observe(
    ctx: &Context,
    tr: &TaskRun,
    ns: String,
    previous: TaskRunStatus,
) -> Result<Observed> {
    let name = tr.name_any();
    let uid = tr.uid().unwrap_or_default();
    let mut job_taken = None;
    let job = match ctx.jobs.get(&ns, &name).filter(|j| j.controlled_by(&uid)) {
        Some(job) => Some(job),
        None => match Api::<CachedJob>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&name)
            .await?
        {
            Some(j) => {
                job_taken = taken::judge("Job", &j.metadata, tr);
                job_taken.is_none().then(|| Arc::new(JobFacts::of(&j)))
            }
            None => None,
        },
    };
    let mut job_state = job.as_ref().map(|j| j.state.clone());
    let mut result = None;
    if let (Some(state), Some(job)) = (job_state.as_mut(), job.as_deref())
        && state.phase.is_terminal()
    {
        result = read_outcome(state, &previous, (&ns, &name), job, ctx).await;
    }
    let finished = job_state
        .as_ref()
        .map(|s| s.phase.is_terminal())
        .unwrap_or(false)
        || previous.phase.is_some_and(Phase::is_terminal);
    Ok(Observed {
        ns,
        name,
        previous,
        job,
        job_state,
        finished,
        job_taken,
        result,
        mode: None,
    })
}

/// Read from the finished Job's pods once, when its outcome is first recorded (afterwards the
/// recorded status is kept): what the agent reported in its termination message
/// (`status.result`), and, as a failed Job says only that it failed (e.g.
/// BackoffLimitExceeded), when the agent container exited non-zero, reason `AgentFailed` with
/// its exit code, reason and message. Only the Job's own pods count (controlled by its uid): a
/// pod made to look like the Job's reports nothing. A failed read keeps the Job's own reason
/// and records no result.
async fn read_outcome(
    state: &mut JobState,
    previous: &TaskRunStatus,
    (ns, name): (&str, &str),
    job: &JobFacts,
    ctx: &Context,
) -> Option<TaskResult> {
    if previous.phase.is_some_and(Phase::is_terminal) {
        if previous.phase == Some(Phase::Failed)
            && let Some(recorded) = status::remembered(previous)
        {
            state.reason = recorded.reason;
            state.message = recorded.message;
        }
        return None;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = match job.uid.as_deref() {
        Some(uid) => format!("batch.kubernetes.io/controller-uid={uid}"),
        None => format!("batch.kubernetes.io/job-name={name}"),
    };
    let list = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(job = %name, error = %e, "could not read the finished Job's pods; the TaskRun keeps the Job's reason and records no result");
            return None;
        }
    };
    let own: Vec<Pod> = list
        .into_iter()
        .filter(|p| job.uid.as_deref().is_none_or(|uid| controlled_by(p, uid)))
        .collect();
    if state.phase == Phase::Failed
        && let Some(agent) = status::agent_failure(&own)
    {
        state.message = format!("{agent}; Job {name}: {}", state.message);
        state.reason = ct::AGENT_FAILED.to_string();
    }
    status::agent_result(&own)
}

/// Whether the pod's controller is the Job with `uid`.
fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "Job" && o.uid == uid)
}
