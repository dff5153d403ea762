//! The `tools/call` path: decide with the current table, refuse what is not on offer (without
//! touching any upstream), forward what is, and record every call (audit line, metrics, span).

use std::{
    ops::ControlFlow,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use rmcp::{
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResponse, ClientRequest, InputRequest,
        InputResponses, ProgressToken, RequestId, ServerRequest, ServerResult,
    },
    service::PeerRequestOptions,
};
use tracing::Instrument;

use crate::{
    config::Server,
    error::Error,
    names::{ServerName, clip},
    router::{Lookup, Route},
    session::ListKind,
    telemetry,
    upstream::{Connection, Revision, StartReason, Upstream},
};

use super::{CallRequest, MRTR_MAX_ROUNDS, Proxy, Snapshot, record::Denial, upstream_meta};

impl Proxy {
    /// `tools/call`: decide, then forward to the upstream that owns the tool. A call that is not
    /// allowed never reaches any upstream.
    pub async fn call_tool(self: &Arc<Self>, req: CallRequest) -> Result<CallToolResponse, Error> {
        let started = Instant::now();
        let _in_flight = InFlight::enter(self);
        let Some(mut snap) = self.snapshot() else {
            return Err(Error::NotReady);
        };
        if self.draining.load(Ordering::Acquire) {
            return self.refuse(&snap, &req, started, Error::ShuttingDown, None);
        }
        // Intent mode: its own tools; a call_tool_* goes on as the call of the tool it names.
        let req = match self.intent_front(&snap, req, started).await {
            ControlFlow::Continue(req) => req,
            ControlFlow::Break(answer) => return answer,
        };
        let mut fetched = false;
        let mut fetch_errors = Vec::new();
        let mut route: Route = loop {
            match snap.router_for(&req.session).lookup(&req.name) {
                Lookup::Routed(route) => break route.clone(),
                Lookup::Denied {
                    server,
                    tool,
                    rule,
                    risk,
                } => {
                    let denial = Denial::by_rule(server, tool.to_string(), &rule, risk);
                    let error = Error::ToolDenied {
                        tool: req.name.clone(),
                        server: denial.server.clone(),
                        rule: denial.rule.clone(),
                    };
                    return self.refuse(&snap, &req, started, error, Some(denial));
                }
                Lookup::NeedsLists(servers) if !fetched => {
                    fetched = true;
                    let timeout = snap.config.call_timeout;
                    match self.fetch_for_call(servers, &req, timeout).await {
                        Ok(errors) => fetch_errors = errors,
                        Err(error) => return self.refuse(&snap, &req, started, error, None),
                    }
                    snap = self.snapshot().ok_or(Error::NotReady)?;
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
                        Error::UnknownTool(clip(&req.name).into_owned()),
                        None,
                    );
                }
            }
        };
        if let Err(refused) = self.check_arguments(&snap, &route, &req).await {
            let (error, denial) = *refused;
            return self.refuse(&snap, &req, started, error, Some(denial));
        }
        // A call that waits for approval takes no rate-limit token while it waits.
        let approved = match self.await_approval(&snap, &route, &req, started).await {
            Ok(approved) => approved,
            Err(answered) => return *answered,
        };
        // The wait may have been long: an approved call goes on only if its tool is still on
        // offer, with the definition that was approved, under the config in force now.
        if approved.is_some() {
            snap = self.snapshot().ok_or(Error::NotReady)?;
            match snap.router_for(&req.session).lookup(&req.name) {
                Lookup::Routed(now)
                    if now.server.name == route.server.name
                        && now.definition == route.definition =>
                {
                    route = now.clone();
                }
                _ => {
                    let rule = format!(
                        "the tool was withdrawn or changed while its call waited for approval (servers[{}])",
                        route.server.name
                    );
                    let error = Error::ToolDenied {
                        tool: req.name.clone(),
                        server: route.server.name.clone(),
                        rule: rule.clone(),
                    };
                    let denial = Denial::by_policy(&route, rule, "denied").held(approved);
                    return self.refuse(&snap, &req, started, error, Some(denial));
                }
            }
        }
        if let Err(refused) = self.check_limits(&route, &req) {
            let (error, denial) = *refused;
            let denial = denial.held(approved);
            return self.refuse(&snap, &req, started, error, Some(denial));
        }
        let timeout = snap.config.call_timeout;
        let span = telemetry::call_span(&req.name, req.session.id, &req.meta);
        let result = tokio::select! {
            result = self.forward(&route, &req, timeout).instrument(span.clone()) => result,
            // Shutdown's grace is over: the call is answered now, not cut off silently.
            () = self.cut_off.cancelled() => Err(Error::ShuttingDown),
        };
        self.finish(
            &snap,
            &req,
            &route,
            started,
            &result,
            &span,
            approved.as_ref(),
        );
        result
    }

    /// The call policy for an exposed tool, first: in intent mode the declared intent must fit
    /// what the tool's server says; its arguments must fit its input schema (unless
    /// `policy.validateArguments` is off). Then (after any wait for approval) it must fit its
    /// rate limits, so a refused call costs no token.
    async fn check_arguments(
        &self,
        snap: &Snapshot,
        route: &Route,
        req: &CallRequest,
    ) -> Result<(), Box<(Error, Denial)>> {
        self.check_intent(route, req)?;
        if snap.config.validate_arguments
            && let Err(refused) = self
                .validators
                .check(
                    &route.definition,
                    &route.input_schema,
                    req.arguments.as_ref(),
                )
                .await
        {
            let problems = refused.problems();
            let rule = format!(
                "policy.validateArguments (servers[{}]: the inputSchema of {:?})",
                route.server.name, route.tool
            );
            let error = Error::InvalidArguments {
                tool: req.name.clone(),
                server: route.server.name.clone(),
                problems,
            };
            return Err(Box::new((
                error,
                Denial::by_policy(route, rule, "invalid_arguments"),
            )));
        }
        Ok(())
    }

    /// The call's rate limits (see [`Proxy::check_arguments`]).
    fn check_limits(&self, route: &Route, req: &CallRequest) -> Result<(), Box<(Error, Denial)>> {
        if let Err(limited) = self.limiters.check(&route.server, route.tool.as_str()) {
            let error = Error::RateLimited {
                tool: req.name.clone(),
                server: route.server.name.clone(),
                limit: limited.path.clone(),
                rate: limited.limit.to_string(),
                retry_after: limited.retry_after,
            };
            let rule = format!("{} ({})", limited.path, limited.limit);
            return Err(Box::new((
                error,
                Denial::by_policy(route, rule, "rate_limited"),
            )));
        }
        Ok(())
    }

    /// Starts (or waits for) the call's server. The start runs on its own, bounded by the start
    /// timeout, so a call that gives up on it does not take it down: the next call finds the
    /// server running.
    async fn start_for_call(
        &self,
        upstream: Arc<Upstream>,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<Arc<Connection>, Error> {
        let server = upstream.server.name.clone();
        let reason = StartReason::CallTool(req.name.clone());
        let session = req.session.clone();
        let connect = tokio::spawn(async move { upstream.connect(&reason, Some(&session)).await });
        match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => Err(Error::Other(format!("starting the server failed: {e}"))),
            Err(_) => Err(Error::Timeout { server, timeout }),
        }
    }

    /// Starts the servers whose tool lists decide a call's name. The starts run on their own
    /// (bounded by the start timeout); the call waits for them at most `timeout`, and not past
    /// shutdown's cut-off.
    async fn fetch_for_call(
        self: &Arc<Self>,
        servers: Vec<Arc<Server>>,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<Vec<Error>, Error> {
        let first = servers.first().map(|s| s.name.clone());
        let fetch = {
            let proxy = self.clone();
            let session = req.session.clone();
            tokio::spawn(async move {
                let errors = proxy.fetch_lists(&servers, &session).await;
                if proxy.rebuild().await {
                    proxy.notify(ListKind::Tools).await;
                }
                errors
            })
        };
        tokio::select! {
            joined = tokio::time::timeout(timeout, fetch) => match joined {
                Ok(Ok(errors)) => Ok(errors),
                Ok(Err(e)) => Err(Error::Other(format!("listing the tools failed: {e}"))),
                Err(_) => Err(match first {
                    Some(server) => Error::Timeout { server, timeout },
                    None => Error::Other("listing the tools timed out".into()),
                }),
            },
            () = self.cut_off.cancelled() => Err(Error::ShuttingDown),
        }
    }

    async fn forward(
        self: &Arc<Self>,
        route: &Route,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<CallToolResponse, Error> {
        let server = &route.server;
        let upstream = self.pool.upstream(server);
        let conn = match upstream.current_for(Revision::of_session(&req.session)) {
            Some(conn) => conn,
            None => self.start_for_call(upstream, req, timeout).await?,
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
            Some(state) if state.starts_with(super::bridge::STATE_PREFIX) => {
                let Some(pending) = self.bridge.resume(state, req.input_responses.as_ref()) else {
                    return Err(Error::InvalidParams(
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
                                return Err(Error::NotRelayable(
                                    "the upstream asked for an input the proxy cannot relay".into(),
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
                _ => {
                    return Err(Error::UnexpectedResult {
                        server: server.name.clone(),
                        method: "tools/call",
                    });
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
            req.stream_cut.clone(),
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
                    Err(e) => Err(upstream_failure(&conn, server, e, timeout).await),
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
            let pending = super::bridge::Pending { done, asks };
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
                Err(Error::Cancelled("the client"))
            }
        }
    }

    /// Waits for a bridged call: its result, or its next question as an input_required result.
    async fn bridged_step(
        &self,
        pending: super::bridge::Pending,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<ServerResult, Error> {
        // A parked call waits for its client at most this long.
        let keep = timeout + Duration::from_secs(60);
        match self.bridge.wait(pending, &req.ct, keep).await {
            super::bridge::Step::Done(result) => *result,
            super::bridge::Step::Asked(question) => Ok(ServerResult::InputRequiredResult(question)),
        }
    }

    /// After a start, compare the upstream's list with the one served (it may come from the disk
    /// cache and be stale); when it differs, update and notify.
    fn check_freshness(self: &Arc<Self>, server: Arc<Server>) {
        let proxy = self.clone();
        tokio::spawn(async move {
            match proxy.pool.relist(&server).await {
                Ok(true) => {
                    if proxy.rebuild().await {
                        tracing::info!(server = %server.name, "the cached tool list was stale; clients are told to re-list");
                        proxy.notify(ListKind::Tools).await;
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(server = %server.name, error = %e, "freshness re-list failed")
                }
            }
        });
    }
}

/// What a failed call says: an HTTP upstream whose reply was not MCP has not gone anywhere (its
/// bytes, bounded); a closed transport has (exit status, stderr).
async fn upstream_failure(
    conn: &Arc<Connection>,
    server: ServerName,
    e: rmcp::ServiceError,
    timeout: Duration,
) -> Error {
    if let Some(what) = crate::upstream::http::protocol_failure(&e) {
        return Error::UpstreamProtocol { server, what };
    }
    match e {
        rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => {
            gone(conn, &server).await
        }
        rmcp::ServiceError::Timeout { .. } => Error::Timeout { server, timeout },
        source => Error::Upstream { server, source },
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
