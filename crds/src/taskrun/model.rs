//! `spec.model` and `spec.budget`: the model the agent talks to, through the task's proxy (the
//! model gateway, [`crate::gateway`]), and what the task may spend on it.
//!
//! The key stays in a Secret only the proxy's container mounts; the agent's runtime is pointed
//! at the proxy (`http://127.0.0.1:<port>/model`) and presents the pod's agent credential as
//! its API key. A TaskRun without `spec.model` uses the operator's default credential (the
//! chart's `model` values), when one is configured.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::KeyRef;
pub use crate::gateway::Budget;

/// The endpoint when `spec.model.endpoint` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://api.anthropic.com";

/// The most model globs a TaskRun may list.
pub const MAX_MODELS: usize = 32;

/// The model credential of a task.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// The Secret key holding the model API key, in the TaskRun's namespace. Only the task's
    /// proxy reads it; naming it needs `get` on that Secret (the chart's admission policy).
    pub secret_key_ref: KeyRef,
    /// The API's base URL (default `https://api.anthropic.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.startsWith('https://') || self.startsWith('http://127.') || self.startsWith('http://localhost')", "message": "must be an https:// URL (http:// only to a loopback address)"}
    ]))]
    pub endpoint: Option<String>,
    /// Globs over the model names the agent may ask for (e.g. `claude-sonnet-*`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256)))]
    pub models: Vec<String>,
    /// A ConfigMap key in the TaskRun's namespace holding PEM CA certificates the proxy trusts
    /// for `endpoint` besides the system's (a private gateway's CA, as trust-manager or
    /// `kubectl create configmap --from-file` puts them). Only the proxy's container mounts it;
    /// the pod waits for it, as for the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map_key_ref: Option<KeyRef>,
}
