//! Prompts, resources, completions and logging levels of the upstreams, relayed as they are
//! (prompt names get the same prefix as tools; resource URIs are global and stay unchanged).
//! Tools are the contract; this is the cheap rest. No filtering applies here.
//!
//! Laziness: a list request starts a server only when its capabilities are not known yet, or it
//! is known to offer the feature; a server known not to offer prompts is never started for
//! `prompts/list`.
// Logging and resources/subscribe are deprecated by SEP-2577 but still part of the legacy
// protocol versions the proxy relays.
#![allow(deprecated)]

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use orchestrator_crds::proxy::{PREFIX_SEPARATOR, ToolPrefix};
use rmcp::{
    Peer, RoleServer,
    model::{
        ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest,
        GetPromptRequestParams, GetPromptResponse, ListPromptsRequest,
        ListResourceTemplatesRequest, ListResourcesRequest, LoggingLevel, PaginatedRequestParams,
        Prompt, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse, Reference,
        RequestMetaObject, Resource, ResourceTemplate, ServerCapabilities, ServerResult,
        SetLevelRequest, SetLevelRequestParams, SubscribeRequest, SubscribeRequestParams,
        UnsubscribeRequest, UnsubscribeRequestParams,
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

use super::Proxy;

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

fn not_found(what: &'static str, name: &str) -> Error {
    Error::NotFound {
        what,
        name: clip(name).into_owned(),
    }
}

impl Proxy {
    /// Live connections of the startable servers that offer `feature` (starting those whose
    /// capabilities are unknown or include it).
    async fn connections_for(
        &self,
        feature: Feature,
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
        let reason = StartReason::Passthrough(match feature {
            Feature::Prompts => "prompts/list",
            Feature::Resources => "resources/list",
        });
        let connects = wanted.into_iter().map(|server| {
            let reason = reason.clone();
            async move {
                let upstream = self.pool.upstream(&server);
                match upstream.connect(&reason, Some(session), false).await {
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
            .filter(|(_, conn)| {
                conn.peer
                    .peer_info()
                    .is_some_and(|i| feature.offered_by(&i.capabilities))
            })
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
                source => Error::Upstream {
                    server: server.clone(),
                    source,
                },
            })
    }

    fn exposed_prompt(&self, server: &ServerName, name: &str) -> String {
        match self.snapshot().map(|s| s.config.tool_prefix) {
            Some(ToolPrefix::None) => name.to_string(),
            _ => format!("{server}{PREFIX_SEPARATOR}{name}"),
        }
    }

    pub async fn list_prompts(
        &self,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<Prompt>> {
        let mut out = Vec::new();
        let mut routes = HashMap::new();
        for (server, conn) in self.connections_for(Feature::Prompts, session).await {
            let mut cursor = None;
            loop {
                let request = ClientRequest::ListPromptsRequest(ListPromptsRequest::with_param(
                    paginated(cursor.take()),
                ));
                let ServerResult::ListPromptsResult(page) =
                    self.relay(&conn, &server.name, request, meta).await?
                else {
                    return Err(unexpected(&server.name, "prompts/list"));
                };
                for mut prompt in page.prompts {
                    let exposed = self.exposed_prompt(&server.name, &prompt.name);
                    routes.insert(exposed.clone(), server.name.clone());
                    prompt.name = exposed;
                    out.push(prompt);
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        self.passthrough.lock().prompts = routes;
        Ok(out)
    }

    /// Which server a prompt belongs to, and its name there.
    async fn prompt_route(
        &self,
        exposed: &str,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<(ServerName, String)> {
        let prefix = self
            .snapshot()
            .map(|s| s.config.tool_prefix)
            .unwrap_or_default();
        if prefix == ToolPrefix::Server {
            let (server, name) = exposed
                .split_once(PREFIX_SEPARATOR)
                .ok_or_else(|| not_found("prompt", exposed))?;
            return Ok((ServerName::new(server), name.to_string()));
        }
        if !self.passthrough.lock().prompts.contains_key(exposed) {
            self.list_prompts(session, meta).await?;
        }
        let known = self.passthrough.lock().prompts.get(exposed).cloned();
        let server = match known {
            Some(server) => server,
            // Unlisted name: with one server offering prompts, let it answer (its own "not
            // found" is what the client would have seen without the proxy).
            None => match self
                .connections_for(Feature::Prompts, session)
                .await
                .as_slice()
            {
                [(server, _)] => server.name.clone(),
                _ => return Err(not_found("prompt", exposed)),
            },
        };
        Ok((server, exposed.to_string()))
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
            .connect(&StartReason::Passthrough(what), Some(session), true)
            .await
    }

    pub async fn get_prompt(
        &self,
        mut params: GetPromptRequestParams,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<GetPromptResponse> {
        let (server, name) = self.prompt_route(&params.name, session, meta).await?;
        let conn = self.connection_of(&server, session, "prompts/get").await?;
        params.name = name;
        params.meta = None;
        match self
            .relay(
                &conn,
                &server,
                ClientRequest::GetPromptRequest(GetPromptRequest::new(params)),
                meta,
            )
            .await?
        {
            ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            _ => Err(unexpected(&server, "prompts/get")),
        }
    }

    pub async fn list_resources(
        &self,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<Resource>> {
        let mut out = Vec::new();
        let mut routes = HashMap::new();
        for (server, conn) in self.connections_for(Feature::Resources, session).await {
            let mut cursor = None;
            loop {
                let request = ClientRequest::ListResourcesRequest(
                    ListResourcesRequest::with_param(paginated(cursor.take())),
                );
                let ServerResult::ListResourcesResult(page) =
                    self.relay(&conn, &server.name, request, meta).await?
                else {
                    return Err(unexpected(&server.name, "resources/list"));
                };
                for resource in page.resources {
                    routes
                        .entry(resource.uri.clone())
                        .or_insert_with(|| server.name.clone());
                    out.push(resource);
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        self.passthrough.lock().resources = routes;
        Ok(out)
    }

    pub async fn list_resource_templates(
        &self,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<ResourceTemplate>> {
        let mut out = Vec::new();
        let mut routes = Vec::new();
        for (server, conn) in self.connections_for(Feature::Resources, session).await {
            let mut cursor = None;
            loop {
                let request = ClientRequest::ListResourceTemplatesRequest(
                    ListResourceTemplatesRequest::with_param(paginated(cursor.take())),
                );
                let ServerResult::ListResourceTemplatesResult(page) =
                    self.relay(&conn, &server.name, request, meta).await?
                else {
                    return Err(unexpected(&server.name, "resources/templates/list"));
                };
                for template in page.resource_templates {
                    let prefix = template
                        .uri_template
                        .split('{')
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    routes.push((prefix, server.name.clone()));
                    out.push(template);
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        // Longest prefix first, so the most specific template wins.
        routes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self.passthrough.lock().templates = routes;
        Ok(out)
    }

    /// Which server a resource URI belongs to: a listed resource, else a template prefix, else
    /// the only server that offers resources.
    async fn resource_route(
        &self,
        uri: &str,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<ServerName> {
        let lookup = |p: &Passthrough| {
            let inner = p.lock();
            inner.resources.get(uri).cloned().or_else(|| {
                inner
                    .templates
                    .iter()
                    .find(|(prefix, _)| !prefix.is_empty() && uri.starts_with(prefix.as_str()))
                    .map(|(_, s)| s.clone())
            })
        };
        if let Some(server) = lookup(&self.passthrough) {
            return Ok(server);
        }
        self.list_resources(session, meta).await?;
        self.list_resource_templates(session, meta).await?;
        if let Some(server) = lookup(&self.passthrough) {
            return Ok(server);
        }
        let offering = self.connections_for(Feature::Resources, session).await;
        if let [(server, _)] = offering.as_slice() {
            return Ok(server.name.clone());
        }
        Err(Error::ResourceNotFound(clip(uri).into_owned()))
    }

    pub async fn read_resource(
        &self,
        mut params: ReadResourceRequestParams,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<ReadResourceResponse> {
        let server = self.resource_route(&params.uri, session, meta).await?;
        let conn = self
            .connection_of(&server, session, "resources/read")
            .await?;
        params.meta = None;
        match self
            .relay(
                &conn,
                &server,
                ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params)),
                meta,
            )
            .await?
        {
            ServerResult::ReadResourceResult(r) => Ok(ReadResourceResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(ReadResourceResponse::InputRequired(r)),
            _ => Err(unexpected(&server, "resources/read")),
        }
    }

    pub async fn subscribe(
        &self,
        uri: String,
        session: &SessionRef,
        meta: &RequestMetaObject,
        on: bool,
    ) -> Result<()> {
        let server = self.resource_route(&uri, session, meta).await?;
        let conn = self
            .connection_of(&server, session, "resources/subscribe")
            .await?;
        let request = if on {
            ClientRequest::SubscribeRequest(SubscribeRequest::new(SubscribeRequestParams::new(
                uri.clone(),
            )))
        } else {
            ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(
                UnsubscribeRequestParams::new(uri.clone()),
            ))
        };
        self.relay(&conn, &server, request, meta).await?;
        let mut inner = self.passthrough.lock();
        let subs = inner.subscriptions.entry(uri).or_default();
        subs.retain(|(id, _)| *id != session.id);
        if on {
            subs.push((session.id, session.peer.clone()));
        }
        Ok(())
    }

    pub async fn complete(
        &self,
        mut params: CompleteRequestParams,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<CompleteResult> {
        let server = match &mut params.r#ref {
            Reference::Prompt(p) => {
                let (server, name) = self.prompt_route(&p.name, session, meta).await?;
                p.name = name;
                server
            }
            Reference::Resource(r) => self.resource_route(&r.uri, session, meta).await?,
            _ => {
                return Err(Error::InvalidParams(
                    "unsupported completion reference".into(),
                ));
            }
        };
        let conn = self
            .connection_of(&server, session, "completion/complete")
            .await?;
        params.meta = None;
        match self
            .relay(
                &conn,
                &server,
                ClientRequest::CompleteRequest(CompleteRequest::new(params)),
                meta,
            )
            .await?
        {
            ServerResult::CompleteResult(r) => Ok(r),
            _ => Err(unexpected(&server, "completion/complete")),
        }
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
