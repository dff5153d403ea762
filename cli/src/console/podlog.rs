//! The page's Logs tab: the end of a container's log of the task's pod, read as `task logs`
//! reads it ([`crate::task::logs`]: the newest pod of the Job in `status.jobName`, `pods/log`
//! with the caller's credentials), bounded in lines and bytes. A pod that is not there yet or is
//! gone is an answer, not an error: the page says which.

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;
use serde::Serialize;

use crate::connect::Cluster;
use crate::error::{Error, Result};
use crate::task::logs::{Where, job_pods, no_proxy_in_pod, where_logs};

/// The most lines and bytes a read returns (the API server cuts the log to them).
pub const MAX_LINES: i64 = 5000;
pub const LIMIT_BYTES: i64 = 256 * 1024;

/// One read of the log.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogRead {
    pub container: &'static str,
    /// The pod read, when there is one.
    pub pod: Option<String>,
    /// `shown`, `notYet` (no pod or the container has not started), `gone` (the pod was
    /// removed with its Job).
    pub state: &'static str,
    /// The log's last lines (invalid UTF-8 replaced), `""` when there is nothing to show.
    pub text: String,
    pub tail_lines: i64,
    /// Whether the text reached the byte limit (older lines may be cut off).
    pub clipped: bool,
    /// What the page says above the text.
    pub message: String,
}

/// The container a query names: `agent` (default) or `proxy`.
pub fn container(query: Option<&str>) -> std::result::Result<&'static str, String> {
    match query.unwrap_or("agent") {
        "agent" => Ok("agent"),
        "proxy" | "mcp-proxy" => Ok("mcp-proxy"),
        other => Err(format!("container {other:?}: give \"agent\" or \"proxy\"")),
    }
}

/// The last `tail_lines` lines of `container`'s log in the pod of `tr`.
pub async fn read(
    cluster: &Cluster,
    tr: &TaskRun,
    container: &'static str,
    tail_lines: i64,
) -> Result<LogRead> {
    let name = tr.name_any();
    let tail_lines = tail_lines.clamp(1, MAX_LINES);
    if container == "mcp-proxy"
        && let Some(e) = no_proxy_in_pod(tr, "the proxy's log")
    {
        return Err(e);
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let found = where_logs(tr, &job_pods(cluster, &pods, tr).await?, container);
    let empty = |state, message: String| LogRead {
        container,
        pod: None,
        state,
        text: String::new(),
        tail_lines,
        clipped: false,
        message,
    };
    let pod = match found {
        Where::Pod(p) => p,
        Where::NotYet(msg) => return Ok(empty("notYet", msg)),
        Where::Gone(msg) => return Ok(empty("gone", msg)),
    };
    let params = LogParams {
        container: Some(container.into()),
        tail_lines: Some(tail_lines),
        limit_bytes: Some(LIMIT_BYTES),
        ..LogParams::default()
    };
    let action = format!("reading the log of container {container} of pod {pod} (TaskRun {name})");
    let stream = match pods.log_stream(&pod, &params).await {
        Ok(s) => s,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Ok(empty(
                "gone",
                format!(
                    "the pod of TaskRun {name} is gone (pod {pod}): its Job finished and was \
                     cleaned up. What the agent reported is in status.result"
                ),
            ));
        }
        Err(e) => return Err(Error::kube(action, e)),
    };
    let mut bytes = Vec::new();
    // The API server stops at limitBytes; a little more is read only to see that it did.
    stream
        .take(LIMIT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| Error::Cluster(format!("{action}: {e}")))?;
    let clipped = bytes.len() as i64 >= LIMIT_BYTES;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let lines = text.lines().count();
    let message = match (lines, clipped) {
        (0, _) => format!("container {container} of pod {pod} has logged nothing yet"),
        (n, false) => format!(
            "the last {n} line{} of container {container} of pod {pod} (at most {tail_lines})",
            if n == 1 { "" } else { "s" }
        ),
        (n, true) => format!(
            "the last {n} lines of container {container} of pod {pod}, cut at {} KiB",
            LIMIT_BYTES / 1024
        ),
    };
    Ok(LogRead {
        container,
        pod: Some(pod),
        state: "shown",
        text,
        tail_lines,
        clipped,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_is_the_agent_or_the_proxy() {
        assert_eq!(container(None), Ok("agent"));
        assert_eq!(container(Some("proxy")), Ok("mcp-proxy"));
        assert!(container(Some("etcd")).is_err());
    }
}
