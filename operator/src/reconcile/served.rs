//! What the task pod's proxy serves: it reports the `contextVersion` it serves on the task's
//! Lease (annotation [`SERVED_ANNOTATION`], see `render::identity`), which the operator watches
//! (metadata only) and turns into `status.servedContextVersion` and the condition `ToolsSynced`.

use k8s_openapi::api::coordination::v1::Lease;
use kube::core::PartialObjectMeta;
use orchestrator_crds::taskrun::conditions as ct;

use super::children::Index;
use super::status::Cond;

/// Annotation on the task's Lease, written by the proxy: the `contextVersion` it serves.
pub const SERVED_ANNOTATION: &str = "orchestrator.io/served-context-version";

/// The version the proxy of task `name` reports it serves, if it has reported.
pub fn reported(leases: &Index<i64>, ns: &str, name: &str) -> Option<i64> {
    leases.get(ns, name).map(|v| *v)
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

/// What the operator keeps of a task Lease: the version its proxy reported, if it did.
pub fn lease_facts(lease: &PartialObjectMeta<Lease>) -> Option<i64> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(SERVED_ANNOTATION)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_only_when_the_proxy_serves_the_rendered_version() {
        assert_eq!(condition(2, Some(2)).status, "True");
        assert_eq!(condition(2, Some(3)).status, "True");
        let behind = condition(2, Some(1));
        assert_eq!(
            (behind.status, behind.reason.as_str()),
            ("False", "Syncing")
        );
        assert!(
            behind
                .message
                .contains("serves contextVersion 1; 2 is rendered")
        );
        assert_eq!(condition(1, None).status, "Unknown");
    }
}
