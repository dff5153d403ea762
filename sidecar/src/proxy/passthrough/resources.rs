//! Resources and resource templates of the upstreams: URIs are global and stay unchanged; a URI
//! is routed by the server that listed it, then by template prefix.
// resources/subscribe is deprecated by SEP-2577 but still part of the legacy protocol versions.
#![allow(deprecated)]

use std::collections::HashMap;

use rmcp::model::{
    ClientRequest, ListResourceTemplatesRequest, ListResourcesRequest, ReadResourceRequest,
    ReadResourceRequestParams, ReadResourceResponse, RequestMetaObject, Resource, ResourceTemplate,
    ServerResult, SubscribeRequest, SubscribeRequestParams, UnsubscribeRequest,
    UnsubscribeRequestParams,
};

use super::{Feature, Passthrough, Reach, Relay, unexpected};
use crate::{
    error::{Error, Result},
    names::{ServerName, clip},
    session::SessionRef,
    upstream::Connection,
};

impl Relay<'_> {
    /// `resources/list`: the resources of the running servers (starts nothing).
    pub async fn list_resources(
        &self,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<Resource>> {
        self.collect_resources(Reach::Running, session, meta).await
    }

    async fn collect_resources(
        &self,
        reach: Reach,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<Resource>> {
        let mut out = Vec::new();
        let mut routes = HashMap::new();
        for (server, conn) in self
            .connections_for(Feature::Resources, reach, session)
            .await
        {
            let resources = self
                .list_all(
                    &conn,
                    &server.name,
                    "resources/list",
                    meta,
                    |p| ClientRequest::ListResourcesRequest(ListResourcesRequest::with_param(p)),
                    |r| match r {
                        ServerResult::ListResourcesResult(page) => {
                            Some((page.resources, page.next_cursor))
                        }
                        _ => None,
                    },
                )
                .await?;
            for resource in resources {
                routes
                    .entry(resource.uri.clone())
                    .or_insert_with(|| server.name.clone());
                out.push(resource);
            }
        }
        self.passthrough.lock().resources = routes;
        Ok(out)
    }

    /// `resources/templates/list`: the templates of the running servers (starts nothing).
    pub async fn list_resource_templates(
        &self,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<ResourceTemplate>> {
        self.collect_templates(Reach::Running, session, meta).await
    }

    async fn collect_templates(
        &self,
        reach: Reach,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<ResourceTemplate>> {
        let mut out = Vec::new();
        let mut routes = Vec::new();
        for (server, conn) in self
            .connections_for(Feature::Resources, reach, session)
            .await
        {
            let templates = self
                .list_all(
                    &conn,
                    &server.name,
                    "resources/templates/list",
                    meta,
                    |p| {
                        ClientRequest::ListResourceTemplatesRequest(
                            ListResourceTemplatesRequest::with_param(p),
                        )
                    },
                    |r| match r {
                        ServerResult::ListResourceTemplatesResult(page) => {
                            Some((page.resource_templates, page.next_cursor))
                        }
                        _ => None,
                    },
                )
                .await?;
            for template in templates {
                let prefix = template
                    .uri_template
                    .split('{')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                routes.push((prefix, server.name.clone()));
                out.push(template);
            }
        }
        // Longest prefix first, so the most specific template wins.
        routes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self.passthrough.lock().templates = routes;
        Ok(out)
    }

    /// Which server a resource URI belongs to: a listed resource, else a template prefix, else
    /// the only server that offers resources. Servers that may offer resources are started to
    /// find out (`what` is the method, an explicit use).
    pub(super) async fn resource_route(
        &self,
        uri: &str,
        what: &'static str,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<ServerName> {
        let reach = Reach::Start(what);
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
        if let Some(server) = lookup(self.passthrough) {
            return Ok(server);
        }
        self.collect_resources(reach, session, meta).await?;
        self.collect_templates(reach, session, meta).await?;
        if let Some(server) = lookup(self.passthrough) {
            return Ok(server);
        }
        let offering = self
            .connections_for(Feature::Resources, reach, session)
            .await;
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
        let server = self
            .resource_route(&params.uri, "resources/read", session, meta)
            .await?;
        params.meta = None;
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params));
        match self
            .relay_named(&server, session, "resources/read", request, meta)
            .await?
        {
            ServerResult::ReadResourceResult(mut r) => {
                // Older upstreams omit `resultType`; 2026-07-28 clients require it (rmcp strips
                // it again for older clients).
                r.result_type
                    .get_or_insert(rmcp::model::ResultType::COMPLETE);
                Ok(ReadResourceResponse::Complete(r))
            }
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
        let what = if on {
            "resources/subscribe"
        } else {
            "resources/unsubscribe"
        };
        let server = self.resource_route(&uri, what, session, meta).await?;
        let conn = self
            .connection_of(&server, session, "resources/subscribe")
            .await?;
        self.subscribe_upstream(&conn, &server, &uri, meta, on)
            .await?;
        if !session.accepts_requests {
            // A 2026-07-28 listen stream: updates reach it through the session registry.
            return Ok(());
        }
        let mut inner = self.passthrough.lock();
        let subs = inner.subscriptions.entry(uri).or_default();
        subs.retain(|(id, _)| *id != session.id);
        if on {
            subs.push((session.id, session.peer.clone()));
        }
        Ok(())
    }

    /// Starts or ends the upstream's updates of `uri`: `resources/subscribe` on the initialize
    /// lifecycle; on 2026-07-28 (which has no such request) a `subscriptions/listen` stream for
    /// the URI, one per server and URI, shared by the client subscriptions to it.
    async fn subscribe_upstream(
        &self,
        conn: &Connection,
        server: &ServerName,
        uri: &str,
        meta: &RequestMetaObject,
        on: bool,
    ) -> Result<()> {
        if conn.protocol < rmcp::model::ProtocolVersion::V_2026_07_28 {
            let request = if on {
                ClientRequest::SubscribeRequest(SubscribeRequest::new(SubscribeRequestParams::new(
                    uri.to_string(),
                )))
            } else {
                ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(
                    UnsubscribeRequestParams::new(uri.to_string()),
                ))
            };
            self.relay(conn, server, request, meta).await?;
            return Ok(());
        }
        let key = (server.clone(), uri.to_string());
        if !on {
            let mut inner = self.passthrough.lock();
            if let Some((count, ct)) = inner.upstream_listens.get_mut(&key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    ct.cancel();
                    inner.upstream_listens.remove(&key);
                }
            }
            return Ok(());
        }
        {
            let mut inner = self.passthrough.lock();
            // A stream that ended with its connection is opened again.
            if let Some((count, _)) = inner
                .upstream_listens
                .get_mut(&key)
                .filter(|(_, ct)| !ct.is_cancelled())
            {
                *count += 1;
                return Ok(());
            }
        }
        let ct = conn.closed.child_token();
        crate::upstream::listen::listen_for_resource(
            server.clone(),
            conn.peer.clone(),
            uri.to_string(),
            self.pool.deps().events.clone(),
            ct.clone(),
        )
        .await
        .map_err(|source| Error::Upstream {
            server: server.clone(),
            source,
        })?;
        let mut inner = self.passthrough.lock();
        let entry = inner.upstream_listens.entry(key).or_insert((0, ct.clone()));
        if entry.1.is_cancelled() {
            *entry = (0, ct);
        } else if entry.0 > 0 {
            // Another subscription opened one meanwhile: that one serves both.
            ct.cancel();
        }
        entry.0 += 1;
        Ok(())
    }
}
