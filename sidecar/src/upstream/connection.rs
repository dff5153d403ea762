//! One live connection to an upstream: the rmcp peer, the child process of a stdio server, the
//! routes of its calls in flight, and how it ends.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use rmcp::{
    Peer, RoleClient,
    model::{Implementation, ProtocolVersion},
    service::RunningService,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    handler::UpstreamHandler,
    routes::{CallRoutes, Forward},
    stdio,
};
use crate::{names::ServerName, sync::lock};

/// One live connection to an upstream.
pub struct Connection {
    pub server: ServerName,
    pub peer: Peer<RoleClient>,
    pub(super) service: std::sync::Mutex<Option<RunningService<RoleClient, UpstreamHandler>>>,
    pub child: Option<stdio::Child>,
    pub routes: Arc<CallRoutes>,
    pub forward: mpsc::UnboundedSender<Forward>,
    /// Cancelled when the upstream's stream ends (exit, crash, connection loss) or on stop.
    pub closed: CancellationToken,
    pub started_at: Instant,
    pub protocol: ProtocolVersion,
    pub server_info: Option<Implementation>,
    /// Set once the tool list was fetched over this connection (freshness check after a start).
    pub listed: AtomicBool,
}

impl Connection {
    pub fn is_alive(&self) -> bool {
        !self.closed.is_cancelled() && !self.peer.is_transport_closed()
    }

    /// Why the connection is gone, for error messages: the exit status and the last stderr line.
    pub async fn gone_reason(&self) -> String {
        let Some(child) = &self.child else {
            return "closed the connection".into();
        };
        // The transport usually notices before the exit status is in; wait for it briefly.
        let info = match tokio::time::timeout(Duration::from_millis(500), child.exited()).await {
            Ok(info) => info.status,
            Err(_) => "stopped answering (still running)".into(),
        };
        let tail = child.stderr_tail();
        match tail.iter().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!("exited ({info}); last stderr line: {line}"),
            None => format!("exited ({info})"),
        }
    }

    /// Stops the connection: closes the session, TERMs the child, KILLs it after the grace time.
    pub async fn stop(&self, grace: Duration) {
        // Take the service first: the watcher reads its absence as "stopped on purpose".
        let service = lock(&self.service).take();
        self.closed.cancel();
        if let Some(service) = service {
            service.cancellation_token().cancel();
        }
        if let Some(child) = &self.child {
            child.terminate(grace).await;
        }
    }
}
