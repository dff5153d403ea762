//! The operator's HTTP endpoints: `/metrics` (Prometheus), `/healthz` (the process serves),
//! `/readyz` (this replica holds the lease and runs the controller, or waits as a standby).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What the endpoints report.
#[derive(Clone, Default)]
pub struct Health {
    /// Set when this replica leads and its controller runs.
    pub leading: Arc<AtomicBool>,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Health,
}

/// Binds `addr` (default loopback) and serves until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, health: Health) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { metrics, health });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve {
            addr: addr.to_string(),
            source,
        })?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app)
        .await
        .map_err(|source| Error::Serve {
            addr: addr.to_string(),
            source,
        })
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// A standby replica is ready too (it is doing its job: waiting for the lease); the body says
/// which it is.
async fn ready(State(s): State<AppState>) -> impl IntoResponse {
    if s.health.leading.load(Ordering::Relaxed) {
        (StatusCode::OK, "leader\n")
    } else {
        (StatusCode::OK, "standby\n")
    }
}
