//! `subscriptions/listen` streams the proxy opens to 2026-07-28 upstreams: one per connection
//! for the list changes it advertises, and one per subscribed resource URI (what
//! `resources/subscribe` is on the older revision).

use rmcp::{
    Peer, RoleClient,
    model::{ServerCapabilities, ServerNotification, SubscriptionFilter},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::handler::UpstreamEvent;
use crate::names::ServerName;

/// A 2026-07-28 upstream sends list changes only on a `subscriptions/listen` stream: open one for
/// what it advertises, and turn what arrives into events, until the connection closes.
pub(super) fn listen_for_changes(
    server: ServerName,
    peer: Peer<RoleClient>,
    capabilities: &ServerCapabilities,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    closed: CancellationToken,
) {
    let mut filter = SubscriptionFilter::builder();
    let mut any = false;
    if capabilities
        .tools
        .as_ref()
        .is_some_and(|t| t.list_changed == Some(true))
    {
        filter = filter.tools_list_changed();
        any = true;
    }
    if capabilities
        .prompts
        .as_ref()
        .is_some_and(|p| p.list_changed == Some(true))
    {
        filter = filter.prompts_list_changed();
        any = true;
    }
    if capabilities
        .resources
        .as_ref()
        .is_some_and(|r| r.list_changed == Some(true))
    {
        filter = filter.resources_list_changed();
        any = true;
    }
    if !any {
        return;
    }
    let filter = filter.build();
    tokio::spawn(async move {
        let mut subscription = match peer.listen(filter).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%server, error = %e, "could not subscribe to the upstream's list changes");
                return;
            }
        };
        loop {
            let next = tokio::select! {
                next = subscription.next() => next,
                () = closed.cancelled() => return,
            };
            let event = match next {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    UpstreamEvent::ToolsChanged(server.clone())
                }
                Ok(Some(ServerNotification::PromptListChangedNotification(_))) => {
                    UpstreamEvent::PromptsChanged(server.clone())
                }
                Ok(Some(ServerNotification::ResourceListChangedNotification(_))) => {
                    UpstreamEvent::ResourcesChanged(server.clone())
                }
                Ok(Some(_)) => continue,
                Ok(None) => {
                    tracing::info!(%server, "the upstream ended the stream of its list changes");
                    return;
                }
                Err(e) => {
                    tracing::info!(%server, error = %e, "the stream of the upstream's list changes failed");
                    return;
                }
            };
            if events.send(event).is_err() {
                return;
            }
        }
    });
}

/// Opens a `subscriptions/listen` stream for updates of one resource (what `resources/subscribe`
/// is on the initialize lifecycle) and turns them into events, until `ct` is cancelled. Returns
/// once the upstream acknowledged the stream (or refused it).
pub async fn listen_for_resource(
    server: ServerName,
    peer: Peer<RoleClient>,
    uri: String,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    ct: CancellationToken,
) -> Result<(), rmcp::ServiceError> {
    let filter = SubscriptionFilter::builder()
        .resource_subscriptions([uri.clone()])
        .build();
    let mut subscription = peer.listen(filter).await?;
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = subscription.next() => next,
                () = ct.cancelled() => return,
            };
            match next {
                Ok(Some(ServerNotification::ResourceUpdatedNotification(n))) => {
                    if events
                        .send(UpstreamEvent::ResourceUpdated(n.params.uri))
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    tracing::debug!(%server, %uri, "the upstream ended a resource subscription");
                    return;
                }
            }
        }
    });
    Ok(())
}
