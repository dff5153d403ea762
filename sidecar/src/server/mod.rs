//! The MCP front the agent talks to: one [`Front`] handler per session (HTTP session, stdio, or
//! a single 2026-07-28 request), over streamable HTTP at `/mcp` ([`http`]) or stdio.

pub mod http;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
        InitializeResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
        ServerCapabilities, ServerConfig, SubscriptionFilter,
    },
    service::{RequestContext, SubscriptionContext},
};

use crate::{
    proxy::{CallRequest, Proxy},
    session::{SessionId, SessionRef},
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

/// What the proxy offers: tools with list-changed notifications.
pub fn server_config() -> ServerConfig {
    let mut capabilities = ServerCapabilities::builder()
        .enable_tools()
        .enable_tool_list_changed()
        .build();
    capabilities.logging = Some(Default::default());
    ServerConfig::new(capabilities).with_server_info(Implementation::new(
        "orchestrator-mcp-proxy",
        env!("CARGO_PKG_VERSION"),
    ))
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        server_config()
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
        tracing::info!(session = %self.session, client = %request.client_info.name, protocol = %request.protocol_version, "client session opened");
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let session = self.session_ref(&context);
        let tools = self
            .proxy
            .list_tools(&session)
            .await
            .map_err(|e| e.to_mcp())?;
        Ok(ListToolsResult::with_all_items((*tools).clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let session = self.session_ref(&context);
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
            })
            .await
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
        context.cancelled().await;
        self.proxy.sessions.remove_subscription(key);
        Ok(())
    }
}
