//! Rendering: a pure function of TaskRun + catalog + operator settings to the ConfigMap and the
//! Job the reconciler applies. Nothing here talks to the API server; snapshot tests pin the output.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! - [`resolve`]: match the task's servers against the catalog, bind Secret env, find problems;
//!   [`identity`]: the pod's ServiceAccount, and a Role that reads only the task's ConfigMap;
//!   [`agent`]: the default agent's script (Claude Code; its result as the termination message).
//! - [`pod`]: the containers' building blocks (uids, security context, mounts) and what they are
//!   rendered from; [`proxy_volumes`]: the volumes only the proxy's container mounts.
//! - [`zone`]: a stdio server's container (its name, its socket or port, the container);
//!   [`model`]: the model gateway in the task's proxy (`spec.model` or the default credential:
//!   the proxy's `gateway`, its key volume, the agent's base URL and key helper).
//! - [`files`]: the ConfigMap's files (`proxy.yaml` for the sidecar, the agent's MCP config and
//!   permission settings, the task text).
//! - [`shared`]: shared-service mode only (docs/design/shared-mode.md): the task's ConfigMap in
//!   the shared proxy's namespace, the agent's token for it, what such a task cannot have;
//!   [`sidecar`]: sidecar mode only: the proxy's container in the pod and the pod's volumes.
//! - [`placement`]: where the task's proxy runs, asked once: the answers that differ between
//!   the two modes, for everything after it (and the [`Plan`]'s [`Placement`]).
//! - [`job`]: the Job: the agent container, the proxy's (sidecar mode) and each stdio server's
//!   container (its zone) as native sidecars.
//! - `tests` (the render's own, and helpers for the next ones), `credential_tests`, `shared_tests`,
//!   `model_tests`.

pub mod agent;
pub mod files;
pub mod identity;
pub mod job;
pub mod model;
pub mod placement;
pub mod pod;
pub mod proxy_volumes;
pub mod resolve;
pub mod shared;
pub mod sidecar;
pub mod zone;

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::{CONFIG_MAP_SUFFIX, EffectiveTools, TaskRun};
use sha2::{Digest, Sha256};

pub use placement::Placement;
use placement::Wiring;
pub use resolve::{Problem, SecretBinding};

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

/// The sidecar's default port (the proxy's own default listen address is 127.0.0.1:8080).
pub const DEFAULT_SIDECAR_PORT: u16 = 8080;

/// What the operator's flags decide about rendered objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderSettings {
    /// Image of the MCP proxy sidecar.
    pub sidecar_image: String,
    /// Agent image when the TaskRun names none.
    pub agent_image: String,
    /// OTLP endpoint handed to every sidecar (`OTEL_EXPORTER_OTLP_ENDPOINT`), if any.
    pub sidecar_otlp_endpoint: Option<String>,
    /// The loopback port the sidecar serves MCP on (the agent and the probes use it).
    pub sidecar_port: u16,
    /// The proxy watches its ConfigMap through the API and reports what it serves (a token of
    /// the task's identity in the proxy container only); see [`identity`].
    pub sidecar_api_watch: bool,
    /// `HOST:PORT` for KUBERNETES_SERVICE_HOST/PORT on the proxy container, if set.
    pub sidecar_kubernetes_service: Option<String>,
    /// Port of the proxy's metrics listener on the pod IP (`--metrics-listen`), if any.
    pub sidecar_metrics_port: Option<u16>,
    /// The shared proxy (`--shared-proxy-*`), when shared mode is on.
    pub shared_proxy: Option<SharedProxy>,
    /// The model credential of a TaskRun that names none (`--model-secret`).
    pub default_model: Option<orchestrator_crds::taskrun::model::ModelSpec>,
}

/// The chart's shared proxy, as the operator's flags name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedProxy {
    /// Its MCP URL as task pods reach it (`--shared-proxy-url`).
    pub url: String,
    /// Its namespace: where each shared task's ConfigMap goes.
    pub namespace: String,
    /// Its ServiceAccount (in `namespace`).
    pub service_account: String,
    /// The audience of the agents' tokens.
    pub audience: String,
}

impl RenderSettings {
    /// Where the proxy listens inside the pod: loopback only, the agent is in the same pod.
    pub fn proxy_addr(&self) -> String {
        format!("127.0.0.1:{}", self.sidecar_port)
    }
}

/// Everything rendered for one TaskRun, before the context version is known.
#[derive(Clone, Debug)]
pub struct Plan {
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    owner: OwnerReference,
    /// The ConfigMap's files with `contextVersion` 0 (see [`Plan::config_map`]).
    files: files::Files,
    config_hash: String,
    job: Job,
    identity: identity::Identity,
    /// Per enabled server: its patterns and the known tools they expose.
    pub tools: Vec<EffectiveTools>,
    /// How many known tools the agent can call.
    pub enabled_tool_count: i64,
    /// Env vars of the pod's containers that come from Secrets.
    pub secrets: Vec<SecretBinding>,
    /// The stdio servers the TaskRun lists (enabled or not): each has its own container.
    zoned: Vec<String>,
    /// Where the task's proxy runs (an input of the render, see `reconcile/placement/`).
    placement: Placement,
}

impl Plan {
    /// Digest of the tool configuration (independent of the context version): when it changes,
    /// the context version increments.
    pub fn config_hash(&self) -> &str {
        &self.config_hash
    }

    pub fn config_map_name(&self) -> String {
        config_map_name(&self.name)
    }

    pub fn job_name(&self) -> &str {
        &self.name
    }

    /// The ConfigMap at `context_version`.
    pub fn config_map(&self, context_version: u64) -> ConfigMap {
        let mut annotations = BTreeMap::new();
        annotations.insert(
            CONTEXT_VERSION_ANNOTATION.to_string(),
            context_version.to_string(),
        );
        annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), self.config_hash.clone());
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.config_map_name()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels.clone()),
                annotations: Some(annotations),
                owner_references: Some(vec![self.owner.clone()]),
                ..Default::default()
            },
            data: Some(self.placement.config_map_data(&self.files, context_version)),
            ..Default::default()
        }
    }

    /// The Job (created once; its pod template never changes afterwards).
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The pod's identity (created with the Job, before it).
    pub fn identity(&self) -> &identity::Identity {
        &self.identity
    }

    /// The Secret env the current tool configuration needs (only enabled servers; the
    /// reconciler checks a running Job has them).
    pub fn required_secret_env(&self) -> impl Iterator<Item = &SecretBinding> {
        self.secrets.iter().filter(|b| !b.optional)
    }

    /// The stdio servers the TaskRun lists: each runs in its own container of the pod.
    pub fn zoned_servers(&self) -> impl Iterator<Item = &str> {
        self.zoned.iter().map(String::as_str)
    }

    /// Shared mode with stdio servers: the task's Secret of its zones' keys
    /// (`<taskrun>-zone-keys`, one item per stdio server, `key` drawing each: `reconcile` draws
    /// them at random), owned by the TaskRun; none otherwise.
    pub fn zone_keys_secret(&self, mut key: impl FnMut() -> String) -> Option<Secret> {
        if !self.placement.zones_prove_keys() || self.zoned.is_empty() {
            return None;
        }
        Some(Secret {
            metadata: ObjectMeta {
                name: Some(zone::zone_keys_secret_name(&self.name)),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels.clone()),
                owner_references: Some(vec![self.owner.clone()]),
                ..Default::default()
            },
            string_data: Some(self.zoned.iter().map(|s| (s.clone(), key())).collect()),
            ..Default::default()
        })
    }

    /// Where the task's proxy runs.
    pub fn mode(&self) -> ProxyMode {
        self.placement.mode()
    }

    /// In shared mode: the task's ConfigMap in the shared proxy's namespace.
    pub fn shared(&self) -> Option<&shared::SharedConfig> {
        self.placement.shared()
    }
}

/// `<taskrun>-tools`.
pub fn config_map_name(taskrun: &str) -> String {
    format!("{taskrun}{CONFIG_MAP_SUFFIX}")
}

/// Renders a TaskRun in sidecar mode (see [`render_mode`]).
pub fn render(
    tr: &TaskRun,
    catalog: &Catalog,
    settings: &RenderSettings,
) -> Result<Plan, Vec<Problem>> {
    render_mode(tr, catalog, settings, ProxyMode::Sidecar)
}

/// Renders a TaskRun whose proxy runs in `mode`. Fails with every problem the operator can
/// judge (unknown servers, env without a Secret, bad globs, in shared mode no shared proxy or a
/// stdio server, ...); the API server has already refused what CEL can judge.
pub fn render_mode(
    tr: &TaskRun,
    catalog: &Catalog,
    settings: &RenderSettings,
    mode: ProxyMode,
) -> Result<Plan, Vec<Problem>> {
    let (Some(namespace), Some(owner)) = (tr.namespace(), tr.controller_owner_ref(&())) else {
        return Err(vec![Problem {
            reason: "InvalidObject",
            message: "the TaskRun has no namespace or uid (it was not read from the API server)"
                .into(),
        }]);
    };
    let name = tr.name_any();
    let resolved = resolve::resolve(&tr.spec, catalog)?;
    // The one place the mode is asked: the rest asks the wiring.
    let wiring = Wiring::resolve(mode, settings, &resolved)?;
    let labels = labels(tr);

    let mut files = files::Files::render(
        tr,
        &namespace,
        &resolved,
        &settings.proxy_addr(),
        wiring.agent_access(),
    );
    // The model gateway runs in the task's proxy: its own container, or the shared proxy.
    let model = model::choose(tr, settings).map_err(|p| vec![p])?;
    if let Some(model) = model {
        files.use_gateway(tr, model);
    }
    let placement = wiring.place(tr, &namespace, &files, &resolved, model);
    let config_hash = digest(&placement.hashed(&files));

    let mut tools = Vec::new();
    let mut enabled_tool_count = 0;
    for server in resolved.servers.iter().filter(|s| s.spec.enabled) {
        let exposed = resolve::exposed_tools(server, &tr.spec.tool_config.policy);
        enabled_tool_count += exposed.as_ref().map_or(0, |e| e.len() as i64);
        tools.push(EffectiveTools {
            server: server.spec.name.clone(),
            allow: server.spec.tools.allow.clone(),
            deny: server.spec.tools.deny.clone(),
            exposed,
        });
    }

    let identity = identity::render(identity::IdentityInput {
        name: &name,
        namespace: &namespace,
        labels: &labels,
        owner: &owner,
        service_account_name: tr.spec.service_account_name.as_deref(),
        config_map_name: &config_map_name(&name),
        proxy: wiring.proxy_rights(tr, &resolved, model, settings.sidecar_api_watch),
    });
    let job = job::render(job::JobInput {
        taskrun: tr,
        namespace: &namespace,
        labels: &labels,
        owner: &owner,
        settings,
        resolved: &resolved,
        service_account_name: identity.service_account_name(),
        wiring: &wiring,
        model,
    });
    // Each stdio server has its container, in either mode.
    let zoned = zone::zones(&resolved)
        .map(|z| z.server.spec.name.clone())
        .collect();

    Ok(Plan {
        namespace,
        name,
        labels,
        owner,
        files,
        config_hash,
        job,
        identity,
        tools,
        enabled_tool_count,
        secrets: resolved.secrets,
        zoned,
        placement,
    })
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

#[cfg(test)]
mod credential_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod shared_tests;
#[cfg(test)]
mod tests;
