//! What a reconcile of an unfinished (or changed) TaskRun starts from ([`Observed`], filled by
//! `steps/observe.rs`).

use std::sync::Arc;

use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::{TaskResult, TaskRunStatus};

use super::children::JobFacts;
use super::job_state::JobState;
use crate::render::Problem;

/// What reconcile knows of a TaskRun before it renders it.
pub struct Observed {
    pub ns: String,
    pub name: String,
    /// The status the last reconcile wrote (as the TaskRun shows it).
    pub previous: TaskRunStatus,
    /// The Job's facts, when it exists (or was created by this reconcile).
    pub job: Option<Arc<JobFacts>>,
    /// The Job's state (a failed agent explained, see `steps/observe.rs`).
    pub job_state: Option<JobState>,
    /// The task finished (its Job says so, or the status recorded it): it is never run again,
    /// even when its Job is gone (deleted after its TTL).
    pub finished: bool,
    /// A Job of the task's name that is not this TaskRun's (see `taken.rs`): not its Job.
    pub job_taken: Option<Problem>,
    /// What the agent reported (its termination message), read when the Job's outcome is first
    /// recorded; `None` otherwise (the recorded one is kept).
    pub result: Option<TaskResult>,
    /// Where the task's proxy runs, once resolved (`placement/mode.rs`): every status written records it.
    pub mode: Option<ProxyMode>,
}
