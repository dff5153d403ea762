//! Rendering: a pure function of TaskRun + catalog + operator settings to the ConfigMap and the
//! Job the reconciler applies. Nothing here talks to the API server; snapshot tests pin the output.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! - [`names`]: the names, labels, annotations and digests every part shares; [`settings`]:
//!   what the operator's flags decide ([`RenderSettings`], the [`SharedProxy`]).
//! - `resolve` (the crds crate's [`orchestrator_crds::resolve`], which `task validate` runs too):
//!   match the task's servers against the catalog, bind Secret env, find problems;
//!   [`identity`]: the pod's ServiceAccount, and a Role that reads only the task's ConfigMap.
//! - [`pod`]: the containers' building blocks (uids, security context, mounts) and what they are
//!   rendered from; [`proxy_volumes`]: the volumes only the proxy's container mounts.
//! - [`zone`]: a stdio server's container (its name, its socket or port, the container);
//!   [`model`]: the model gateway in the task's proxy (`spec.model` or the default credential:
//!   the proxy's `gateway` for the runtime's API, its key volume, the agent's key helper).
//! - [`runtime`]: the agent's runtime (`spec.agent.runtime`: Claude Code, Codex CLI, Gemini CLI,
//!   OpenCode, custom): its files, env and default script, and what it refuses.
//! - [`files`]: the ConfigMap's files (`proxy.yaml` for the sidecar, the runtime's files, the
//!   credential helpers, the task text).
//! - [`shared`]: shared-service mode only (docs/design/shared-mode.md): the task's ConfigMap in
//!   the shared proxy's namespace, the agent's token for it, what such a task cannot have;
//!   [`sidecar`]: sidecar mode only: the proxy's container in the pod and the pod's volumes.
//! - [`placement`]: where the task's proxy runs, asked once: the answers that differ between
//!   the two modes, for everything after it (and the [`Plan`]'s [`Placement`]).
//! - [`job`]: the Job: the agent container, the proxy's (sidecar mode) and each stdio server's
//!   container (its zone) as native sidecars.
//! - `tests` (the render's own, and helpers for the next ones), `credential_tests`, `shared_tests`,
//!   `model_tests`.

pub mod files;
pub mod identity;
pub mod job;
pub mod model;
pub mod names;
pub mod placement;
pub mod pod;
pub mod proxy_volumes;
pub mod runtime;
pub mod settings;
pub mod shared;
pub mod sidecar;
pub mod zone;

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::resolve;
use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::{EffectiveTools, TaskRun};

pub use names::{
    CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION, MANAGED_BY, SERVICE_LABEL, TASK_ID_LABEL,
    TASKRUN_LABEL, config_map_name, digest, labels, managed_selector, short_hex,
};
pub use placement::Placement;
use placement::Wiring;
pub use resolve::{Problem, SecretBinding};
pub use settings::{DEFAULT_SIDECAR_PORT, RenderSettings, RuntimeImages, SharedProxy};

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

    // The model gateway runs in the task's proxy: its own container, or the shared proxy.
    let model = model::choose(tr, settings).map_err(|p| vec![p])?;
    let problems = runtime::check(tr, model);
    if !problems.is_empty() {
        return Err(problems);
    }
    let launch = runtime::render(tr, &wiring.agent_access(), model.is_some())?;
    let mut files = files::Files::render(
        tr,
        &namespace,
        &resolved,
        &settings.proxy_addr(),
        launch.files.clone(),
    );
    if let Some(model) = model {
        files.use_gateway(tr, model);
    }
    if let Some(point) = &settings.decision_point {
        files.ask_first(tr, point);
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
        launch: &launch,
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

#[cfg(test)]
mod credential_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod shared_tests;
#[cfg(test)]
mod tests;
