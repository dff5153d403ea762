//! Keeps the task's baseline of tool definitions (`policy::definitions::Baseline`: the hash
//! first seen of each tool of each server) on the task's Lease, annotation
//! [`BASELINE_ANNOTATION`], outside the pod: a restarted proxy restores it before it serves
//! anything, so a definition that changed while an earlier proxy of the task ran stays changed
//! (and blocked, under `onChange: block`), whatever the pod's disk cache holds. Only the task's
//! own proxy may write the Lease (the chart's admission policy); the agent has no API token.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::Patch};

use crate::{policy::definitions::Baseline, upstream::Shared};

/// The Lease annotation holding the baseline: JSON, `{"server@revision": {"spec": ..., "tools":
/// {"name": "sha256:..."}}}`.
pub const BASELINE_ANNOTATION: &str = "orchestrator.io/tool-baseline";

/// How long the proxy waits, before it serves, to read what an earlier proxy recorded.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(3);
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// Capped low: until the operator binds the Lease to this pod, the admission policy refuses
/// its writes for a moment.
const MAX_RETRY: Duration = Duration::from_secs(5);
const PATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the recorded baseline into `baseline`. Says, and goes on with nothing, when the Lease
/// cannot be read in time (the guarantee then lasts only while this proxy runs).
pub async fn restore(api: &Api<Lease>, name: &str, baseline: &Baseline) {
    let lease = match tokio::time::timeout(RESTORE_TIMEOUT, api.get_opt(name)).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => {
            tracing::warn!(lease = %name, error = %e, "cannot read the tool-definition baseline an earlier proxy of this task recorded; comparing with what this proxy sees first");
            return;
        }
        Err(_) => {
            tracing::warn!(lease = %name, timeout_s = RESTORE_TIMEOUT.as_secs(), "no answer reading the tool-definition baseline; comparing with what this proxy sees first");
            return;
        }
    };
    let Some(text) = lease
        .as_ref()
        .and_then(|l| l.metadata.annotations.as_ref())
        .and_then(|a| a.get(BASELINE_ANNOTATION))
    else {
        return;
    };
    match baseline.restore(text) {
        Ok(servers) => {
            tracing::info!(lease = %name, servers, "restored the tool-definition baseline recorded by an earlier proxy of this task")
        }
        Err(e) => {
            tracing::warn!(lease = %name, error = %e, "ignoring a malformed tool-definition baseline on the Lease")
        }
    }
}

/// Records the baseline on the Lease whenever it learns a tool; runs until aborted.
pub async fn record(api: Api<Lease>, name: String, shared: Arc<Shared>) {
    let baseline = shared.baseline();
    let mut changes = baseline.subscribe();
    let mut retry = FIRST_RETRY;
    let mut warned_size = false;
    loop {
        let _ = changes.borrow_and_update();
        let (json, left_out) = baseline.to_json();
        if left_out > 0 && !warned_size {
            tracing::warn!(lease = %name, servers_left_out = left_out, "the tool-definition baseline is too large to record in full; the servers left out are compared with what this proxy saw first");
            warned_size = true;
        }
        let body = serde_json::json!({"metadata": {"annotations": {BASELINE_ANNOTATION: json}}});
        let patched = tokio::time::timeout(
            PATCH_TIMEOUT,
            api.patch(&name, &super::patch_params(), &Patch::Merge(&body)),
        )
        .await;
        match patched {
            Ok(Ok(_)) => retry = FIRST_RETRY,
            Ok(Err(e)) => {
                tracing::debug!(lease = %name, error = %e, "recording the tool-definition baseline failed; retrying");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
            Err(_) => {
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}
