//! Upstream MCP servers: one [`Upstream`] per configured server (lazy start, crash detection,
//! restart with backoff), each holding at most one live [`Connection`] (the rmcp client, the
//! child process for stdio servers, and the routes of its in-flight calls).
//!
//! Submodules: `connection` (one live connection: its peer, process and call routes), `stdio`
//! (child processes), `zoned` (processes a server's own container starts
//! for us), `zone_tcp` (a zone over TCP, for `zoned`), `http` (streamable-HTTP client),
//! `handler` (what the upstream may send us), `routes` (which session a call belongs to), `cache` (tool lists on
//! disk), `shared` (capabilities and logging level all upstreams share), `pool` (all upstreams,
//! their tool lists, reconciliation and shutdown).
// Logging and resources/subscribe are deprecated by SEP-2577 but still part of the legacy
// protocol versions the proxy relays.
#![allow(deprecated)]

mod backoff;
pub mod cache;
mod connection;
mod framing;
pub mod guard;
pub mod handler;
mod handshake;
pub mod http;
pub mod listen;
mod listing;
pub mod pool;
mod revision;
pub mod routes;
mod shared;
pub mod stderr;
pub mod stdio;
mod zone_tcp;
pub mod zoned;

pub use connection::Connection;
pub use revision::Revision;
pub use shared::Shared;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use rmcp::{
    ClientLifecycleMode, RoleClient,
    model::{ClientRequest, ProtocolVersion, SetLevelRequest, SetLevelRequestParams},
    service::serve_client_with_lifecycle,
    transport::IntoTransport,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::{
    backoff::Backoff,
    handler::{Tap, UpstreamEvent, UpstreamHandler},
    handshake::{StartFailure, answered, client_config, start_failure},
    routes::CallRoutes,
};
use crate::{
    config::{Server, Transport},
    error::{Error, Result},
    metrics::Metrics,
    names::clip_to,
    session::SessionRef,
    sync::lock,
};

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
    /// This pod's name, for what a failed start of a zoned server says (where its log is).
    pub pod_name: Option<String>,
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

/// One configured upstream server. It is spoken to in the revision of the session a request
/// comes from: at most one connection per revision, each opened when a session of that revision
/// first needs the server (for a stdio server, a process each). A revision the server turned out
/// not to speak is served by the other connection, and the proxy translates.
pub struct Upstream {
    pub server: Arc<Server>,
    conns: [ArcSwapOption<Connection>; 2],
    /// Revisions the server turned out not to speak (indexed like `conns`).
    lacks: [AtomicBool; 2],
    /// Revisions a connection was ever opened in (indexed like `conns`).
    opened: [AtomicBool; 2],
    state: tokio::sync::Mutex<Backoff>,
    /// Cancelled by [`Upstream::stop`]: ends a start in progress at once.
    stop: CancellationToken,
    deps: Deps,
}

impl Upstream {
    pub fn new(server: Arc<Server>, deps: Deps) -> Self {
        Self {
            server,
            conns: Default::default(),
            lacks: Default::default(),
            opened: Default::default(),
            state: Default::default(),
            stop: CancellationToken::new(),
            deps,
        }
    }

    /// A live connection of either revision, if there is one (never starts anything).
    pub fn current(&self) -> Option<Arc<Connection>> {
        self.connections().into_iter().next()
    }

    /// Every live connection (at most one per revision).
    pub fn connections(&self) -> Vec<Arc<Connection>> {
        // The 2026-07-28 one first: it carries each request's client identity.
        [Revision::Modern, Revision::Legacy]
            .into_iter()
            .filter_map(|r| self.live(r))
            .collect()
    }

    fn live(&self, revision: Revision) -> Option<Arc<Connection>> {
        self.conns[revision.slot()]
            .load_full()
            .filter(|c| c.is_alive())
    }

    fn lacks(&self, revision: Revision) -> bool {
        self.lacks[revision.slot()].load(Ordering::Relaxed)
    }

    /// The revisions whose sessions a connection in `revision` serves: its own, and the other
    /// one when the server turned out not to speak it.
    pub fn revisions_served_by(&self, revision: Revision) -> Vec<Revision> {
        let mut served = vec![revision];
        if self.lacks(revision.other()) {
            served.push(revision.other());
        }
        served
    }

    /// The live connection a session of `revision` uses (never starts anything): its own
    /// revision's, or the other when the server does not speak it.
    pub fn current_for(&self, revision: Revision) -> Option<Arc<Connection>> {
        self.live(revision).or_else(|| {
            self.lacks(revision)
                .then(|| self.live(revision.other()))
                .flatten()
        })
    }

    fn usable(&self, want: Option<Revision>) -> Option<Arc<Connection>> {
        match want {
            Some(revision) => self.current_for(revision),
            None => self.current(),
        }
    }

    /// "running", "stopped" or "failed" (for `GET /tools`).
    pub fn state_label(&self) -> &'static str {
        let conns: Vec<_> = self.conns.iter().filter_map(|c| c.load_full()).collect();
        if conns.iter().any(|c| c.is_alive()) {
            "running"
        } else if conns.is_empty() {
            "stopped"
        } else {
            "failed"
        }
    }

    /// The live connection for `session`'s revision (any, without a session), starting one if
    /// needed. Concurrent callers share one start. After failures, starts of either revision
    /// are spaced by the backoff from the last one: a request inside that window fails at once
    /// with `Error::Backoff`, which names the time left (a server that exits at once is spawned
    /// no faster than the backoff, however many requests come).
    pub async fn connect(
        &self,
        reason: &StartReason,
        session: Option<&SessionRef>,
    ) -> Result<Arc<Connection>> {
        let want = session.map(Revision::of_session);
        if let Some(c) = self.usable(want) {
            return Ok(c);
        }
        let stopped = || Error::Stopped {
            server: self.server.name.clone(),
        };
        let mut state = tokio::select! {
            state = self.state.lock() => state,
            () = self.stop.cancelled() => return Err(stopped()),
        };
        if let Some(c) = self.usable(want) {
            return Ok(c);
        }
        if self.stop.is_cancelled() {
            return Err(stopped());
        }
        let dead = self
            .conns
            .iter()
            .filter(|c| c.load().as_ref().is_some_and(|c| !c.is_alive()))
            .find_map(|c| c.swap(None));
        let restarting = if let Some(dead) = dead {
            let lived = dead.started_at.elapsed();
            let why = dead.gone_reason().await;
            state.ended(lived, why.clone());
            tracing::warn!(server = %self.server.name, %why, lived_ms = lived.as_millis() as u64, "upstream had stopped; restarting it");
            true
        } else {
            state.failures() > 0
        };
        // A revision's first connection to a server that is up in the other revision is not a
        // restart: the server is not in a crash loop, whatever its record.
        let first_while_up = self.current().is_some()
            && want.is_some_and(|w| !self.opened[w.slot()].load(Ordering::Relaxed));
        if first_while_up {
            state.start_anyway();
        } else if let Err(wait) = state.start() {
            return Err(Error::Backoff {
                server: self.server.name.clone(),
                failures: state.failures(),
                retry_in: wait,
                last: clip_to(state.last_failure(), 512).into_owned(),
            });
        }
        tracing::info!(server = %self.server.name, %reason, restart = restarting, "starting upstream server");
        self.deps
            .metrics
            .upstream_started(&self.server.name, reason.label(), restarting);
        let started = Instant::now();
        // A start given up (timeout, stop) drops its future, and with it the child: its process
        // group is killed (see `stdio::Child`).
        let attempt = tokio::select! {
            attempt = tokio::time::timeout(self.deps.start_timeout, self.start_in(want, session)) => attempt,
            () = self.stop.cancelled() => return Err(stopped()),
        };
        match attempt {
            Ok(Ok(conn)) => {
                let conn = Arc::new(conn);
                let revision = Revision::of(&conn.protocol);
                if want.is_some_and(|w| w != revision) {
                    // Asked for one revision, got the other: the server does not speak it.
                    self.lacks[revision.other().slot()].store(true, Ordering::Relaxed);
                }
                if let Some(live) = self.live(revision) {
                    // Learning that cost a start: the connection in that revision stays.
                    tracing::info!(server = %self.server.name, protocol = %conn.protocol, "the server does not speak the revision asked for; using its running connection");
                    conn.stop(self.deps.kill_grace).await;
                    return Ok(live);
                }
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
                    wanted = ?want,
                    pid = conn.child.as_ref().map(|c| c.pid),
                    ms = started.elapsed().as_millis() as u64,
                    "upstream server ready"
                );
                self.conns[revision.slot()].store(Some(conn.clone()));
                self.opened[revision.slot()].store(true, Ordering::Relaxed);
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
                state.failed(e.to_string());
                self.deps.metrics.upstream_start_failed(&self.server.name);
                tracing::warn!(server = %self.server.name, error = %e, "upstream server failed to start");
                Err(e)
            }
            Err(_) => {
                self.deps.metrics.upstream_start_failed(&self.server.name);
                let e = Error::StartFailed {
                    server: self.server.name.clone(),
                    reason: format!("not ready within {}s", self.deps.start_timeout.as_secs()),
                };
                state.failed(e.to_string());
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

    /// Starts a connection in `want` (either, preferring 2026-07-28, without a session). A
    /// server that refuses the `initialize` lifecycle is started again with `server/discover`.
    async fn start_in(
        &self,
        want: Option<Revision>,
        session: Option<&SessionRef>,
    ) -> Result<Connection> {
        let auto = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: None,
        };
        if want != Some(Revision::Legacy) {
            return self.start(session, auto).await.map_err(|f| f.error);
        }
        match self.start(session, ClientLifecycleMode::Initialize).await {
            Ok(conn) => Ok(conn),
            // A server that did not answer (it exited, or never ran) would not speak the other
            // lifecycle either: trying it would only spawn it again, inside the backoff.
            Err(failed) if !failed.answered => Err(failed.error),
            Err(failed) => {
                tracing::info!(server = %self.server.name, error = %failed.error, "the initialize lifecycle failed; trying server/discover");
                self.start(session, auto).await.map_err(|f| f.error)
            }
        }
    }

    async fn start(
        &self,
        session: Option<&SessionRef>,
        lifecycle: ClientLifecycleMode,
    ) -> std::result::Result<Connection, StartFailure> {
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
        let (service, child) = match &self.server.transport {
            Transport::Stdio(spec) => {
                let spawned = stdio::spawn(
                    name,
                    spec,
                    self.deps.guard.as_ref(),
                    self.deps.pod_name.as_deref(),
                    &self.deps.shared,
                )
                .await
                .map_err(|error| StartFailure {
                    error,
                    answered: false,
                })?;
                let transport: Tap<_> = Tap::new(
                    IntoTransport::<RoleClient, std::io::Error, _>::into_transport((
                        framing::bounded(
                            spawned.stdout,
                            name.clone(),
                            crate::memory::bounds().result,
                        ),
                        spawned.stdin,
                    )),
                    forward_tx.clone(),
                    closed.clone(),
                );
                match serve_client_with_lifecycle(handler, transport, lifecycle).await {
                    Ok(service) => (service, Some(spawned.child)),
                    Err(e) => {
                        let answered = answered(&e);
                        let reason = start_failure(&e.to_string(), &spawned.child).await;
                        spawned.child.terminate(self.deps.kill_grace).await;
                        return Err(StartFailure {
                            error: Error::StartFailed {
                                server: name.clone(),
                                reason,
                            },
                            answered,
                        });
                    }
                }
            }
            Transport::Http(spec) => {
                let transport = Tap::new(
                    http::transport(name, spec, self.deps.shared.secrets(), routes.clone())
                        .map_err(|error| StartFailure {
                            error,
                            answered: false,
                        })?,
                    forward_tx.clone(),
                    closed.clone(),
                );
                let service = serve_client_with_lifecycle(handler, transport, lifecycle)
                    .await
                    .map_err(|e| StartFailure {
                        error: Error::StartFailed {
                            server: name.clone(),
                            reason: e.to_string(),
                        },
                        // An HTTP server may refuse `initialize` with an HTTP status alone, and
                        // trying the other lifecycle spawns nothing.
                        answered: true,
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
            listen::listen_for_changes(
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
        let conns: Vec<_> = self.conns.iter().filter_map(|c| c.swap(None)).collect();
        if !conns.is_empty() {
            tracing::info!(server = %self.server.name, connections = conns.len(), "stopping upstream server");
        }
        futures::future::join_all(conns.iter().map(|c| c.stop(self.deps.kill_grace))).await;
    }
}
