//! Prompts, resources, completions and logging levels of the upstreams, relayed as they are
//! (prompt names get the same prefix as tools; resource URIs are global and stay unchanged).
//! Tools are the contract; this is the cheap rest. No filtering applies here.
//!
//! Laziness: a list request (`prompts/list`, `resources/list`, `resources/templates/list`) never
//! starts a server; only running servers answer it (clients such as Claude Code send them right
//! after connecting, and that must not start anything). A server that starts later and offers
//! prompts or resources makes the proxy send `list_changed` (see `Upstream::connect`). A request
//! for a named prompt or URI (`prompts/get`, `resources/read`, subscribe, completions) is an
//! explicit use: it may start the server it needs, or, to find it, the servers that may offer
//! the feature (capabilities unknown or including it).
//!
//! Children: `prompts` (list, get, completions), `resources` (list, templates, read,
//! subscribe).
// Logging and resources/subscribe are deprecated by SEP-2577 but still part of the legacy
// protocol versions the proxy relays.
#![allow(deprecated)]

mod prompts;
mod resources;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use rmcp::{
    Peer, RoleServer,
    model::{
        ClientRequest, LoggingLevel, PaginatedRequestParams, RequestMetaObject, ServerCapabilities,
        ServerResult, SetLevelRequest, SetLevelRequestParams,
    },
    service::PeerRequestOptions,
};

use crate::{
    config::Server,
    error::{Error, Result},
    names::{ServerName, clip},
    session::{SessionId, SessionRef},
    sync::lock,
    upstream::{Connection, StartReason},
};

use super::Snapshot;

/// What a passthrough request needs from servers.
#[derive(Clone, Copy, Debug)]
pub enum Feature {
    Prompts,
    Resources,
}

impl Feature {
    fn offered_by(self, caps: &ServerCapabilities) -> bool {
        match self {
            Feature::Prompts => caps.prompts.is_some(),
            Feature::Resources => caps.resources.is_some(),
        }
    }
    fn label(self) -> &'static str {
        match self {
            Feature::Prompts => "prompts",
            Feature::Resources => "resources",
        }
    }
}

/// Which servers a passthrough request reaches.
#[derive(Clone, Copy, Debug)]
enum Reach {
    /// Only those running now (list requests).
    Running,
    /// Those that may offer the feature, started if needed, for this method (explicit use).
    Start(&'static str),
}

/// Routing learned from list results, and client state to replay on new upstreams.
#[derive(Default)]
pub struct Passthrough {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    prompts: HashMap<String, ServerName>,
    resources: HashMap<String, ServerName>,
    /// URI template prefix (text before the first `{`) -> server.
    templates: Vec<(String, ServerName)>,
    /// Legacy `resources/subscribe`: URI -> sessions to tell about updates.
    subscriptions: HashMap<String, Vec<(SessionId, Peer<RoleServer>)>>,
    /// Resource update streams opened to 2026-07-28 upstreams, per server and URI: how many
    /// client subscriptions share it, and what ends it.
    upstream_listens: HashMap<(ServerName, String), (usize, tokio_util::sync::CancellationToken)>,
}

impl Passthrough {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Sessions subscribed to `uri` (legacy `resources/subscribe`).
    pub fn subscribers(&self, uri: &str) -> Vec<Peer<RoleServer>> {
        let mut inner = self.lock();
        let Some(list) = inner.subscriptions.get_mut(uri) else {
            return Vec::new();
        };
        list.retain(|(_, p)| !p.is_transport_closed());
        list.iter().map(|(_, p)| p.clone()).collect()
    }
}

/// The relayed rest of MCP, over the proxy's upstreams and its current table: what
/// [`super::Proxy::relay`] gives the front for every request that is not about tools.
pub struct Relay<'a> {
    pub(in crate::proxy) pool: &'a crate::upstream::pool::Pool,
    pub(in crate::proxy) passthrough: &'a Passthrough,
    pub(in crate::proxy) current: &'a arc_swap::ArcSwapOption<Snapshot>,
}

fn not_found(what: &'static str, name: &str) -> Error {
    Error::NotFound {
        what,
        name: clip(name).into_owned(),
    }
}

impl Relay<'_> {
    fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.current.load_full()
    }

    /// Live connections of the startable servers that offer `feature`: the running ones, or with
    /// [`Reach::Start`] also those started now (capabilities unknown or including the feature).
    async fn connections_for(
        &self,
        feature: Feature,
        reach: Reach,
        session: &SessionRef,
    ) -> Vec<(Arc<Server>, Arc<Connection>)> {
        let Some(snap) = self.snapshot() else {
            return Vec::new();
        };
        let wanted: Vec<Arc<Server>> = snap
            .config
            .servers
            .iter()
            .filter(|s| s.is_startable())
            .filter(|s| {
                self.pool
                    .capabilities(s)
                    .is_none_or(|c| feature.offered_by(&c))
            })
            .cloned()
            .collect();
        let what = match reach {
            Reach::Start(what) => what,
            Reach::Running => {
                return wanted
                    .into_iter()
                    .filter_map(|s| {
                        let conn = self
                            .pool
                            .existing(&s.name)
                            .filter(|u| u.server.spec_hash == s.spec_hash)
                            .and_then(|u| u.current())?;
                        Some((s, conn))
                    })
                    .filter(|(_, conn)| offers(conn, feature))
                    .collect();
            }
        };
        let reason = StartReason::Passthrough(what);
        let connects = wanted.into_iter().map(|server| {
            let reason = reason.clone();
            async move {
                let upstream = self.pool.upstream(&server);
                match upstream.connect(&reason, Some(session)).await {
                    Ok(conn) => Some((server, conn)),
                    Err(e) => {
                        tracing::warn!(server = %server.name, error = %e, feature = feature.label(), "upstream unavailable; left out");
                        None
                    }
                }
            }
        });
        futures::future::join_all(connects)
            .await
            .into_iter()
            .flatten()
            .filter(|(_, conn)| offers(conn, feature))
            .collect()
    }

    async fn relay(
        &self,
        conn: &Connection,
        server: &ServerName,
        request: ClientRequest,
        meta: &RequestMetaObject,
    ) -> Result<ServerResult> {
        let timeout = self
            .snapshot()
            .map(|s| s.config.call_timeout)
            .unwrap_or(Duration::from_secs(60));
        let modern = conn.protocol >= rmcp::model::ProtocolVersion::V_2026_07_28;
        let options =
            PeerRequestOptions::with_timeout(timeout).with_meta(super::upstream_meta(meta, modern));
        let handle = conn
            .peer
            .send_request_with_option(request, options)
            .await
            .map_err(|source| Error::Upstream {
                server: server.clone(),
                source,
            })?;
        handle
            .await_response()
            .await
            .map_err(|source| match source {
                rmcp::ServiceError::Timeout { .. } => Error::Timeout {
                    server: server.clone(),
                    timeout,
                },
                source => match crate::upstream::http::protocol_failure(&source) {
                    Some(what) => Error::UpstreamProtocol {
                        server: server.clone(),
                        what,
                    },
                    None => Error::Upstream {
                        server: server.clone(),
                        source,
                    },
                },
            })
    }

    /// A request for one named thing (`what`: a prompt, a resource, a completion) to `server`,
    /// started if needed, the client's `_meta` carried as [`Self::relay`] does.
    async fn relay_named(
        &self,
        server: &ServerName,
        session: &SessionRef,
        what: &'static str,
        request: ClientRequest,
        meta: &RequestMetaObject,
    ) -> Result<ServerResult> {
        let conn = self.connection_of(server, session, what).await?;
        self.relay(&conn, server, request, meta).await
    }

    /// Every page of a list request (`what`) to `server`: `request` makes the request for a
    /// cursor, `page` takes a page's items and next cursor out of the result (`None`: another
    /// kind of result).
    async fn list_all<T>(
        &self,
        conn: &Connection,
        server: &ServerName,
        what: &'static str,
        meta: &RequestMetaObject,
        request: impl Fn(PaginatedRequestParams) -> ClientRequest,
        page: impl Fn(ServerResult) -> Option<(Vec<T>, Option<String>)>,
    ) -> Result<Vec<T>> {
        let mut items = Vec::new();
        let mut cursor = None;
        loop {
            let result = self
                .relay(conn, server, request(paginated(cursor.take())), meta)
                .await?;
            let (mut batch, next) = page(result).ok_or_else(|| unexpected(server, what))?;
            items.append(&mut batch);
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(items),
            }
        }
    }

    async fn connection_of(
        &self,
        server: &ServerName,
        session: &SessionRef,
        what: &'static str,
    ) -> Result<Arc<Connection>> {
        let snap = self.snapshot().ok_or(Error::NotReady)?;
        let server = snap
            .config
            .server(server.as_str())
            .filter(|s| s.is_startable())
            .cloned()
            .ok_or_else(|| not_found("server", server.as_str()))?;
        self.pool
            .upstream(&server)
            .connect(&StartReason::Passthrough(what), Some(session))
            .await
    }

    /// `logging/setLevel`: remembered for servers started later, sent to running ones that log.
    pub async fn set_level(&self, level: LoggingLevel, meta: &RequestMetaObject) -> Result<()> {
        self.pool.deps().shared.set_log_level(level);
        for (server, conn) in self.pool.live() {
            let logs = conn
                .peer
                .peer_info()
                .is_some_and(|i| i.capabilities.logging.is_some());
            // 2026-07-28 has no logging/setLevel: the level travels in each request's _meta.
            if conn.protocol >= rmcp::model::ProtocolVersion::V_2026_07_28 || !logs {
                continue;
            }
            let request = ClientRequest::SetLevelRequest(SetLevelRequest::new(
                SetLevelRequestParams::new(level),
            ));
            if let Err(e) = self.relay(&conn, &server, request, meta).await {
                tracing::warn!(%server, error = %e, "upstream refused logging/setLevel");
            }
        }
        Ok(())
    }

    /// `notifications/roots/list_changed` from a client: every running upstream may depend on it.
    pub async fn roots_changed(&self) {
        for (server, conn) in self.pool.live() {
            if let Err(e) = conn.peer.notify_roots_list_changed().await {
                tracing::debug!(%server, error = %e, "could not forward roots/list_changed");
            }
        }
    }
}

fn offers(conn: &Connection, feature: Feature) -> bool {
    conn.peer
        .peer_info()
        .is_some_and(|i| feature.offered_by(&i.capabilities))
}

fn unexpected(server: &ServerName, method: &'static str) -> Error {
    Error::UnexpectedResult {
        server: server.clone(),
        method,
    }
}

fn paginated(cursor: Option<String>) -> PaginatedRequestParams {
    let mut p = PaginatedRequestParams::default();
    p.cursor = cursor;
    p
}
