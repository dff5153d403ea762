//! Status: the phase from the Job (`facts::job_state`), the conditions (`ToolsSynced` from what
//! the proxy reports, `BudgetExceeded` from its usage, ...), and keeping each condition's
//! `lastTransitionTime` when its status did not change. Pure.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use orchestrator_crds::gateway::ModelUsage;
use orchestrator_crds::taskrun::{Phase, TaskResult, TaskRunStatus};

use super::facts::JobState;
use crate::render::job::AGENT_CONTAINER;
use orchestrator_crds::taskrun::conditions as ct;

/// The longest container termination message kept in a condition message.
const MAX_TERMINATION_MESSAGE: usize = 512;

/// One condition to write (the transition time is filled in by [`conditions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

impl Cond {
    fn new(
        type_: &'static str,
        status: &'static str,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn yes(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(type_, "True", reason, message)
    }

    pub fn no(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(type_, "False", reason, message)
    }

    pub fn unknown(
        type_: &'static str,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(type_, "Unknown", reason, message)
    }
}

/// Full conditions, keeping the previous `lastTransitionTime` of those whose status is unchanged.
pub fn conditions(
    wanted: Vec<Cond>,
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    wanted
        .into_iter()
        .map(|c| {
            let status = c.status;
            let since = previous
                .iter()
                .find(|p| p.type_ == c.type_ && p.status == status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: c.type_.to_string(),
                status: status.to_string(),
                reason: c.reason,
                message: c.message,
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// `ToolsSynced` for the rendered `version` and what the proxy reported.
pub fn condition(version: u64, served: Option<i64>) -> Cond {
    match served {
        Some(s) if s >= version as i64 => Cond::yes(
            ct::TOOLS_SYNCED,
            "Served",
            format!("the task pod's proxy serves contextVersion {s}"),
        ),
        Some(s) => Cond::no(
            ct::TOOLS_SYNCED,
            "Syncing",
            format!("the task pod's proxy serves contextVersion {s}; {version} is rendered"),
        ),
        None => Cond::unknown(
            ct::TOOLS_SYNCED,
            "NotReported",
            "the task pod's proxy has not reported what it serves yet",
        ),
    }
}

/// `BudgetExceeded`: True while the gateway refuses the task's requests for its budget.
pub fn budget_condition(usage: &ModelUsage) -> Cond {
    match &usage.exceeded {
        Some(limit) => Cond::yes(
            ct::BUDGET_EXCEEDED,
            "BudgetExceeded",
            format!(
                "the task's model requests are refused: spec.budget.{limit} is spent; raise it \
                 to let the task go on"
            ),
        ),
        None => Cond::no(
            ct::BUDGET_EXCEEDED,
            "WithinBudget",
            format!("{} model requests within the budget", usage.requests),
        ),
    }
}

/// How the agent ended in the newest of a failed Job's pods whose agent container exited with a
/// non-zero code: "the agent container of pod P exited with code N (Reason): message". `None`
/// when no agent container ended that way (the pod never started it, or the Job failed for
/// another reason, e.g. its deadline), so the Job's own reason stands.
pub fn agent_failure(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter_map(|pod| {
            let status = pod.status.as_ref()?;
            let agent = status
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == AGENT_CONTAINER)?;
            let ended = agent.state.as_ref()?.terminated.as_ref()?;
            (ended.exit_code != 0).then_some((pod, ended))
        })
        .max_by_key(|(_, ended)| ended.finished_at.as_ref().map(|t| t.0))
        .map(|(pod, ended)| {
            let mut out = format!(
                "the agent container of pod {} exited with code {}",
                pod.metadata.name.as_deref().unwrap_or("?"),
                ended.exit_code
            );
            if let Some(reason) = ended.reason.as_deref().filter(|r| !r.is_empty()) {
                out += &format!(" ({reason})");
            }
            let message = ended.message.as_deref().map(str::trim);
            if message.is_some_and(|m| {
                m.starts_with('{') && matches!(TaskResult::from_termination_message(m), Ok(Some(_)))
            }) {
                out += ": its report is in status.result";
            } else if let Some(message) = message.filter(|m| !m.is_empty()) {
                let mut cut = message.len().min(MAX_TERMINATION_MESSAGE);
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                out += &format!(": {}", &message[..cut]);
            }
            out
        })
}

/// What the agent reported in its termination message (docs/api.md, "The agent's result"): the
/// newest of the pods whose agent container has terminated. `None` when no agent container has
/// terminated or it wrote nothing; a message that is not a result is recorded as unreadable.
pub fn agent_result(pods: &[Pod]) -> Option<TaskResult> {
    let message = pods
        .iter()
        .filter_map(|pod| {
            let agent = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == AGENT_CONTAINER)?;
            agent.state.as_ref()?.terminated.clone()
        })
        .max_by_key(|ended| ended.finished_at.as_ref().map(|t| t.0))?
        .message?;
    match TaskResult::from_termination_message(&message) {
        Ok(result) => result,
        Err(reason) => Some(TaskResult::unreadable(reason)),
    }
}

pub fn now() -> Time {
    Time(Timestamp::now())
}

/// Sets phase and times from the Job (or what was recorded once the Job is gone).
pub fn fill_phase(status: &mut TaskRunStatus, previous: &TaskRunStatus, state: Option<&JobState>) {
    status.phase = Some(state.map_or(Phase::Pending, |s| s.phase));
    status.start_time = state
        .and_then(|s| s.start_time.clone())
        .or_else(|| previous.start_time.clone());
    status.completion_time = state
        .and_then(|s| s.completion_time.clone())
        .or_else(|| previous.completion_time.clone());
}

/// The outcome recorded in the status when the Job no longer exists.
pub fn remembered(previous: &TaskRunStatus) -> Option<JobState> {
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

/// What the task's status is built from: the Job's state, or what was recorded once the Job is
/// gone; a cancelled task's recorded outcome stands even while its Job is still going away.
pub fn outcome(job: Option<&JobState>, previous: &TaskRunStatus) -> Option<JobState> {
    if previous.phase == Some(Phase::Cancelled) {
        return remembered(previous);
    }
    job.cloned().or_else(|| remembered(previous))
}

/// The `Succeeded` condition from the Job's state (`Unknown` while it runs or does not exist).
pub fn succeeded_cond(state: Option<&JobState>) -> Cond {
    match state {
        Some(s) if s.phase == Phase::Succeeded => {
            Cond::yes(ct::SUCCEEDED, s.reason.clone(), s.message.clone())
        }
        Some(s) if matches!(s.phase, Phase::Failed | Phase::Cancelled) => {
            Cond::no(ct::SUCCEEDED, s.reason.clone(), s.message.clone())
        }
        Some(s) => Cond::unknown(ct::SUCCEEDED, s.reason.clone(), s.message.clone()),
        None => Cond::unknown(ct::SUCCEEDED, "Pending", "the Job does not exist yet"),
    }
}

/// `JobCreated`: the Job exists, or it ran and is gone (deleted after its TTL, or when the task
/// was cancelled: `recorded` is the phase the status records), or it does not exist yet.
pub fn job_created_cond(name: &str, exists: bool, finished: bool, recorded: Option<Phase>) -> Cond {
    match (exists, finished) {
        (false, true) if recorded == Some(Phase::Cancelled) => Cond::yes(
            ct::JOB_CREATED,
            "DeletedOnCancel",
            format!("Job {name} was deleted when the task was cancelled"),
        ),
        (false, true) => Cond::yes(
            ct::JOB_CREATED,
            "DeletedAfterTTL",
            format!("Job {name} ran and was deleted after ttlSecondsAfterFinished"),
        ),
        (true, _) => Cond::yes(ct::JOB_CREATED, "Created", format!("Job {name} exists")),
        (false, false) => Cond::no(ct::JOB_CREATED, "NotCreated", "the Job does not exist yet"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::core::PartialObjectMeta;
    use orchestrator_crds::gateway::USAGE_ANNOTATION;
    use serde_json::json;

    use super::*;
    use crate::reconcile::facts::lease::lease_facts;

    #[test]
    fn transition_time_is_kept_while_the_status_holds() {
        let t0 = Time(Timestamp::UNIX_EPOCH);
        let first = conditions(vec![Cond::yes("Ready", "Ready", "ok")], &[], Some(1), &t0);
        let t1 = now();
        let same = conditions(
            vec![Cond::yes("Ready", "Ready", "still ok")],
            &first,
            Some(2),
            &t1,
        );
        assert_eq!(same[0].last_transition_time, t0);
        let flipped = conditions(
            vec![Cond::no("Ready", "UnknownServer", "x")],
            &same,
            Some(3),
            &t1,
        );
        assert_eq!(flipped[0].last_transition_time, t1);
        assert_eq!(flipped[0].status, "False");
    }

    #[test]
    fn a_failed_agent_is_named_with_its_exit_code_and_reason() {
        let pod = |name: &str, agent: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"containerStatuses": [{"name": "agent", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0, "state": agent}]}
            }))
            .expect("pod")
        };
        let failed = |code: i32, at: &str, message: &str| {
            serde_json::json!({"terminated": {"exitCode": code, "reason": "Error", "message": message,
                "finishedAt": at}})
        };
        // The newest failure wins; a running or a successful agent says nothing.
        let pods = [
            pod("p-1", failed(2, "2026-01-01T00:00:00Z", "")),
            pod("p-2", failed(3, "2026-01-01T00:01:00Z", "  no API key\n")),
            pod("p-3", serde_json::json!({"running": {}})),
        ];
        assert_eq!(
            agent_failure(&pods).as_deref(),
            Some("the agent container of pod p-2 exited with code 3 (Error): no API key")
        );
        assert_eq!(agent_failure(&pods[2..]), None);
        assert_eq!(
            agent_failure(&[pod("p", failed(0, "2026-01-01T00:00:00Z", ""))]),
            None
        );
        // A long termination message is cut (on a character boundary).
        let long = "é".repeat(600);
        let said = agent_failure(&[pod("p", failed(137, "2026-01-01T00:00:00Z", &long))])
            .expect("a failure");
        assert!(said.len() < 600 + 80, "{}", said.len());
    }

    #[test]
    fn the_proxys_usage_report_becomes_status_usage_and_a_spent_budget_a_condition() {
        let with = |text: &str| -> PartialObjectMeta<Lease> {
            serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "t", "namespace": "team-a",
                             "annotations": {USAGE_ANNOTATION: text}}}))
            .unwrap_or_else(|e| panic!("a Lease: {e}"))
        };
        let report = json!({"inputTokens": 1200, "outputTokens": 100, "cacheCreationInputTokens": 0,
                            "cacheReadInputTokens": 4000, "costUsd": "0.0123", "requests": 3,
                            "refused": 2, "exceeded": "outputTokens"});
        let usage = lease_facts(&with(&report.to_string()))
            .and_then(|f| f.usage)
            .expect("the usage");
        assert_eq!((usage.output_tokens, usage.requests), (100, 3));
        let cond = budget_condition(&usage);
        assert!(
            cond.message.contains("spec.budget.outputTokens"),
            "{}",
            cond.message
        );
        assert_eq!(cond.reason, "BudgetExceeded");
        let within = ModelUsage {
            exceeded: None,
            ..usage
        };
        assert_eq!(budget_condition(&within).reason, "WithinBudget");
        // Not our proxy's: too long, or not the shape.
        for bad in [
            format!("{{\"requests\": 1, \"x\": \"{}\"}}", "a".repeat(2000)),
            "[1]".into(),
        ] {
            assert!(
                lease_facts(&with(&bad)).and_then(|f| f.usage).is_none(),
                "{bad:.40}"
            );
        }
    }
}
