//! Publishes the calls held for approval on the task's Lease (the one `lease` reports the served
//! `contextVersion` on): a merge patch of the annotation [`REQUESTS_ANNOTATION`] alone, whose
//! value is the JSON array of pending `ApprovalRequest`s (`crate::approval`, at most 16 of
//! 12 KiB). The first value (`[]` at start) clears what an earlier proxy of the task left;
//! after it, every change of the pending set is published. Only the latest set matters: sets
//! that change while a patch is in flight or failing are coalesced; failures are retried with
//! backoff (within 2 s while the admission policy refuses the writes: the Lease is not bound to
//! this pod yet).
//!
//! Shared mode ([`publish_shared`]): several replicas write the annotation, each only its own
//! entries, by read-modify-write (`holders`); each write done is reported to the pending set
//! (`Approvals::committed`), for the approved calls that wait until their request is off it.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::Patch};
use orchestrator_crds::approval::REQUESTS_ANNOTATION;
use tokio::sync::watch;

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A patch that takes longer is abandoned and retried.
const PATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs until `requests`' sender is gone or the task is aborted.
pub async fn publish(api: Api<Lease>, name: String, mut requests: watch::Receiver<Arc<str>>) {
    let mut published: Option<Arc<str>> = None;
    let mut retry = FIRST_RETRY;
    let mut failing = false;
    loop {
        let wanted = requests.borrow_and_update().clone();
        if published.as_deref() != Some(&*wanted) {
            match patch(&api, &name, &wanted).await {
                Ok(()) => {
                    tracing::debug!(lease = %name, bytes = wanted.len(), "published the approval requests");
                    published = Some(wanted);
                    retry = FIRST_RETRY;
                    failing = false;
                }
                Err(e) => {
                    if failing {
                        tracing::debug!(lease = %name, error = %e, "publishing the approval requests failed again");
                    } else {
                        tracing::warn!(lease = %name, error = %e, "cannot publish the approval requests; retrying with backoff (held calls wait meanwhile)");
                    }
                    failing = true;
                    // A 403 of the admission policy (the Lease not bound to this pod yet) is
                    // retried within 2 s.
                    let (wait, next) = super::backoff(retry, MAX_RETRY, &e);
                    tokio::time::sleep(wait).await;
                    retry = next;
                    continue;
                }
            }
        }
        if requests.changed().await.is_err() {
            return;
        }
    }
}

/// Shared mode: publishes this replica's pending set through `holders`, until `requests`'
/// sender is gone or the task is aborted.
pub async fn publish_shared(
    holders: Arc<super::holders::Holders>,
    proxy: Arc<crate::proxy::Proxy>,
    mut requests: watch::Receiver<Arc<str>>,
) {
    let approvals = &proxy.approvals;
    let mut published: Option<u64> = None;
    let mut retry = FIRST_RETRY;
    let mut failing = false;
    loop {
        requests.borrow_and_update();
        let wanted = approvals.current().0;
        if published != Some(wanted) {
            let written = {
                let _writing = holders.writes.lock().await;
                // What is pending now, under the lock (an adoption may have added to it).
                requests.borrow_and_update();
                let (generation, text) = approvals.current();
                holders.publish(approvals, &text).await.map(|()| generation)
            };
            match written {
                Ok(generation) => {
                    tracing::debug!(generation, "published this replica's approval requests");
                    approvals.committed(generation);
                    published = Some(generation);
                    retry = FIRST_RETRY;
                    failing = false;
                }
                Err(e) => {
                    if failing {
                        tracing::debug!(error = %e, "publishing the approval requests failed again");
                    } else {
                        tracing::warn!(error = %e, "cannot publish the approval requests; retrying with backoff (held calls wait meanwhile)");
                    }
                    failing = true;
                    let (wait, next) = super::backoff(retry, MAX_RETRY, &e);
                    tokio::time::sleep(wait).await;
                    retry = next;
                    continue;
                }
            }
        }
        if requests.changed().await.is_err() {
            return;
        }
    }
}

async fn patch(api: &Api<Lease>, name: &str, requests: &str) -> anyhow::Result<()> {
    tokio::time::timeout(
        PATCH_TIMEOUT,
        api.patch(name, &super::patch_params(), &Patch::Merge(&body(requests))),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no answer within {}s", PATCH_TIMEOUT.as_secs()))??;
    Ok(())
}

/// The merge patch: the annotation alone.
fn body(requests: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {REQUESTS_ANNOTATION: requests}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_only_the_annotation() {
        assert_eq!(
            body("[]"),
            serde_json::json!({"metadata": {"annotations": {"orchestrator.io/approval-requests": "[]"}}})
        );
    }
}
