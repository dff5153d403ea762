//! The proxy's optional use of the Kubernetes API, both with the pod's own least-privilege
//! identity (the standard in-cluster config, or `$KUBECONFIG` outside a cluster): `watch` follows
//! the task's ConfigMap so a new config is served at once instead of when the kubelet updates the
//! mounted file (and hands the approval verdicts it carries to `crate::approval`), `lease`
//! reports the `contextVersion` served on the task's Lease, `approvals` publishes the calls
//! held for approval there, and `baseline` keeps the task's first-seen tool definitions there
//! (restored before the proxy serves, waiting at most a few seconds). None blocks the proxy:
//! when the API is unreachable the mounted file still applies changes. In shared mode `holders`
//! writes this replica's share of the pending set and adopts the calls of replicas that are gone.
//! `usage` reports the model gateway's counts on the Lease and takes them up at start.

mod approvals;
pub mod backoff;
mod baseline;
mod events;
mod holders;
mod lease;
pub mod usage;
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

pub use baseline::BASELINE_ANNOTATION;
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
    /// Shared mode: this replica, one of several writing the task's Lease.
    pub replica: Option<Replica>,
}

/// A replica of the shared proxy: its pod's name and namespace (where its sibling replicas'
/// pods are).
#[derive(Clone, Debug)]
pub struct Replica {
    pub pod: String,
    pub namespace: String,
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

/// A client of the API and the namespace of the task's objects, made once for all uses.
pub struct Connected {
    client: kube::Client,
    namespace: String,
}

impl Connected {
    /// `client`, for the objects in `namespace` (shared mode: the task's namespace).
    pub fn new(client: kube::Client, namespace: String) -> Self {
        Self { client, namespace }
    }
}

/// The client `opts` asks for, if any. A client that cannot be configured (no in-cluster config,
/// no kubeconfig) is logged, and the proxy goes on with the mounted file alone.
pub async fn connect(opts: &ApiOptions) -> Option<Connected> {
    if !opts.is_used() {
        return None;
    }
    match kube::Client::try_default().await {
        Ok(client) => Some(Connected {
            namespace: opts
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string()),
            client,
        }),
        Err(e) => {
            tracing::error!(error = %e, "cannot configure a Kubernetes API client; serving the mounted file only, reporting nothing");
            None
        }
    }
}

/// Before the proxy serves anything: restores the task's baseline of tool definitions from its
/// Lease (`--served-lease`), so the first list this proxy sees is compared with what the task's
/// earlier proxies saw. Without a Lease or a client, nothing.
pub async fn restore_baseline(
    api: Option<&Connected>,
    opts: &ApiOptions,
    shared: &crate::upstream::Shared,
) {
    let (Some(api), Some(name)) = (api, &opts.served_lease) else {
        return;
    };
    let leases: Api<Lease> = Api::namespaced(api.client.clone(), &api.namespace);
    baseline::restore(&leases, name, shared.baseline()).await;
}

/// The model gateway's usage: taken up from the task's Lease (an earlier proxy's report), then
/// reported there after each request (see `usage`). Nothing without a Lease (`--served-lease`).
pub async fn model_usage(
    api: Option<&Connected>,
    opts: &ApiOptions,
    gateway: &Arc<crate::gateway::Gateway>,
) -> Option<usage::Reporter> {
    let (Some(api), Some(name)) = (api, &opts.served_lease) else {
        return None;
    };
    let leases: Api<Lease> = Api::namespaced(api.client.clone(), &api.namespace);
    usage::restore(&leases, name, gateway).await;
    Some(usage::Reporter::start(
        leases,
        name.clone(),
        gateway.clone(),
    ))
}

/// Starts the ConfigMap watch and the Lease report that `opts` asks for, with `api`'s client
/// (none: the proxy goes on with the mounted file alone).
pub async fn start(api: Option<Connected>, opts: &ApiOptions, applier: &Arc<Applier>) -> ApiTasks {
    let mut tasks = ApiTasks::default();
    let Some(Connected { client, namespace }) = api else {
        return tasks;
    };
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
        let api: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        // From here on a call that needs approval can be held: someone can see it. The Lease is
        // the TaskRun's namesake: its namespace and name go into every request's digest.
        let proxy = applier.proxy();
        let requests = proxy.approvals.reporter(&namespace, name);
        match &opts.replica {
            Some(replica) => {
                let holders = Arc::new(holders::Holders {
                    store: Box::new(holders::LeaseStore {
                        api: api.clone(),
                        name: name.clone(),
                    }),
                    replicas: Box::new(holders::Pods(Api::namespaced(
                        client.clone(),
                        &replica.namespace,
                    ))),
                    me: replica.pod.clone(),
                    writes: Default::default(),
                });
                proxy.approvals.share(replica.pod.clone(), holders.clone());
                tasks.tasks.push(tokio::spawn(approvals::publish_shared(
                    holders,
                    proxy.clone(),
                    requests,
                )));
            }
            None => tasks.tasks.push(tokio::spawn(approvals::publish(
                api.clone(),
                name.clone(),
                requests,
            ))),
        }
        tasks.tasks.push(tokio::spawn(baseline::record(
            api.clone(),
            name.clone(),
            applier.proxy().pool.deps().shared.clone(),
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

/// Until the operator binds the task's Lease to this pod (it does once the pod exists), the
/// chart's admission policy refuses the proxy's writes of it: retried this often at least.
const UNBOUND_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a write was refused by an admission policy (403 naming a
/// ValidatingAdmissionPolicy): the Lease is not bound to this pod yet.
fn refused_by_policy(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<kube::Error>(),
        Some(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("ValidatingAdmissionPolicy")
    )
}

/// After a failed write: how long to wait now, and the wait after the next failure (doubled up
/// to `max`, and up to [`UNBOUND_RETRY`] while the admission policy refuses the writes; held
/// calls wait meanwhile, and their timeout runs).
fn backoff(
    retry: std::time::Duration,
    max: std::time::Duration,
    error: &anyhow::Error,
) -> (std::time::Duration, std::time::Duration) {
    let max = if refused_by_policy(error) {
        max.min(UNBOUND_RETRY)
    } else {
        max
    };
    (retry.min(max), (retry * 2).min(max))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn status(code: u16, message: &str) -> anyhow::Error {
        let mut status = kube::core::Status::failure(message, "Forbidden");
        status.code = code;
        kube::Error::Api(Box::new(status)).into()
    }

    #[test]
    fn a_write_the_admission_policy_refuses_is_retried_within_two_seconds() {
        let unbound = status(
            403,
            "leases.coordination.k8s.io \"task-a\" is forbidden: ValidatingAdmissionPolicy 'orchestrator-proxy-lease' with binding 'orchestrator-proxy-lease' denied request: only the proxy of the task pod task-a-x7k2p may write Lease task-a",
        );
        let rbac = status(
            403,
            "leases.coordination.k8s.io \"task-a\" is forbidden: User \"x\" cannot patch resource",
        );
        let max = Duration::from_secs(30);
        assert!(refused_by_policy(&unbound) && !refused_by_policy(&rbac));
        let second = Duration::from_secs(1);
        assert_eq!(backoff(second, max, &unbound), (second, UNBOUND_RETRY));
        // After a streak of other failures, too.
        assert_eq!(backoff(max, max, &unbound), (UNBOUND_RETRY, UNBOUND_RETRY));
        assert_eq!(
            backoff(Duration::from_secs(16), max, &rbac),
            (Duration::from_secs(16), max)
        );
        let quarter = Duration::from_millis(250);
        assert_eq!(
            backoff(quarter, max, &anyhow::anyhow!("no answer")),
            (quarter, Duration::from_millis(500))
        );
    }
}
