//! The proxy's client side towards one upstream: what it declares when connecting, and what it
//! does with messages the upstream sends on its own (requests during a call, notifications).
//!
//! [`Tap`] wraps the upstream transport so progress and log notifications are handed to the
//! ordered forwarder as they arrive (rmcp dispatches notifications on separate tasks, which
//! could reorder them), and so the end of the stream is noticed at once.

use std::{borrow::Cow, sync::Arc};

use rmcp::{
    ErrorData, RoleClient,
    model::{
        ClientConfig, ClientJsonRpcMessage, ClientResult, GetExtensions, GetMeta, JsonRpcMessage,
        ServerCapabilities, ServerJsonRpcMessage, ServerNotification, ServerRequest,
    },
    service::{
        InboundStreamOrigin, NotificationContext, OriginatingRequestId, RequestContext, Service,
    },
    transport::Transport,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::routes::{Ask, CallRoutes, Forward};
use crate::{error::Error, names::ServerName};

/// Something an upstream told us that changes what the proxy exposes.
#[derive(Clone, Debug)]
pub enum UpstreamEvent {
    ResourceUpdated(String),
    ToolsChanged(ServerName),
    PromptsChanged(ServerName),
    ResourcesChanged(ServerName),
}

impl UpstreamEvent {
    /// What a server that just started adds to the lists clients see. List requests for prompts
    /// and resources start nothing and answer from running servers only, so a client that
    /// listed before the start has not seen this server's prompts or resources.
    pub fn on_start(server: &ServerName, capabilities: &ServerCapabilities) -> Vec<UpstreamEvent> {
        let mut events = Vec::new();
        if capabilities.prompts.is_some() {
            events.push(UpstreamEvent::PromptsChanged(server.clone()));
        }
        if capabilities.resources.is_some() {
            events.push(UpstreamEvent::ResourcesChanged(server.clone()));
        }
        events
    }
}

pub struct UpstreamHandler {
    pub server: ServerName,
    pub info: ClientConfig,
    pub routes: Arc<CallRoutes>,
    pub events: mpsc::UnboundedSender<UpstreamEvent>,
}

impl Service<RoleClient> for UpstreamHandler {
    async fn handle_request(
        &self,
        request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        self.relay(request, context).await.map_err(Into::into)
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        _context: NotificationContext<RoleClient>,
    ) -> Result<(), ErrorData> {
        let event = match notification {
            ServerNotification::ToolListChangedNotification(_) => {
                UpstreamEvent::ToolsChanged(self.server.clone())
            }
            ServerNotification::PromptListChangedNotification(_) => {
                UpstreamEvent::PromptsChanged(self.server.clone())
            }
            ServerNotification::ResourceListChangedNotification(_) => {
                UpstreamEvent::ResourcesChanged(self.server.clone())
            }
            ServerNotification::ResourceUpdatedNotification(n) => {
                UpstreamEvent::ResourceUpdated(n.params.uri)
            }
            // Progress and log messages go through the ordered forwarder (see `Tap`).
            _ => return Ok(()),
        };
        let _ = self.events.send(event);
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}

impl UpstreamHandler {
    /// A request from the upstream (sampling, elicitation, roots): to the client whose call it
    /// belongs to, as is, or as an `input_required` round for a 2026-07-28 client.
    async fn relay(
        &self,
        request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, Error> {
        if let ServerRequest::PingRequest(_) = request {
            return Ok(ClientResult::empty(()));
        }
        let origin = match context.extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id),
            _ => None,
        };
        let Some(target) = self.routes.session_for_request(origin) else {
            return Err(Error::NoClient(
                "no client session is waiting on this server".into(),
            ));
        };
        let (session, front_request) = (target.session, target.front_request);
        if !session.accepts_requests {
            // A 2026-07-28 client gets the question as an input_required result of its call.
            let Some(asks) = target.asks else {
                return Err(Error::NoClient(
                    "the client's session (protocol 2026-07-28) takes no server-to-client requests outside a call".into(),
                ));
            };
            let (answer, answered) = tokio::sync::oneshot::channel();
            if asks.send(Ask { request, answer }).is_err() {
                return Err(Error::NoClient(
                    "the call this request belongs to has ended".into(),
                ));
            }
            return tokio::select! {
                result = answered => result.unwrap_or_else(|_| Err(Error::NoClient("the client did not answer".into()))),
                () = context.ct.cancelled() => Err(Error::Cancelled("the upstream server")),
            };
        }
        // Relay as is, with the upstream's _meta, and let a cancellation from the upstream
        // cancel the relayed request too.
        let mut request = request;
        *request.get_meta_mut() = context.meta;
        // SEP-2260: ride the stream of the client's call, as if the server were talking directly.
        if let Some(id) = front_request {
            request.extensions_mut().insert(OriginatingRequestId(id));
        }
        let handle = session
            .peer
            .send_cancellable_request(request, Default::default())
            .await
            .map_err(|e| self.relay_error(e))?;
        let id = handle.id.clone();
        let peer = handle.peer.clone();
        tokio::select! {
            result = handle.await_response() => result.map_err(|e| self.relay_error(e)),
            () = context.ct.cancelled() => {
                let params = rmcp::model::CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the upstream server".into()),
                );
                let _ = peer.notify_cancelled(params).await;
                Err(Error::Cancelled("the upstream server"))
            }
        }
    }

    /// The client's own error answer passes through; anything else says the client could not
    /// be reached.
    fn relay_error(&self, e: rmcp::ServiceError) -> Error {
        match e {
            rmcp::ServiceError::McpError(e) => Error::Client(e),
            other => Error::NoClient(format!(
                "could not relay the request of server {:?} to the client: {other}",
                self.server
            )),
        }
    }
}

/// A transport wrapper: copies progress and log notifications to the ordered forwarder and
/// cancels `closed` when the upstream's stream ends.
pub struct Tap<T> {
    inner: T,
    forward: mpsc::UnboundedSender<Forward>,
    closed: CancellationToken,
}

impl<T> Tap<T> {
    pub fn new(
        inner: T,
        forward: mpsc::UnboundedSender<Forward>,
        closed: CancellationToken,
    ) -> Self {
        Self {
            inner,
            forward,
            closed,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Tap<T> {
    type Error = T::Error;

    fn name() -> Cow<'static, str> {
        T::name()
    }

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let message = self.inner.receive().await;
        match &message {
            Some(JsonRpcMessage::Notification(n))
                if matches!(
                    n.notification,
                    ServerNotification::ProgressNotification(_)
                        | ServerNotification::LoggingMessageNotification(_)
                ) =>
            {
                let _ = self
                    .forward
                    .send(Forward::Notification(n.notification.clone()));
            }
            None => self.closed.cancel(),
            _ => {}
        }
        message
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.closed.cancel();
        self.inner.close().await
    }
}
