//! Reports the `contextVersion` being served on the task's Lease (created beforehand by the
//! operator; its Role lets this identity get and patch only that Lease): a merge patch of the
//! annotation [`SERVED_VERSION_ANNOTATION`], `spec.holderIdentity` (the pod) and
//! `spec.renewTime`. Only the latest version matters: versions served while a patch is in flight
//! or failing are coalesced; failures are retried with backoff and never hold up a reload.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::Patch};
use tokio::sync::watch;

/// The Lease annotation carrying the served `contextVersion` (a decimal string).
pub const SERVED_VERSION_ANNOTATION: &str = "orchestrator.io/served-context-version";

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A patch that takes longer is abandoned and retried.
const PATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs until `served`'s sender is gone or the task is aborted.
pub async fn report(
    api: Api<Lease>,
    name: String,
    pod: Option<String>,
    mut served: watch::Receiver<Option<u64>>,
) {
    let mut reported: Option<u64> = None;
    let mut retry = FIRST_RETRY;
    let mut failing = false;
    loop {
        let wanted = *served.borrow_and_update();
        if let Some(version) = wanted
            && reported != Some(version)
        {
            match patch(&api, &name, pod.as_deref(), version).await {
                Ok(()) => {
                    tracing::info!(lease = %name, context_version = version, "reported the served contextVersion");
                    reported = Some(version);
                    retry = FIRST_RETRY;
                    failing = false;
                }
                Err(e) => {
                    if failing {
                        tracing::debug!(lease = %name, context_version = version, error = %e, "reporting the served contextVersion failed again");
                    } else {
                        tracing::warn!(lease = %name, context_version = version, error = %e, "cannot report the served contextVersion; retrying with backoff");
                    }
                    failing = true;
                    // A 403 of the admission policy (the Lease not bound to this pod yet) is
                    // retried within 2 s.
                    let (wait, next) = super::backoff(retry, MAX_RETRY, &e);
                    tokio::time::sleep(wait).await;
                    retry = next;
                    // The next round reports whatever is served by then.
                    continue;
                }
            }
        }
        if served.changed().await.is_err() {
            return;
        }
    }
}

async fn patch(
    api: &Api<Lease>,
    name: &str,
    pod: Option<&str>,
    version: u64,
) -> anyhow::Result<()> {
    let body = body(pod, version, jiff::Timestamp::now());
    tokio::time::timeout(
        PATCH_TIMEOUT,
        api.patch(name, &super::patch_params(), &Patch::Merge(&body)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no answer within {}s", PATCH_TIMEOUT.as_secs()))??;
    Ok(())
}

/// The merge patch: the annotation, and the holder and renew time (a MicroTime).
fn body(pod: Option<&str>, version: u64, now: jiff::Timestamp) -> serde_json::Value {
    let mut spec = serde_json::json!({
        "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
    });
    if let Some(pod) = pod {
        spec["holderIdentity"] = pod.into();
    }
    serde_json::json!({
        "metadata": {"annotations": {SERVED_VERSION_ANNOTATION: version.to_string()}},
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_the_annotation_the_holder_and_a_microtime() {
        let now: jiff::Timestamp = "2026-11-25T09:30:01.5Z".parse().expect("a timestamp");
        assert_eq!(
            body(Some("task-a-x7k2p"), 12, now),
            serde_json::json!({
                "metadata": {"annotations": {"orchestrator.io/served-context-version": "12"}},
                "spec": {"holderIdentity": "task-a-x7k2p", "renewTime": "2026-11-25T09:30:01.500000Z"},
            })
        );
        assert_eq!(
            body(None, 1, now)["spec"],
            serde_json::json!({"renewTime": "2026-11-25T09:30:01.500000Z"})
        );
    }
}
