//! Where the task's proxy runs, asked once: a container of the task's pod (sidecar mode, see
//! [`super::sidecar`]) or the chart's shared proxy (shared mode, see [`super::shared`]).
//!
//! - [`Wiring`]: resolved from the task's mode before anything is rendered; its methods answer
//!   each question the render asks that the two placements answer differently: how the agent
//!   reaches its proxy (URL, credential, model base URL), the pod's native sidecars and
//!   volumes, how each zone is reached, and what the proxy's identity is granted.
//! - [`Placement`]: the [`super::Plan`]'s, once rendered: in shared mode the task's ConfigMap in
//!   the shared proxy's namespace; it says what the task's ConfigMap holds, what the config hash
//!   covers and whether the zones prove keys.
//!
//! The rest of the render asks these and never the mode.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Volume, VolumeMount};
use orchestrator_crds::proxy::PROXY_CONFIG_FILE;
use orchestrator_crds::shared::{LEASE_MODE_ANNOTATION, ProxyMode, TOKEN_DIR};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::model::ModelSpec;

use super::files::Files;
use super::identity::{ProxyRights, SharedAccount};
use super::pod::{PodInput, env, mount};
use super::proxy_volumes::AGENT_CREDENTIAL_VOLUME;
use super::runtime::ProxyAccess;
use super::shared::{self, SharedConfig, TOKEN_VOLUME};
use super::zone::{self, Zone, ZoneLink, zone_container, zones};
use super::{RenderSettings, SharedProxy, sidecar};
use orchestrator_crds::resolve::{Problem, Resolved};

/// How the task's pod is wired to its proxy, while rendering.
#[derive(Clone, Debug)]
pub enum Wiring<'a> {
    /// The proxy is a container of the pod, serving MCP on the pod's loopback at `addr`.
    Sidecar { addr: String },
    /// The chart's shared proxy serves the task; each stdio server's zone listens on the pod's IP.
    Shared(&'a SharedProxy),
}

impl<'a> Wiring<'a> {
    /// The task's proxy in `mode`, or why a shared one cannot serve it (every problem).
    pub fn resolve(
        mode: ProxyMode,
        settings: &'a RenderSettings,
        resolved: &Resolved<'_>,
    ) -> Result<Self, Vec<Problem>> {
        Ok(match mode {
            ProxyMode::Sidecar => Wiring::Sidecar {
                addr: settings.proxy_addr(),
            },
            ProxyMode::Shared => Wiring::Shared(shared::check(settings, resolved)?),
        })
    }

    /// The agent's MCP URL (`ORCHESTRATOR_MCP_URL`).
    pub fn mcp_url(&self) -> String {
        match self {
            Wiring::Sidecar { addr } => format!("http://{addr}/mcp"),
            Wiring::Shared(proxy) => proxy.url.clone(),
        }
    }

    /// How the agent's files reach the proxy: its MCP URL, the model API's base URL (at the
    /// pod's proxy, or next to the shared proxy's `/mcp`) and the credential helpers.
    pub fn agent_access(&self) -> ProxyAccess {
        match self {
            Wiring::Sidecar { addr } => ProxyAccess::sidecar(addr),
            Wiring::Shared(proxy) => {
                ProxyAccess::shared(&proxy.url, &super::model::shared_base_url(&proxy.url))
            }
        }
    }

    /// The agent's credential for its proxy at [`TOKEN_DIR`], read-only: env besides the token
    /// file's path, and its mount. In shared mode a projected token with the shared proxy's
    /// audience; in sidecar mode the one the pod's proxy writes.
    pub fn agent_credential(&self) -> (Option<EnvVar>, VolumeMount) {
        match self {
            Wiring::Sidecar { .. } => (None, mount(AGENT_CREDENTIAL_VOLUME, TOKEN_DIR, true)),
            Wiring::Shared(_) => (
                Some(env("ORCHESTRATOR_PROXY_MODE", "shared")),
                mount(TOKEN_VOLUME, TOKEN_DIR, true),
            ),
        }
    }

    /// The native sidecars: the proxy (sidecar mode only), then each stdio server's zone; none
    /// in shared mode without stdio servers.
    pub fn init_containers(&self, pod: &PodInput<'_>) -> Option<Vec<Container>> {
        let zoned = zones(pod.resolved)
            .map(|z| zone_container(pod.settings, pod.resolved, &z, self.zone_link(&z)));
        match self {
            Wiring::Sidecar { .. } => Some(
                std::iter::once(sidecar::proxy_container(pod))
                    .chain(zoned)
                    .collect(),
            ),
            Wiring::Shared(_) => {
                let zoned: Vec<Container> = zoned.collect();
                (!zoned.is_empty()).then_some(zoned)
            }
        }
    }

    /// How a zone's container is reached: over its socket by the pod's proxy, or on the pod's
    /// IP with its key by the shared proxy.
    fn zone_link(&self, zone: &Zone<'_>) -> ZoneLink {
        match self {
            Wiring::Sidecar { .. } => zone::socket_link(zone),
            Wiring::Shared(_) => zone::tcp_link(zone),
        }
    }

    /// The pod's volumes after the task's ConfigMap, the task and the workspace.
    pub fn pod_volumes(&self, pod: &PodInput<'_>) -> Vec<Volume> {
        match self {
            Wiring::Sidecar { .. } => sidecar::pod_volumes(pod),
            Wiring::Shared(proxy) => shared::pod_volumes(proxy, pod),
        }
    }

    /// What the task's identity grants its proxy. A sidecar reports to the Lease when it
    /// watches the API (`api_watch`) and runs as the pod's account; the shared proxy always
    /// reports, runs as its own account, and reads the task's Secrets and the model's CAs.
    pub fn proxy_rights(
        &self,
        tr: &TaskRun,
        resolved: &Resolved<'_>,
        model: Option<&ModelSpec>,
        api_watch: bool,
    ) -> ProxyRights<'a> {
        match self {
            Wiring::Sidecar { .. } => ProxyRights {
                reports: api_watch,
                lease_annotations: None,
                secrets: Vec::new(),
                config_maps: Vec::new(),
                account: None,
            },
            Wiring::Shared(proxy) => ProxyRights {
                reports: true,
                // The admission policy then admits the shared proxy's writes instead of a pod's.
                lease_annotations: Some(BTreeMap::from([(
                    LEASE_MODE_ANNOTATION.to_string(),
                    ProxyMode::Shared.as_str().to_string(),
                )])),
                secrets: shared::secret_names(tr, resolved, model),
                config_maps: model
                    .and_then(|m| m.ca_config_map_key_ref.as_ref())
                    .map(|ca| ca.name.clone())
                    .into_iter()
                    .collect(),
                account: Some(SharedAccount {
                    namespace: &proxy.namespace,
                    service_account: &proxy.service_account,
                }),
            },
        }
    }

    /// The Plan's placement, once the task's files are rendered (in shared mode the task's
    /// ConfigMap in the shared proxy's namespace, from the sidecar's proxy config).
    pub fn place(
        &self,
        tr: &TaskRun,
        namespace: &str,
        files: &Files,
        resolved: &Resolved<'_>,
        model: Option<&ModelSpec>,
    ) -> Placement {
        match self {
            Wiring::Sidecar { .. } => Placement::Sidecar,
            Wiring::Shared(proxy) => Placement::Shared(Box::new(SharedConfig::render(
                tr,
                namespace,
                files.proxy(),
                resolved,
                proxy,
                model,
            ))),
        }
    }
}

/// Where the task's proxy runs, as rendered: a container of the task's pod, or the shared
/// proxy, with the task's ConfigMap in its namespace.
#[derive(Clone, Debug)]
pub enum Placement {
    Sidecar,
    Shared(Box<SharedConfig>),
}

impl Placement {
    pub fn mode(&self) -> ProxyMode {
        match self {
            Placement::Sidecar => ProxyMode::Sidecar,
            Placement::Shared(_) => ProxyMode::Shared,
        }
    }

    /// In shared mode: the task's ConfigMap in the shared proxy's namespace.
    pub fn shared(&self) -> Option<&SharedConfig> {
        match self {
            Placement::Sidecar => None,
            Placement::Shared(config) => Some(config),
        }
    }

    /// The task's ConfigMap's data at `context_version`: the agent's files, and in sidecar mode
    /// the pod's proxy's (the shared proxy's are in its own ConfigMap).
    pub fn config_map_data(&self, files: &Files, context_version: u64) -> BTreeMap<String, String> {
        match self {
            Placement::Sidecar => files.data(context_version),
            Placement::Shared(_) => files.agent_data(),
        }
    }

    /// What the config hash covers: everything the task's proxy and agent read, wherever it
    /// is kept (`contextVersion` 0).
    pub fn hashed(&self, files: &Files) -> BTreeMap<String, String> {
        match self {
            Placement::Sidecar => files.data(0),
            Placement::Shared(config) => {
                let mut hashed = files.agent_data();
                hashed.insert(PROXY_CONFIG_FILE.to_string(), config.proxy_yaml(0));
                hashed
            }
        }
    }

    /// The zones prove keys from the task's Secret `<taskrun>-zone-keys` (shared mode; a
    /// sidecar reaches them over their sockets).
    pub fn zones_prove_keys(&self) -> bool {
        matches!(self, Placement::Shared(_))
    }
}
