//! Which client session each in-flight call on one upstream belongs to, so that what the upstream
//! sends during a call (progress, log messages, sampling/elicitation/roots requests) reaches the
//! session that made the call. Progress and log notifications are forwarded by one task per
//! upstream, in the order the upstream sent them.
// Logging is deprecated by SEP-2577 but still part of the protocol versions we relay.
#![allow(deprecated)]

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rmcp::model::{
    ClientResult, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
    RequestId, ServerNotification, ServerRequest,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    error::Error,
    session::{SessionId, SessionRef},
    sync::lock,
};

/// A question the upstream asked during a call whose client cannot take server-to-client
/// requests (2026-07-28), and where its answer goes (see `proxy::bridge`).
pub struct Ask {
    pub request: ServerRequest,
    pub answer: tokio::sync::oneshot::Sender<Result<ClientResult, Error>>,
}

/// Progress that arrived before its call registered is kept this long.
const EARLY_PROGRESS_TTL: Duration = Duration::from_secs(5);
const EARLY_PROGRESS_MAX: usize = 64;

/// Messages for the ordered forwarder of one upstream.
pub enum Forward {
    /// A progress or log notification from the upstream, in arrival order.
    Notification(ServerNotification),
    /// A call registered its upstream progress token: deliver anything that came early.
    Registered(ProgressToken),
    /// Answered once everything queued before it has been forwarded: a call's result must not
    /// overtake the progress notifications the upstream sent before it.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

struct CallRoute {
    session: SessionRef,
    /// The client's request id of the call (the stream a relayed request must ride on).
    front_request: RequestId,
    /// The progress token the client gave (what it expects to see), if any.
    client_token: Option<ProgressToken>,
    upstream_token: Option<ProgressToken>,
    /// For a client that cannot take server-to-client requests: where the upstream's questions
    /// go instead (see `bridge`).
    asks: Option<mpsc::UnboundedSender<Ask>>,
    request_id: Option<RequestId>,
    /// Ends the client's answer stream of the call (initialize-era HTTP sessions only), when
    /// the upstream ended its own before answering (see [`CallRoutes::stream_cut`]).
    stream_cut: Option<CancellationToken>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// In-flight calls, oldest first.
    calls: BTreeMap<u64, CallRoute>,
    by_token: HashMap<ProgressToken, u64>,
    by_request: HashMap<RequestId, u64>,
    /// The session that used this upstream last (for messages outside any call).
    last_session: Option<SessionRef>,
}

/// Where a request from the upstream goes.
pub struct Target {
    pub session: SessionRef,
    /// The client's request id of the call it belongs to.
    pub front_request: Option<RequestId>,
    pub asks: Option<mpsc::UnboundedSender<Ask>>,
}

/// The in-flight calls of one upstream connection.
#[derive(Default)]
pub struct CallRoutes {
    inner: Mutex<Inner>,
}

/// Keeps a call registered; dropping it unregisters the call.
pub struct CallGuard {
    routes: Arc<CallRoutes>,
    id: u64,
}

impl CallRoutes {
    /// Registers a call from `session` before it is sent upstream.
    pub fn begin(
        self: &Arc<Self>,
        session: SessionRef,
        front_request: RequestId,
        client_token: Option<ProgressToken>,
        asks: Option<mpsc::UnboundedSender<Ask>>,
        stream_cut: Option<CancellationToken>,
    ) -> CallGuard {
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        inner.last_session = Some(session.clone());
        inner.calls.insert(
            id,
            CallRoute {
                session,
                front_request,
                client_token,
                upstream_token: None,
                request_id: None,
                asks,
                stream_cut,
            },
        );
        CallGuard {
            routes: self.clone(),
            id,
        }
    }

    /// The session that started the upstream: it gets what the server asks right after start
    /// (e.g. `roots/list` on initialization).
    pub fn seed(&self, session: SessionRef) {
        let mut inner = self.lock();
        if inner.last_session.is_none() {
            inner.last_session = Some(session);
        }
    }

    /// The upstream ended the answer stream of its request `upstream_request` before answering
    /// (it asks the proxy to resume with `Last-Event-ID`, SEP-1699): the client's stream of that
    /// call is ended too, so the client resumes from the proxy as it would from the server, and
    /// gets the answer on its resumed stream.
    pub fn stream_cut(&self, upstream_request: &RequestId) {
        let inner = self.lock();
        let call = inner
            .by_request
            .get(upstream_request)
            .and_then(|c| inner.calls.get(c));
        if let Some(cut) = call.and_then(|c| c.stream_cut.as_ref()) {
            tracing::debug!(request = %upstream_request, "the upstream ended a call's stream before its answer; ending the client's too");
            cut.cancel();
        }
    }

    /// Number of calls in flight.
    pub fn in_flight(&self) -> usize {
        self.lock().calls.len()
    }

    /// Sessions with calls in flight, oldest call first, each once.
    fn active_sessions(&self) -> Vec<SessionRef> {
        let inner = self.lock();
        let mut seen: Vec<SessionId> = Vec::new();
        let mut out = Vec::new();
        for route in inner.calls.values() {
            if !seen.contains(&route.session.id) {
                seen.push(route.session.id);
                out.push(route.session.clone());
            }
        }
        if out.is_empty() {
            out.extend(inner.last_session.clone());
        }
        out
    }

    /// The session an upstream request (sampling, elicitation, roots) belongs to: the call whose
    /// upstream request id the transport associated it with, else the newest call in flight,
    /// else the session that used this upstream last.
    /// Also returns the client's request id of that call and its question channel, when there
    /// is a call.
    pub fn session_for_request(&self, origin: Option<&RequestId>) -> Option<Target> {
        let inner = self.lock();
        let call = origin
            .and_then(|id| inner.by_request.get(id))
            .and_then(|c| inner.calls.get(c))
            .or_else(|| inner.calls.values().next_back());
        if let Some(call) = call {
            return Some(Target {
                session: call.session.clone(),
                front_request: Some(call.front_request.clone()),
                asks: call.asks.clone(),
            });
        }
        inner.last_session.clone().map(|session| Target {
            session,
            front_request: None,
            asks: None,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        lock(&self.inner)
    }
}

impl CallGuard {
    /// Records the upstream request id and progress token of the call once sent.
    pub fn sent(
        &self,
        request_id: RequestId,
        upstream_token: ProgressToken,
        forwarder: &mpsc::UnboundedSender<Forward>,
    ) {
        {
            let mut inner = self.routes.lock();
            inner.by_token.insert(upstream_token.clone(), self.id);
            inner.by_request.insert(request_id.clone(), self.id);
            if let Some(call) = inner.calls.get_mut(&self.id) {
                call.upstream_token = Some(upstream_token.clone());
                call.request_id = Some(request_id);
            }
        }
        let _ = forwarder.send(Forward::Registered(upstream_token));
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut inner = self.routes.lock();
        if let Some(call) = inner.calls.remove(&self.id) {
            if let Some(t) = call.upstream_token {
                inner.by_token.remove(&t);
            }
            if let Some(r) = call.request_id {
                inner.by_request.remove(&r);
            }
        }
    }
}

/// Forwards progress and log notifications of one upstream, in order, until the channel closes.
pub async fn run_forwarder(routes: Arc<CallRoutes>, mut rx: mpsc::UnboundedReceiver<Forward>) {
    let mut early: VecDeque<(Instant, ProgressNotificationParam)> = VecDeque::new();
    while let Some(msg) = rx.recv().await {
        match msg {
            Forward::Notification(ServerNotification::ProgressNotification(n)) => {
                if !forward_progress(&routes, n.params.clone()).await {
                    early.retain(|(at, _)| at.elapsed() < EARLY_PROGRESS_TTL);
                    if early.len() == EARLY_PROGRESS_MAX {
                        early.pop_front();
                    }
                    early.push_back((Instant::now(), n.params));
                }
            }
            Forward::Notification(ServerNotification::LoggingMessageNotification(n)) => {
                forward_log(&routes, n.params).await;
            }
            Forward::Notification(_) => {}
            Forward::Barrier(done) => {
                let _ = done.send(());
            }
            Forward::Registered(token) => {
                let (ready, rest): (Vec<_>, Vec<_>) = early
                    .drain(..)
                    .partition(|(_, p)| p.progress_token == token);
                early.extend(rest);
                for (_, p) in ready {
                    forward_progress(&routes, p).await;
                }
            }
        }
    }
}

/// Returns false when no call owns the token (yet).
async fn forward_progress(routes: &CallRoutes, mut params: ProgressNotificationParam) -> bool {
    let target = {
        let inner = routes.lock();
        inner
            .by_token
            .get(&params.progress_token)
            .and_then(|id| inner.calls.get(id))
            .map(|call| (call.session.clone(), call.client_token.clone()))
    };
    let Some((session, client_token)) = target else {
        return false;
    };
    // The client asked for no progress: nothing to deliver, but the token was known.
    let Some(client_token) = client_token else {
        return true;
    };
    params.progress_token = client_token;
    if let Err(e) = session.peer.notify_progress(params).await {
        tracing::debug!(session = %session.id, error = %e, "could not forward progress");
    }
    true
}

async fn forward_log(routes: &CallRoutes, params: LoggingMessageNotificationParam) {
    for session in routes.active_sessions() {
        if let Err(e) = session.peer.notify_logging_message(params.clone()).await {
            tracing::debug!(session = %session.id, error = %e, "could not forward a log message");
        }
    }
}
