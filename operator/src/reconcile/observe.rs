//! What a reconcile of an unfinished (or changed) TaskRun starts from: the TaskRun as it is to be
//! rendered, the status the last reconcile recorded, and the task's Job, with a failed agent
//! explained. Reads the cache first, the API server only where the cache cannot answer.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskRun, TaskRunStatus, conditions as ct};

use super::Context;
use super::cached_job::CachedJob;
use super::children::JobFacts;
use super::status::{self, JobState};
use super::{taken, trim};
use crate::error::Result;
use crate::render::Problem;

/// What reconcile knows of a TaskRun before it renders it.
pub struct Observed {
    pub ns: String,
    pub name: String,
    /// The status the last reconcile wrote (as the TaskRun shows it).
    pub previous: TaskRunStatus,
    /// The Job's facts, when it exists (or was created by this reconcile).
    pub job: Option<Arc<JobFacts>>,
    /// The Job's state (a failed agent explained, see [`explain_failure`]).
    pub job_state: Option<JobState>,
    /// The task finished (its Job says so, or the status recorded it): it is never run again,
    /// even when its Job is gone (deleted after its TTL).
    pub finished: bool,
    /// A Job of the task's name that is not this TaskRun's (see `taken.rs`): not its Job.
    pub job_taken: Option<Problem>,
}

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
    if let Some(state) = job_state.as_mut()
        && state.phase == Phase::Failed
    {
        explain_failure(state, &previous, &ns, &name, ctx).await;
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
    })
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
