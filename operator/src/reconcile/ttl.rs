//! `ttlSecondsAfterFinished`: when the operator deletes a finished Job. It deletes it itself,
//! after recording the outcome, so the deletion can never be mistaken for a Job to recreate.
//! Pure.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use orchestrator_crds::taskrun::Phase;

use super::status::JobState;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// No TTL, the task is unfinished, or its outcome is not recorded yet.
    NotDue,
    /// Look again after this long.
    Wait(Duration),
    /// Delete the Job now.
    Delete,
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
    let left = (done + SignedDuration::from_secs(i64::from(ttl))).duration_since(now);
    if left.is_positive() {
        Ttl::Wait(left.unsigned_abs())
    } else {
        Ttl::Delete
    }
}
