//! The one runtime of both proxy modes (sidecar: one task, [`crate::run::run`]; shared: many,
//! `crate::tenant`): the MCP listener a mode binds, the second `--metrics-listen` listener, the
//! audit records' OTLP export, SIGTERM/SIGINT and the drain. A mode is a [`Mode`]: what it
//! serves, and how it stops; [`serve`] runs either the same way.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    audit::{self, Audit, otlp::AuditExport},
    metrics::Metrics,
    server::listener,
};

/// What both modes take from the command line (`cli::common`, `--metrics-listen`,
/// `--audit-otlp`). The runtime reads `shutdown_grace`, `header_read_timeout`, `metrics_listen`
/// and `audit_otlp`; the modes the rest.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long calls in flight may finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// How long an upstream may take to start and answer the handshake.
    pub start_timeout: Duration,
    /// An HTTP session with no message either way for this long is closed (zero: never).
    pub session_idle: Duration,
    /// Initialize-era HTTP sessions open at once (shared mode: per task); over it `initialize`
    /// gets a JSON-RPC error.
    pub max_sessions: usize,
    /// An HTTP request's headers must arrive within this, or its connection is closed.
    pub header_read_timeout: Duration,
    /// A second listener serving `GET /metrics` only (e.g. the pod IP, for a PodMonitor).
    pub metrics_listen: Option<SocketAddr>,
    /// Also export each audit record as an OTLP log record.
    pub audit_otlp: bool,
    /// The memory bounds, installed before anything is served.
    pub memory: crate::memory::Bounds,
}

/// A proxy mode, as [`serve`] runs it: in this order, [`Mode::listen`], [`Mode::metrics_app`],
/// [`Mode::start`], [`Mode::ended`] (raced against SIGTERM/SIGINT), [`Mode::freeze`],
/// [`Mode::drain`].
pub(crate) trait Mode {
    /// The last log line, once every upstream is stopped.
    const BYE: &'static str;

    /// Binds the MCP listener and returns it with its app (none: no HTTP front).
    async fn listen(&mut self) -> anyhow::Result<Option<(TcpListener, Router)>>;

    /// The app of the `--metrics-listen` listener, bound at `addr`.
    fn metrics_app(&self, addr: SocketAddr) -> Router;

    /// Starts what serves besides the listeners (MCP on stdio), once they are up.
    async fn start(&mut self) -> anyhow::Result<()>;

    /// Resolves when the mode ends on its own (the stdio client went away); otherwise never.
    async fn ended(&mut self);

    /// At shutdown, before the listeners stop accepting: no config change from now on.
    fn freeze(&mut self);

    /// Lets calls in flight finish within `grace`, then stops every upstream.
    async fn drain(self, grace: Duration);
}

/// The process's audit writer on `stream`, with the OTLP export when `--audit-otlp` asks.
pub fn audit(
    stream: audit::Stream,
    metrics: &Arc<Metrics>,
    settings: &Settings,
) -> anyhow::Result<Audit> {
    let audit = Audit::to_stream(stream);
    Ok(if settings.audit_otlp {
        audit.with_otlp(Some(AuditExport::from_env(metrics.clone())?))
    } else {
        audit
    })
}

/// Runs `mode` until SIGTERM/SIGINT (or its own end), then drains it: the listeners stop
/// accepting, calls in flight finish within the grace, upstreams stop, `audit` is flushed and
/// its OTLP export shut down.
pub(crate) async fn serve<M: Mode>(
    settings: &Settings,
    mut mode: M,
    audit: Audit,
) -> anyhow::Result<()> {
    let accept_cancel = CancellationToken::new();
    if let Some((listener, app)) = mode.listen().await? {
        tokio::spawn(listener::serve(
            listener,
            app,
            settings.header_read_timeout,
            accept_cancel.clone(),
        ));
    }
    if let Some(addr) = settings.metrics_listen {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {addr} (--metrics-listen, MCP_PROXY_METRICS_LISTEN): {e}"
            )
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
        // The same bounds as the MCP listener: connections at once, header-read timeout.
        tokio::spawn(listener::serve(
            listener,
            mode.metrics_app(addr),
            settings.header_read_timeout,
            accept_cancel.clone(),
        ));
    }
    mode.start().await?;

    tokio::select! {
        () = mode.ended() => {}
        signal = shutdown_signal() => tracing::info!(%signal, "shutting down"),
    }

    // Stop taking new connections and calls, let calls in flight finish, then stop children.
    mode.freeze();
    accept_cancel.cancel();
    mode.drain(settings.shutdown_grace).await;
    audit.flush();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(otlp) = audit.otlp() {
            otlp.shutdown();
        }
    })
    .await;
    tracing::info!("{}", M::BYE);
    Ok(())
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
