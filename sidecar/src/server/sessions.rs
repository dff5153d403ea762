//! The cap on initialize-era HTTP sessions, and what happens at it: a new `initialize` is served
//! by closing the least recently used idle session (its client, if it comes back, gets the
//! spec's 404 and initializes again). A session is busy, and never closed for room, while a
//! request of it is being answered: a call in flight (its SSE answer stream is open) or its GET
//! stream. Only when every session is busy does an `initialize` get HTTP 503
//! (`PROXY.TOO_MANY_SESSIONS`).
//!
//! Most clients never send `DELETE` (they end, crash or restart), so without eviction a cap meant
//! to bound memory would lock out the only client the proxy has once it had reconnected `max`
//! times.
//!
//! A request of a session also carries a [`StreamCut`]: a call's answer stream can be ended by
//! the proxy (as its upstream ended its own, mid-call) and the client resumes it with
//! `Last-Event-ID`, from the events rmcp keeps per stream.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    body::Body,
    extract::{Request, State},
    http::StatusCode,
    middleware::Next,
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use rmcp::transport::streamable_http_server::{
    SessionManager, session::local::LocalSessionManager,
};
use tokio_util::sync::CancellationToken;

use super::limits::{MAX_BODY, initialize_id, json_rpc_error, may_open_session};
use crate::{error::Error, sync::lock};

const SESSION_HEADER: &str = "mcp-session-id";

/// Put in the extensions of every request of an initialize-era session (rmcp hands them to the
/// handler with the request's parts): cancelling it ends the request's answer stream to the
/// client, who can resume it with `Last-Event-ID`.
#[derive(Clone, Debug)]
pub struct StreamCut(pub CancellationToken);

/// What the cap knows of one session.
#[derive(Debug, Clone, Copy)]
struct Use {
    /// When a request of it last arrived or its last answer ended.
    last: Instant,
    /// Answers of it being sent now (open SSE streams: calls in flight, the GET stream).
    busy: usize,
}

/// The cap on initialize-era sessions.
pub struct SessionCap {
    pub manager: Arc<LocalSessionManager>,
    pub max: usize,
    /// Held from the count to the session's creation, so concurrent `initialize`s cannot
    /// overshoot the cap.
    creating: tokio::sync::Mutex<()>,
    uses: Mutex<HashMap<Arc<str>, Use>>,
}

impl SessionCap {
    pub fn new(manager: Arc<LocalSessionManager>, max: usize) -> Self {
        Self {
            manager,
            max,
            creating: Default::default(),
            uses: Default::default(),
        }
    }

    fn touch(&self, id: &str, busy: isize) {
        let mut uses = lock(&self.uses);
        let now = Instant::now();
        match uses.get_mut(id) {
            Some(u) => {
                u.last = now;
                u.busy = u.busy.saturating_add_signed(busy);
            }
            None if busy >= 0 => {
                uses.insert(
                    id.into(),
                    Use {
                        last: now,
                        busy: busy.unsigned_abs(),
                    },
                );
            }
            None => {}
        }
    }

    /// The session to close for room: the least recently used one with nothing in flight.
    /// Forgets sessions rmcp closed meanwhile (DELETE, idle expiry).
    fn pick_idle(&self, open: &[Arc<str>]) -> Option<Arc<str>> {
        let mut uses = lock(&self.uses);
        uses.retain(|id, _| open.contains(id));
        let now = Instant::now();
        open.iter()
            .map(|id| {
                // A session the cap has no record of counts as just used: never closed first.
                let u = uses.get(id).copied().unwrap_or(Use { last: now, busy: 0 });
                (id, u)
            })
            .filter(|(_, u)| u.busy == 0)
            .min_by_key(|(_, u)| u.last)
            .map(|(id, _)| id.clone())
    }
}

/// Marks the session a request belongs to as used (and busy while its answer is sent), and
/// makes room for a new session at the cap by closing the least recently used idle one. Only
/// when every session is busy is an `initialize` refused with a JSON-RPC error
/// (`PROXY.TOO_MANY_SESSIONS`, HTTP 503).
pub async fn session_cap(
    State(cap): State<Arc<SessionCap>>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(id) = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(Arc::<str>::from)
    {
        if request.method() == http::Method::DELETE {
            lock(&cap.uses).remove(&id);
            // rmcp accepts a DELETE of any id; the spec's answer to an unknown one is 404.
            if !cap.manager.sessions.read().await.contains_key(&id) {
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
            return next.run(request).await;
        }
        let cut = CancellationToken::new();
        request.extensions_mut().insert(StreamCut(cut.clone()));
        return busy_while_answering(cap, id, cut, next.run(request).await);
    }
    if !may_open_session(&request) {
        return next.run(request).await;
    }
    let creating = cap.creating.lock().await;
    let mut open: Vec<Arc<str>> = cap.manager.sessions.read().await.keys().cloned().collect();
    if open.len() >= cap.max {
        let (parts, body) = request.into_parts();
        // The body is already whole (`read_body`): this only takes it.
        let bytes = axum::body::to_bytes(body, MAX_BODY)
            .await
            .unwrap_or_default();
        let Some(id) = initialize_id(&bytes) else {
            drop(creating);
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
        };
        let mut room = open.len() < cap.max;
        for _ in cap.max..=open.len() {
            let Some(victim) = cap.pick_idle(&open) else {
                break;
            };
            let _ = cap.manager.close_session(&victim).await;
            lock(&cap.uses).remove(&victim);
            open.retain(|id| *id != victim);
            tracing::info!(session = %victim, limit = cap.max, "closed the least recently used idle client session to make room for a new one (its client gets 404 and can initialize again)");
            room = cap.manager.sessions.read().await.len() < cap.max;
            if room {
                break;
            }
        }
        if !room {
            tracing::warn!(
                limit = cap.max,
                "refused a new client session: every open one is busy"
            );
            return json_rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                Error::TooManySessions { limit: cap.max },
                Some(id),
            );
        }
        let response = next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
        return opened(&cap, response);
    }
    let response = next.run(request).await;
    drop(creating);
    opened(&cap, response)
}

/// Registers the session an `initialize` answer opened.
fn opened(cap: &SessionCap, response: Response) -> Response {
    if let Some(id) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        cap.touch(id, 0);
    }
    response
}

/// Counts the session busy until `response`'s body has been sent or dropped; ends the body when
/// `cut` is cancelled.
fn busy_while_answering(
    cap: Arc<SessionCap>,
    id: Arc<str>,
    cut: CancellationToken,
    response: Response,
) -> Response {
    if response.status() == StatusCode::NOT_FOUND {
        return response;
    }
    cap.touch(&id, 1);
    let done = Done { cap, id };
    let (parts, body) = response.into_parts();
    let body = body
        .into_data_stream()
        .take_until(cut.cancelled_owned())
        .map(move |chunk| {
            let _ = &done;
            chunk
        });
    Response::from_parts(parts, Body::from_stream(body))
}

/// Ends a session's busy mark when its answer's body is gone.
struct Done {
    cap: Arc<SessionCap>,
    id: Arc<str>,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.cap.touch(&self.id, -1);
    }
}
