//! The names, labels, annotations and digests every part of a render shares.

use std::collections::BTreeMap;

use kube::ResourceExt;
use orchestrator_crds::taskrun::{CONFIG_MAP_SUFFIX, TaskRun};
use sha2::{Digest, Sha256};

/// Annotation on the ConfigMap: the context version it holds.
pub const CONTEXT_VERSION_ANNOTATION: &str = "orchestrator.io/context-version";
/// Annotation on the ConfigMap: the digest of its tool configuration (without the version).
pub const CONFIG_HASH_ANNOTATION: &str = "orchestrator.io/config-hash";
/// Label on every child: the TaskRun it belongs to.
pub const TASKRUN_LABEL: &str = "orchestrator.io/taskrun";
/// Label on every child: the task id.
pub const TASK_ID_LABEL: &str = "orchestrator.io/task-id";
/// Label on every child: the service.
pub const SERVICE_LABEL: &str = "orchestrator.io/service";
/// `app.kubernetes.io/managed-by` value of every child (the operator watches children by it).
pub const MANAGED_BY: &str = "orchestrator-operator";

/// `<taskrun>-tools`.
pub fn config_map_name(taskrun: &str) -> String {
    format!("{taskrun}{CONFIG_MAP_SUFFIX}")
}

/// The labels every child carries (and a selector the operator's watches use).
pub fn labels(tr: &TaskRun) -> BTreeMap<String, String> {
    let name = tr.name_any();
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "orchestrator-task".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), name.clone()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "orchestrator".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGED_BY.to_string(),
        ),
        (TASKRUN_LABEL.to_string(), name),
        (TASK_ID_LABEL.to_string(), tr.spec.task_id.to_string()),
        (SERVICE_LABEL.to_string(), tr.spec.service_name.clone()),
    ])
}

/// The label selector for everything the operator manages.
pub fn managed_selector() -> String {
    format!("app.kubernetes.io/managed-by={MANAGED_BY}")
}

/// A short digest of a ConfigMap's data (the config hash, and how the cache tells a ConfigMap's
/// data without keeping it).
pub fn digest(data: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in data {
        // Length-prefix both so no two different maps hash alike.
        h.update((k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_le_bytes());
        h.update(v.as_bytes());
    }
    short_hex(&h.finalize())
}

/// The first 8 bytes of a hash as 16 hex digits: how the operator's digests are written.
pub fn short_hex(hash: &[u8]) -> String {
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
