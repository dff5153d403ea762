//! What the task pod's proxy reports on the task's Lease: the calls it holds for approval
//! ([`LeaseFacts`], see `approvals.rs`), and what it serves: it reports the `contextVersion` it serves on the task's
//! Lease (annotation [`SERVED_ANNOTATION`], see `render::identity`), which the operator watches
//! (metadata only) and turns into `status.servedContextVersion` and the condition `ToolsSynced`.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use orchestrator_crds::approval::{
    ApprovalRequest, MAX_PENDING, MAX_SUMMARY_CHARS, MAX_SUMMARY_KEYS, REQUESTS_ANNOTATION,
};
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
                let before = requests.len();
                requests.retain(well_formed);
                if requests.len() != before {
                    tracing::warn!(lease = %lease.name_any(), dropped = before - requests.len(), "ignoring approval requests with oversized or malformed fields");
                }
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

/// Whether a request's fields are within what a proxy writes (`orchestrator_crds::approval`):
/// anything else did not come from our proxy, and would only bloat the status.
fn well_formed(r: &ApprovalRequest) -> bool {
    let short = |s: &str, max: usize| !s.is_empty() && s.len() <= max;
    short(&r.id, 64)
        && r.id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && short(&r.server, 128)
        && short(&r.tool, 128)
        && short(&r.requested_at, 64)
        && short(&r.expires_at, 64)
        && r.arguments.len() <= MAX_SUMMARY_KEYS + 1
        && r.arguments
            .iter()
            .all(|(k, v)| k.len() <= 4 * MAX_SUMMARY_CHARS && v.len() <= 16 * MAX_SUMMARY_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_or_malformed_requests_are_dropped() {
        let lease = |requests: serde_json::Value| -> PartialObjectMeta<Lease> {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "t", "annotations": {REQUESTS_ANNOTATION: requests.to_string()}}}))
            .unwrap_or_else(|e| panic!("a Lease: {e}"))
        };
        let ok = serde_json::json!({"id": "a1b2c3d4", "server": "fs", "tool": "write",
            "arguments": {"path": "\"/w\""}, "requestedAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-01T00:05:00Z"});
        let mut huge = ok.clone();
        huge["tool"] = serde_json::json!("x".repeat(10_000));
        let mut bad_id = ok.clone();
        bad_id["id"] = serde_json::json!("../../etc");
        let facts = lease_facts(&lease(serde_json::json!([ok, huge, bad_id]))).unwrap_or_default();
        let ids: Vec<_> = facts
            .requests
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["a1b2c3d4"]);
    }
}
