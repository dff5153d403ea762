//! The MCP front the agent talks to: one [`Front`] handler per session (HTTP session, stdio, or
//! a single 2026-07-28 request), over streamable HTTP at `/mcp` ([`http`]) or stdio.
// Logging and resources/subscribe are deprecated by SEP-2577 but still spoken by clients on the
// initialize lifecycle.
#![allow(deprecated)]

pub mod audit;
pub mod auth;
pub mod hosts;
pub mod http;
pub mod limits;
pub mod listener;
pub mod priming;
pub mod sessions;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
        CustomRequest, CustomResult, GetPromptRequestParams, GetPromptResponse, Implementation,
        InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
        ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
        ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
        SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
        UnsubscribeRequestParams,
    },
    service::{NotificationContext, RequestContext, SubscriptionContext},
};

use crate::{
    error::Error,
    names::clip,
    proxy::{CallRequest, Proxy},
    session::{SessionId, SessionRef},
    upstream::Revision,
};

/// The MCP server side of the proxy for one session.
pub struct Front {
    proxy: Arc<Proxy>,
    session: SessionId,
    registered: AtomicBool,
}

impl Front {
    pub fn new(proxy: Arc<Proxy>) -> Self {
        Self {
            proxy,
            session: SessionId::next(),
            registered: AtomicBool::new(false),
        }
    }

    fn session_ref(&self, context: &RequestContext<RoleServer>) -> SessionRef {
        let accepts_requests = context
            .protocol_version()
            .is_none_or(|v| v < ProtocolVersion::V_2026_07_28);
        SessionRef {
            id: self.session,
            peer: context.peer.clone(),
            accepts_requests,
            protocol: context.protocol_version(),
            client_info: context.client_info(),
            capabilities: context.client_capabilities(),
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if self.registered.load(Ordering::Relaxed) {
            self.proxy.sessions.remove_session(self.session);
        }
    }
}

/// The request methods of the protocol (both generations).
const MCP_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "subscriptions/listen",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
];

/// Methods of the initialize lifecycle that 2026-07-28 removed: a request for one in that
/// revision is an unknown method (HTTP 404, -32601), whatever its params.
const REMOVED_IN_2026_07_28: &[&str] = &[
    "initialize",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

fn removed(method: &str, context: &RequestContext<RoleServer>) -> Option<ErrorData> {
    let modern = context
        .protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
    (modern && REMOVED_IN_2026_07_28.contains(&method))
        .then(|| Error::UnknownMethod(method.to_string()).into())
}

/// What the proxy offers: tools (the contract), and the upstreams' prompts, resources,
/// completions and logging relayed.
pub fn server_config() -> ServerConfig {
    let mut capabilities = ServerCapabilities::builder()
        .enable_tools()
        .enable_tool_list_changed()
        .enable_prompts()
        .enable_prompts_list_changed()
        .enable_resources()
        .enable_resources_list_changed()
        .enable_resources_subscribe()
        .enable_completions()
        .enable_logging()
        .build();
    capabilities.logging.get_or_insert_with(Default::default);
    ServerConfig::new(capabilities).with_server_info(Implementation::new(
        "orchestrator-mcp-proxy",
        env!("CARGO_PKG_VERSION"),
    ))
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        server_config()
    }

    /// A tool on offer to 2026-07-28 clients, by its exposed name: rmcp checks a `tools/call`'s
    /// `Mcp-Param-*` headers against the `x-mcp-header` properties of its input schema (SEP-2243;
    /// over it, HTTP 400 with -32020) before the call reaches the proxy. The upstream is sent
    /// headers rmcp builds from the arguments, so this is the only place they are checked.
    fn get_tool(&self, name: &str) -> Option<Tool> {
        let snap = self.proxy.snapshot()?;
        let tools = snap.router(Revision::Modern).tools();
        tools.iter().find(|t| t.name == name).cloned()
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        self.proxy
            .sessions
            .add_session(self.session, context.peer.clone());
        self.registered.store(true, Ordering::Relaxed);
        let answer = self.negotiate_initialize(&request)?;
        // The revision the session speaks is the one answered, not the one offered (a client
        // offering 2026-07-28 inside `initialize` gets 2025-11-25).
        tracing::info!(session = %self.session, client = %clip(&request.client_info.name), protocol = %answer.protocol_version, offered = %clip(request.protocol_version.as_str()), "client session opened");
        Ok(answer)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let session = self.session_ref(&context);
        let tools = self.proxy.list_tools(&session).await?;
        Ok(ListToolsResult::with_all_items((*tools).clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let session = self.session_ref(&context);
        let stream_cut = context
            .extensions
            .get::<::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<sessions::StreamCut>())
            .map(|cut| cut.cut.clone());
        self.proxy
            .call_tool(CallRequest {
                name: request.name.into_owned(),
                arguments: request.arguments,
                input_responses: request.input_responses,
                request_state: request.request_state,
                meta: context.meta,
                request_id: context.id,
                ct: context.ct,
                session,
                intent: None,
                stream_cut,
            })
            .await
            .map_err(Into::into)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let session = self.session_ref(&context);
        let prompts = self
            .proxy
            .relay()
            .list_prompts(&session, &context.meta)
            .await?;
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let session = self.session_ref(&context);
        self.proxy
            .relay()
            .get_prompt(request, &session, &context.meta)
            .await
            .map_err(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let session = self.session_ref(&context);
        let resources = self
            .proxy
            .relay()
            .list_resources(&session, &context.meta)
            .await?;
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let session = self.session_ref(&context);
        let templates = self
            .proxy
            .relay()
            .list_resource_templates(&session, &context.meta)
            .await?;
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let session = self.session_ref(&context);
        self.proxy
            .relay()
            .read_resource(request, &session, &context.meta)
            .await
            .map_err(Into::into)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if let Some(e) = removed("resources/subscribe", &context) {
            return Err(e);
        }
        let session = self.session_ref(&context);
        self.proxy
            .relay()
            .subscribe(request.uri, &session, &context.meta, true)
            .await
            .map_err(Into::into)
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if let Some(e) = removed("resources/unsubscribe", &context) {
            return Err(e);
        }
        let session = self.session_ref(&context);
        self.proxy
            .relay()
            .subscribe(request.uri, &session, &context.meta, false)
            .await
            .map_err(Into::into)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let session = self.session_ref(&context);
        self.proxy
            .relay()
            .complete(request, &session, &context.meta)
            .await
            .map_err(Into::into)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if let Some(e) = removed("logging/setLevel", &context) {
            return Err(e);
        }
        self.proxy
            .relay()
            .set_level(request.level, &context.meta)
            .await
            .map_err(Into::into)
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        self.proxy.relay().roots_changed().await;
    }

    /// rmcp hands over a request it could not read as a known method (its params do not fit)
    /// as a custom request: for a method of the protocol that is bad params, else an unknown
    /// method.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if let Some(e) = removed(&request.method, &context) {
            return Err(e);
        }
        let method = clip(&request.method);
        let error = if MCP_METHODS.contains(&request.method.as_str()) {
            let why = match request.method.as_str() {
                "tools/call" => request
                    .params
                    .map(serde_json::from_value::<CallToolRequestParams>)
                    .and_then(Result::err)
                    .map(|e| format!(": {e}")),
                _ => None,
            };
            Error::InvalidParams(format!(
                "the params do not fit {method}{}",
                why.unwrap_or_default()
            ))
        } else {
            Error::UnknownMethod(method.into_owned())
        };
        Err(error.into())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // rmcp narrows this to what the client asked for and what `get_info` advertises.
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let key = self.proxy.sessions.add_subscription(context.sink().clone());
        // Resource URIs the client listens to: the upstreams that own them are asked for their
        // updates for as long as the stream is open.
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        let request = context.request_context();
        let session = self.session_ref(request);
        let mut subscribed = Vec::new();
        for uri in uris {
            match self
                .proxy
                .relay()
                .subscribe(uri.clone(), &session, &request.meta, true)
                .await
            {
                Ok(()) => {
                    // The client was acknowledged before the upstream's stream was open: a
                    // change in between would be lost, so say "updated" once (clients re-read).
                    let _ = context.sink().notify_resource_updated(&uri).await;
                    subscribed.push(uri)
                }
                Err(e) => {
                    tracing::warn!(uri = %clip(&uri), error = %e, "no upstream updates for a resource a listen stream asked for")
                }
            }
        }
        context.cancelled().await;
        self.proxy.sessions.remove_subscription(key);
        for uri in subscribed {
            let _ = self
                .proxy
                .relay()
                .subscribe(uri, &session, &request.meta, false)
                .await;
        }
        Ok(())
    }
}
