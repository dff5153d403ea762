//! What the task pod's proxy serves: it reports the `contextVersion` it serves on the task's
//! Lease (annotation [`SERVED_ANNOTATION`], see `render::identity`), which the operator watches
//! (metadata only) and turns into `status.servedContextVersion` and the condition `ToolsSynced`.

use orchestrator_crds::taskrun::conditions as ct;

use super::approvals::LeaseFacts;
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
