//! What the task pod's proxy reports on the task's Lease: the calls it holds for approval
//! ([`LeaseFacts`], see `approvals.rs`), and what it serves: it reports the `contextVersion` it serves on the task's
//! Lease (annotation [`SERVED_ANNOTATION`], see `render::identity`), which the operator watches
//! (metadata only) and turns into `status.servedContextVersion` and the condition `ToolsSynced`.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use orchestrator_crds::approval::{ApprovalRequest, MAX_PENDING, REQUESTS_ANNOTATION};
use orchestrator_crds::taskrun::conditions as ct;

use super::children::Index;
use super::status::Cond;

/// Annotation on the task's Lease, written by the proxy: the `contextVersion` it serves.
pub const SERVED_ANNOTATION: &str = "orchestrator.io/served-context-version";

/// The version the proxy of task `name` reports it serves, if it has reported.
pub fn reported(leases: &Index<LeaseFacts>, ns: &str, name: &str) -> Option<i64> {
    leases.get(ns, name).and_then(|f| f.served)
}

/// `ToolsSynced` for the rendered `version` and what the proxy reported.
pub fn condition(version: u64, served: Option<i64>) -> Cond {
    match served {
        Some(s) if s >= version as i64 => Cond::yes(
            ct::TOOLS_SYNCED,
            "Served",
            format!("the task pod's proxy serves contextVersion {s}"),
        ),
        Some(s) => Cond::no(
            ct::TOOLS_SYNCED,
            "Syncing",
            format!("the task pod's proxy serves contextVersion {s}; {version} is rendered"),
        ),
        None => Cond::unknown(
            ct::TOOLS_SYNCED,
            "NotReported",
            "the task pod's proxy has not reported what it serves yet",
        ),
    }
}

/// What the operator keeps of a task Lease: the version its proxy serves, and the calls it
/// holds for approval.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LeaseFacts {
    pub served: Option<i64>,
    /// `None`: the proxy never published any (nothing to withdraw).
    pub requests: Option<Vec<ApprovalRequest>>,
}

/// The facts of a task Lease; a malformed request list counts as none published (logged).
pub fn lease_facts(lease: &PartialObjectMeta<Lease>) -> Option<LeaseFacts> {
    let annotations = lease.metadata.annotations.as_ref()?;
    let served = annotations
        .get(SERVED_ANNOTATION)
        .and_then(|v| v.parse().ok());
    let requests = annotations
        .get(REQUESTS_ANNOTATION)
        .and_then(|v| match serde_json::from_str::<Vec<ApprovalRequest>>(v) {
            Ok(mut requests) => {
                requests.truncate(MAX_PENDING);
                Some(requests)
            }
            Err(e) => {
                tracing::warn!(lease = %lease.name_any(), error = %e, "ignoring a malformed {REQUESTS_ANNOTATION}");
                None
            }
        });
    (served.is_some() || requests.is_some()).then_some(LeaseFacts { served, requests })
}
