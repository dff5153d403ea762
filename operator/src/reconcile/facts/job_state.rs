//! The task's phase as its Job says it ([`JobState`]), read from the Job as cached.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use orchestrator_crds::taskrun::Phase;

use super::cached_job::CachedJob;

/// What the Job says about the task.
#[derive(Clone, Debug, PartialEq)]
pub struct JobState {
    pub phase: Phase,
    /// Why it failed (the Job's `Failed` condition reason), or how it succeeded.
    pub reason: String,
    pub message: String,
    pub start_time: Option<Time>,
    pub completion_time: Option<Time>,
}

/// The task's phase from its Job.
pub fn job_state(job: &CachedJob) -> JobState {
    let status = job.status.clone().unwrap_or_default();
    let conditions = status.conditions.clone().unwrap_or_default();
    let holds = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
    };
    let (phase, reason, message, completion) = if let Some(c) = holds("Complete") {
        let done = status
            .completion_time
            .clone()
            .or_else(|| c.last_transition_time.clone());
        (
            Phase::Succeeded,
            "Completed".to_string(),
            "the agent finished successfully".to_string(),
            done,
        )
    } else if let Some(c) = holds("Failed") {
        (
            Phase::Failed,
            c.reason.clone().unwrap_or_else(|| "JobFailed".into()),
            c.message.clone().unwrap_or_else(|| "the Job failed".into()),
            c.last_transition_time.clone(),
        )
    } else if status.active.unwrap_or(0) > 0
        || status.succeeded.unwrap_or(0) > 0
        || status.failed.unwrap_or(0) > 0
    {
        // A pod that already finished counts as running until the Job controller sets its
        // terminal condition, so the phase never steps back from Running to Pending.
        (
            Phase::Running,
            "Running".into(),
            "the agent is running".into(),
            None,
        )
    } else {
        (
            Phase::Pending,
            "Pending".into(),
            "waiting for the Job's pod to start".into(),
            None,
        )
    };
    JobState {
        phase,
        reason,
        message,
        start_time: status.start_time,
        completion_time: completion,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_follows_the_job() {
        let job = |status: serde_json::Value| -> CachedJob {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "j"}, "status": status}))
                .expect("job")
        };
        assert_eq!(job_state(&job(serde_json::json!({}))).phase, Phase::Pending);
        assert_eq!(
            job_state(&job(serde_json::json!({"active": 1}))).phase,
            Phase::Running
        );
        // The pod finished but the Job controller has not set Complete yet: still Running.
        assert_eq!(
            job_state(&job(serde_json::json!({"active": 0, "succeeded": 1}))).phase,
            Phase::Running
        );
        let done = job_state(&job(serde_json::json!({"conditions": [
            {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}
        ], "completionTime": "2026-01-01T00:00:00Z"})));
        assert_eq!(done.phase, Phase::Succeeded);
        assert!(done.completion_time.is_some());
        let failed = job_state(&job(serde_json::json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too slow"}
        ]})));
        assert_eq!(
            (failed.phase, failed.reason.as_str()),
            (Phase::Failed, "DeadlineExceeded")
        );
    }
}
