//! The context version of a rendered config: the number the sidecar, the agent and the status
//! use to say which config is in force. Pure.

use orchestrator_crds::taskrun::TaskRunStatus;

use super::facts::ConfigMapFacts;

/// The version a rendered config gets, and the highest version seen before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub current: u64,
    pub seen: u64,
}

impl Version {
    /// A config never applied before (not a re-apply of a version already seen). (Reconcile
    /// records each version in the history until the status shows it, see `history.rs`.)
    #[cfg(test)]
    pub fn is_new(self) -> bool {
        self.current > self.seen
    }
}

/// Kept while the rendered config (by `hash`) is the one already applied (the ConfigMap's
/// annotations, else the status), else one more than any version seen in either: a lagging
/// cache or status never yields the same version for two different configs.
pub fn context_version(
    existing: Option<&ConfigMapFacts>,
    previous: &TaskRunStatus,
    hash: &str,
) -> Version {
    let cm_version: u64 = existing
        .and_then(|c| c.context_version.as_deref()?.parse().ok())
        .unwrap_or(0);
    let status_version = u64::try_from(previous.context_version.unwrap_or(0)).unwrap_or(0);
    let seen = cm_version.max(status_version);
    let cm_hash = existing.and_then(|c| c.config_hash.as_deref());
    let current = if cm_hash == Some(hash) && cm_version > 0 {
        cm_version
    } else if previous.config_hash.as_deref() == Some(hash) && status_version > 0 {
        status_version
    } else {
        seen + 1
    };
    Version { current, seen }
}
