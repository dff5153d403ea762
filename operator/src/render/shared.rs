//! Shared-service mode (docs/design/shared-mode.md, §1): the task's proxy is the chart's shared
//! Deployment, not a container of its pod. What that changes in the render:
//! - [`check`]: what such a task cannot have: no shared proxy configured
//!   (`SharedProxyUnavailable`);
//! - [`SharedConfig`]: the task's ConfigMap `task.<namespace>.<taskrun>` in the shared proxy's
//!   namespace, holding the same `proxy.yaml` a sidecar gets with `task.uid` set, the task's
//!   Secret keys whose values the proxy masks in held calls (`mask-keys.json`, the keys a
//!   sidecar's mask volume holds), the HTTP
//!   servers' headers read from the task's Secrets (`headersFromSecret`) instead of env, each
//!   stdio server's zone reached over TCP (`zonePort`, its key in the task's Secret
//!   `<taskrun>-zone-keys`: `zoneKey`) instead of a socket, and the annotations the proxy maps
//!   tokens to tasks with;
//! - [`pod_volumes`]: the pod's volumes without a proxy in it, among them [`token_volume`]: the
//!   agent's token for the shared proxy (a projected ServiceAccount token whose audience is the
//!   shared proxy's, mounted into the agent container only);
//! - [`secret_names`]: the task's Secrets, which the task's Role lets the shared proxy `get`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use orchestrator_crds::approval::{MASK_KEYS_KEY, MaskKey};
use orchestrator_crds::proxy::{DEFAULT_LISTEN, PROXY_CONFIG_FILE, ProxyConfig, SecretKey};
use orchestrator_crds::shared::{
    CONFIG_LABEL, TASK_ANNOTATION, TASK_PHASE_ANNOTATION, TASK_POD_IP_ANNOTATION,
    TASK_POD_UID_ANNOTATION, TASK_UID_ANNOTATION, TOKEN_FILE, config_map_name,
};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::model::ModelSpec;

use super::names::{CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION};
use super::pod::{AGENT_TMP_VOLUME, PodInput, empty_dir};
use super::settings::SharedProxy;
use super::zone::{zone_key_volume, zone_keys_secret_name, zones};
use orchestrator_crds::resolve::{Problem, Resolved, mask_keys};

/// The condition reason of a shared task when no shared proxy is configured.
pub const SHARED_PROXY_UNAVAILABLE: &str = "SharedProxyUnavailable";
/// The agent's token volume.
pub const TOKEN_VOLUME: &str = "mcp-token";
/// The shortest and the longest lifetime of the agent's token.
const TOKEN_MIN_SECONDS: i64 = 3600;
const TOKEN_MAX_SECONDS: i64 = 86_400;

/// The shared proxy a task in shared mode is served by, or why it cannot be (every problem).
pub fn check<'a>(
    settings: &'a super::RenderSettings,
    _resolved: &Resolved<'_>,
) -> Result<&'a SharedProxy, Vec<Problem>> {
    let mut problems = Vec::new();
    if settings.shared_proxy.is_none() {
        problems.push(Problem {
            reason: SHARED_PROXY_UNAVAILABLE,
            message:
                "the task's proxy mode is shared (spec.proxy.mode, else its Namespace's label \
                      orchestrator.io/proxy-mode, else the operator's --default-proxy-mode), but \
                      this operator has no shared proxy (--shared-proxy-url; chart: \
                      sharedProxy.enabled); install the shared proxy, or create the TaskRun with \
                      spec.proxy.mode: sidecar"
                    .into(),
        });
    }
    match (&settings.shared_proxy, problems.is_empty()) {
        (Some(proxy), true) => Ok(proxy),
        _ => Err(problems),
    }
}

/// The task's Secrets (every one its servers or its agent env name, its zone keys' when it has
/// stdio servers, and its model key's): the shared proxy may `get` them by name through the
/// task's Role, to send HTTP servers' headers, mask their values, prove each zone's key and
/// call the model.
pub fn secret_names(
    tr: &TaskRun,
    resolved: &Resolved<'_>,
    model: Option<&ModelSpec>,
) -> Vec<String> {
    let agent_env = tr
        .spec
        .agent
        .as_ref()
        .map(|a| a.env.as_slice())
        .unwrap_or_default();
    let mut names: Vec<String> = mask_keys(&resolved.secrets, agent_env)
        .into_iter()
        .map(|k| k.secret)
        .collect();
    if zones(resolved).next().is_some() {
        names.push(zone_keys_secret_name(&tr.name_any()));
    }
    // The model gateway's key, which the shared proxy reads for the task.
    names.extend(model.map(|m| m.secret_key_ref.name.clone()));
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// The task's ConfigMap in the shared proxy's namespace, before the version and the pod are
/// known.
#[derive(Clone, Debug)]
pub struct SharedConfig {
    namespace: String,
    name: String,
    task_uid: String,
    task: String,
    proxy: ProxyConfig,
    /// `mask-keys.json`: the task's Secret keys (see [`mask_keys`]).
    mask_keys: String,
}

/// The task's pod, as the operator bound it (`reconcile/placement/binding.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskPod {
    pub uid: String,
    /// `status.podIP`, once the pod has one.
    pub ip: Option<String>,
}

impl SharedConfig {
    /// From the sidecar's proxy config: `task.uid` set, `listen` the default (the shared proxy
    /// ignores it), and each HTTP header from the task's Secret key its env came from.
    pub fn render(
        tr: &TaskRun,
        namespace: &str,
        sidecar: &ProxyConfig,
        resolved: &Resolved<'_>,
        proxy: &SharedProxy,
        model: Option<&ModelSpec>,
    ) -> Self {
        let mut config = sidecar.clone();
        config.task.uid = tr.uid();
        config.listen = DEFAULT_LISTEN.to_string();
        // The shared proxy reads the model key and CAs through the API (the task's Role names
        // them), not from files of its own.
        config.gateway = model.map(|m| super::model::shared_gateway_spec(tr, m));
        for server in &mut config.servers {
            let Some(http) = server.http.as_mut() else {
                continue;
            };
            let from_env = std::mem::take(&mut http.headers_from_env);
            http.headers_from_secret = from_env
                .into_iter()
                .filter_map(|(header, env)| {
                    let b = resolved
                        .secrets
                        .iter()
                        .find(|b| b.env == env && b.servers.contains(&server.name))?;
                    Some((
                        header,
                        SecretKey {
                            name: b.secret.clone(),
                            key: b.key.clone(),
                        },
                    ))
                })
                .collect();
        }
        let name = tr.name_any();
        let agent_env = tr
            .spec
            .agent
            .as_ref()
            .map(|a| a.env.as_slice())
            .unwrap_or_default();
        let keys: Vec<MaskKey> = mask_keys(&resolved.secrets, agent_env)
            .into_iter()
            .map(|k| MaskKey {
                secret: k.secret,
                key: k.key,
            })
            .collect();
        let mask_keys = serde_json::to_string(&keys).unwrap_or_else(|_| "[]".into());
        // Each stdio server's zone listens on the pod's IP (see `zone`), its key in the task's
        // Secret `<taskrun>-zone-keys` (made by `reconcile`), which the task's Role lets the
        // shared proxy `get`.
        for zone in zones(resolved) {
            let Some(stdio) = config
                .servers
                .iter_mut()
                .find(|s| s.name == zone.server.spec.name)
                .and_then(|s| s.stdio.as_mut())
            else {
                continue;
            };
            stdio.socket = None;
            stdio.zone_uid = None;
            stdio.zone_port = Some(zone.port());
            stdio.zone_key = Some(SecretKey {
                name: zone_keys_secret_name(&name),
                key: zone.server.spec.name.clone(),
            });
        }
        Self {
            namespace: proxy.namespace.clone(),
            name: config_map_name(namespace, &name),
            task_uid: tr.uid().unwrap_or_default(),
            task: format!("{namespace}/{name}"),
            proxy: config,
            mask_keys,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `proxy.yaml` at `context_version`.
    pub fn proxy_yaml(&self, context_version: u64) -> String {
        let mut proxy = self.proxy.clone();
        proxy.context_version = context_version;
        match serde_saphyr::to_string(&proxy) {
            Ok(text) => text,
            // As in `files.rs`: an unparsable file keeps the proxy's last good config.
            Err(e) => format!("# render error: {e}\n"),
        }
    }

    /// The ConfigMap at `context_version` (digest `config_hash`), the task in `phase`
    /// (`Pending`, `Running`), bound to `pod` once known: without its uid the proxy serves no
    /// token for the task. No owner reference (it cannot cross namespaces): the operator deletes
    /// it when the task ends, and sweeps those of TaskRuns that are gone.
    pub fn config_map(
        &self,
        context_version: u64,
        config_hash: &str,
        phase: &str,
        pod: Option<&TaskPod>,
    ) -> ConfigMap {
        let mut annotations = BTreeMap::from([
            (
                CONTEXT_VERSION_ANNOTATION.to_string(),
                context_version.to_string(),
            ),
            (CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string()),
            (TASK_UID_ANNOTATION.to_string(), self.task_uid.clone()),
            (TASK_ANNOTATION.to_string(), self.task.clone()),
            (TASK_PHASE_ANNOTATION.to_string(), phase.to_string()),
        ]);
        if let Some(pod) = pod {
            annotations.insert(TASK_POD_UID_ANNOTATION.to_string(), pod.uid.clone());
            if let Some(ip) = &pod.ip {
                annotations.insert(TASK_POD_IP_ANNOTATION.to_string(), ip.clone());
            }
        }
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (CONFIG_LABEL.to_string(), "true".to_string()),
                    (
                        "app.kubernetes.io/part-of".to_string(),
                        "orchestrator".to_string(),
                    ),
                ])),
                annotations: Some(annotations),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (
                    PROXY_CONFIG_FILE.to_string(),
                    self.proxy_yaml(context_version),
                ),
                (MASK_KEYS_KEY.to_string(), self.mask_keys.clone()),
            ])),
            ..Default::default()
        }
    }
}

/// How long the agent's token lives: `max(3600, activeDeadlineSeconds + 600)`, at most a day
/// (a day without a deadline). The kubelet renews it at 80 %; the agent's MCP client reads the
/// file again when it reconnects.
pub fn token_seconds(active_deadline_seconds: Option<i64>) -> i64 {
    active_deadline_seconds
        .map_or(TOKEN_MAX_SECONDS, |d| {
            d.saturating_add(600).max(TOKEN_MIN_SECONDS)
        })
        .min(TOKEN_MAX_SECONDS)
}

/// The pod's volumes after the task's ConfigMap, the task and the workspace: the agent's
/// `/tmp` and token, and each zone's `/tmp` and key (no proxy, no socket, no API token, no mask
/// volume).
pub fn pod_volumes(proxy: &SharedProxy, pod: &PodInput<'_>) -> Vec<Volume> {
    let tr = pod.taskrun;
    let mut volumes = vec![
        empty_dir(AGENT_TMP_VOLUME),
        token_volume(proxy, tr.spec.active_deadline_seconds),
    ];
    for zone in zones(pod.resolved) {
        volumes.push(empty_dir(&zone.tmp_volume()));
        volumes.push(zone_key_volume(&tr.name_any(), &zone));
    }
    volumes
}

/// The agent's token for the shared proxy: a projected token of the pod's ServiceAccount with
/// the shared proxy's audience (the API server refuses it: not an API token), bound to the pod.
pub fn token_volume(proxy: &SharedProxy, active_deadline_seconds: Option<i64>) -> Volume {
    Volume {
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(proxy.audience.clone()),
                    path: TOKEN_FILE.into(),
                    expiration_seconds: Some(token_seconds(active_deadline_seconds)),
                }),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_outlives_the_deadline_within_an_hour_and_a_day() {
        assert_eq!(token_seconds(Some(60)), 3600);
        assert_eq!(token_seconds(Some(7200)), 7800);
        assert_eq!(token_seconds(Some(200_000)), 86_400);
        assert_eq!(token_seconds(None), 86_400);
        assert_eq!(token_seconds(Some(i64::MAX)), 86_400);
    }
}
