//! Client sessions as the rest of the proxy sees them: an id, the peer to reach the client, and
//! what the client declared. The registry is what `list_changed` fan-out walks.

use crate::sync::lock;
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use rmcp::{
    Peer, RoleServer,
    model::{ClientCapabilities, Implementation, ProtocolVersion},
    service::SubscriptionSink,
};

/// Identifies one client session (a legacy HTTP session, the stdio session, or one 2026-07-28
/// request, which is its own session).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl SessionId {
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SessionId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// The session a request came from, enough to route what an upstream sends back during a call.
#[derive(Clone, Debug)]
pub struct SessionRef {
    pub id: SessionId,
    pub peer: Peer<RoleServer>,
    /// Whether the client may be sent requests (sampling, elicitation, roots). Sessions on
    /// 2026-07-28 may not: that protocol has no server-to-client requests.
    pub accepts_requests: bool,
    /// The revision this request is spoken in: negotiated at `initialize`, or the request's own
    /// for 2026-07-28.
    pub protocol: Option<ProtocolVersion>,
    pub client_info: Option<Implementation>,
    pub capabilities: Option<ClientCapabilities>,
}

/// Where to send `list_changed` notifications.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Legacy sessions (initialize handshake): notified directly.
    sessions: HashMap<SessionId, Peer<RoleServer>>,
    /// 2026-07-28 `subscriptions/listen` streams.
    subscriptions: HashMap<u64, SubscriptionSink>,
    next_subscription: u64,
}

/// What a list changed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
}

impl Registry {
    pub fn add_session(&self, id: SessionId, peer: Peer<RoleServer>) {
        self.lock().sessions.insert(id, peer);
    }

    pub fn remove_session(&self, id: SessionId) {
        self.lock().sessions.remove(&id);
    }

    /// Registers a listen stream; returns the key to remove it with.
    pub fn add_subscription(&self, sink: SubscriptionSink) -> u64 {
        let mut inner = self.lock();
        inner.next_subscription += 1;
        let key = inner.next_subscription;
        inner.subscriptions.insert(key, sink);
        key
    }

    pub fn remove_subscription(&self, key: u64) {
        self.lock().subscriptions.remove(&key);
    }

    /// Number of legacy sessions and listen streams.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.sessions.len(), inner.subscriptions.len())
    }

    /// Sends `notifications/<kind>/list_changed` to every session and every listen stream that
    /// asked for it. Returns how many were sent. Closed sessions are dropped on the way.
    pub async fn notify_list_changed(self: &Arc<Self>, kind: ListKind) -> usize {
        let (sessions, subscriptions) = {
            let mut inner = self.lock();
            inner.sessions.retain(|_, peer| !peer.is_transport_closed());
            let sessions: Vec<Peer<RoleServer>> = inner.sessions.values().cloned().collect();
            let subs: Vec<(u64, SubscriptionSink)> = inner
                .subscriptions
                .iter()
                .map(|(k, s)| (*k, s.clone()))
                .collect();
            (sessions, subs)
        };
        let mut sent = 0;
        for peer in sessions {
            let result = match kind {
                ListKind::Tools => peer.notify_tool_list_changed().await,
                ListKind::Prompts => peer.notify_prompt_list_changed().await,
                ListKind::Resources => peer.notify_resource_list_changed().await,
            };
            match result {
                Ok(()) => sent += 1,
                Err(e) => tracing::debug!(error = %e, "could not notify a session"),
            }
        }
        for (key, sink) in subscriptions {
            let wanted = match kind {
                ListKind::Tools => sink.accepted().tools_list_changed,
                ListKind::Prompts => sink.accepted().prompts_list_changed,
                ListKind::Resources => sink.accepted().resources_list_changed,
            };
            if wanted != Some(true) {
                continue;
            }
            let result = match kind {
                ListKind::Tools => sink.notify_tool_list_changed().await,
                ListKind::Prompts => sink.notify_prompt_list_changed().await,
                ListKind::Resources => sink.notify_resource_list_changed().await,
            };
            match result {
                Ok(()) => sent += 1,
                Err(e) => {
                    tracing::debug!(error = %e, "listen stream is gone");
                    self.remove_subscription(key);
                }
            }
        }
        sent
    }

    /// Tells listen streams that subscribed to `uri` that it changed.
    pub async fn notify_resource_updated(&self, uri: &str) {
        let sinks: Vec<SubscriptionSink> = self
            .lock()
            .subscriptions
            .values()
            .filter(|s| {
                s.accepted()
                    .resource_subscriptions
                    .as_ref()
                    .is_some_and(|u| u.iter().any(|x| x == uri))
            })
            .cloned()
            .collect();
        for sink in sinks {
            let _ = sink.notify_resource_updated(uri).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        lock(&self.inner)
    }
}
