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
    body::{Body, Bytes},
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

use super::limits::{MAX_BODY, initialize_id, json_rpc_error, may_open_session, modern};
use crate::{error::Error, sync::lock};

const SESSION_HEADER: &str = "mcp-session-id";

/// Put in the extensions of every request of an initialize-era session (rmcp hands them to the
/// handler with the request's parts): cancelling it ends the request's answer stream to the
/// client, who can resume it with `Last-Event-ID`. It also keeps its session busy for as long as
/// the handler holds the request (a call in flight, its answer stream cut or not).
#[derive(Clone)]
pub struct StreamCut {
    pub cut: CancellationToken,
    _busy: Arc<Busy>,
}

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

    /// Records a use of a session the cap knows (only an `initialize` answer makes one known: an
    /// id a client made up never becomes an entry).
    fn touch(&self, id: &str, busy: isize) {
        if let Some(u) = lock(&self.uses).get_mut(id) {
            u.last = Instant::now();
            u.busy = u.busy.saturating_add_signed(busy);
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
        // Busy from now: rmcp may still be handling the request when another client knocks.
        cap.touch(&id, 1);
        let busy = Arc::new(Busy { cap, id });
        let cut = CancellationToken::new();
        request.extensions_mut().insert(StreamCut {
            cut: cut.clone(),
            _busy: busy.clone(),
        });
        return busy_while_answering(busy, cut, next.run(request).await);
    }
    if request.method() == http::Method::POST && modern(request.headers()) {
        return removed_initialize(request, next).await;
    }
    if !may_open_session(&request) {
        return next.run(request).await;
    }
    let creating = cap.creating.lock().await;
    let mut open: Vec<Arc<str>> = cap.manager.sessions.read().await.keys().cloned().collect();
    if open.len() >= cap.max {
        let (parts, bytes) = whole(request).await;
        // Only an `initialize` that rmcp will take makes room (one it refuses must not close a
        // session for nothing).
        let Some(id) = initialize_id(&bytes).filter(|_| takes_initialize(&parts.headers)) else {
            drop(creating);
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
        };
        let mut room = false;
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

/// 2026-07-28 removed `initialize`: one sent in that revision is an unknown method (HTTP 404,
/// -32601), whatever its params (rmcp would open an initialize-era session for it).
async fn removed_initialize(request: Request, next: Next) -> Response {
    let (parts, bytes) = whole(request).await;
    if let Some(id) = initialize_id(&bytes) {
        return json_rpc_error(
            StatusCode::NOT_FOUND,
            Error::UnknownMethod("initialize".into()),
            Some(id),
        );
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The request's parts and its body (already whole, `read_body`: this only takes it).
async fn whole(request: Request) -> (http::request::Parts, Bytes) {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    (parts, bytes)
}

/// Whether rmcp takes an `initialize` with these headers (what it checks before the body): JSON,
/// and an `Accept` of both answer kinds.
fn takes_initialize(headers: &http::HeaderMap) -> bool {
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    accept.contains("application/json") && accept.contains("text/event-stream")
}

/// Registers the session an `initialize` answer opened.
fn opened(cap: &SessionCap, response: Response) -> Response {
    if let Some(id) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        lock(&cap.uses).insert(
            id.into(),
            Use {
                last: Instant::now(),
                busy: 0,
            },
        );
    }
    response
}

/// Keeps the session busy until `response`'s body has been sent or dropped (and the handler let
/// go of the request); ends the body when `cut` is cancelled.
fn busy_while_answering(busy: Arc<Busy>, cut: CancellationToken, response: Response) -> Response {
    if response.status() == StatusCode::NOT_FOUND {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = body
        .into_data_stream()
        .take_until(cut.cancelled_owned())
        .map(move |chunk| {
            let _ = &busy;
            chunk
        });
    Response::from_parts(parts, Body::from_stream(body))
}

/// A session's busy mark, ended when the last holder (the answer's body, the request in the
/// handler) lets go.
struct Busy {
    cap: Arc<SessionCap>,
    id: Arc<str>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.cap.touch(&self.id, -1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sessions_an_initialize_opened_are_tracked_and_the_idle_least_recent_goes_first() {
        let cap = SessionCap::new(Arc::new(LocalSessionManager::default()), 2);
        // Ids a client makes up never become entries, however many.
        for i in 0..1000 {
            cap.touch(&format!("made-up-{i}"), 1);
        }
        assert!(lock(&cap.uses).is_empty());
        let known = |id: &str| {
            lock(&cap.uses).insert(
                id.into(),
                Use {
                    last: Instant::now(),
                    busy: 0,
                },
            );
        };
        known("old");
        known("new");
        cap.touch("old", 1); // busy now, and the most recent
        let open: Vec<Arc<str>> = vec!["old".into(), "new".into(), "gone".into()];
        assert_eq!(
            cap.pick_idle(&open).as_deref(),
            Some("new"),
            "busy sessions are never picked"
        );
        cap.touch("old", -1);
        cap.touch("new", 0);
        assert_eq!(cap.pick_idle(&open).as_deref(), Some("old"));
        let open: Vec<Arc<str>> = vec!["new".into()];
        cap.pick_idle(&open);
        assert_eq!(lock(&cap.uses).len(), 1, "closed sessions are forgotten");
    }
}
