//! The HTTP/1.1 listener: accepts connections (at most [`MAX_CONNECTIONS`] at a time), closes a
//! connection whose request headers do not arrive within the header-read timeout (slowloris),
//! and on shutdown stops accepting and lets each connection finish its requests in flight. Each
//! request carries its connection's [`ConnAbort`], with which an answer that its client does not
//! take can close the connection (and free what it holds).

use std::{sync::Arc, time::Duration};

use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Connections served at once; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 256;

/// In every request's extensions: cancelling it closes the request's connection at once.
#[derive(Clone, Debug)]
pub struct ConnAbort(pub CancellationToken);

/// In every request's extensions: the address of the connection's peer (shared mode's peer
/// check).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

/// Serves `app` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    header_read_timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let http = Arc::new(http);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = MAX_CONNECTIONS, "too many connections; closing a new one");
            continue;
        };
        // Small JSON-RPC messages must not wait for Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let abort = CancellationToken::new();
        let tagged = ConnAbort(abort.clone());
        let service = TowerToHyperService::new(app.clone().map_request(
            move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(tagged.clone());
                request.extensions_mut().insert(Peer(peer));
                request
            },
        ));
        let http = http.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let conn = http.serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                // Dropping the connection closes it, whatever it was sending.
                () = abort.cancelled() => return,
                () = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
