//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas never run the
//! controller at once. Every write is a server-side apply carrying the `resourceVersion` last
//! read, which the API server treats as a precondition: of two replicas racing for the Lease
//! exactly one write succeeds (the compare-and-swap a lock needs). Expiry is judged by how long
//! the Lease record has stayed unchanged on this replica's own clock, never by comparing clocks.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::error::{Error, Result};
use crate::reconcile::MANAGER;

/// One replica's view of the Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The last Lease record seen (holder, renew time, resourceVersion) and when it was first seen.
    observed: Option<(String, Instant)>,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: String,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity,
            duration,
            observed: None,
        }
    }

    /// How often a leader renews (a third of the lease, as client-go does by default).
    pub fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&mut self) -> Result<()> {
        let retry = self.renew_interval();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews the Lease until it cannot be renewed for a whole lease duration; then returns the
    /// error (the caller must stop the controller: another replica may take over).
    pub async fn hold(&mut self) -> Error {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.renew_interval()).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => return Error::LostLease(self.name.clone()),
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the leader lease");
                    if last_renewed.elapsed() >= self.duration {
                        return Error::LostLease(self.name.clone());
                    }
                }
            }
        }
    }

    /// Gives the Lease up (on shutdown) so a standby takes over at once.
    pub async fn release(&mut self) {
        if let Ok(Some(lease)) = self.api.get_opt(&self.name).await
            && holder(&lease) == Some(self.identity.as_str())
        {
            let body = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "resourceVersion": lease.metadata.resource_version},
                "spec": {"holderIdentity": null, "leaseDurationSeconds": 1},
            });
            let pp = PatchParams::apply(MANAGER).force();
            if let Err(e) = self.api.patch(&self.name, &pp, &Patch::Apply(body)).await {
                tracing::warn!(error = %e, "releasing the leader lease");
            }
        }
    }

    /// One round: returns whether this replica holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": self.name},
                "spec": {
                    "holderIdentity": self.identity, "leaseDurationSeconds": seconds,
                    "acquireTime": now, "renewTime": now, "leaseTransitions": 0,
                },
            }))
            .map_err(|source| Error::Serialize {
                what: "lease",
                source,
            })?;
            return match self
                .api
                .create(
                    &PostParams {
                        field_manager: Some(MANAGER.into()),
                        ..Default::default()
                    },
                    &lease,
                )
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let spec = lease.spec.clone().unwrap_or_default();
        let held_by_me = holder(&lease) == Some(self.identity.as_str());
        if !held_by_me {
            // The record changes whenever its holder renews; it is expired once it has stayed
            // the same for longer than the lease duration the holder announced.
            let record = rv.clone();
            let announced = spec
                .lease_duration_seconds
                .map_or(self.duration, |s| Duration::from_secs(s.max(1) as u64));
            let expired = holder(&lease).is_none()
                || match &self.observed {
                    Some((seen, since)) if *seen == record => since.elapsed() >= announced,
                    _ => {
                        self.observed = Some((record, Instant::now()));
                        false
                    }
                };
            if !expired {
                return Ok(false);
            }
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!held_by_me);
        let acquire_time = if held_by_me {
            spec.acquire_time.unwrap_or(now.clone())
        } else {
            now.clone()
        };
        let body = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "resourceVersion": rv},
            "spec": {
                "holderIdentity": self.identity, "leaseDurationSeconds": seconds,
                "acquireTime": acquire_time, "renewTime": now, "leaseTransitions": transitions,
            },
        });
        let pp = PatchParams::apply(MANAGER).force();
        match self.api.patch(&self.name, &pp, &Patch::Apply(body)).await {
            Ok(_) => {
                self.observed = None;
                Ok(true)
            }
            // Someone else wrote first: they hold it.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}
