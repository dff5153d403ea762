//! The tasks this process serves: one [`Tenant`] per labelled ConfigMap, each with its own
//! [`Proxy`] (pool of upstreams, sessions, limits, approvals, audit stamped with the task), its
//! own [`Applier`] fed with the ConfigMap's `proxy.yaml`, its own MCP service (its own session
//! manager) and its own reports on the task's Lease in the task's namespace (`crate::api`).
//! Indexed by the pod uid the operator bound ([`TASK_POD_UID_ANNOTATION`]): the only way a
//! request reaches a tenant. A ConfigMap deleted removes its tenant at once.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use orchestrator_crds::{
    approval::{MASK_KEYS_KEY, MaskKey, VERDICTS_KEY},
    shared::{
        TASK_POD_IP_ANNOTATION, TASK_POD_UID_ANNOTATION, TASK_UID_ANNOTATION, task_of_config_map,
    },
};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::secrets::{self, MaskValues, ModelKeys};
use crate::{
    api::{self, ApiOptions, ApiTasks, Connected},
    apply::{Applier, Source},
    approval::MaskSource,
    audit::{Audit, Stamp},
    config::{self, Transport},
    gateway::{Gateway, Reader},
    metrics::Metrics,
    proxy::Proxy,
    reload::fingerprint,
    server::http,
    sync::lock,
    upstream::{Deps, Shared, pool::Pool},
};

/// The ConfigMap key holding the task's proxy config.
pub const CONFIG_KEY: &str = "proxy.yaml";

/// What every tenant is made with.
pub struct Settings {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// The process's audit writer; each tenant writes through a stamped copy.
    pub audit: Audit,
    pub http: http::Settings,
    pub start_timeout: Duration,
    pub kill_grace: Duration,
    /// This replica's pod name (the Lease's holder, the Events' reporting instance).
    pub pod_name: Option<String>,
    /// The shared proxy's namespace (its replicas' pods are there).
    pub namespace: String,
}

/// Which task a tenant serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskId {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// Where the task's pod is, as the operator bound it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    pub pod_uid: Option<String>,
    pub pod_ip: Option<IpAddr>,
}

/// One task served here.
pub struct Tenant {
    pub config_map: String,
    pub task: TaskId,
    pub proxy: Arc<Proxy>,
    pub applier: Arc<Applier>,
    /// MCP at `/mcp`, with this task's own session manager.
    pub mcp: axum::Router,
    /// The model gateway at `/model`, with the task's own key, budget and usage.
    pub model: axum::Router,
    gateway: Arc<Gateway>,
    /// The gateway's usage reports on the task's Lease.
    usage: Mutex<Option<api::usage::Reporter>>,
    /// The task's Secret keys its held calls show masked.
    masks: Arc<MaskValues>,
    binding: Mutex<Binding>,
    sessions: CancellationToken,
    api: Mutex<Option<ApiTasks>>,
    events: JoinHandle<()>,
    /// Fingerprints of the last `proxy.yaml` and `approvals.json` handed on.
    last: Mutex<Prints>,
}

/// Fingerprints of a ConfigMap's `proxy.yaml` and `approvals.json`.
type Prints = (Option<[u8; 32]>, Option<[u8; 32]>);

impl Tenant {
    pub fn binding(&self) -> Binding {
        lock(&self.binding).clone()
    }

    /// `<namespace>/<name>`, for logs.
    pub fn label(&self) -> String {
        format!("{}/{}", self.task.namespace, self.task.name)
    }

    /// Closes its sessions, stops its reports and upstreams; calls in flight get `grace`.
    async fn stop(&self, grace: Duration) {
        self.proxy.metrics.forget_task();
        lock(&self.api).take();
        self.proxy.drain(grace).await;
        // Its last model requests reach `status.usage` (the report loop pauses between reports).
        let usage = lock(&self.usage).take();
        if let Some(usage) = usage {
            usage.finish(&self.gateway).await;
        }
        self.sessions.cancel();
        self.proxy.pool.shutdown().await;
        self.events.abort();
        self.proxy.flush_audit();
    }
}

#[derive(Default)]
struct Index {
    by_config_map: HashMap<String, Arc<Tenant>>,
    by_pod_uid: HashMap<String, String>,
}

/// Every tenant, by ConfigMap and by pod uid.
pub struct Tenants {
    settings: Settings,
    index: RwLock<Index>,
}

impl Tenants {
    pub fn new(settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            settings,
            index: Default::default(),
        })
    }

    /// The tenant whose task runs in the pod `pod_uid`.
    pub fn by_pod_uid(&self, pod_uid: &str) -> Option<Arc<Tenant>> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        let name = index.by_pod_uid.get(pod_uid)?;
        index.by_config_map.get(name).cloned()
    }

    /// The ConfigMaps served now.
    pub fn names(&self) -> Vec<String> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index.by_config_map.keys().cloned().collect()
    }

    fn get(&self, config_map: &str) -> Option<Arc<Tenant>> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index.by_config_map.get(config_map).cloned()
    }

    /// A new or changed ConfigMap: makes its tenant if needed, then hands on its binding,
    /// verdicts and config.
    pub async fn upsert(&self, cm: ConfigMap) {
        let Some(name) = cm.metadata.name.clone() else {
            return;
        };
        let annotations = cm.metadata.annotations.clone().unwrap_or_default();
        let mut data = cm.data.unwrap_or_default();
        let tenant = match self.get(&name) {
            Some(tenant) => tenant,
            None => {
                let Some(task) = task_id(&name, data.get(CONFIG_KEY), &annotations) else {
                    tracing::error!(configmap = %name, "a labelled ConfigMap whose task cannot be told (no valid task in {CONFIG_KEY}, a name not task.<namespace>.<name>); serving nothing for it");
                    return;
                };
                let tenant = self.make(&name, task).await;
                let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
                index.by_config_map.insert(name.clone(), tenant.clone());
                tenant
            }
        };
        let binding = Binding {
            pod_uid: annotations
                .get(TASK_POD_UID_ANNOTATION)
                .filter(|u| !u.is_empty())
                .cloned(),
            pod_ip: annotations
                .get(TASK_POD_IP_ANNOTATION)
                .and_then(|ip| ip.parse().ok()),
        };
        self.bind(&tenant, binding);
        let origin = format!("configmap {name}");
        match data
            .remove(MASK_KEYS_KEY)
            .map(|text| serde_json::from_str::<Vec<MaskKey>>(&text))
        {
            Some(Ok(keys)) => tenant.masks.listed(keys),
            Some(Err(e)) => {
                tracing::error!(configmap = %name, error = %e, "{MASK_KEYS_KEY} is not a JSON array of Secret keys; the keys it listed before stay masked")
            }
            None => tenant.masks.listed(Vec::new()),
        }
        let verdicts = data.remove(VERDICTS_KEY);
        let config = data.remove(CONFIG_KEY);
        let (config_print, verdicts_print) = (
            config.as_deref().map(|c| fingerprint(c.as_bytes())),
            verdicts.as_deref().map(|v| fingerprint(v.as_bytes())),
        );
        let (config_new, verdicts_new) = {
            let mut last = lock(&tenant.last);
            let news = (last.0 != config_print, last.1 != verdicts_print);
            *last = (config_print, verdicts_print);
            news
        };
        if verdicts_new && let Some(verdicts) = verdicts {
            tenant
                .proxy
                .approvals
                .verdicts(&origin, verdicts.as_bytes());
        }
        if config_new {
            match config {
                Some(text) => self.offer(&tenant, &origin, text.as_bytes()).await,
                None => tenant.applier.reject(
                    Source::Api,
                    &origin,
                    &format!("the ConfigMap has no data key {CONFIG_KEY}"),
                ),
            }
        }
    }

    /// Indexes the tenant under the pod uid the operator bound (none: it serves no token yet).
    fn bind(&self, tenant: &Arc<Tenant>, binding: Binding) {
        tenant
            .proxy
            .pool
            .deps()
            .shared
            .set_zone_host(binding.pod_ip);
        let old = std::mem::replace(&mut *lock(&tenant.binding), binding.clone());
        if old.pod_uid == binding.pod_uid {
            return;
        }
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = &old.pod_uid
            && index.by_pod_uid.get(old) == Some(&tenant.config_map)
        {
            index.by_pod_uid.remove(old);
        }
        if let Some(uid) = binding.pod_uid {
            if let Some(other) = index.by_pod_uid.get(&uid)
                && *other != tenant.config_map
            {
                tracing::error!(pod_uid = %uid, configmap = %tenant.config_map, other = %other, "two ConfigMaps name one pod; the later one is used");
            }
            tracing::info!(task = %tenant.label(), pod_uid = %uid, "serving the task's pod");
            index.by_pod_uid.insert(uid, tenant.config_map.clone());
        }
    }

    /// A deleted ConfigMap: the tenant goes at once (no new request reaches it), then its
    /// sessions are closed and its upstreams stopped.
    pub async fn remove(&self, config_map: &str) {
        let tenant = {
            let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
            let Some(tenant) = index.by_config_map.remove(config_map) else {
                return;
            };
            index.by_pod_uid.retain(|_, cm| cm != config_map);
            tenant
        };
        tracing::info!(task = %tenant.label(), configmap = %config_map, "the task's ConfigMap is gone; no longer serving it");
        tenant.stop(Duration::ZERO).await;
    }

    /// At shutdown: every tenant, calls in flight given `grace`.
    pub async fn stop_all(&self, grace: Duration) {
        let all: Vec<Arc<Tenant>> = {
            let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
            index.by_pod_uid.clear();
            index.by_config_map.drain().map(|(_, t)| t).collect()
        };
        futures::future::join_all(all.iter().map(|t| t.stop(grace))).await;
    }

    async fn make(&self, config_map: &str, task: TaskId) -> Arc<Tenant> {
        let s = &self.settings;
        let metrics = Arc::new(s.metrics.for_task(&task.namespace, &task.name));
        let (events_tx, mut events_rx) = mpsc::unbounded_channel();
        let deps = Deps {
            shared: Arc::new(Shared::new(None)),
            events: events_tx,
            metrics: metrics.clone(),
            start_timeout: s.start_timeout,
            kill_grace: s.kill_grace,
            guard: None,
            pod_name: s.pod_name.clone(),
        };
        let opts = ApiOptions {
            watch_config_map: None,
            served_lease: Some(task.name.clone()),
            namespace: Some(task.namespace.clone()),
            pod_name: s.pod_name.clone(),
            task_uid: task.uid.clone(),
            replica: Some(api::Replica {
                pod: replica_name(s.pod_name.as_deref()),
                namespace: s.namespace.clone(),
            }),
        };
        let connected = Connected::new(s.client.clone(), task.namespace.clone());
        // The pins are per task: what the task's proxies saw first, from its Lease.
        api::restore_baseline(Some(&connected), &opts, &deps.shared).await;
        let audit = s.audit.stamped(Stamp {
            task_uid: task.uid.clone(),
            proxy_mode: "shared",
            replica: Some(replica_name(s.pod_name.as_deref())),
        });
        let proxy = Proxy::new(Pool::new(deps), metrics, audit);
        // Held calls show the values of the task's Secrets masked, read through the API.
        let masks = Arc::new(MaskValues::new(kube::Api::namespaced(
            s.client.clone(),
            &task.namespace,
        )));
        proxy
            .approvals
            .mask_secrets_with(MaskSource::Values(masks.clone()));
        let events = {
            let proxy = proxy.clone();
            tokio::spawn(async move {
                while let Some(event) = events_rx.recv().await {
                    let proxy = proxy.clone();
                    tokio::spawn(async move { proxy.on_upstream_event(event).await });
                }
            })
        };
        // The model gateway reads the task's key and CAs through the API; its counts are
        // taken up from the task's Lease (what an earlier replica reported) before it serves.
        let reader: Arc<dyn Reader> = Arc::new(ModelKeys::new(s.client.clone(), &task.namespace));
        let gateway = Gateway::with_reader(proxy.clone(), Some(reader));
        let usage = api::model_usage(Some(&connected), &opts, &gateway).await;
        let applier = Applier::new(proxy.clone(), true);
        let api = api::start(Some(connected), &opts, &applier).await;
        let sessions = CancellationToken::new();
        let mcp = http::mcp(proxy.clone(), &s.http, sessions.clone());
        let model = http::model(gateway.clone());
        tracing::info!(task = %format!("{}/{}", task.namespace, task.name), configmap = %config_map, "serving a new task");
        Arc::new(Tenant {
            config_map: config_map.to_string(),
            task,
            proxy,
            applier,
            mcp,
            model,
            gateway,
            usage: Mutex::new(usage),
            masks,
            binding: Default::default(),
            sessions,
            api: Mutex::new(Some(api)),
            events,
            last: Default::default(),
        })
    }
}

impl Tenants {
    /// Offers a config to the tenant's applier, unless it names a stdio server without a zone
    /// over TCP (`zonePort`): a shared proxy never runs a task's command itself, so the change is
    /// refused (the last good config stays). The Secret keys its HTTP headers and zone keys name
    /// are read first.
    async fn offer(&self, tenant: &Tenant, origin: &str, bytes: &[u8]) {
        let applier = &tenant.applier;
        if let Some(config) = config::load_bytes(bytes).config {
            let stdio: Vec<&str> = config
                .servers
                .iter()
                .filter(|s| {
                    s.enabled
                        && matches!(&s.transport, Transport::Stdio(t) if t.zone_port.is_none())
                })
                .map(|s| s.name.as_str())
                .collect();
            if !stdio.is_empty() {
                tracing::error!(code = "SHARED_MODE_STDIO_UNSUPPORTED", servers = ?stdio, "servers[].stdio without zonePort: a shared proxy never runs a task's command itself; the server must run in its zone in the task's pod (stdio.zonePort, stdio.zoneKey; the operator renders them)");
                applier.reject(
                    Source::Api,
                    origin,
                    &format!(
                        "stdio servers {} have no zonePort, and a shared proxy never runs a task's command itself",
                        stdio.join(", ")
                    ),
                );
                return;
            }
            tenant.masks.named_in(&config);
            let api = kube::Api::namespaced(self.settings.client.clone(), &tenant.task.namespace);
            let values = secrets::read(&api, &config).await;
            tenant.proxy.pool.deps().shared.secrets().replace(values);
        }
        applier.offer(Source::Api, origin, bytes).await;
    }
}

/// This replica's name: its pod's (`--pod-name`, `POD_NAME`), else the host name (a pod's
/// host name is its name).
fn replica_name(pod_name: Option<&str>) -> String {
    pod_name
        .map(str::to_string)
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "orchestrator-mcp-proxy".into())
}

/// The task of a ConfigMap: `task` of its `proxy.yaml` (name, namespace, uid), else its name
/// (`task.<namespace>.<name>`) and the uid annotation.
fn task_id(
    config_map: &str,
    config: Option<&String>,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<TaskId> {
    let head: Option<serde_json::Value> = config.and_then(|text| serde_saphyr::from_str(text).ok());
    let field = |key: &str| {
        head.as_ref()
            .and_then(|h| h.get("task"))
            .and_then(|t| t.get(key))
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let uid = field("uid").or_else(|| annotations.get(TASK_UID_ANNOTATION).cloned());
    let from_name = task_of_config_map(config_map);
    let namespace = field("namespace").or_else(|| from_name.map(|(ns, _)| ns.to_string()))?;
    let name = field("name").or_else(|| from_name.map(|(_, n)| n.to_string()))?;
    Some(TaskId {
        namespace,
        name,
        uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_comes_from_proxy_yaml_else_from_the_config_map() {
        let mut annotations = std::collections::BTreeMap::new();
        annotations.insert(TASK_UID_ANNOTATION.to_string(), "uid-ann".to_string());
        let yaml =
            "task: {name: fix-1, namespace: team-a, uid: uid-yaml}\nservers: []\n".to_string();
        assert_eq!(
            task_id("task.x.y", Some(&yaml), &annotations),
            Some(TaskId {
                namespace: "team-a".into(),
                name: "fix-1".into(),
                uid: Some("uid-yaml".into())
            })
        );
        assert_eq!(
            task_id(
                "task.team-b.fix-2",
                Some(&"contextVersion: [".to_string()),
                &annotations
            ),
            Some(TaskId {
                namespace: "team-b".into(),
                name: "fix-2".into(),
                uid: Some("uid-ann".into())
            })
        );
        assert_eq!(task_id("other", None, &Default::default()), None);
    }
}
