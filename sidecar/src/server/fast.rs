//! The direct path for `tools/call` on an established HTTP session.
//!
//! rmcp's streamable-HTTP server hands every request through a session worker, a service loop
//! and a task per request, parses it into its typed message model and answers on an SSE stream
//! that starts with a priming event: most of the proxy's own cost per call (docs/benchmarks.md).
//! A `tools/call` on a session that finished its initialize handshake skips all that: this
//! middleware reads the body, runs the call through the same [`Proxy::call_tool`] (filter,
//! audit, metrics, span, upstream routing), and answers on the POST itself. Everything else —
//! initialize, other methods, GET/DELETE, 2026-07-28 requests, anything unusual in the
//! headers or body — goes to rmcp unchanged.
//!
//! What rmcp would do during such a call, this path does on the call's own stream: progress
//! notifications for the client's token, and requests the upstream sends back (sampling,
//! elicitation, roots), whose answers arrive as POSTed JSON-RPC responses and are picked up here
//! by id. `notifications/cancelled` for a call on this path cancels it here. The call's stream
//! carries no event ids (resumption is optional for servers); a call answered within
//! [`FIRST_EVENT_WAIT`] gets its whole SSE body in one write.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use rmcp::transport::streamable_http_server::session::{
    SessionManager, local::LocalSessionManager,
};
use rmcp::{
    ErrorData, Peer, RoleServer,
    model::{
        CallToolRequestParams, CallToolResponse, CancelledNotification, CancelledNotificationParam,
        ClientCapabilities, ClientResult, Implementation, ProtocolVersion, RequestId,
        ServerJsonRpcMessage, ServerNotification, ServerRequest, ServerResult,
    },
};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::{
    lock,
    proxy::{CallRequest, Proxy},
    session::{SessionId, SessionRef},
};

/// How long a call's answer may take and still be sent as one complete body; a slower call gets
/// its stream's headers then, and its events as they come.
pub const FIRST_EVENT_WAIT: Duration = Duration::from_secs(1);

/// Bodies above this go to rmcp (which applies the same limit and says so).
const MAX_BODY: u64 = 4 * 1024 * 1024;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// An HTTP session the direct path may serve: registered once the client sent
/// `notifications/initialized`, removed when rmcp drops the session.
pub struct FastSession {
    pub session: SessionId,
    pub peer: Peer<RoleServer>,
    /// The version the session negotiated (always before 2026-07-28).
    pub protocol: ProtocolVersion,
    client_info: Option<Implementation>,
    capabilities: Option<ClientCapabilities>,
    /// Requests sent to the client on a call's stream, waiting for its answer.
    asked: Mutex<HashMap<RequestId, oneshot::Sender<Result<serde_json::Value, ErrorData>>>>,
    /// Calls in flight on this path, by the client's request id.
    calls: Mutex<HashMap<RequestId, CancellationToken>>,
    /// Cancelled when the session ends (DELETE, expiry, proxy shutdown): its calls with it.
    ct: CancellationToken,
    /// When the client last sent anything on this session, or a stream of it ended
    /// (milliseconds on [`clock_ms`]).
    last_seen: AtomicU64,
    /// Responses of this session still streaming (its GET stream, requests rmcp serves).
    open: AtomicUsize,
}

impl FastSession {
    pub fn new(
        session: SessionId,
        peer: Peer<RoleServer>,
        protocol: ProtocolVersion,
        ct: CancellationToken,
    ) -> Self {
        let info = peer.peer_info();
        Self {
            session,
            client_info: info.as_ref().map(|i| i.client_info.clone()),
            capabilities: info.as_ref().map(|i| i.capabilities.clone()),
            peer,
            protocol,
            asked: Mutex::default(),
            calls: Mutex::default(),
            ct,
            last_seen: AtomicU64::new(clock_ms()),
            open: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        self.last_seen.store(clock_ms(), Ordering::Relaxed);
    }

    /// Ends the session's calls on this path (the session is over).
    pub fn end(&self) {
        self.ct.cancel();
    }
}

/// Counts a streaming response of a session while it lasts.
struct Open(Arc<FastSession>);

impl Open {
    fn new(session: Arc<FastSession>) -> Self {
        session.open.fetch_add(1, Ordering::Relaxed);
        Open(session)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// Keeps an SSE response of `session` counted as activity until its body is done.
fn while_streaming(response: Response, session: Arc<FastSession>) -> Response {
    let streaming = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        return response;
    }
    let open = Open::new(session);
    response.map(|body| {
        Body::from_stream(futures::StreamExt::map(
            body.into_data_stream(),
            move |chunk| {
                let _ = &open;
                chunk
            },
        ))
    })
}

/// Milliseconds since the first use, a monotonic clock for idle times.
pub(crate) fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = START.get_or_init(std::time::Instant::now).elapsed();
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// Closes sessions no request used for `idle`, with no call in flight and no open stream,
/// and sessions that never finished their handshake (rmcp's idle timer cannot see calls on the
/// direct path, so it is off and this does its job), until `cancel`. `idle` zero: never.
pub fn spawn_reaper(
    proxy: Arc<Proxy>,
    manager: Arc<LocalSessionManager>,
    idle: Duration,
    cancel: CancellationToken,
) {
    if idle.is_zero() {
        return;
    }
    let period = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(600));
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = cancel.cancelled() => return,
            }
            let now = clock_ms();
            for (http_id, session) in proxy.sessions.http_sessions() {
                let quiet = now.saturating_sub(session.last_seen.load(Ordering::Relaxed));
                let busy =
                    !lock(&session.calls).is_empty() || session.open.load(Ordering::Relaxed) > 0;
                if quiet < idle_ms || busy {
                    continue;
                }
                tracing::info!(session = %session.session, idle_ms = quiet, "closing an idle client session");
                proxy.sessions.remove_http_session(&http_id);
                session.end();
                if let Err(e) = manager.close_session(&http_id.as_str().into()).await {
                    tracing::debug!(error = %e, "closing an idle session");
                }
            }
            for (http_id, since) in proxy.sessions.pending_sessions() {
                if now.saturating_sub(since) < idle_ms {
                    continue;
                }
                tracing::info!(session = %http_id, "closing a client session that never finished its handshake");
                proxy.sessions.remove_pending(&http_id);
                if let Err(e) = manager.close_session(&http_id.as_str().into()).await {
                    tracing::debug!(error = %e, "closing an unfinished session");
                }
            }
        }
    });
}

/// One SSE event for the call's stream; `last` marks the call's response.
struct Event {
    bytes: Bytes,
    last: bool,
}

/// The response stream of one call on the direct path: where what the upstream sends during the
/// call goes.
#[derive(Clone)]
pub struct CallStream {
    events: mpsc::UnboundedSender<Event>,
    session: Arc<FastSession>,
}

impl std::fmt::Debug for CallStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStream")
            .field("session", &self.session.session)
            .finish_non_exhaustive()
    }
}

impl CallStream {
    fn send(&self, message: &ServerJsonRpcMessage, last: bool) -> bool {
        match serde_json::to_vec(message) {
            Ok(json) => self
                .events
                .send(Event {
                    bytes: sse_event(&json),
                    last,
                })
                .is_ok(),
            Err(e) => {
                tracing::warn!(error = %e, "could not encode a message for the client");
                false
            }
        }
    }

    /// Sends a notification (progress) on the call's stream.
    pub fn notify(&self, notification: ServerNotification) -> bool {
        self.send(&ServerJsonRpcMessage::notification(notification), false)
    }

    /// Sends a request to the client on the call's stream and waits for its answer; `ct`
    /// withdraws it (the client is told with `notifications/cancelled`).
    pub async fn request(
        &self,
        request: ServerRequest,
        ct: &CancellationToken,
    ) -> Result<ClientResult, ErrorData> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = RequestId::String(
            format!("orchestrator-{}", NEXT.fetch_add(1, Ordering::Relaxed)).into(),
        );
        let (tx, rx) = oneshot::channel();
        lock(&self.session.asked).insert(id.clone(), tx);
        let _forget = Forget {
            session: &self.session,
            id: &id,
        };
        if !self.send(&ServerJsonRpcMessage::request(request, id.clone()), false) {
            return Err(ErrorData::internal_error(
                "the client's call this request belongs to has ended",
                None,
            ));
        }
        tokio::select! {
            answer = rx => match answer {
                Ok(Ok(value)) => serde_json::from_value(value).map_err(|e| {
                    ErrorData::invalid_params(format!("the client's answer is not a valid result: {e}"), None)
                }),
                Ok(Err(error)) => Err(error),
                Err(_) => Err(ErrorData::internal_error("the client session ended", None)),
            },
            () = ct.cancelled() => {
                let cancelled = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id.clone()),
                    Some("cancelled by the upstream server".into()),
                ));
                self.notify(ServerNotification::CancelledNotification(cancelled));
                Err(ErrorData::internal_error("cancelled", None))
            }
            () = self.events.closed() => Err(ErrorData::internal_error(
                "the client closed the call's stream before answering",
                None,
            )),
        }
    }
}

/// Removes an unanswered request from the session's table.
struct Forget<'a> {
    session: &'a FastSession,
    id: &'a RequestId,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.session.asked).remove(self.id);
    }
}

fn sse_event(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// What a POST body is, as far as this path cares.
enum Incoming {
    Call(RequestId, CallToolRequestParams),
    Answer(RequestId, Result<serde_json::Value, ErrorData>),
    Cancel(RequestId),
}

#[derive(Deserialize)]
struct Message {
    jsonrpc: Option<String>,
    id: Option<RequestId>,
    method: Option<String>,
    params: Option<serde_json::Value>,
    result: Option<serde_json::Value>,
    error: Option<ErrorData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelParams {
    request_id: RequestId,
}

fn classify(body: &[u8]) -> Option<Incoming> {
    let m: Message = serde_json::from_slice(body).ok()?;
    if m.jsonrpc.as_deref() != Some("2.0") {
        return None;
    }
    match (m.method.as_deref(), m.id) {
        (Some("tools/call"), Some(id)) if m.result.is_none() && m.error.is_none() => {
            let params: CallToolRequestParams = serde_json::from_value(m.params?).ok()?;
            // Per-request protocol keys (2026-07-28 style) are rmcp's to validate.
            let protocol_keys = params.meta.as_ref().is_some_and(|meta| {
                meta.0
                    .0
                    .keys()
                    .any(|k| k.starts_with("io.modelcontextprotocol/"))
            });
            if protocol_keys {
                return None;
            }
            Some(Incoming::Call(id, params))
        }
        (Some("notifications/cancelled"), None) => {
            let params: CancelParams = serde_json::from_value(m.params?).ok()?;
            Some(Incoming::Cancel(params.request_id))
        }
        (None, Some(id)) => match (m.result, m.error) {
            (Some(result), None) => Some(Incoming::Answer(id, Ok(result))),
            (None, Some(error)) => Some(Incoming::Answer(id, Err(error))),
            _ => None,
        },
        _ => None,
    }
}

/// The media-type essences of a header, or `None` when any entry has parameters (those are
/// left to rmcp's full parser).
fn plain_media_types(headers: &HeaderMap, name: header::HeaderName) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for value in headers.get_all(name) {
        for entry in value.to_str().ok()?.split(',') {
            let entry = entry.trim();
            if entry.contains(';') {
                return None;
            }
            out.push(entry.to_ascii_lowercase());
        }
    }
    Some(out)
}

/// Whether a POST on a known session may be read here at all: a JSON body rmcp would read too
/// (it refuses a body without both media types in `Accept` before reading it).
fn readable(headers: &HeaderMap) -> bool {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
        .to_ascii_lowercase();
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split_once(';').map_or(v, |(e, _)| e);
            essence.trim().eq_ignore_ascii_case("application/json")
        });
    // A declared size over the limit: rmcp answers 413 without reading.
    let small = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_none_or(|n| n <= MAX_BODY);
    accept.contains("application/json")
        && accept.contains("text/event-stream")
        && json_body
        && small
}

/// Whether a `tools/call` is the plain case this path serves exactly as rmcp would.
fn call_eligible(headers: &HeaderMap, session: &FastSession) -> bool {
    let accepts = plain_media_types(headers, header::ACCEPT).is_some_and(|types| {
        types.iter().any(|t| t == "application/json")
            && types.iter().any(|t| t == "text/event-stream")
    });
    let version_ok = match headers.get(VERSION_HEADER) {
        None => true,
        Some(v) => v.as_bytes() == session.protocol.as_str().as_bytes(),
    };
    accepts && version_ok
}

/// Middleware on `/mcp`: serves `tools/call` (and the answers and cancellations that belong to
/// calls on this path) directly; passes everything else to rmcp.
pub async fn fast_path(State(proxy): State<Arc<Proxy>>, request: Request, next: Next) -> Response {
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|id| proxy.sessions.http_session(id));
    let Some(session) = session else {
        // An initialize answered with a new session id: remembered until the handshake is
        // done, so that a session that never finishes it is closed when idle too.
        let opens = request.method() == http::Method::POST
            && !request.headers().contains_key(SESSION_HEADER);
        let response = next.run(request).await;
        if opens
            && let Some(id) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
        {
            proxy.sessions.add_pending(id.to_string(), clock_ms());
        }
        return response;
    };
    session.touch();
    // A session that is ending: rmcp says so (404).
    if session.ct.is_cancelled()
        || request.method() != http::Method::POST
        || !readable(request.headers())
    {
        return while_streaming(next.run(request).await, session);
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY as usize).await else {
        // Over the limit (or the client went away while sending).
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Payload Too Large: request body exceeds {MAX_BODY} bytes"),
        )
            .into_response();
    };
    match classify(&bytes) {
        Some(Incoming::Call(id, params)) if call_eligible(&parts.headers, &session) => {
            return call(proxy, session, id, params).await;
        }
        Some(Incoming::Answer(id, answer)) => {
            let waiting = lock(&session.asked).remove(&id);
            if let Some(waiting) = waiting {
                let _ = waiting.send(answer);
                return StatusCode::ACCEPTED.into_response();
            }
        }
        Some(Incoming::Cancel(id)) => {
            let call = lock(&session.calls).get(&id).cloned();
            if let Some(ct) = call {
                ct.cancel();
                return StatusCode::ACCEPTED.into_response();
            }
        }
        _ => {}
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    while_streaming(response, session)
}

async fn call(
    proxy: Arc<Proxy>,
    session: Arc<FastSession>,
    id: RequestId,
    mut params: CallToolRequestParams,
) -> Response {
    tracing::debug!(session = %session.session, request = %id, "tools/call on the direct path");
    let ct = session.ct.child_token();
    lock(&session.calls).insert(id.clone(), ct.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = CallStream {
        events: tx,
        session: session.clone(),
    };
    let req = CallRequest {
        name: params.name.into_owned(),
        arguments: params.arguments.take(),
        input_responses: params.input_responses.take(),
        request_state: params.request_state.take(),
        meta: params.meta.take().unwrap_or_default(),
        request_id: id.clone(),
        ct: ct.clone(),
        session: SessionRef {
            id: session.session,
            peer: session.peer.clone(),
            accepts_requests: true,
            client_info: session.client_info.clone(),
            capabilities: session.capabilities.clone(),
            stream: Some(stream.clone()),
        },
    };
    // The call runs on its own so that it finishes (and is audited) even if the client goes away.
    tokio::spawn(async move {
        let result = proxy.call_tool(req).await;
        lock(&stream.session.calls).remove(&id);
        // The answer is activity too: idle time counts from here.
        stream.session.touch();
        if ct.is_cancelled() {
            // A cancelled request gets no response (as rmcp does); its stream ends here.
            let _ = stream.events.send(Event {
                bytes: Bytes::new(),
                last: true,
            });
        } else {
            let tasks = stream
                .session
                .capabilities
                .as_ref()
                .is_some_and(|c| c.supports_tasks());
            stream.send(&response(result, id, tasks), true);
        }
    });
    let first = tokio::time::timeout(FIRST_EVENT_WAIT, rx.recv()).await;
    match first {
        // The whole answer at once: one write.
        Ok(Some(event)) if event.last => sse_response(Body::from(event.bytes)),
        Ok(Some(event)) => sse_response(Body::from_stream(events(Some(event), rx))),
        Ok(None) => sse_response(Body::empty()),
        Err(_) => sse_response(Body::from_stream(events(None, rx))),
    }
}

/// An SSE comment sent on a quiet call stream, so clients' read timeouts do not fire while a
/// long call runs (rmcp's streams do the same, every 15 s).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The call's events until its response, with keep-alive comments while it is quiet.
fn events(
    first: Option<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::unfold((first, rx, false), |(first, mut rx, done)| async move {
        if let Some(event) = first {
            return Some((Ok(event.bytes), (None, rx, event.last)));
        }
        if done {
            return None;
        }
        tokio::select! {
            event = rx.recv() => {
                let event = event?;
                let last = event.last;
                Some((Ok(event.bytes), (None, rx, last)))
            }
            () = tokio::time::sleep(KEEP_ALIVE) => {
                Some((Ok(Bytes::from_static(b":\n\n")), (None, rx, false)))
            }
        }
    })
}

fn sse_response(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The JSON-RPC response rmcp's server handler would send a client on an initialize-era version.
fn response(
    result: Result<CallToolResponse, ErrorData>,
    id: RequestId,
    client_declared_tasks: bool,
) -> ServerJsonRpcMessage {
    let result = result.and_then(|response| {
        if matches!(response, CallToolResponse::Task(_)) && !client_declared_tasks {
            return Err(ErrorData::missing_required_client_capability(
                ClientCapabilities::builder().enable_tasks().build(),
            ));
        }
        let mut result = ServerResult::from(response);
        if matches!(result, ServerResult::InputRequiredResult(_)) {
            return Err(ErrorData::invalid_request(
                "InputRequiredResult requires negotiated protocol version 2026-07-28 or newer",
                None,
            ));
        }
        result.strip_result_type_for_legacy_peer();
        Ok(result)
    });
    match result {
        Ok(result) => ServerJsonRpcMessage::response(result, id),
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_sorts_the_messages_this_path_takes_and_leaves_the_rest() {
        let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a__b","arguments":{"x":1},"_meta":{"progressToken":3}}}"#;
        let Some(Incoming::Call(id, params)) = classify(call) else {
            panic!("a tools/call is taken");
        };
        assert_eq!(id, RequestId::Number(7));
        assert_eq!(params.name, "a__b");
        assert!(params.meta.is_some());

        let answer = br#"{"jsonrpc":"2.0","id":"orchestrator-1","result":{"roots":[]}}"#;
        assert!(matches!(classify(answer), Some(Incoming::Answer(_, Ok(_)))));
        let error =
            br#"{"jsonrpc":"2.0","id":"orchestrator-1","error":{"code":-1,"message":"no"}}"#;
        assert!(matches!(classify(error), Some(Incoming::Answer(_, Err(_)))));
        let cancel =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#;
        assert!(matches!(
            classify(cancel),
            Some(Incoming::Cancel(RequestId::Number(7)))
        ));

        for other in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}]"#,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            b"not json",
        ] {
            assert!(
                classify(other).is_none(),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_call_stream_gets_keep_alives_and_ends_with_the_response() {
        use futures::StreamExt;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut stream = std::pin::pin!(events(None, rx));
        // Nothing for 15 s: a comment, so the client's read timeout does not fire.
        let quiet = tokio::time::timeout(KEEP_ALIVE + Duration::from_millis(10), stream.next());
        let chunk = quiet.await.ok().flatten().and_then(Result::ok);
        assert_eq!(chunk.as_deref(), Some(&b":\n\n"[..]));
        let event = |text: &'static str, last| Event {
            bytes: Bytes::from_static(text.as_bytes()),
            last,
        };
        tx.send(event("data: progress\n\n", false)).ok();
        tx.send(event("data: response\n\n", true)).ok();
        // Still open senders (a relayed request's clone) do not keep the stream going.
        let _other_sender = tx.clone();
        let rest: Vec<Bytes> = stream.filter_map(|c| async move { c.ok() }).collect().await;
        assert_eq!(
            rest,
            vec![
                Bytes::from_static(b"data: progress\n\n"),
                Bytes::from_static(b"data: response\n\n"),
            ]
        );
    }

    #[test]
    fn only_plain_accept_headers_are_taken() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        assert!(plain_media_types(&h, header::ACCEPT).is_some());
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json;q=0, text/event-stream"),
        );
        assert!(plain_media_types(&h, header::ACCEPT).is_none());
    }
}
