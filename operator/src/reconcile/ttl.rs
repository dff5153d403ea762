//! Time-to-live after a task finished, for its Job (`ttlSecondsAfterFinished`) and for the
//! TaskRun itself (`retentionSecondsAfterFinished`, else the operator's default). The operator
//! deletes both itself, after recording the outcome, so a deleted Job can never be mistaken for a
//! Job to recreate, and a TaskRun never goes before its outcome was in its status. Pure.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use orchestrator_crds::taskrun::{Phase, TaskRunStatus, conditions as ct};

use super::facts::JobState;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// No TTL, the task is unfinished, or its outcome is not recorded yet.
    NotDue,
    /// Look again after this long.
    Wait(Duration),
    /// Delete now.
    Delete,
}

impl Ttl {
    /// When to look again, if this says to wait.
    pub fn wait(self) -> Option<Duration> {
        match self {
            Ttl::Wait(left) => Some(left),
            _ => None,
        }
    }
}

/// What to do about a Job whose task recorded `recorded` as its phase, `now`.
pub fn decide(
    ttl_seconds: Option<i32>,
    state: Option<&JobState>,
    recorded: Option<Phase>,
    now: Timestamp,
) -> Ttl {
    let (Some(ttl), Some(state)) = (ttl_seconds, state) else {
        return Ttl::NotDue;
    };
    if !state.phase.is_terminal() || recorded != Some(state.phase) {
        return Ttl::NotDue;
    }
    let done = state.completion_time.as_ref().map_or(now, |t| t.0);
    after(i64::from(ttl), done, now)
}

/// What to do about a TaskRun with this recorded status, kept `retention_seconds` after its task
/// finished (its `retentionSecondsAfterFinished`, else the operator's default), `now`.
pub fn decide_taskrun(
    retention_seconds: Option<i64>,
    recorded: &TaskRunStatus,
    now: Timestamp,
) -> Ttl {
    match (retention_seconds, finished_at(recorded)) {
        (Some(retention), Some(done)) => after(retention, done, now),
        _ => Ttl::NotDue,
    }
}

/// When the task finished, as its recorded status says: its completion time, else when its
/// `Succeeded` condition became final. `None` while unfinished or not recorded.
pub fn finished_at(recorded: &TaskRunStatus) -> Option<Timestamp> {
    if !recorded.phase.is_some_and(Phase::is_terminal) {
        return None;
    }
    recorded.completion_time.as_ref().map(|t| t.0).or_else(|| {
        recorded
            .conditions
            .iter()
            .find(|c| c.type_ == ct::SUCCEEDED && c.status != "Unknown")
            .map(|c| c.last_transition_time.0)
    })
}

/// The longest wait asked for: the controller's timer wheel takes no deadline years away, and
/// looking at a finished task once a day costs nothing (it reads only the cache).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

fn after(ttl_seconds: i64, done: Timestamp, now: Timestamp) -> Ttl {
    let left = done
        .checked_add(SignedDuration::from_secs(ttl_seconds))
        .map_or(SignedDuration::MAX, |due| due.duration_since(now));
    if left.is_positive() {
        Ttl::Wait(left.unsigned_abs().min(MAX_WAIT))
    } else {
        Ttl::Delete
    }
}
