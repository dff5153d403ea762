//! Following a TaskRun with a watch: until a terminal phase (`submit --wait`, `cancel --wait`;
//! showing each call that waits for approval meanwhile), or until a given
//! generation of its spec is live (`add-context --wait-synced`): rendered by the operator and,
//! for a running task whose proxy reports (condition `ToolsSynced`), served by that proxy.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::collections::HashSet;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::ApprovalState;
use orchestrator_crds::taskrun::{Phase, TaskRun, conditions};

use crate::error::{Error, Result};
use crate::output::{age, visible};

/// The condition of `type_` in the status, if any.
pub fn condition<'a>(tr: &'a TaskRun, type_: &str) -> Option<&'a Condition> {
    tr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Watches one TaskRun, feeding each version to `step` until it returns `Some`. A deleted
/// TaskRun is an error. Transient watch failures are retried for a while.
async fn follow<T>(
    api: &Api<TaskRun>,
    name: &str,
    timeout: Option<Duration>,
    what: &str,
    mut step: impl FnMut(&TaskRun) -> Result<Option<T>>,
) -> Result<T> {
    let stream = kube::runtime::watcher::watch_object(api.clone(), name);
    let work = async move {
        futures::pin_mut!(stream);
        drive(&mut stream, name, &mut step).await
    };
    match timeout {
        None => work.await,
        Some(after) => tokio::time::timeout(after, work)
            .await
            .map_err(|_| Error::Timeout {
                what: what.to_string(),
                after,
            })?,
    }
}

async fn drive<T, S>(
    stream: &mut S,
    name: &str,
    step: &mut impl FnMut(&TaskRun) -> Result<Option<T>>,
) -> Result<T>
where
    S: Stream<Item = std::result::Result<Option<TaskRun>, watcher::Error>> + Unpin,
{
    let mut failures = 0u32;
    while let Some(item) = stream.next().await {
        match item {
            Ok(Some(tr)) => {
                failures = 0;
                if let Some(done) = step(&tr)? {
                    return Ok(done);
                }
            }
            Ok(None) => {
                return Err(Error::NotFound(format!(
                    "TaskRun {name} does not exist (or was deleted while waiting)"
                )));
            }
            Err(e) => {
                failures += 1;
                if failures >= 30 {
                    return Err(Error::Cluster(format!(
                        "watching TaskRun {name} keeps failing: {e}"
                    )));
                }
                tracing::warn!(error = %e, "watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    Err(Error::Cluster(format!("the watch on TaskRun {name} ended")))
}

/// Follows the task to Succeeded, Failed or Cancelled, reporting on stderr each new phase, each
/// new problem condition, and each call that starts waiting for a person (once, with the
/// command to decide it). Returns the final phase.
pub async fn until_finished(
    api: &Api<TaskRun>,
    name: &str,
    timeout: Option<Duration>,
) -> Result<Phase> {
    let mut last_phase = None;
    let mut last_problem: Option<String> = None;
    let mut shown = HashSet::new();
    let what = format!("TaskRun {name} to finish");
    follow(api, name, timeout, &what, |tr| {
        let status = tr.status.clone().unwrap_or_default();
        if status.phase != last_phase {
            if let Some(p) = status.phase {
                let by = status
                    .cancellation
                    .as_ref()
                    .filter(|_| p == Phase::Cancelled)
                    .map(|c| format!(" by {}", visible(&c.requested_by)))
                    .unwrap_or_default();
                eprintln!("{name}: {}{by}", p.as_str());
            }
            last_phase = status.phase;
        }
        let problem = status
            .conditions
            .iter()
            .find(|c| c.status == "False" && c.type_ != conditions::SUCCEEDED)
            .map(|c| format!("{} is False: {} ({})", c.type_, c.message, c.reason));
        if problem.is_some() && problem != last_problem {
            eprintln!("{name}: {}", problem.clone().unwrap_or_default());
        }
        last_problem = problem;
        for line in waiting_approvals(tr, &mut shown, Timestamp::now()) {
            eprintln!("{line}");
        }
        Ok(status.phase.filter(|p| p.is_terminal()))
    })
    .await
}

/// The calls of `tr` waiting for a person that are not in `shown` yet (added to it): one line
/// each, naming the call, its id, when it expires and the commands to decide it.
pub fn waiting_approvals(tr: &TaskRun, shown: &mut HashSet<String>, now: Timestamp) -> Vec<String> {
    let name = tr.name_any();
    let ns = tr.namespace().unwrap_or_default();
    let approvals = tr
        .status
        .as_ref()
        .map(|s| s.approvals.as_slice())
        .unwrap_or_default();
    approvals
        .iter()
        .filter(|a| a.state == ApprovalState::Pending && shown.insert(a.id.clone()))
        .map(|a| {
            let id = visible(&a.id);
            let expires = match a.expires_at.parse::<Timestamp>() {
                Ok(t) if t > now => format!("{} (in {})", a.expires_at, age(now, t)),
                Ok(_) => format!("{} (now)", a.expires_at),
                Err(_) => visible(&a.expires_at),
            };
            format!(
                "{name}: waiting for approval: call {id} to {}, expires {expires}; see it whole: \
                 orchestrator-cli -n {ns} task approvals {name} --show {id}, then \
                 `task approve {name} {id} --digest ...` or `task reject {name} {id}`",
                visible(&format!("{}/{}", a.server, a.tool)),
            )
        })
        .collect()
}

/// What `--wait-synced` reports once the change is live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Synced {
    pub context_version: Option<i64>,
    pub config_map: Option<String>,
    /// The version the task pod's proxy serves, when it reports (`status.servedContextVersion`).
    pub served: Option<i64>,
}

/// Waits until the status describes `generation` (or later) with `ConfigRendered` True and, when
/// the task is running and its proxy reports what it serves (`ToolsSynced` present), until
/// `status.servedContextVersion` reaches the rendered version. If the operator reports
/// `ConfigRendered` (or `Ready`) False for it, that is the answer (exit 5).
pub async fn until_synced(
    api: &Api<TaskRun>,
    name: &str,
    generation: i64,
    timeout: Duration,
) -> Result<Synced> {
    let what = format!(
        "generation {generation} of TaskRun {name} to be rendered by the operator and served by the task pod's proxy"
    );
    follow(api, name, Some(timeout), &what, |tr| synced(tr, generation)).await
}

/// The decision of [`until_synced`] for one version of the object.
pub fn synced(tr: &TaskRun, generation: i64) -> Result<Option<Synced>> {
    let Some(status) = &tr.status else {
        return Ok(None);
    };
    if status.observed_generation.unwrap_or(0) < generation {
        return Ok(None);
    }
    let fresh = |c: &&Condition| c.observed_generation.is_none_or(|g| g >= generation);
    let rendered = condition(tr, conditions::CONFIG_RENDERED).filter(fresh);
    match rendered {
        Some(c) if c.status == "True" => {
            // The proxy reports what it serves once it reaches the API server; one that never
            // has (the API watch off, or the API unreachable from the pod) still applies the
            // mounted file, so there is nothing to wait for beyond the render.
            let reports = condition(tr, conditions::TOOLS_SYNCED).is_some()
                && status.served_context_version.is_some();
            let running = status.phase == Some(Phase::Running);
            let version = status.context_version.unwrap_or(0);
            // A pending pod's proxy starts with the rendered version; a finished one serves none.
            let served = status.served_context_version.filter(|s| *s >= version);
            if reports && running && served.is_none() {
                return Ok(None);
            }
            Ok(Some(Synced {
                context_version: status.context_version,
                config_map: status.config_map_name.clone(),
                served: status.served_context_version,
            }))
        }
        Some(c) if c.status == "False" => Err(Error::Failed(format!(
            "the operator did not apply the change: ConfigRendered is False: {} ({})",
            c.message, c.reason
        ))),
        _ => match condition(tr, conditions::READY).filter(fresh) {
            Some(c) if c.status == "False" => Err(Error::Failed(format!(
                "the operator did not apply the change: Ready is False: {} ({})",
                c.message, c.reason
            ))),
            _ => Ok(None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taskrun(status: serde_json::Value) -> TaskRun {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "generation": 3},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"}},
            "status": status,
        }))
        .expect("valid TaskRun")
    }

    fn cond(type_: &str, status: &str, generation: i64) -> serde_json::Value {
        serde_json::json!({"type": type_, "status": status, "reason": "R", "message": "m",
            "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": generation})
    }

    #[test]
    fn synced_waits_for_the_generation_and_config_rendered() {
        let old = taskrun(
            serde_json::json!({"observedGeneration": 2, "contextVersion": 1,
            "conditions": [cond("ConfigRendered", "True", 2)]}),
        );
        assert_eq!(synced(&old, 3).expect("no error"), None, "older generation");
        let stale_condition = taskrun(serde_json::json!({"observedGeneration": 3,
            "conditions": [cond("ConfigRendered", "True", 2)]}));
        assert_eq!(synced(&stale_condition, 3).expect("no error"), None);
        let done = taskrun(
            serde_json::json!({"observedGeneration": 3, "contextVersion": 2,
            "configMapName": "t-tools", "conditions": [cond("ConfigRendered", "True", 3)]}),
        );
        assert_eq!(
            synced(&done, 3).expect("no error"),
            Some(Synced {
                context_version: Some(2),
                config_map: Some("t-tools".into()),
                served: None,
            })
        );
    }

    #[test]
    fn a_running_tasks_change_is_live_when_its_proxy_serves_it() {
        let rendered = |served: i64, phase: &str| {
            taskrun(
                serde_json::json!({"observedGeneration": 3, "contextVersion": 2,
                "phase": phase, "servedContextVersion": served,
                "conditions": [cond("ConfigRendered", "True", 3), cond("ToolsSynced", "False", 3)]}),
            )
        };
        // Rendered, but the running proxy still serves version 1: keep waiting.
        assert_eq!(synced(&rendered(1, "Running"), 3).expect("no error"), None);
        let live = synced(&rendered(2, "Running"), 3)
            .expect("no error")
            .expect("live");
        assert_eq!((live.context_version, live.served), (Some(2), Some(2)));
        // A proxy that never reported (e.g. it cannot reach the API server): the render.
        let silent = taskrun(
            serde_json::json!({"observedGeneration": 3, "contextVersion": 2,
            "phase": "Running", "conditions": [cond("ConfigRendered", "True", 3),
            cond("ToolsSynced", "Unknown", 3)]}),
        );
        assert!(synced(&silent, 3).expect("no error").is_some());
        // Not running: nothing to wait for beyond the render.
        assert!(
            synced(&rendered(1, "Pending"), 3)
                .expect("no error")
                .is_some()
        );
        assert!(
            synced(&rendered(1, "Succeeded"), 3)
                .expect("no error")
                .is_some()
        );
    }

    #[test]
    fn each_waiting_call_is_shown_once_with_how_to_decide_it() {
        let approval = |id: &str, state: &str| {
            serde_json::json!({"id": id, "server": "github", "tool": "merge_pr\u{1b}[2J",
                "state": state, "requestedAt": "2025-01-01T00:00:00Z",
                "expiresAt": "2025-01-01T00:05:00Z", "contextVersion": 1})
        };
        let mut tr = taskrun(serde_json::json!({"phase": "Running",
            "approvals": [approval("a1", "Pending"), approval("a0", "Approved")]}));
        tr.metadata.namespace = Some("team-a".into());
        let now: Timestamp = "2025-01-01T00:01:00Z".parse().expect("valid");
        let mut shown = HashSet::new();
        let lines = waiting_approvals(&tr, &mut shown, now);
        assert_eq!(
            lines,
            [
                "t: waiting for approval: call a1 to github/merge_pr\\u{1b}[2J, expires \
              2025-01-01T00:05:00Z (in 4m); see it whole: \
                 orchestrator-cli -n team-a task \
              approvals t --show a1, then `task approve t a1 --digest ...` or `task reject t a1`"
            ]
        );
        assert!(waiting_approvals(&tr, &mut shown, now).is_empty(), "once");
    }

    #[test]
    fn a_refused_change_ends_the_wait_with_the_operators_reason() {
        let refused = taskrun(serde_json::json!({"observedGeneration": 3,
            "conditions": [cond("Ready", "False", 3)]}));
        let err = synced(&refused, 3).expect_err("refused");
        assert_eq!(err.exit_code(), 5);
        assert!(err.to_string().contains("Ready is False: m (R)"), "{err}");
    }
}
