//! What the model gateway counted, reported on the task's Lease (annotation
//! [`USAGE_ANNOTATION`], JSON `ModelUsage`), which the operator copies to `status.usage` and
//! the `BudgetExceeded` condition; and read back when the proxy starts, so a restarted proxy
//! container does not start the task's budget again. At most one patch per [`EVERY`]: the
//! latest count is what matters; failures are retried with backoff.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::Patch};
use orchestrator_crds::gateway::{ModelUsage, USAGE_ANNOTATION};
use serde_json::json;

use crate::gateway::Gateway;

/// The least time between two reports.
const EVERY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A read or patch that takes longer is abandoned.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What an earlier proxy of the task reported, taken up by `gateway` (nothing when the Lease
/// cannot be read within [`TIMEOUT`] or has no report).
pub async fn restore(api: &Api<Lease>, name: &str, gateway: &Gateway) {
    let lease = match tokio::time::timeout(TIMEOUT, api.get_metadata_opt(name)).await {
        Ok(Ok(Some(lease))) => lease,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            tracing::warn!(lease = %name, error = %e, "cannot read the model usage reported before; counting from zero");
            return;
        }
        Err(_) => {
            tracing::warn!(lease = %name, "no answer reading the model usage reported before; counting from zero");
            return;
        }
    };
    let reported = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(USAGE_ANNOTATION))
        .and_then(|v| serde_json::from_str::<ModelUsage>(v).ok());
    if let Some(usage) = reported {
        tracing::info!(lease = %name, requests = usage.requests, output_tokens = usage.output_tokens, "took up the model usage an earlier proxy of the task reported");
        gateway.restore(&usage);
    }
}

/// The report loop of one proxy, and what its last report needs.
pub struct Reporter {
    task: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    name: String,
}

impl Reporter {
    /// Reports `gateway`'s usage on the Lease `name` until [`Reporter::finish`].
    pub fn start(api: Api<Lease>, name: String, gateway: Arc<Gateway>) -> Self {
        let task = tokio::spawn(report(api.clone(), name.clone(), gateway));
        Self { task, api, name }
    }

    /// At shutdown, once calls have drained: stops the loop and reports the count as it is
    /// now, once. The loop pauses [`EVERY`] between reports, and an agent exits right after
    /// its last answer: without this its last requests would never reach `status.usage`.
    pub async fn finish(self, gateway: &Gateway) {
        self.task.abort();
        let usage = gateway.usage_now();
        if usage.requests == 0 && usage.refused == 0 {
            return;
        }
        match tokio::time::timeout(TIMEOUT, patch(&self.api, &self.name, &usage)).await {
            Ok(Ok(())) => {
                tracing::info!(lease = %self.name, requests = usage.requests, "reported the final model usage")
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "cannot report the final model usage")
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "no answer reporting the final model usage")
            }
        }
    }
}

async fn patch(api: &Api<Lease>, name: &str, usage: &ModelUsage) -> Result<(), kube::Error> {
    let text = serde_json::to_string(usage).map_err(kube::Error::SerdeError)?;
    let body = json!({"metadata": {"annotations": {USAGE_ANNOTATION: text}}});
    api.patch(name, &super::patch_params(), &Patch::Merge(&body))
        .await
        .map(|_| ())
}

/// Reports `gateway`'s usage on the Lease `name` until the proxy stops.
async fn report(api: Api<Lease>, name: String, gateway: Arc<Gateway>) {
    let mut usage = gateway.usage_watch();
    let mut retry = EVERY;
    loop {
        if usage.changed().await.is_err() {
            return;
        }
        let current = usage.borrow_and_update().clone();
        let patched = tokio::time::timeout(TIMEOUT, patch(&api, &name, &current)).await;
        match patched {
            Ok(Ok(_)) => retry = EVERY,
            Ok(Err(e)) => {
                tracing::debug!(lease = %name, error = %e, "cannot report the model usage; retrying");
                usage.mark_changed();
                retry = (retry * 2).min(MAX_RETRY);
            }
            Err(_) => {
                usage.mark_changed();
                retry = (retry * 2).min(MAX_RETRY);
            }
        }
        tokio::time::sleep(retry).await;
    }
}
