//! What every step of a reconcile shares: the [`Context`] (the client, the facts' indexes, the
//! settings), the one way the operator writes ([`apply`], under [`MANAGER`]), and when a
//! TaskRun is looked at again ([`RESYNC`], [`SECRET_RETRY`], [`POD_RETRY`], [`soonest`]).

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client, Resource};
use orchestrator_crds::shared::ProxyMode;

use super::facts::{ConfigMapFacts, DecisionFacts, Index, JobFacts, LeaseFacts, SharedFacts};
use crate::catalog::CatalogStore;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::render::RenderSettings;

/// The field manager of every write the operator makes.
pub const MANAGER: &str = "orchestrator-operator";

/// How often an unfinished TaskRun is looked at again without any event: a safety net so a
/// missed or reordered watch event can delay a status update by a minute at most.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How soon a TaskRun waiting for a Secret (which the operator does not watch) is looked at again.
pub const SECRET_RETRY: Duration = Duration::from_secs(10);
/// How soon a shared task whose pod the shared proxy's ConfigMap does not name yet (with its IP)
/// is looked at again: until then the shared proxy serves the agent nothing.
pub const POD_RETRY: Duration = Duration::from_secs(2);
/// For how long after its Job started a shared task's pod is looked for every [`POD_RETRY`].
pub const POD_POLL_SECONDS: i64 = 120;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    /// What reconcile reads of the operator's Jobs (see `facts/children.rs`).
    pub jobs: Index<JobFacts>,
    /// What reconcile reads of the operator's ConfigMaps.
    pub config_maps: Index<ConfigMapFacts>,
    /// What reconcile reads of the shared tasks' ConfigMaps in the shared proxy's namespace
    /// (empty without a shared proxy; see `facts/shared.rs`).
    pub shared_config_maps: Index<SharedFacts>,
    /// The mode of a TaskRun whose spec and Namespace say none (`--default-proxy-mode`).
    pub default_proxy_mode: ProxyMode,
    /// What each task's proxy reports on its Lease: the version it serves and the calls it holds
    /// for approval (see `facts/lease.rs`).
    pub leases: Index<LeaseFacts>,
    /// The ToolApprovals: people's decisions on held calls (see `approvals.rs`).
    pub decisions: Index<DecisionFacts>,
    pub render: RenderSettings,
    pub catalog: CatalogStore,
    pub metrics: Arc<Metrics>,
    /// Who publishes the events (see `events.rs`).
    pub reporter: Reporter,
    /// Seconds a finished TaskRun is kept when its spec says nothing
    /// (`--retention-seconds-after-finished`); `None`: kept.
    pub retention_seconds: Option<u32>,
    /// Where a call newly waiting for approval is announced (`--approval-webhook-url`); `None`:
    /// off.
    pub notifier: Option<crate::notify::Notifier>,
}

/// The sooner of two times to look again (`None`: no need).
pub fn soonest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Server-side apply of a rendered object under [`MANAGER`]; the answer is read as `K` (for a
/// Job, only what the operator reads of it).
pub async fn apply<K, P>(api: &Api<K>, obj: &P) -> Result<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    P: Resource + serde::Serialize + std::fmt::Debug,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingField("metadata.name"))?;
    Ok(api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await?)
}
