//! Shared-service mode (docs/design/shared-mode.md): one proxy Deployment serves many tasks. The
//! names the operator and the shared proxy agree on; types only.
//!
//! The operator writes, per task in shared mode, a ConfigMap [`config_map_name`] in the shared
//! proxy's namespace, labelled [`CONFIG_LABEL`], holding the task's `proxy.yaml` and
//! `approvals.json` and the annotations [`TASK_POD_UID_ANNOTATION`], [`TASK_POD_IP_ANNOTATION`]
//! and [`TASK_PHASE_ANNOTATION`]. The proxy only reads them: a token whose pod uid matches no such
//! ConfigMap is refused, and the operator deletes the ConfigMap when the task ends.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a task's MCP proxy runs.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// A native sidecar in the task's pod (one proxy per task).
    #[default]
    Sidecar,
    /// The chart's shared proxy Deployment, reached through its Service.
    Shared,
}

impl ProxyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sidecar => "sidecar",
            Self::Shared => "shared",
        }
    }

    /// Parses `sidecar` or `shared` (a flag's or a label's value).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sidecar" => Some(Self::Sidecar),
            "shared" => Some(Self::Shared),
            _ => None,
        }
    }
}

impl std::fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The label on a Namespace choosing the mode of its TaskRuns that do not set `spec.proxy.mode`.
pub const NAMESPACE_MODE_LABEL: &str = "orchestrator.io/proxy-mode";

/// The label on every per-task ConfigMap of the shared proxy (its watch's selector).
pub const CONFIG_LABEL: &str = "orchestrator.io/shared-proxy-config";

/// Annotation: the uid of the task's pod (the one the operator bound). A token is accepted only
/// when the API server vouches it was issued to this pod.
pub const TASK_POD_UID_ANNOTATION: &str = "orchestrator.io/task-pod-uid";
/// Annotation: the task pod's IP (the peer check; the zones' address).
pub const TASK_POD_IP_ANNOTATION: &str = "orchestrator.io/task-pod-ip";
/// Annotation: the task's phase as the operator last wrote it (`Pending`, `Running`,
/// `Terminating`).
pub const TASK_PHASE_ANNOTATION: &str = "orchestrator.io/task-phase";
/// Annotation: the task's TaskRun uid.
pub const TASK_UID_ANNOTATION: &str = "orchestrator.io/task-uid";
/// Annotation: the task's namespace and name (`<namespace>/<name>`), for messages and the sweep.
pub const TASK_ANNOTATION: &str = "orchestrator.io/task";

/// The Lease annotation marking a task served by the shared proxy (the admission policy then
/// checks writes against the shared proxy's ServiceAccount instead of a pod uid).
pub const LEASE_MODE_ANNOTATION: &str = "orchestrator.io/proxy-mode";

/// The default audience of the agent's token for the shared proxy.
pub const DEFAULT_AUDIENCE: &str = "orchestrator.io/mcp-proxy";

/// Where the agent container finds its credential for its proxy, in both modes: in shared mode a
/// projected ServiceAccount token for the shared proxy's audience; in sidecar mode the random
/// token the pod's proxy writes there (a volume only the proxy's and the agent's containers
/// mount).
pub const TOKEN_DIR: &str = "/var/run/secrets/orchestrator.io/mcp";
/// The token file inside [`TOKEN_DIR`].
pub const TOKEN_FILE: &str = "token";

/// The Secret, one per tasks' namespace, whose key [`AUDITOR_TOKEN_KEY`] is the auditors'
/// credential for the task proxies' read-only endpoints (`GET /audit`, `/tools`, `/metrics`):
/// the operator creates it (random) when missing, each sidecar mounts it, and `orchestrator-cli
/// task audit` reads it with its caller's own rights (`get` on this Secret by name).
pub const AUDITOR_SECRET: &str = "orchestrator-task-auditor";
/// The auditors' token inside [`AUDITOR_SECRET`].
pub const AUDITOR_TOKEN_KEY: &str = "token";

/// The prefix of the per-task ConfigMaps (`task.<namespace>.<name>`).
pub const CONFIG_MAP_PREFIX: &str = "task.";

/// The shared proxy's ConfigMap for a task: `task.<namespace>.<name>`. A namespace is a DNS-1123
/// label and a TaskRun name one too (57 characters at most), so the name is unique per task and
/// fits the 253 characters of a ConfigMap name.
pub fn config_map_name(namespace: &str, name: &str) -> String {
    format!("{CONFIG_MAP_PREFIX}{namespace}.{name}")
}

/// The task a ConfigMap name belongs to, when it is one of [`config_map_name`]'s.
pub fn task_of_config_map(cm: &str) -> Option<(&str, &str)> {
    let rest = cm.strip_prefix(CONFIG_MAP_PREFIX)?;
    let (ns, name) = rest.split_once('.')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('.')).then_some((ns, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_map_names_round_trip_and_stay_unique() {
        let cm = config_map_name("team-a", "fix-1");
        assert_eq!(cm, "task.team-a.fix-1");
        assert_eq!(task_of_config_map(&cm), Some(("team-a", "fix-1")));
        // "a.b" cannot be a namespace (a label), so team-a/b.c never clashes with team-a.b/c.
        assert_eq!(task_of_config_map("task.a.b.c"), None);
        assert_eq!(task_of_config_map("other"), None);
        assert_eq!(task_of_config_map("task..x"), None);
    }

    #[test]
    fn mode_parses_its_own_names_only() {
        for m in [ProxyMode::Sidecar, ProxyMode::Shared] {
            assert_eq!(ProxyMode::parse(m.as_str()), Some(m));
            assert_eq!(
                serde_json::to_value(m).expect("mode as JSON"),
                serde_json::json!(m.as_str())
            );
        }
        assert_eq!(ProxyMode::parse("Shared"), None);
        assert_eq!(ProxyMode::default(), ProxyMode::Sidecar);
    }
}
