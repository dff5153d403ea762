//! `task logs`: the log of a container of the task's pod (the pod of the Job in
//! `status.jobName`, found by the Job's pod label), read through the API server (`pods/log`).
//!
//! Three situations are told apart ([`where_logs`]): the pod is there and its container has
//! started (print, and with `-f` follow); it is not there yet or its container has not started
//! (say so; with `-f` wait for it, watching the TaskRun and the Job's pods); it is gone, because
//! the task finished and its Job was cleaned up (say so, and point at `task describe`, whose
//! `status.result` outlives the pod).
//!
//! The log is the agent's (or the proxy's) own output: on a terminal every character a terminal
//! would act on (escape sequences, carriage returns, bidi overrides) is printed escaped, as
//! `task approvals --show` does; into a pipe or file the bytes are passed on as they are.

use std::io::{IsTerminal, Write};

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{ListParams, LogParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::{Phase, ProxyMode, TaskRun};

use crate::args::{Global, LogContainer, LogsArgs};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result};
use crate::output::visible;

/// The label the Job controller puts on its pods (since Kubernetes 1.27), and the older one.
const JOB_LABELS: [&str; 2] = ["batch.kubernetes.io/job-name", "job-name"];

/// Where the container's log is.
#[derive(Debug, PartialEq, Eq)]
pub enum Where {
    /// The pod, its container started (running or ended).
    Pod(String),
    /// Not yet: why (no Job yet, no pod yet, the container waiting).
    NotYet(String),
    /// Gone for good: the message to print.
    Gone(String),
}

/// Decides where the log of `container` is, from the TaskRun and its Job's pods.
pub fn where_logs(tr: &TaskRun, pods: &[Pod], container: &str) -> Where {
    let name = tr.name_any();
    let status = tr.status.clone().unwrap_or_default();
    let phase = Phase::label(status.phase);
    let finished = status.phase.is_some_and(|p| p.is_terminal());
    let Some(job) = status.job_name else {
        return if finished {
            Where::Gone(format!(
                "TaskRun {name} has no pod: it ended {phase} without one (see `orchestrator-cli task describe {name}`)"
            ))
        } else {
            Where::NotYet(format!(
                "TaskRun {name} has no Job yet ({phase}): its pod has not started"
            ))
        };
    };
    let Some(pod) = pods
        .iter()
        .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
    else {
        let how = if status.phase == Some(Phase::Cancelled) {
            format!("its Job {job} was deleted when the task was cancelled")
        } else {
            format!("its Job {job} finished ({phase}) and was cleaned up")
        };
        return if finished {
            Where::Gone(format!(
                "the pod of TaskRun {name} is gone: {how}, and its log with it. What the agent \
                 reported is in status.result: `orchestrator-cli task describe {name}`"
            ))
        } else {
            Where::NotYet(format!(
                "TaskRun {name} ({phase}): Job {job} has no pod yet"
            ))
        };
    };
    let pod_name = pod.name_any();
    let statuses = pod.status.as_ref().map(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .collect::<Vec<&ContainerStatus>>()
    });
    let state = statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == container)
        .and_then(|c| c.state.clone());
    match state {
        Some(s) if s.running.is_some() || s.terminated.is_some() => Where::Pod(pod_name),
        Some(s) => {
            let why = s
                .waiting
                .and_then(|w| w.reason)
                .unwrap_or_else(|| "waiting".into());
            Where::NotYet(format!(
                "container {container} of pod {pod_name} (TaskRun {name}) has not started yet: {why}"
            ))
        }
        None => Where::NotYet(format!(
            "container {container} of pod {pod_name} (TaskRun {name}) has not started yet (pod {})",
            pod.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into())
        )),
    }
}

/// In shared mode the task's pod has no proxy container: its proxy is the shared proxy
/// Deployment, whose log holds the task's audit records (each with the task's uid). `what` is
/// what the caller wanted (e.g. "the proxy's log").
pub fn no_proxy_in_pod(tr: &TaskRun, what: &str) -> Option<Error> {
    let status = tr.status.as_ref()?;
    (status.proxy_mode == Some(ProxyMode::Shared)).then(|| {
        let uid = tr.metadata.uid.as_deref().unwrap_or("?");
        Error::NotFound(format!(
            "TaskRun {} runs in shared mode (status.proxyMode: shared): its pod has no proxy, so \
             {what} is not there; the shared proxy Deployment serves it, and its log holds this \
             task's audit records (\"taskUid\":\"{uid}\"): kubectl logs -n <the chart's \
             namespace> deploy/<release>-shared-proxy | grep {uid}",
            tr.name_any()
        ))
    })
}

/// `task logs`.
pub async fn run(global: &Global, args: &LogsArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task).await?;
    let name = tr.name_any();
    let container = args.container.container_name();
    if matches!(args.container, LogContainer::Proxy)
        && let Some(e) = no_proxy_in_pod(&tr, "the proxy's log")
    {
        return Err(e);
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let pod = match where_logs(&tr, &job_pods(&cluster, &pods, &tr).await?, container) {
        Where::Pod(p) => p,
        Where::Gone(msg) => return Err(Error::NotFound(msg)),
        Where::NotYet(msg) if !args.follow => {
            return Err(Error::NotFound(format!(
                "{msg}; nothing to print yet (-f waits for it)"
            )));
        }
        Where::NotYet(msg) => {
            eprintln!("{msg}; waiting (-f)");
            wait_for_pod(&cluster, &pods, &name, container).await?
        }
    };
    let params = LogParams {
        container: Some(container.into()),
        follow: args.follow,
        tail_lines: args.tail,
        previous: args.previous,
        ..LogParams::default()
    };
    let action = format!("reading the log of container {container} of pod {pod} (TaskRun {name})");
    let stream = pods.log_stream(&pod, &params).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => Error::NotFound(format!(
            "the pod of TaskRun {name} is gone (pod {pod}): its Job finished and was cleaned up. \
             What the agent reported is in status.result: `orchestrator-cli task describe {name}`"
        )),
        e => Error::kube(action.clone(), e),
    })?;
    copy(stream, std::io::stdout().is_terminal())
        .await
        .map_err(|e| Error::Cluster(format!("{action}: {e}")))
}

/// The pods of the TaskRun's Job (none without a Job); also where `task audit` finds the proxy.
pub async fn job_pods(cluster: &Cluster, pods: &Api<Pod>, tr: &TaskRun) -> Result<Vec<Pod>> {
    let Some(job) = tr.status.as_ref().and_then(|s| s.job_name.clone()) else {
        return Ok(Vec::new());
    };
    for label in JOB_LABELS {
        let list = pods
            .list(&ListParams::default().labels(&format!("{label}={job}")))
            .await
            .map_err(|e| {
                Error::kube(
                    format!(
                        "listing the pods of Job {job} in namespace {}",
                        cluster.namespace
                    ),
                    e,
                )
            })?;
        if !list.items.is_empty() {
            return Ok(list.items);
        }
    }
    Ok(Vec::new())
}

/// Waits (-f) until the container has started, watching the TaskRun and the namespace's pods
/// (decided again on each change of either); the pod going first is an error.
async fn wait_for_pod(
    cluster: &Cluster,
    pods: &Api<Pod>,
    name: &str,
    container: &str,
) -> Result<String> {
    let taskruns = super::api(cluster);
    let tr_changes = kube::runtime::watcher::watch_object(taskruns, name).map(|_| ());
    let pod_changes = watcher(
        pods.clone(),
        watcher::Config::default().labels(JOB_LABELS[0]),
    )
    .map(|_| ());
    let changes = futures::stream::select(tr_changes, pod_changes);
    futures::pin_mut!(changes);
    let mut last = String::new();
    loop {
        let tr = super::get_named(cluster, name).await?;
        match where_logs(&tr, &job_pods(cluster, pods, &tr).await?, container) {
            Where::Pod(p) => return Ok(p),
            Where::Gone(msg) => return Err(Error::NotFound(msg)),
            Where::NotYet(msg) => {
                if msg != last {
                    tracing::info!("{msg}");
                    last = msg;
                }
            }
        }
        if changes.next().await.is_none() {
            return Err(Error::Cluster(format!(
                "the watch on TaskRun {name} and its pods ended"
            )));
        }
    }
}

/// Copies the log to stdout as it comes, line by line; on a terminal, escaped.
async fn copy(
    mut stream: impl futures::AsyncBufRead + Unpin,
    terminal: bool,
) -> std::io::Result<()> {
    let mut out = std::io::stdout();
    let mut line = Vec::new();
    loop {
        line.clear();
        if stream.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let written = if terminal {
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            out.write_all(escape_line(text).as_bytes())
        } else {
            out.write_all(&line)
        };
        match written.and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r?,
        }
    }
}

/// One log line for a terminal: every character that would act on it escaped (tabs kept).
pub fn escape_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let shown: Vec<String> = text.split('\t').map(visible).collect();
    shown.join("\t") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taskrun(status: serde_json::Value) -> TaskRun {
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "namespace": "n"},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"}},
            "status": status,
        }))
        .expect("valid TaskRun")
    }

    fn pod(name: &str, created: &str, statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "status": {"phase": "Running", "containerStatuses": statuses,
                "initContainerStatuses": [{"name": "mcp-proxy", "image": "p", "imageID": "",
                    "ready": true, "restartCount": 0, "state": {"running": {}}}]},
        }))
        .expect("valid pod")
    }

    #[test]
    fn a_shared_task_has_no_proxy_log_and_says_where_its_audit_is() {
        let mut tr = taskrun(json!({"phase": "Running", "proxyMode": "shared"}));
        tr.metadata.uid = Some("u-1".into());
        let Some(Error::NotFound(msg)) = no_proxy_in_pod(&tr, "the proxy's log") else {
            panic!("a shared task's proxy log must be refused");
        };
        assert!(msg.contains("TaskRun t runs in shared mode"), "{msg}");
        assert!(msg.contains("the proxy's log is not there"), "{msg}");
        assert!(msg.contains("\"taskUid\":\"u-1\""), "{msg}");
        let sidecar = taskrun(json!({"phase": "Running", "proxyMode": "sidecar"}));
        assert!(no_proxy_in_pod(&sidecar, "x").is_none());
        // Before the operator resolved the mode: the pod is looked for as before.
        assert!(no_proxy_in_pod(&taskrun(json!({})), "x").is_none());
    }

    fn agent(state: serde_json::Value) -> serde_json::Value {
        json!([{"name": "agent", "image": "a", "imageID": "", "ready": false,
            "restartCount": 0, "state": state}])
    }

    #[test]
    fn a_started_container_of_the_newest_pod_is_read() {
        let tr = taskrun(json!({"phase": "Running", "jobName": "t"}));
        let pods = [
            pod(
                "t-old",
                "2025-01-01T00:00:00Z",
                agent(json!({"terminated": {"exitCode": 1}})),
            ),
            pod(
                "t-new",
                "2025-01-01T00:01:00Z",
                agent(json!({"running": {}})),
            ),
        ];
        assert_eq!(where_logs(&tr, &pods, "agent"), Where::Pod("t-new".into()));
        // The proxy is a native sidecar: its status is among the init containers'.
        assert_eq!(
            where_logs(&tr, &pods, "mcp-proxy"),
            Where::Pod("t-new".into())
        );
    }

    #[test]
    fn not_started_yet_says_why() {
        let pending = taskrun(json!({"phase": "Pending"}));
        assert!(matches!(where_logs(&pending, &[], "agent"),
            Where::NotYet(m) if m.contains("has no Job yet")));
        let no_pod = taskrun(json!({"phase": "Pending", "jobName": "t"}));
        assert!(matches!(where_logs(&no_pod, &[], "agent"),
            Where::NotYet(m) if m.contains("Job t has no pod yet")));
        let waiting = [pod(
            "t-1",
            "2025-01-01T00:00:00Z",
            agent(json!({"waiting": {"reason": "ContainerCreating"}})),
        )];
        assert!(matches!(where_logs(&no_pod, &waiting, "agent"),
            Where::NotYet(m) if m.contains("has not started yet: ContainerCreating")));
    }

    #[test]
    fn a_finished_task_without_a_pod_is_gone_and_points_at_describe() {
        let done = taskrun(json!({"phase": "Succeeded", "jobName": "t"}));
        let Where::Gone(msg) = where_logs(&done, &[], "agent") else {
            panic!("gone expected");
        };
        assert!(msg.contains("the pod of TaskRun t is gone"), "{msg}");
        assert!(
            msg.contains("finished (Succeeded) and was cleaned up"),
            "{msg}"
        );
        assert!(msg.contains("orchestrator-cli task describe t"), "{msg}");
        let cancelled = taskrun(json!({"phase": "Cancelled", "jobName": "t"}));
        assert!(matches!(where_logs(&cancelled, &[], "agent"),
            Where::Gone(m) if m.contains("its Job t was deleted when the task was cancelled")));
        let cancelled_early = taskrun(json!({"phase": "Cancelled"}));
        assert!(matches!(
            where_logs(&cancelled_early, &[], "agent"),
            Where::Gone(_)
        ));
    }

    #[test]
    fn log_lines_on_a_terminal_are_escaped() {
        assert_eq!(
            escape_line(b"ok\t\x1b[2Jdone\r\xe2\x80\xae!"),
            "ok\t\\u{1b}[2Jdone\\u{d}\\u{202e}!\n"
        );
    }
}
