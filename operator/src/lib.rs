//! The orchestrator operator: reconciles `TaskRun`s into a ConfigMap (the proxy and agent
//! configuration) and a Job (the agent with the MCP proxy as a native sidecar).
//!
//! - [`render`]: pure TaskRun + catalog -> ConfigMap + Job.
//! - [`reconcile`]: applies what render returns (server-side apply), status, events.
//! - [`catalog`]: loads and watches the catalog ConfigMap.
//! - [`controller`]: the controller, the watches that feed it, and the sweeps.
//! - [`leader`]: Lease-based leader election.
//! - [`backoff`]: how the watches retry (each by itself, a 410 at once, at most 5 s apart).
//! - [`namespaces`]: the namespaces watched (all, or a list: one watch each, merged).
//! - [`metrics`], [`server`], [`telemetry`]: `/metrics`, `/healthz`, traces over OTLP.
//! - [`notify`]: the approval webhook (a POST when a call starts waiting for approval).
//! - [`settings`]: flags and env.
//! - [`rbac`]: every API verb the operator uses (the chart's RBAC).
//! - [`report`]: the agent's report (a runtime's output to the TaskResult), which the agent
//!   images' `orchestrator-agent result` writes at the end of the default agent script.

pub mod backoff;
pub mod catalog;
pub mod controller;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod namespaces;
pub mod notify;
pub mod rbac;
pub mod reconcile;
pub mod render;
pub mod report;
pub mod server;
pub mod settings;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::Client;
use tokio::sync::mpsc;

pub use error::{Error, Result};
pub use settings::Settings;

use crate::catalog::CatalogStore;
use crate::metrics::Metrics;
use crate::namespaces::Watched;
use crate::server::Health;

/// Runs the operator until SIGTERM or Ctrl-C: telemetry, a client from the usual places
/// (`$KUBECONFIG`, `~/.kube/config`, or in-cluster), then [`run_with`].
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let _telemetry = telemetry::init(settings.otlp_endpoint.as_deref(), settings.log_json)?;
    let client = Client::try_default().await?;
    // A namespace the operator is told to watch but may not work in is said at once, with
    // everything it lacks there, rather than as a watch retrying forbidden lists.
    // A webhook URL that cannot work is said at once (without repeating it: it is a secret).
    if let Some(url) = settings.approval_webhook_url.as_deref() {
        notify::check_url(url).map_err(anyhow::Error::msg)?;
    }
    if let Watched::Only(namespaces) = settings.watched() {
        rbac::check_namespaces(&client, &namespaces)
            .await
            .map_err(anyhow::Error::msg)?;
    }
    run_with(client, settings, shutdown_signal()).await?;
    Ok(())
}

/// Runs the operator with `client` until `shutdown` completes: serves `/metrics` and `/healthz`,
/// waits for the leader Lease (if enabled), then runs the controller. Returns an error if the
/// lease is lost (the process should exit so that it restarts clean).
pub async fn run_with(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let health = Health::default();
    let server = tokio::spawn(server::serve(
        settings.bind,
        metrics.clone(),
        health.clone(),
    ));

    let catalog = CatalogStore::default();
    let (changed_tx, changed_rx) = mpsc::channel(1);
    let catalog_watch = tokio::spawn(catalog::watch(
        client.clone(),
        settings.catalog_namespace.clone(),
        settings.catalog_name.clone(),
        catalog.clone(),
        metrics.clone(),
        changed_tx,
    ));

    let mut shutdown = std::pin::pin!(shutdown);
    let identity = settings.identity();
    let mut elector = elector(&client, &settings, &identity);
    let result = async {
        if let Some(elector) = elector.as_mut() {
            tokio::select! {
                acquired = elector.acquire() => acquired?,
                () = &mut shutdown => return Ok(()),
            }
        }
        health.leading.store(true, Ordering::Relaxed);
        let parts = controller::Parts {
            catalog,
            metrics,
            identity: identity.clone(),
            catalog_changed: changed_rx,
        };
        let controller = controller::run(client.clone(), &settings, parts);
        let hold = async {
            match elector.as_mut() {
                Some(e) => e.hold().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = controller => Ok(()),
            lost = hold => Err(lost),
            () = &mut shutdown => Ok(()),
        }
    }
    .await;
    health.leading.store(false, Ordering::Relaxed);
    if let Some(elector) = elector.as_mut() {
        elector.release().await;
    }
    // Each task gone before this returns, while the client they use still works: a watch that
    // outlives the runtime's shutdown would meet a closed client and retry at once, forever.
    server.abort();
    catalog_watch.abort();
    let _ = server.await;
    let _ = catalog_watch.await;
    tracing::info!("operator stopped");
    result
}

/// The leader election, when enabled (`--leader-election`).
fn elector(client: &Client, settings: &Settings, identity: &str) -> Option<leader::Elector> {
    settings.leader_election.then(|| {
        leader::Elector::new(
            client.clone(),
            &settings.lease_namespace,
            &settings.lease_name,
            identity.to_string(),
            settings.lease_duration(),
        )
    })
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
