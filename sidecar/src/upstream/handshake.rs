//! The MCP handshake of a start, around rmcp's: what the proxy declares to an upstream, and
//! what a failed handshake says (and whether trying the other lifecycle could help).

use std::time::Duration;

use rmcp::{
    model::{ClientConfig, Implementation},
    service::ClientInitializeError,
};

use super::stdio;
use crate::{error::Error, session::SessionRef};

/// A start that failed, and whether the server answered the handshake (with a refusal).
pub(super) struct StartFailure {
    pub error: Error,
    pub answered: bool,
}

/// Whether the server answered the handshake (a JSON-RPC error, a result of the wrong kind), as
/// opposed to closing the connection without a word (a process that exited at once).
pub(super) fn answered(e: &ClientInitializeError) -> bool {
    !matches!(
        e,
        ClientInitializeError::ConnectionClosed(_)
            | ClientInitializeError::TransportError { .. }
            | ClientInitializeError::ExpectedInitResponse(None)
            | ClientInitializeError::ExpectedInitResult(None)
    )
}

/// Why a stdio start failed: the handshake's error, the exit status, the last stderr line.
pub(super) async fn start_failure(error: &str, child: &stdio::Child) -> String {
    // Give the exit status a moment to arrive so the message says what happened.
    let status = tokio::time::timeout(Duration::from_millis(300), child.exited())
        .await
        .ok();
    let tail = child.stderr_tail();
    let mut reason = format!("the MCP handshake failed: {error}");
    if let Some(status) = status {
        reason.push_str(&format!("; the process exited ({})", status.status));
    }
    if let Some(line) = tail.iter().rev().find(|l| !l.trim().is_empty()) {
        reason.push_str(&format!("; last stderr line: {line}"));
    }
    reason
}

/// What the proxy declares to an upstream: the client identity and capabilities of the session
/// that caused the start (so the upstream sees what the client declared), else its own.
pub(super) fn client_config(session: Option<&SessionRef>) -> ClientConfig {
    let capabilities = session
        .and_then(|s| s.capabilities.clone())
        .unwrap_or_default();
    let info = session
        .and_then(|s| s.client_info.clone())
        .unwrap_or_else(|| {
            Implementation::new("orchestrator-mcp-proxy", env!("CARGO_PKG_VERSION"))
        });
    ClientConfig::new(capabilities, info)
}
