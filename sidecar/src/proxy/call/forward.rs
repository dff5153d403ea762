//! The call's last step: forward it to the upstream that owns the tool (started now if it is not
//! running), relay what the upstream asks meanwhile, and turn what it answers (or how it failed)
//! into the call's result. [`params_of`] makes the params it sends, which is also what a person
//! approving the call is shown (`held`), so the two cannot drift apart.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use rmcp::{
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResponse, ClientRequest, InputRequest,
        InputResponses, ProgressToken, RequestId, RequestMetaObject, ServerRequest, ServerResult,
    },
    service::PeerRequestOptions,
};

use crate::{
    config::Server,
    error::Error,
    names::ServerName,
    router::Route,
    session::ListKind,
    telemetry,
    upstream::{Connection, Revision, StartReason, Upstream},
};

use super::super::{CallRequest, MRTR_MAX_ROUNDS, Proxy, upstream_meta};

impl Proxy {
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

    /// Forwards the call to its upstream (started now if it is not running) and returns what the
    /// upstream answered, driving `input_required` rounds for a client that cannot.
    pub(super) async fn forward(
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
        let mut params = params_of(route, req);
        let client_token = req.meta.get_progress_token();
        // The retry of a call the proxy parked for a 2026-07-28 client (see `bridge`).
        let mut resumed = match req.request_state.as_deref() {
            Some(state) if state.starts_with(super::super::bridge::STATE_PREFIX) => {
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
        mut params: CallToolRequestParams,
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
        // `_meta` goes as this upstream may get it, with the proxy's trace context.
        let mut meta = upstream_meta(&params.meta.take().unwrap_or_default(), modern);
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
            let pending = super::super::bridge::Pending { done, asks };
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
        pending: super::super::bridge::Pending,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<ServerResult, Error> {
        // A parked call waits for its client at most this long.
        let keep = timeout + Duration::from_secs(60);
        match self.bridge.wait(pending, &req.ct, keep).await {
            super::super::bridge::Step::Done(result) => *result,
            super::super::bridge::Step::Asked(question) => {
                Ok(ServerResult::InputRequiredResult(question))
            }
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

/// The `tools/call` params the proxy sends for `req` on `route`: the upstream's name of the tool,
/// and the client's `arguments`, `inputResponses`, `requestState` and `_meta` ([`meta_of`]) as
/// it sent them. What a person approving the call is shown and its digest covers
/// ([`shown_params`]); `forward` sends them.
pub(super) fn params_of(route: &Route, req: &CallRequest) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(route.tool.as_str().to_string());
    params.arguments = req.arguments.clone();
    params.input_responses = req.input_responses.clone();
    params.request_state = req.request_state.clone();
    let meta = meta_of(req);
    params.meta = (!meta.0.0.is_empty()).then_some(meta);
    params
}

/// [`params_of`] as JSON.
pub(super) fn shown_params(route: &Route, req: &CallRequest) -> Result<serde_json::Value, Error> {
    serde_json::to_value(params_of(route, req))
        .map_err(|e| Error::Other(format!("the call's params cannot be written as JSON: {e}")))
}

/// The client's `_meta` as an upstream may get it (a 2026-07-28 one gets the most; an older one
/// a part, see [`upstream_meta`]). With tracing on, the client's trace context is not passed:
/// the proxy sends its call span's instead (`telemetry::inject`), so it is not the client's to
/// show either.
fn meta_of(req: &CallRequest) -> RequestMetaObject {
    let mut meta = upstream_meta(&req.meta, true);
    if telemetry::tracing_on() {
        for key in ["traceparent", "tracestate"] {
            meta.0.0.remove(key);
        }
    }
    meta
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
