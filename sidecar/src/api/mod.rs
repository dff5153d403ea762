//! The proxy's optional use of the Kubernetes API, both with the pod's own least-privilege
//! identity (the standard in-cluster config, or `$KUBECONFIG` outside a cluster): `watch` follows
//! the task's ConfigMap so a new config is served at once instead of when the kubelet updates the
//! mounted file (and hands the approval verdicts it carries to `crate::approval`), `lease`
//! reports the `contextVersion` served on the task's Lease, and `approvals` publishes the calls
//! held for approval there. None blocks the proxy: when the API is unreachable the mounted file
//! still applies changes.

mod approvals;
mod events;
mod lease;
mod watch;

use std::sync::Arc;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::Api;
use tokio::task::JoinHandle;

use crate::apply::Applier;

/// The field manager of the proxy's writes (the Lease's `managedFields` name it: who wrote with
/// the task's identity).
pub(crate) const FIELD_MANAGER: &str = "orchestrator-mcp-proxy";

/// Patch parameters under [`FIELD_MANAGER`].
fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

pub use lease::SERVED_VERSION_ANNOTATION;

/// Which objects to use (flags `--watch-config-map`, `--served-lease`, `--namespace`,
/// `--pod-name`); all `None`: the API is not used at all.
#[derive(Clone, Debug, Default)]
pub struct ApiOptions {
    /// The task's ConfigMap, whose `proxy.yaml` is the same config as the mounted file.
    pub watch_config_map: Option<String>,
    /// The Lease on which the served `contextVersion` is reported.
    pub served_lease: Option<String>,
    /// The namespace of both (default: the client's, i.e. the pod's).
    pub namespace: Option<String>,
    /// Written as the Lease's `holderIdentity`, and as the reporting instance of Events.
    pub pod_name: Option<String>,
    /// The TaskRun's uid: Events about the task (a tool definition that changed) are published
    /// on it. The TaskRun's name and namespace come from the config.
    pub task_uid: Option<String>,
}

impl ApiOptions {
    pub fn is_used(&self) -> bool {
        self.watch_config_map.is_some() || self.served_lease.is_some() || self.task_uid.is_some()
    }
}

/// The background tasks talking to the API; dropping this stops them.
#[derive(Default)]
pub struct ApiTasks {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for ApiTasks {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts the ConfigMap watch and the Lease report that `opts` asks for. A client that cannot
/// be configured (no in-cluster config, no kubeconfig) is logged and the proxy goes on with the
/// file alone.
pub async fn start(opts: &ApiOptions, applier: &Arc<Applier>) -> ApiTasks {
    let mut tasks = ApiTasks::default();
    if !opts.is_used() {
        return tasks;
    }
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot configure a Kubernetes API client; serving the mounted file only, reporting nothing");
            return tasks;
        }
    };
    let namespace = opts
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    if let Some(name) = &opts.watch_config_map {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        tasks.tasks.push(tokio::spawn(watch::follow(
            api,
            format!("{namespace}/{name}"),
            name.clone(),
            applier.clone(),
        )));
    }
    if let (Some(uid), Some(events)) = (&opts.task_uid, applier.proxy().take_task_events()) {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(client.clone(), &namespace);
        let reporter = events::Reporter {
            uid: uid.clone(),
            namespace: namespace.clone(),
            instance: opts
                .pod_name
                .clone()
                .unwrap_or_else(|| "orchestrator-mcp-proxy".into()),
        };
        tasks
            .tasks
            .push(tokio::spawn(events::publish(api, reporter, events)));
    }
    if let Some(name) = &opts.served_lease {
        let api: Api<Lease> = Api::namespaced(client, &namespace);
        // From here on a call that needs approval can be held: someone can see it.
        let requests = applier.proxy().approvals.reporter();
        tasks.tasks.push(tokio::spawn(approvals::publish(
            api.clone(),
            name.clone(),
            requests,
        )));
        tasks.tasks.push(tokio::spawn(lease::report(
            api,
            name.clone(),
            opts.pod_name.clone(),
            applier.served(),
        )));
    }
    tasks
}
