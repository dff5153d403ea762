//! The context version of a rendered config: the number the sidecar, the agent and the status
//! use to say which config is in force. Pure.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use orchestrator_crds::taskrun::TaskRunStatus;

use crate::render::{CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION};

/// The version a rendered config gets, and the highest version seen before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub current: u64,
    pub seen: u64,
}

impl Version {
    /// A config never applied before (not a re-apply of a version already seen).
    pub fn is_new(self) -> bool {
        self.current > self.seen
    }
}

/// Kept while the rendered config (by `hash`) is the one already applied (the ConfigMap's
/// annotations, else the status), else one more than any version seen in either: a lagging
/// cache or status never yields the same version for two different configs.
pub fn context_version(
    existing: Option<&ConfigMap>,
    previous: &TaskRunStatus,
    hash: &str,
) -> Version {
    let annotation = |key: &str| existing.and_then(|c| c.annotations().get(key).cloned());
    let cm_version: u64 = annotation(CONTEXT_VERSION_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let status_version = u64::try_from(previous.context_version.unwrap_or(0)).unwrap_or(0);
    let seen = cm_version.max(status_version);
    let current = if annotation(CONFIG_HASH_ANNOTATION).as_deref() == Some(hash) && cm_version > 0 {
        cm_version
    } else if previous.config_hash.as_deref() == Some(hash) && status_version > 0 {
        status_version
    } else {
        seen + 1
    };
    Version { current, seen }
}
