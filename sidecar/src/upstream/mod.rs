//! Upstream MCP servers: one [`Upstream`] per configured server (lazy start, crash detection,
//! restart with backoff), each holding at most one live [`Connection`] (the rmcp client, the
//! child process for stdio servers, and the routes of its in-flight calls).
//!
//! Submodules: `stdio` (child processes), `http` (streamable-HTTP client), `handler` (what the
//! upstream may send us), `routes` (which session a call belongs to), `cache` (tool lists on
//! disk), `shared` (capabilities and logging level all upstreams share), `pool` (all upstreams,
//! their tool lists, reconciliation and shutdown).
// Logging and resources/subscribe are deprecated by SEP-2577 but still part of the legacy
// protocol versions the proxy relays.
#![allow(deprecated)]

pub mod cache;
pub mod guard;
pub mod handler;
pub mod http;
pub mod pool;
pub mod routes;
mod shared;
pub mod stderr;
pub mod stdio;

pub use shared::Shared;

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use rmcp::{
    ClientLifecycleMode, Peer, RoleClient,
    model::{
        ClientConfig, ClientRequest, Implementation, ProtocolVersion, ServerCapabilities,
        ServerNotification, SetLevelRequest, SetLevelRequestParams, SubscriptionFilter,
    },
    service::{RunningService, serve_client_with_lifecycle},
    transport::IntoTransport,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::{
    handler::{Tap, UpstreamEvent, UpstreamHandler},
    routes::{CallRoutes, Forward},
};
use crate::{
    config::{Server, Transport},
    error::{Error, Result},
    metrics::Metrics,
    names::ServerName,
    session::SessionRef,
    sync::lock,
};

/// A connection that lived longer than this had been healthy: its crash restarts the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Delay before the next start after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let exp = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << exp).min(MAX_BACKOFF)
}

/// Everything an upstream needs from the rest of the proxy.
#[derive(Clone)]
pub struct Deps {
    pub shared: Arc<Shared>,
    pub events: mpsc::UnboundedSender<UpstreamEvent>,
    pub metrics: Arc<Metrics>,
    pub start_timeout: Duration,
    /// Time a child gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Kills the process groups of stdio servers if the proxy dies (see `guard`).
    pub guard: Option<Arc<guard::Guard>>,
}

/// Why a server is being started (logged and counted).
#[derive(Clone, Debug)]
pub enum StartReason {
    /// `tools/list` needs the server's tool list and it is not known.
    ListTools,
    /// A `tools/call` for one of its tools.
    CallTool(String),
    /// Prompts or resources were asked for.
    Passthrough(&'static str),
}

impl StartReason {
    pub fn label(&self) -> &'static str {
        match self {
            StartReason::ListTools => "tools_list",
            StartReason::CallTool(_) => "tools_call",
            StartReason::Passthrough(_) => "passthrough",
        }
    }
}

impl std::fmt::Display for StartReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartReason::ListTools => {
                f.write_str("tools/list needs its tool list, which is not known yet")
            }
            StartReason::CallTool(tool) => write!(f, "tools/call {tool}"),
            StartReason::Passthrough(what) => write!(f, "{what} was requested"),
        }
    }
}

/// One live connection to an upstream.
pub struct Connection {
    pub server: ServerName,
    pub peer: Peer<RoleClient>,
    service: std::sync::Mutex<Option<RunningService<RoleClient, UpstreamHandler>>>,
    pub child: Option<stdio::Child>,
    pub routes: Arc<CallRoutes>,
    pub forward: mpsc::UnboundedSender<Forward>,
    /// Cancelled when the upstream's stream ends (exit, crash, connection loss) or on stop.
    pub closed: CancellationToken,
    pub started_at: Instant,
    pub protocol: ProtocolVersion,
    pub server_info: Option<Implementation>,
    /// Set once the tool list was fetched over this connection (freshness check after a start).
    pub listed: AtomicBool,
}

impl Connection {
    pub fn is_alive(&self) -> bool {
        !self.closed.is_cancelled() && !self.peer.is_transport_closed()
    }

    /// Why the connection is gone, for error messages: the exit status and the last stderr line.
    pub async fn gone_reason(&self) -> String {
        let Some(child) = &self.child else {
            return "closed the connection".into();
        };
        // The transport usually notices before the exit status is in; wait for it briefly.
        let info = match tokio::time::timeout(Duration::from_millis(500), child.exited()).await {
            Ok(info) => info.status,
            Err(_) => "stopped answering (still running)".into(),
        };
        let tail = child.stderr_tail();
        match tail.iter().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!("exited ({info}); last stderr line: {line}"),
            None => format!("exited ({info})"),
        }
    }

    /// Stops the connection: closes the session, TERMs the child, KILLs it after the grace time.
    pub async fn stop(&self, grace: Duration) {
        // Take the service first: the watcher reads its absence as "stopped on purpose".
        let service = lock(&self.service).take();
        self.closed.cancel();
        if let Some(service) = service {
            service.cancellation_token().cancel();
        }
        if let Some(child) = &self.child {
            child.terminate(grace).await;
        }
    }
}

#[derive(Default)]
struct StartState {
    failures: u32,
    last_failure: Option<Instant>,
}

/// One configured upstream server.
pub struct Upstream {
    pub server: Arc<Server>,
    conn: ArcSwapOption<Connection>,
    state: tokio::sync::Mutex<StartState>,
    /// Cancelled by [`Upstream::stop`]: ends a start in progress (and its backoff wait) at once.
    stop: CancellationToken,
    deps: Deps,
}

impl Upstream {
    pub fn new(server: Arc<Server>, deps: Deps) -> Self {
        Self {
            server,
            conn: ArcSwapOption::empty(),
            state: Default::default(),
            stop: CancellationToken::new(),
            deps,
        }
    }

    /// The live connection, if there is one (never starts anything).
    pub fn current(&self) -> Option<Arc<Connection>> {
        self.conn.load_full().filter(|c| c.is_alive())
    }

    /// "running", "stopped" or "failed" (for `GET /tools`).
    pub fn state_label(&self) -> &'static str {
        match self.conn.load_full() {
            Some(c) if c.is_alive() => "running",
            Some(_) => "failed",
            None => "stopped",
        }
    }

    /// The live connection, starting the server if needed. Concurrent callers share one start.
    /// After failures the start waits out the backoff, or fails at once with `Error::Backoff`
    /// when `wait_backoff` is false.
    pub async fn connect(
        &self,
        reason: &StartReason,
        session: Option<&SessionRef>,
        wait_backoff: bool,
    ) -> Result<Arc<Connection>> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let stopped = || Error::Stopped {
            server: self.server.name.clone(),
        };
        let mut state = tokio::select! {
            state = self.state.lock() => state,
            () = self.stop.cancelled() => return Err(stopped()),
        };
        if let Some(c) = self.current() {
            return Ok(c);
        }
        if self.stop.is_cancelled() {
            return Err(stopped());
        }
        let restarting = if let Some(dead) = self.conn.swap(None) {
            let lived = dead.started_at.elapsed();
            state.failures = if lived > HEALTHY_AFTER {
                1
            } else {
                state.failures + 1
            };
            state.last_failure = Some(Instant::now());
            let why = dead.gone_reason().await;
            tracing::warn!(server = %self.server.name, %why, lived_ms = lived.as_millis() as u64, "upstream had stopped; restarting it");
            true
        } else {
            state.failures > 0
        };
        if let Some(last) = state.last_failure {
            let wait = backoff(state.failures).saturating_sub(last.elapsed());
            if !wait.is_zero() {
                if !wait_backoff {
                    return Err(Error::Backoff {
                        server: self.server.name.clone(),
                        failures: state.failures,
                        retry_in: wait,
                    });
                }
                tracing::info!(server = %self.server.name, wait_ms = wait.as_millis() as u64, failures = state.failures, "waiting out the restart backoff");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = self.stop.cancelled() => return Err(stopped()),
                }
            }
        }
        tracing::info!(server = %self.server.name, %reason, restart = restarting, "starting upstream server");
        self.deps
            .metrics
            .upstream_started(&self.server.name, reason.label(), restarting);
        let started = Instant::now();
        // A start given up (timeout, stop) drops its future, and with it the child: its process
        // group is killed (see `stdio::Child`).
        let attempt = tokio::select! {
            attempt = tokio::time::timeout(self.deps.start_timeout, self.start(session)) => attempt,
            () = self.stop.cancelled() => return Err(stopped()),
        };
        match attempt {
            Ok(Ok(conn)) => {
                let conn = Arc::new(conn);
                if let Some(info) = conn.peer.peer_info() {
                    self.deps
                        .shared
                        .record_capabilities(&self.server.spec_hash, &info.capabilities);
                }
                if let Some(session) = session {
                    conn.routes.seed(session.clone());
                }
                self.apply_log_level(&conn).await;
                tracing::info!(
                    server = %self.server.name,
                    protocol = %conn.protocol,
                    pid = conn.child.as_ref().map(|c| c.pid),
                    ms = started.elapsed().as_millis() as u64,
                    "upstream server ready"
                );
                self.conn.store(Some(conn.clone()));
                self.watch(conn.clone());
                // After the store: clients told to re-list must find the server running.
                if let Some(info) = conn.peer.peer_info() {
                    for event in UpstreamEvent::on_start(&self.server.name, &info.capabilities) {
                        let _ = self.deps.events.send(event);
                    }
                }
                Ok(conn)
            }
            Ok(Err(e)) => {
                state.failures += 1;
                state.last_failure = Some(Instant::now());
                self.deps.metrics.upstream_start_failed(&self.server.name);
                tracing::warn!(server = %self.server.name, error = %e, "upstream server failed to start");
                Err(e)
            }
            Err(_) => {
                state.failures += 1;
                state.last_failure = Some(Instant::now());
                self.deps.metrics.upstream_start_failed(&self.server.name);
                let e = Error::StartFailed {
                    server: self.server.name.clone(),
                    reason: format!("not ready within {}s", self.deps.start_timeout.as_secs()),
                };
                tracing::warn!(server = %self.server.name, error = %e, "upstream server failed to start");
                Err(e)
            }
        }
    }

    /// Replays the client's `logging/setLevel` on a new legacy connection that supports logging.
    async fn apply_log_level(&self, conn: &Connection) {
        let Some(level) = self.deps.shared.log_level() else {
            return;
        };
        let logs = conn
            .peer
            .peer_info()
            .is_some_and(|i| i.capabilities.logging.is_some());
        if conn.protocol >= ProtocolVersion::V_2026_07_28 || !logs {
            return;
        }
        let request =
            ClientRequest::SetLevelRequest(SetLevelRequest::new(SetLevelRequestParams::new(level)));
        if let Err(e) = conn.peer.send_request(request).await {
            tracing::debug!(server = %self.server.name, error = %e, "upstream refused logging/setLevel");
        }
    }

    /// Logs and counts an unexpected end of the connection as soon as it happens.
    fn watch(&self, conn: Arc<Connection>) {
        let metrics = self.deps.metrics.clone();
        let server = self.server.name.clone();
        tokio::spawn(async move {
            conn.closed.cancelled().await;
            if lock(&conn.service).is_none() {
                return; // stopped on purpose
            }
            let why = conn.gone_reason().await;
            let in_flight = conn.routes.in_flight();
            tracing::warn!(%server, %why, in_flight, "upstream server went away; in-flight calls fail, the next call restarts it");
            metrics.upstream_exited(&server);
            // Make sure a half-dead child (stdout closed, still running) does not linger.
            if let Some(child) = &conn.child {
                child.terminate(Duration::from_secs(1)).await;
            }
        });
    }

    async fn start(&self, session: Option<&SessionRef>) -> Result<Connection> {
        let name = &self.server.name;
        let routes = Arc::new(CallRoutes::default());
        let (forward_tx, forward_rx) = mpsc::unbounded_channel();
        let closed = CancellationToken::new();
        let handler = UpstreamHandler {
            server: name.clone(),
            info: client_config(session),
            routes: routes.clone(),
            events: self.deps.events.clone(),
        };
        // Prefer the 2026-07-28 lifecycle; fall back to `initialize` for older servers.
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: None,
        };
        let (service, child) = match &self.server.transport {
            Transport::Stdio(spec) => {
                let spawned = stdio::spawn(name, spec, self.deps.guard.as_ref())?;
                let transport: Tap<_> = Tap::new(
                    IntoTransport::<RoleClient, std::io::Error, _>::into_transport((
                        spawned.stdout,
                        spawned.stdin,
                    )),
                    forward_tx.clone(),
                    closed.clone(),
                );
                match serve_client_with_lifecycle(handler, transport, lifecycle).await {
                    Ok(service) => (service, Some(spawned.child)),
                    Err(e) => {
                        let reason = start_failure(&e.to_string(), &spawned.child).await;
                        spawned.child.terminate(self.deps.kill_grace).await;
                        return Err(Error::StartFailed {
                            server: name.clone(),
                            reason,
                        });
                    }
                }
            }
            Transport::Http(spec) => {
                let transport = Tap::new(
                    http::transport(name, spec)?,
                    forward_tx.clone(),
                    closed.clone(),
                );
                let service = serve_client_with_lifecycle(handler, transport, lifecycle)
                    .await
                    .map_err(|e| Error::StartFailed {
                        server: name.clone(),
                        reason: e.to_string(),
                    })?;
                (service, None)
            }
        };
        tokio::spawn(routes::run_forwarder(routes.clone(), forward_rx));
        let peer = service.peer().clone();
        let info = peer.peer_info();
        if let Some(info) = &info
            && info.protocol_version >= ProtocolVersion::V_2026_07_28
        {
            listen_for_changes(
                name.clone(),
                peer.clone(),
                &info.capabilities,
                self.deps.events.clone(),
                closed.clone(),
            );
        }
        Ok(Connection {
            server: name.clone(),
            protocol: info
                .as_ref()
                .map(|i| i.protocol_version.clone())
                .unwrap_or_default(),
            server_info: info.and_then(|i| i.server_info.clone()),
            peer,
            service: std::sync::Mutex::new(Some(service)),
            child,
            routes,
            forward: forward_tx,
            closed,
            started_at: Instant::now(),
            listed: AtomicBool::new(false),
        })
    }

    /// Stops the server for good (config removed it, or shutdown). A start in progress is
    /// ended at once, not waited for.
    pub async fn stop(&self) {
        self.stop.cancel();
        let _state = self.state.lock().await;
        if let Some(conn) = self.conn.swap(None) {
            tracing::info!(server = %self.server.name, "stopping upstream server");
            conn.stop(self.deps.kill_grace).await;
        }
    }
}

/// A 2026-07-28 upstream sends list changes only on a `subscriptions/listen` stream: open one for
/// what it advertises, and turn what arrives into events, until the connection closes.
fn listen_for_changes(
    server: ServerName,
    peer: Peer<RoleClient>,
    capabilities: &ServerCapabilities,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    closed: CancellationToken,
) {
    let mut filter = SubscriptionFilter::builder();
    let mut any = false;
    if capabilities
        .tools
        .as_ref()
        .is_some_and(|t| t.list_changed == Some(true))
    {
        filter = filter.tools_list_changed();
        any = true;
    }
    if capabilities
        .prompts
        .as_ref()
        .is_some_and(|p| p.list_changed == Some(true))
    {
        filter = filter.prompts_list_changed();
        any = true;
    }
    if capabilities
        .resources
        .as_ref()
        .is_some_and(|r| r.list_changed == Some(true))
    {
        filter = filter.resources_list_changed();
        any = true;
    }
    if !any {
        return;
    }
    let filter = filter.build();
    tokio::spawn(async move {
        let mut subscription = match peer.listen(filter).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%server, error = %e, "could not subscribe to the upstream's list changes");
                return;
            }
        };
        loop {
            let next = tokio::select! {
                next = subscription.next() => next,
                () = closed.cancelled() => return,
            };
            let event = match next {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    UpstreamEvent::ToolsChanged(server.clone())
                }
                Ok(Some(ServerNotification::PromptListChangedNotification(_))) => {
                    UpstreamEvent::PromptsChanged(server.clone())
                }
                Ok(Some(ServerNotification::ResourceListChangedNotification(_))) => {
                    UpstreamEvent::ResourcesChanged(server.clone())
                }
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            };
            if events.send(event).is_err() {
                return;
            }
        }
    });
}

async fn start_failure(error: &str, child: &stdio::Child) -> String {
    // Give the exit status a moment to arrive so the message says what happened.
    let status = tokio::time::timeout(Duration::from_millis(300), child.exited())
        .await
        .ok();
    let tail = child.stderr_tail();
    let mut reason = format!("the MCP handshake failed: {error}");
    if let Some(status) = status {
        reason.push_str(&format!("; the process exited ({})", status.status));
    }
    if let Some(line) = tail.iter().rev().find(|l| !l.trim().is_empty()) {
        reason.push_str(&format!("; last stderr line: {line}"));
    }
    reason
}

/// What the proxy declares to an upstream: the client identity and capabilities of the session
/// that caused the start (so the upstream sees what the client declared), else its own.
fn client_config(session: Option<&SessionRef>) -> ClientConfig {
    let capabilities = session
        .and_then(|s| s.capabilities.clone())
        .unwrap_or_default();
    let info = session
        .and_then(|s| s.client_info.clone())
        .unwrap_or_else(|| {
            Implementation::new("orchestrator-mcp-proxy", env!("CARGO_PKG_VERSION"))
        });
    ClientConfig::new(capabilities, info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_millis(250));
        assert_eq!(backoff(2), Duration::from_millis(500));
        assert_eq!(backoff(5), Duration::from_secs(4));
        assert_eq!(backoff(50), MAX_BACKOFF);
    }
}
