//! Shared mode's pending set on the task's Lease (see `crate::approval::lease`): every write is
//! a read-modify-write of the annotation [`REQUESTS_ANNOTATION`] with the Lease's
//! `resourceVersion` (a merge patch carrying it: the API server answers 409 when another replica
//! wrote in between, and the write is made again on what is there now), changing only this
//! replica's entries. Also the [`Adopter`]: it takes over the entry of a call whose holder is
//! gone, which it asks of the API: the holder's pod in the shared proxy's namespace is not found
//! (or has ended). Writes of one replica are serialized ([`Holders::writes`]), so an adoption's
//! entry is never taken out by this replica's own publisher before it is in the pending set.

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Pod};
use kube::{Api, api::Patch};
use orchestrator_crds::approval::REQUESTS_ANNOTATION;
use serde_json::json;

use crate::approval::{Adopted, Adopter, Approvals, HoldCall, lease};

/// A read or write that takes longer is abandoned.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Conflicts in a row before a write gives up (and is retried later by its caller).
const MAX_CONFLICTS: usize = 20;

/// The Lease as a store of the annotation, by version (a trait so the retry is tested).
pub trait Store: Send + Sync {
    /// The annotation's value and the object's `resourceVersion`.
    fn read(&self) -> BoxFuture<'_, anyhow::Result<(Option<String>, String)>>;
    /// Writes `value` if the object is still at `version`: `Ok(false)` on a conflict.
    fn write<'a>(&'a self, version: &'a str, value: &'a str)
    -> BoxFuture<'a, anyhow::Result<bool>>;
}

/// The task's Lease through the API.
pub struct LeaseStore {
    pub api: Api<Lease>,
    pub name: String,
}

impl Store for LeaseStore {
    fn read(&self) -> BoxFuture<'_, anyhow::Result<(Option<String>, String)>> {
        Box::pin(async move {
            let lease = tokio::time::timeout(API_TIMEOUT, self.api.get(&self.name))
                .await
                .map_err(|_| anyhow::anyhow!("no answer within {}s", API_TIMEOUT.as_secs()))??;
            let value = lease
                .metadata
                .annotations
                .and_then(|mut a| a.remove(REQUESTS_ANNOTATION));
            Ok((value, lease.metadata.resource_version.unwrap_or_default()))
        })
    }

    fn write<'a>(
        &'a self,
        version: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            let body = json!({"metadata": {
                "resourceVersion": version,
                "annotations": {REQUESTS_ANNOTATION: value},
            }});
            let (params, patch) = (super::patch_params(), Patch::Merge(&body));
            let patched = self.api.patch(&self.name, &params, &patch);
            match tokio::time::timeout(API_TIMEOUT, patched).await {
                Err(_) => Err(anyhow::anyhow!(
                    "no answer within {}s",
                    API_TIMEOUT.as_secs()
                )),
                Ok(Ok(_)) => Ok(true),
                Ok(Err(kube::Error::Api(status))) if status.code == 409 => Ok(false),
                Ok(Err(e)) => Err(e.into()),
            }
        })
    }
}

/// Reads, changes with `change` (`None`: nothing to write; the same value: nothing either) and
/// writes at the version read, again on a conflict. `Ok(false)`: `change` said `None`.
pub async fn read_modify_write(
    store: &dyn Store,
    change: impl Fn(Option<&str>) -> Option<String>,
) -> anyhow::Result<bool> {
    for _ in 0..MAX_CONFLICTS {
        let (current, version) = store.read().await?;
        let Some(value) = change(current.as_deref()) else {
            return Ok(false);
        };
        if current.as_deref() == Some(value.as_str()) || (current.is_none() && value == "[]") {
            return Ok(true);
        }
        if store.write(&version, &value).await? {
            return Ok(true);
        }
        tracing::debug!("the Lease changed under the write of the approval requests; again");
    }
    Err(anyhow::anyhow!(
        "the Lease kept changing: {MAX_CONFLICTS} conflicting writes in a row"
    ))
}

/// Whether a replica is gone (a trait so adoption is tested).
pub trait Replicas: Send + Sync {
    fn gone<'a>(&'a self, replica: &'a str) -> BoxFuture<'a, bool>;
}

/// The shared proxy's pods, in its own namespace: a replica is gone when its pod is not found
/// or has ended. Unknown (an error): not gone.
pub struct Pods(pub Api<Pod>);

impl Replicas for Pods {
    fn gone<'a>(&'a self, replica: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            match tokio::time::timeout(API_TIMEOUT, self.0.get_opt(replica)).await {
                Ok(Ok(None)) => true,
                Ok(Ok(Some(pod))) => pod
                    .status
                    .and_then(|s| s.phase)
                    .is_some_and(|p| p == "Succeeded" || p == "Failed"),
                Ok(Err(e)) => {
                    tracing::warn!(replica, error = %e, "cannot tell whether the replica holding a call is gone (get pods); not adopting it");
                    false
                }
                Err(_) => false,
            }
        })
    }
}

/// This replica's writes of the task's pending set.
pub struct Holders {
    pub store: Box<dyn Store>,
    /// Whether another holder is gone.
    pub replicas: Box<dyn Replicas>,
    /// This replica's pod name.
    pub me: String,
    /// One write at a time from this replica.
    pub writes: tokio::sync::Mutex<()>,
}

impl Holders {
    /// Writes `own` (this replica's pending set as published) into the Lease's set.
    pub async fn publish(&self, approvals: &Approvals, own: &str) -> anyhow::Result<()> {
        let own = lease::entries(Some(own));
        let now = jiff::Timestamp::now();
        read_modify_write(&*self.store, |current| {
            Some(lease::merge_own(
                current,
                &self.me,
                &own,
                |id| approvals.held_here(id),
                now,
            ))
        })
        .await
        .map(|_| ())
    }

    /// Whether the replica `holder` is gone: an earlier process of this pod is (an entry under
    /// this name with an id this process never held); another as [`Replicas`] says.
    async fn gone(&self, holder: &str) -> bool {
        holder == self.me || self.replicas.gone(holder).await
    }

    async fn adopt_call<'a>(
        &'a self,
        approvals: &'a Approvals,
        call: HoldCall<'a>,
    ) -> Option<Adopted<'a>> {
        let _writing = self.writes.lock().await;
        let (current, _) = match self.store.read().await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the Lease for a call to adopt; holding the call anew");
                return None;
            }
        };
        for entry in approvals.adoptable(current.as_deref(), &call) {
            let holder = entry.holder.clone().unwrap_or_default();
            if !self.gone(&holder).await {
                tracing::debug!(approval = %entry.request.id, %holder, "the same call is held by a live replica; not adopted");
                continue;
            }
            let known = approvals.known_verdict(&entry.request);
            let id = entry.request.id.clone();
            let taken = read_modify_write(&*self.store, |current| {
                lease::take_over(current, &id, &holder, &self.me, known.is_some())
            })
            .await;
            match taken {
                Ok(true) => {
                    return Some(match known {
                        Some(outcome) => {
                            tracing::info!(approval = %id, from = %holder, "adopted a decided call held by a replica that is gone; its request left the Lease");
                            Adopted::Decided {
                                request: entry.request,
                                outcome,
                            }
                        }
                        None => Adopted::Held(approvals.adopted(entry.request)),
                    });
                }
                Ok(false) => {
                    tracing::info!(approval = %id, from = %holder, "another replica adopted the call first")
                }
                Err(e) => {
                    tracing::warn!(approval = %id, error = %e, "cannot adopt a call on the Lease; holding it anew");
                    return None;
                }
            }
        }
        None
    }
}

impl Adopter for Holders {
    fn adopt<'a>(
        &'a self,
        approvals: &'a Approvals,
        call: HoldCall<'a>,
    ) -> BoxFuture<'a, Option<Adopted<'a>>> {
        Box::pin(self.adopt_call(approvals, call))
    }
}

#[cfg(test)]
mod tests;
