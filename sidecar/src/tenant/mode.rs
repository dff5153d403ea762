//! Shared mode as the runtime ([`crate::runtime`]) runs it: the tenant registry, the ConfigMap
//! watch that fills it and the HTTP front that dispatches to it.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::Router;
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::{net::TcpListener, task::JoinHandle};

use super::{auth, dispatch, registry, watch};
use crate::{
    audit::{self, Audit},
    metrics::Metrics,
    runtime::{self, Mode},
    server::{auth::ClientAuth, http},
};

/// Shared mode's options (`orchestrator-mcp-proxy shared`).
#[derive(Clone, Debug)]
pub struct SharedOptions {
    pub listen: SocketAddr,
    /// Where the tasks' ConfigMaps are (the proxy's own namespace).
    pub namespace: String,
    /// The audience the agents' tokens must be for.
    pub audience: String,
    /// The connection must come from the task pod's IP.
    pub check_peer: bool,
    pub pod_name: Option<String>,
    pub kill_grace: Duration,
    /// What both modes share (`max_sessions` is per task here).
    pub runtime: runtime::Settings,
}

/// Every task whose ConfigMap is labelled for the shared proxy in the namespace.
pub struct Shared {
    opts: SharedOptions,
    metrics: Arc<Metrics>,
    tenants: Arc<registry::Tenants>,
    watch: JoinHandle<()>,
    front: Arc<dispatch::Front>,
}

impl Shared {
    /// Connects to the API, starts the watch; returns the mode and the process's audit writer.
    pub async fn new(opts: &SharedOptions) -> anyhow::Result<(Self, Audit)> {
        let client = kube::Client::try_default().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot configure a Kubernetes API client (in-cluster config or $KUBECONFIG): {e}"
            )
        })?;
        let metrics = Arc::new(Metrics::shared());
        let audit = runtime::audit(audit::Stream::Stdout, &metrics, &opts.runtime)?;
        let tenants = registry::Tenants::new(registry::Settings {
            client: client.clone(),
            metrics: metrics.clone(),
            audit: audit.clone(),
            http: http::Settings {
                listen: opts.listen,
                session_idle: opts.runtime.session_idle,
                max_sessions: opts.runtime.max_sessions,
                // Each request is authenticated by its token's TokenReview (`tenant::auth`).
                auth: ClientAuth::default(),
                // Each task's model gateway is its tenant's, served by `dispatch` at `/model`.
                gateway: None,
            },
            start_timeout: opts.runtime.start_timeout,
            kill_grace: opts.kill_grace,
            pod_name: opts.pod_name.clone(),
            namespace: opts.namespace.clone(),
        });
        let (listed_tx, listed) = tokio::sync::watch::channel(false);
        let configmaps: kube::Api<ConfigMap> =
            kube::Api::namespaced(client.clone(), &opts.namespace);
        let watch = tokio::spawn(watch::follow(configmaps, tenants.clone(), listed_tx));
        let front = Arc::new(dispatch::Front {
            auth: auth::Authenticator::new(
                Arc::new(auth::KubeReviewer(client)),
                opts.audience.clone(),
                auth::MAX_ENTRIES,
            ),
            tenants: tenants.clone(),
            check_peer: opts.check_peer,
            listed,
        });
        let shared = Self {
            opts: opts.clone(),
            metrics,
            tenants,
            watch,
            front,
        };
        Ok((shared, audit))
    }
}

impl Mode for Shared {
    const BYE: &'static str = "every task's upstreams stopped; bye";

    async fn listen(&mut self) -> anyhow::Result<Option<(TcpListener, Router)>> {
        let opts = &self.opts;
        let listener = TcpListener::bind(opts.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {} (--listen): {e}", opts.listen))?;
        tracing::info!(listen = %opts.listen, namespace = %opts.namespace, audience = %opts.audience, check_peer = opts.check_peer, "serving the tasks' MCP at http://{}/mcp", opts.listen);
        Ok(Some((listener, dispatch::app(self.front.clone()))))
    }

    fn metrics_app(&self, _addr: SocketAddr) -> Router {
        http::shared_metrics_app(self.metrics.clone())
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        Ok(())
    }

    async fn ended(&mut self) {
        std::future::pending().await
    }

    fn freeze(&mut self) {
        self.watch.abort();
    }

    async fn drain(self, grace: Duration) {
        self.tenants.stop_all(grace).await;
    }
}
