//! The proxy core, independent of the front transport: the current config and exposed-tool table
//! (one `Arc` swapped atomically), `tools/list` (lazy, parallel starts of servers whose list is
//! unknown), `tools/call` (enforcement before anything reaches an upstream), config application,
//! upstream list changes and draining on shutdown.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use rmcp::{
    ErrorData,
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResponse, ClientRequest, InputRequest,
        InputResponses, JsonObject, ProgressToken, RequestId, RequestMetaObject, ServerRequest,
        ServerResult, Tool,
    },
    service::PeerRequestOptions,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    audit::{self, Audit, Outcome},
    config::{Config, Server},
    error::Error,
    filter::{Rule, RuleDisplay},
    metrics::Metrics,
    names::ServerName,
    router::{Lookup, Route, Router},
    session::{ListKind, Registry, SessionRef},
    telemetry,
    upstream::{Connection, StartReason, handler::UpstreamEvent, pool::Pool},
};

/// Rounds of `input_required` the proxy drives for a client that cannot take them itself.
const MRTR_MAX_ROUNDS: usize = 10;

/// The config in use and the tool table built from it.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub router: Router,
}

/// One `tools/call` as received from a client.
pub struct CallRequest {
    pub name: String,
    pub arguments: Option<JsonObject>,
    pub input_responses: Option<InputResponses>,
    pub request_state: Option<String>,
    pub meta: RequestMetaObject,
    pub request_id: RequestId,
    pub ct: CancellationToken,
    pub session: SessionRef,
}

pub struct Proxy {
    snapshot: ArcSwapOption<Snapshot>,
    /// Serializes router rebuilds so no update is lost between load and swap.
    rebuild: tokio::sync::Mutex<()>,
    pub pool: Pool,
    pub passthrough: crate::passthrough::Passthrough,
    bridge: crate::bridge::Bridge,
    pub sessions: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    audit: Audit,
    calls_in_flight: AtomicUsize,
    idle: Notify,
    draining: AtomicBool,
}

impl Proxy {
    pub fn new(pool: Pool, metrics: Arc<Metrics>, audit: Audit) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwapOption::empty(),
            rebuild: Default::default(),
            pool,
            passthrough: Default::default(),
            bridge: Default::default(),
            sessions: Default::default(),
            metrics,
            audit,
            calls_in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            draining: AtomicBool::new(false),
        })
    }

    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snapshot.load_full()
    }

    /// Puts a validated config in use: swaps the table, stops what the config no longer needs
    /// (starting nothing), and tells every session when the tools on offer may have changed.
    pub async fn apply_config(self: &Arc<Self>, config: Config) {
        let config = Arc::new(config);
        let changed = {
            let _guard = self.rebuild.lock().await;
            let before = self.snapshot();
            let router = Router::build(&config, &self.pool.known_lists(&config));
            let changed = before
                .as_ref()
                .is_none_or(|b| surface_changed(&b.router, &router));
            self.snapshot.store(Some(Arc::new(Snapshot {
                config: config.clone(),
                router,
            })));
            changed
        };
        self.metrics.config_in_use(config.context_version);
        tracing::info!(
            context_version = config.context_version,
            servers = config.servers.len(),
            startable = config.servers.iter().filter(|s| s.is_startable()).count(),
            "config in use"
        );
        self.pool.reconcile(&config).await;
        if changed {
            self.notify(ListKind::Tools).await;
        }
    }

    /// Rebuilds the table from the current config and known lists. Returns whether the tools on
    /// offer changed.
    async fn rebuild(&self) -> bool {
        let _guard = self.rebuild.lock().await;
        let Some(current) = self.snapshot() else {
            return false;
        };
        let router = Router::build(&current.config, &self.pool.known_lists(&current.config));
        let changed = surface_changed(&current.router, &router);
        self.snapshot.store(Some(Arc::new(Snapshot {
            config: current.config.clone(),
            router,
        })));
        changed
    }

    pub async fn notify(&self, kind: ListKind) {
        let sent = self.sessions.notify_list_changed(kind).await;
        let label = match kind {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
        };
        self.metrics.list_changed_sent(label, sent);
        tracing::info!(kind = label, sessions = sent, "sent list_changed");
    }

    /// The exposed tools. Servers whose list is not known are started (in parallel) first;
    /// one that fails is left out and logged, the others are still listed.
    pub async fn list_tools(&self, session: &SessionRef) -> Result<Arc<Vec<Tool>>, Error> {
        let snap = self.snapshot().ok_or(Error::NotReady)?;
        let missing = snap.router.missing_lists().to_vec();
        if missing.is_empty() {
            return Ok(snap.router.tools());
        }
        self.fetch_lists(&missing, session, false).await;
        self.rebuild().await;
        Ok(self.snapshot().ok_or(Error::NotReady)?.router.tools())
    }

    /// Fetches the lists of `servers` in parallel; returns the failures (also logged).
    /// `tools/list` does not wait out a restart backoff (it leaves the server out); a call does.
    async fn fetch_lists(
        &self,
        servers: &[Arc<Server>],
        session: &SessionRef,
        wait_backoff: bool,
    ) -> Vec<Error> {
        let fetches = servers.iter().map(|s| async move {
            let result = self.pool.fetch_list(s, Some(session), wait_backoff).await;
            if let Err(e) = &result {
                tracing::warn!(server = %s.name, error = %e, "tool list unavailable; its tools are left out");
            }
            result.err()
        });
        futures::future::join_all(fetches)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Handles a change notified by an upstream: re-list it, and tell the clients when what they
    /// see changed.
    pub async fn on_upstream_event(self: &Arc<Self>, event: UpstreamEvent) {
        match event {
            UpstreamEvent::ToolsChanged(name) => {
                let Some(server) = self
                    .snapshot()
                    .and_then(|s| s.config.server(name.as_str()).cloned())
                else {
                    return;
                };
                match self.pool.relist(&server).await {
                    Ok(Some(_)) => {
                        tracing::info!(server = %name, "upstream tool list changed");
                        if self.rebuild().await {
                            self.notify(ListKind::Tools).await;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "could not re-list tools after list_changed")
                    }
                }
            }
            UpstreamEvent::ResourceUpdated(uri) => {
                for peer in self.passthrough.subscribers(&uri) {
                    let params = rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone());
                    let _ = peer.notify_resource_updated(params).await;
                }
                self.sessions.notify_resource_updated(&uri).await;
            }
            UpstreamEvent::PromptsChanged(_) => self.notify(ListKind::Prompts).await,
            UpstreamEvent::ResourcesChanged(_) => self.notify(ListKind::Resources).await,
        }
    }

    /// `tools/call`: decide, then forward to the upstream that owns the tool. A call that is not
    /// allowed never reaches any upstream.
    pub async fn call_tool(
        self: &Arc<Self>,
        req: CallRequest,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let _in_flight = InFlight::enter(self);
        let Some(mut snap) = self.snapshot() else {
            return Err(Error::NotReady.to_mcp());
        };
        if self.draining.load(Ordering::Acquire) {
            return self.refuse(&snap, &req, started, Error::ShuttingDown, None);
        }
        let mut fetched = false;
        let mut fetch_errors = Vec::new();
        let route: Route = loop {
            match snap.router.lookup(&req.name) {
                Lookup::Routed(route) => break route.clone(),
                Lookup::Denied { server, tool, rule } => {
                    let error = Error::ToolDenied {
                        tool: req.name.clone(),
                        server: server.clone(),
                        rule: RuleDisplay {
                            server: &server,
                            rule: &rule,
                        }
                        .to_string(),
                    };
                    return self.refuse(
                        &snap,
                        &req,
                        started,
                        error,
                        Some((server, tool.to_string(), rule)),
                    );
                }
                Lookup::NeedsLists(servers) if !fetched => {
                    fetched = true;
                    fetch_errors = self.fetch_lists(&servers, &req.session, true).await;
                    if self.rebuild().await {
                        self.notify(ListKind::Tools).await;
                    }
                    snap = self.snapshot().ok_or_else(|| Error::NotReady.to_mcp())?;
                }
                Lookup::NeedsLists(_) | Lookup::Unknown => {
                    // The server that could own the name did not start: say that, not "unknown".
                    if let Some(error) = fetch_errors.into_iter().next() {
                        return self.refuse(&snap, &req, started, error, None);
                    }
                    return self.refuse(
                        &snap,
                        &req,
                        started,
                        Error::UnknownTool(req.name.clone()),
                        None,
                    );
                }
            }
        };
        let timeout = snap.config.call_timeout;
        let span = telemetry::call_span(&req.name, req.session.id, &req.meta);
        let result = self
            .forward(&route, &req, timeout)
            .instrument(span.clone())
            .await;
        self.finish(&snap, &req, &route, started, &result, &span);
        result.map_err(|e| e.to_mcp())
    }

    async fn forward(
        self: &Arc<Self>,
        route: &Route,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<CallToolResponse, Error> {
        let server = &route.server;
        let upstream = self.pool.upstream(server);
        let reason = StartReason::CallTool(req.name.clone());
        let conn = match tokio::time::timeout(
            timeout,
            upstream.connect(&reason, Some(&req.session), true),
        )
        .await
        {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(Error::Timeout {
                    server: server.name.clone(),
                    timeout,
                });
            }
        };
        if !conn.listed.swap(true, Ordering::Relaxed) {
            self.check_freshness(server.clone());
        }
        let mut params = CallToolRequestParams::new(route.tool.as_str().to_string());
        params.arguments = req.arguments.clone();
        params.input_responses = req.input_responses.clone();
        params.request_state = req.request_state.clone();
        let client_token = req.meta.get_progress_token();
        // The retry of a call the proxy parked for a 2026-07-28 client (see `bridge`).
        let mut resumed = match req.request_state.as_deref() {
            Some(state) if state.starts_with(crate::bridge::STATE_PREFIX) => {
                let Some(pending) = self.bridge.resume(state, req.input_responses.as_ref()) else {
                    return Err(Error::Other(
                        "the call this retry continues is gone (finished, timed out or the proxy restarted); call the tool again".into(),
                    ));
                };
                Some(pending)
            }
            _ => None,
        };
        for _round in 0..MRTR_MAX_ROUNDS {
            let result = match resumed.take() {
                Some(pending) => self.bridged_step(pending, req, timeout).await?,
                None => {
                    self.send_call(
                        &conn,
                        server,
                        params.clone(),
                        req,
                        client_token.clone(),
                        timeout,
                    )
                    .await?
                }
            };
            match result {
                ServerResult::CallToolResult(mut r) => {
                    // Older upstreams omit `resultType`; 2026-07-28 clients require it (rmcp strips
                    // it again for older clients).
                    r.result_type
                        .get_or_insert(rmcp::model::ResultType::COMPLETE);
                    return Ok(CallToolResponse::Complete(r));
                }
                ServerResult::CreateTaskResult(t) => return Ok(CallToolResponse::Task(t)),
                ServerResult::InputRequiredResult(r) if !req.session.accepts_requests => {
                    // A 2026-07-28 client drives the rounds itself; hand it over unchanged.
                    return Ok(CallToolResponse::InputRequired(r));
                }
                ServerResult::InputRequiredResult(r) => {
                    // A client on the initialize lifecycle gets the upstream's questions as
                    // ordinary requests; the proxy retries with the answers.
                    let mut responses = InputResponses::new();
                    for (key, request) in r.input_requests.clone().unwrap_or_default() {
                        let request = match request {
                            InputRequest::CreateMessage(m) => {
                                ServerRequest::CreateMessageRequest(m)
                            }
                            InputRequest::Elicitation(e) => ServerRequest::ElicitRequest(e),
                            InputRequest::ListRoots(l) => ServerRequest::ListRootsRequest(l),
                            _ => {
                                return Err(Error::Other(
                                    "unsupported input request from the upstream".into(),
                                ));
                            }
                        };
                        let answer = req.session.peer.send_request(request).await.map_err(|e| {
                            Error::Other(format!(
                                "the client could not answer the server's request: {e}"
                            ))
                        })?;
                        let value = serde_json::to_value(answer)
                            .map_err(|e| Error::Other(e.to_string()))?;
                        responses.insert(key, value);
                    }
                    params.input_responses = Some(responses);
                    params.request_state = r.request_state.clone();
                }
                other => {
                    return Err(Error::Other(format!(
                        "the upstream answered tools/call with an unexpected result: {other:?}"
                    )));
                }
            }
        }
        Err(Error::Other(format!(
            "the upstream asked for input more than {MRTR_MAX_ROUNDS} times"
        )))
    }

    async fn send_call(
        &self,
        conn: &Arc<Connection>,
        server: &Arc<Server>,
        params: CallToolRequestParams,
        req: &CallRequest,
        client_token: Option<ProgressToken>,
        timeout: Duration,
    ) -> Result<ServerResult, Error> {
        let modern = conn.protocol >= rmcp::model::ProtocolVersion::V_2026_07_28;
        // An initialize-era upstream may ask a 2026-07-28 client things during the call: those
        // questions become input_required rounds (see `bridge`).
        let bridged = !req.session.accepts_requests && !modern;
        let (asks_tx, asks_rx) = if bridged {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let wants_progress = client_token.is_some();
        let guard = conn.routes.begin(
            req.session.clone(),
            req.request_id.clone(),
            client_token,
            asks_tx,
        );
        let mut meta = upstream_meta(&req.meta, modern);
        telemetry::inject(&tracing::Span::current(), &mut meta);
        let options = PeerRequestOptions::with_timeout(timeout)
            .reset_timeout_on_progress()
            .with_meta(meta);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = match conn.peer.send_request_with_option(request, options).await {
            Ok(handle) => handle,
            Err(_) => return Err(gone(conn, &server.name).await),
        };
        guard.sent(
            handle.id.clone(),
            handle.progress_token.clone(),
            &conn.forward,
        );
        let id = handle.id.clone();
        let wait = {
            let conn = conn.clone();
            let server = server.name.clone();
            async move {
                let result = match handle.await_response().await {
                    Ok(result) => {
                        if wants_progress {
                            flush_notifications(&conn).await;
                        }
                        Ok(result)
                    }
                    Err(rmcp::ServiceError::TransportClosed)
                    | Err(rmcp::ServiceError::TransportSend(_)) => Err(gone(&conn, &server).await),
                    Err(rmcp::ServiceError::Timeout { .. }) => {
                        Err(Error::Timeout { server, timeout })
                    }
                    Err(source) => Err(Error::Upstream { server, source }),
                };
                drop(guard);
                result
            }
        };
        if let Some(asks) = asks_rx {
            // The call must outlive this client request if it asks something: run it on its own.
            let (done_tx, done) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let _ = done_tx.send(wait.await);
            });
            let pending = crate::bridge::Pending { done, asks };
            let result = self.bridged_step(pending, req, timeout).await;
            if req.ct.is_cancelled() {
                cancel_upstream(conn, id).await;
            }
            return result;
        }
        tokio::select! {
            result = wait => result,
            () = req.ct.cancelled() => {
                cancel_upstream(conn, id).await;
                Err(Error::Other("cancelled by the client".into()))
            }
        }
    }

    /// Waits for a bridged call: its result, or its next question as an input_required result.
    async fn bridged_step(
        &self,
        pending: crate::bridge::Pending,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<ServerResult, Error> {
        // A parked call waits for its client at most this long.
        let keep = timeout + Duration::from_secs(60);
        match self.bridge.wait(pending, &req.ct, keep).await {
            crate::bridge::Step::Done(result) => *result,
            crate::bridge::Step::Asked(question) => Ok(ServerResult::InputRequiredResult(question)),
        }
    }

    /// After a start, compare the upstream's list with the one served (it may come from the disk
    /// cache and be stale); when it differs, update and notify.
    fn check_freshness(self: &Arc<Self>, server: Arc<Server>) {
        let proxy = self.clone();
        tokio::spawn(async move {
            match proxy.pool.relist(&server).await {
                Ok(Some(_)) => {
                    if proxy.rebuild().await {
                        tracing::info!(server = %server.name, "the cached tool list was stale; clients are told to re-list");
                        proxy.notify(ListKind::Tools).await;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(server = %server.name, error = %e, "freshness re-list failed")
                }
            }
        });
    }

    /// Records a call refused by the proxy itself and returns its error.
    fn refuse(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        started: Instant,
        error: Error,
        denied: Option<(ServerName, String, Rule)>,
    ) -> Result<CallToolResponse, ErrorData> {
        // A tool that is not on offer is the agent's mistake to see and correct: it gets a tool
        // error result it can read (as most MCP servers answer unknown tools). Failures of the
        // proxy itself stay JSON-RPC errors.
        let as_result = matches!(error, Error::ToolDenied { .. } | Error::UnknownTool(_));
        let outcome = match (&denied, as_result) {
            (Some(_), _) => Outcome::Denied,
            (None, true) => Outcome::ToolError,
            (None, false) => Outcome::ProtocolError,
        };
        let (server, upstream_tool, rule) = match &denied {
            Some((s, t, r)) => (
                Some(s.as_str()),
                Some(t.as_str()),
                Some(RuleDisplay { server: s, rule: r }.to_string()),
            ),
            None => (None, None, None),
        };
        tracing::info!(tool = %req.name, session = %req.session.id, error = %error, "tools/call refused");
        let span = telemetry::call_span(&req.name, req.session.id, &req.meta);
        if !span.is_none() {
            span.record("mcp.server", server.unwrap_or(""));
            span.record(
                "mcp.decision",
                if denied.is_some() {
                    "denied"
                } else {
                    "unknown"
                },
            );
            span.record("mcp.outcome", outcome.as_str());
            span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
        }
        // Unknown names are client input: keep them out of metric labels.
        let label_tool = if upstream_tool.is_some() {
            req.name.as_str()
        } else {
            "(unknown)"
        };
        self.metrics.call(
            server.unwrap_or("(none)"),
            label_tool,
            outcome.as_str(),
            started.elapsed().as_secs_f64(),
        );
        self.write_audit(
            snap,
            req,
            server,
            upstream_tool,
            if denied.is_some() {
                "denied"
            } else {
                "unknown"
            },
            rule,
            outcome,
            Some(error.to_string()),
            started,
        );
        if !as_result {
            return Err(error.to_mcp());
        }
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert(
            "io.orchestrator/proxy".into(),
            error.to_mcp().data.unwrap_or_default(),
        );
        let result = rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(
            error.to_string(),
        )])
        .with_meta(Some(meta));
        Ok(CallToolResponse::Complete(result))
    }

    fn finish(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        route: &Route,
        started: Instant,
        result: &Result<CallToolResponse, Error>,
        span: &tracing::Span,
    ) {
        let (outcome, error) = match result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
                (Outcome::ToolError, None)
            }
            Ok(_) => (Outcome::Ok, None),
            Err(e) => (Outcome::ProtocolError, Some(e.to_string())),
        };
        if let Err(e) = result {
            tracing::warn!(tool = %req.name, server = %route.server.name, error = %e, "tools/call failed");
        }
        let elapsed = started.elapsed();
        if !span.is_none() {
            span.record("mcp.server", route.server.name.as_str());
            span.record("mcp.decision", "allowed");
            span.record("mcp.outcome", outcome.as_str());
            span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        }
        self.metrics.call(
            route.server.name.as_str(),
            &req.name,
            outcome.as_str(),
            elapsed.as_secs_f64(),
        );
        let rule = route.server.filter.verdict(route.tool.as_str());
        let rule = RuleDisplay {
            server: &route.server.name,
            rule: rule.rule(),
        }
        .to_string();
        self.write_audit(
            snap,
            req,
            Some(route.server.name.as_str()),
            Some(route.tool.as_str()),
            "allowed",
            Some(rule),
            outcome,
            error,
            started,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn write_audit(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        server: Option<&str>,
        upstream_tool: Option<&str>,
        decision: &'static str,
        rule: Option<String>,
        outcome: Outcome,
        error: Option<String>,
        started: Instant,
    ) {
        let config = &snap.config;
        let argument_bytes = req
            .arguments
            .as_ref()
            .map(|a| serde_json::to_vec(a).map(|v| v.len()).unwrap_or(0))
            .unwrap_or(0);
        let record = audit::Record {
            ts: audit::timestamp(),
            task: &config.task_name,
            namespace: &config.task_namespace,
            context_version: config.context_version,
            session: req.session.id.to_string(),
            request_id: req.request_id.to_string(),
            tool: &req.name,
            server,
            upstream_tool,
            decision,
            rule,
            outcome,
            error,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            argument_bytes,
            arguments: if config.audit.include_arguments {
                req.arguments.as_ref()
            } else {
                None
            },
        };
        self.audit.record(config.audit.path.as_ref(), &record);
    }

    /// Refuses new calls and waits (up to `grace`) for the calls in flight to finish.
    pub async fn drain(&self, grace: Duration) {
        self.draining.store(true, Ordering::Release);
        let deadline = tokio::time::Instant::now() + grace;
        let mut waited = false;
        loop {
            let idle = self.idle.notified();
            let n = self.calls_in_flight.load(Ordering::Acquire);
            if n == 0 {
                if waited {
                    // The last results are being written to their streams right now.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                return;
            }
            waited = true;
            tracing::info!(calls = n, "waiting for calls in flight");
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                tracing::warn!(
                    calls = self.calls_in_flight.load(Ordering::Acquire),
                    "grace period over; calls still in flight are cut off"
                );
                return;
            }
        }
    }

    /// Writes the audit lines still queued (at shutdown).
    pub fn flush_audit(&self) {
        self.audit.flush();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Per server: running state and calls in flight.
    pub fn upstream_states(&self) -> HashMap<ServerName, (&'static str, usize)> {
        self.pool.states()
    }
}

async fn gone(conn: &Arc<Connection>, server: &ServerName) -> Error {
    Error::UpstreamGone {
        server: server.clone(),
        what: conn.gone_reason().await,
    }
}

/// Waits (briefly) until the notifications the upstream sent before its result are forwarded.
async fn flush_notifications(conn: &Connection) {
    let (done, flushed) = tokio::sync::oneshot::channel();
    if conn
        .forward
        .send(crate::upstream::routes::Forward::Barrier(done))
        .is_ok()
    {
        let _ = tokio::time::timeout(Duration::from_secs(1), flushed).await;
    }
}

async fn cancel_upstream(conn: &Connection, id: RequestId) {
    let params = rmcp::model::CancelledNotificationParam::new(
        Some(id),
        Some("cancelled by the client".into()),
    );
    let _ = conn.peer.notify_cancelled(params).await;
}

/// Counts a call in flight for draining.
struct InFlight<'a>(&'a Proxy);

impl<'a> InFlight<'a> {
    fn enter(proxy: &'a Proxy) -> Self {
        proxy.calls_in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(proxy)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.calls_in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Whether clients should re-list: the exposed tools differ, or servers whose list is unknown
/// came or went (their tools appear only once listed).
fn surface_changed(before: &Router, after: &Router) -> bool {
    let missing = |r: &Router| -> Vec<(String, String)> {
        r.missing_lists()
            .iter()
            .map(|s| (s.name.to_string(), s.spec_hash.to_string()))
            .collect()
    };
    before.tools() != after.tools() || missing(before) != missing(after)
}

/// The client's `_meta` as the upstream should see it: trace context and custom keys pass; the
/// lifecycle keys are the proxy's to set (rmcp sets the upstream's own); 2026-07-28 context keys
/// are kept only for upstreams that speak it, so they carry what the client declared.
pub(crate) fn upstream_meta(
    client: &RequestMetaObject,
    modern_upstream: bool,
) -> RequestMetaObject {
    let mut meta = client.clone();
    let map = &mut meta.0.0;
    map.remove("progressToken");
    map.remove("io.modelcontextprotocol/protocolVersion");
    if !modern_upstream {
        map.remove("io.modelcontextprotocol/clientInfo");
        map.remove("io.modelcontextprotocol/clientCapabilities");
        map.remove("io.modelcontextprotocol/logLevel");
    }
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_meta_keeps_trace_context_and_drops_lifecycle_keys() {
        let mut meta = RequestMetaObject::new();
        meta.set_traceparent("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
        meta.set_progress_token(ProgressToken(rmcp::model::NumberOrString::Number(7)));
        meta.set_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28);
        meta.set_client_capabilities(Default::default());
        meta.0.0.insert("vendor/key".into(), serde_json::json!(1));
        let legacy = upstream_meta(&meta, false);
        assert!(legacy.get_traceparent().is_some());
        assert!(legacy.get_progress_token().is_none());
        assert!(legacy.protocol_version().is_none());
        assert!(legacy.client_capabilities().is_none());
        assert_eq!(legacy.0.0.get("vendor/key"), Some(&serde_json::json!(1)));
        let modern = upstream_meta(&meta, true);
        assert!(modern.client_capabilities().is_some());
        assert!(modern.protocol_version().is_none());
    }
}
