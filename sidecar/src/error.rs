//! The crate's error type: protocol, transport and internal failures. Every one a client (or an
//! upstream) can see is a JSON-RPC error with a stable `PROXY.*` code in its `data` (see
//! [`Error::to_mcp`]). JSON-RPC errors an upstream or a client sent pass through unchanged.
//! A call the proxy's policy refuses is not an error but a [`crate::policy::refusal::Refusal`]:
//! the agent gets a tool error result it can read and correct.

use std::time::Duration;

use rmcp::{ErrorData, model::ErrorCode};
use serde_json::json;

use crate::names::ServerName;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("method {0:?} not found")]
    UnknownMethod(String),

    /// A prompt, server or completion reference the proxy cannot route.
    #[error("{what} {name:?} not found")]
    NotFound { what: &'static str, name: String },

    #[error("resource {0:?} not found")]
    ResourceNotFound(String),

    #[error("upstream server {server:?} could not be started: {reason}")]
    StartFailed { server: ServerName, reason: String },

    /// Starts are spaced by the restart backoff; the request can be made again after `retry_in`.
    #[error("upstream server {server:?} is waiting out its restart backoff after {failures} failed start(s) or early exit(s); retry in {:.1}s (last: {last})", tenths_up(*retry_in))]
    Backoff {
        server: ServerName,
        failures: u32,
        retry_in: Duration,
        /// What the last failure was.
        last: String,
    },

    #[error("upstream server {server:?} {what}")]
    UpstreamGone { server: ServerName, what: String },

    /// The upstream answered with something that is not an MCP message (`what` quotes the
    /// start of its bytes, bounded).
    #[error("upstream server {server:?} answered with something that is not MCP: {what}")]
    UpstreamProtocol { server: ServerName, what: String },

    /// The server was stopped (config change, shutdown) before it was ready.
    #[error("upstream server {server:?} was stopped before it was ready")]
    Stopped { server: ServerName },

    #[error("upstream server {server:?} did not answer within {}s", timeout.as_secs())]
    Timeout {
        server: ServerName,
        timeout: Duration,
    },

    /// The upstream answered with a result of the wrong kind for the request.
    #[error("upstream server {server:?} answered {method} with an unexpected result")]
    UnexpectedResult {
        server: ServerName,
        method: &'static str,
    },

    #[error("the proxy is shutting down")]
    ShuttingDown,

    #[error("no config is loaded yet")]
    NotReady,

    #[error("cancelled by {0}")]
    Cancelled(&'static str),

    #[error("upstream server {server:?}: {source}")]
    Upstream {
        server: ServerName,
        #[source]
        source: rmcp::ServiceError,
    },

    /// The client answered a request relayed from an upstream with an error (passed on as is).
    #[error("the client answered with an error: {}", .0.message)]
    Client(ErrorData),

    /// A request from an upstream that has no client to go to.
    #[error("{0}")]
    NoClient(String),

    /// A request from an upstream the client's protocol has no way to carry.
    #[error("{0}")]
    NotRelayable(String),

    #[error(
        "too many client sessions (the limit is {limit}); end one (DELETE) or wait for idle ones to expire"
    )]
    TooManySessions { limit: usize },

    /// A tool list beyond a bound of the memory budget (`crate::memory`): refused whole.
    #[error(
        "upstream server {server:?} lists {seen} {what}, more than the proxy takes from one server \
         ({max} {what}, {setting}); its tools are left out"
    )]
    ListTooLarge {
        server: ServerName,
        /// `tools` or `bytes of tool definitions`.
        what: &'static str,
        /// What it listed so far (the list is refused as soon as it is beyond).
        seen: String,
        max: String,
        setting: &'static str,
    },

    #[error("parse error: {0}")]
    Parse(String),

    #[error("invalid request: {0}")]
    InvalidRequest(String),

    #[error("invalid params: {0}")]
    InvalidParams(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The stable code carried in the JSON-RPC error `data`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::UnknownMethod(_) => "PROXY.UNKNOWN_METHOD",
            Error::NotFound { .. } | Error::ResourceNotFound(_) => "PROXY.NOT_FOUND",
            Error::StartFailed { .. } => "PROXY.UPSTREAM_START_FAILED",
            Error::Backoff { .. } => "PROXY.UPSTREAM_BACKOFF",
            Error::UpstreamGone { .. } => "PROXY.UPSTREAM_EXITED",
            Error::UpstreamProtocol { .. } => "PROXY.UPSTREAM_PROTOCOL",
            Error::Stopped { .. } => "PROXY.UPSTREAM_STOPPED",
            Error::Timeout { .. } => "PROXY.UPSTREAM_TIMEOUT",
            Error::UnexpectedResult { .. } | Error::Upstream { .. } => "PROXY.UPSTREAM_ERROR",
            Error::ShuttingDown => "PROXY.SHUTTING_DOWN",
            Error::NotReady => "PROXY.NOT_READY",
            Error::Cancelled(_) => "PROXY.CANCELLED",
            Error::Client(_) => "PROXY.CLIENT_ERROR",
            Error::NoClient(_) => "PROXY.NO_CLIENT",
            Error::NotRelayable(_) => "PROXY.NOT_RELAYABLE",
            Error::TooManySessions { .. } => "PROXY.TOO_MANY_SESSIONS",
            Error::ListTooLarge { .. } => "PROXY.LIST_TOO_LARGE",
            Error::Parse(_) => "PROXY.PARSE_ERROR",
            Error::InvalidRequest(_) => "PROXY.INVALID_REQUEST",
            Error::InvalidParams(_) => "PROXY.INVALID_PARAMS",
            Error::Io { .. } | Error::Other(_) => "PROXY.INTERNAL",
        }
    }

    fn json_rpc_code(&self) -> ErrorCode {
        match self {
            Error::NotFound { .. } | Error::InvalidParams(_) => ErrorCode::INVALID_PARAMS,
            Error::ResourceNotFound(_) => ErrorCode::RESOURCE_NOT_FOUND,
            Error::NoClient(_) | Error::InvalidRequest(_) => ErrorCode::INVALID_REQUEST,
            Error::NotRelayable(_) | Error::UnknownMethod(_) => ErrorCode::METHOD_NOT_FOUND,
            Error::Parse(_) => ErrorCode::PARSE_ERROR,
            _ => ErrorCode::INTERNAL_ERROR,
        }
    }

    /// As a JSON-RPC error. JSON-RPC errors of an upstream or a client pass through unchanged,
    /// so each side sees exactly what the other said.
    pub fn to_mcp(&self) -> ErrorData {
        match self {
            Error::Upstream {
                source: rmcp::ServiceError::McpError(e),
                ..
            }
            | Error::Client(e) => return e.clone(),
            _ => {}
        }
        let mut data = json!({ "code": self.code() });
        if let Error::Backoff {
            server,
            failures,
            retry_in,
            ..
        } = self
        {
            data["server"] = json!(server);
            data["failures"] = json!(failures);
            data["retryAfterSeconds"] = json!(retry_in.as_secs_f64());
        }
        if let Error::ListTooLarge {
            server, setting, ..
        } = self
        {
            data["server"] = json!(server);
            data["setting"] = json!(setting);
        }
        ErrorData::new(self.json_rpc_code(), self.to_string(), Some(data))
    }
}

impl From<Error> for ErrorData {
    fn from(e: Error) -> Self {
        e.to_mcp()
    }
}

/// Seconds, rounded up to a tenth (a wait of 40 ms reads "0.1s", not "0.0s").
fn tenths_up(d: Duration) -> f64 {
    d.as_millis().div_ceil(100) as f64 / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_carries_its_code_and_peer_errors_pass_unchanged() {
        let parse = Error::Parse("expected value".into()).to_mcp();
        assert_eq!(parse.code, ErrorCode::PARSE_ERROR);
        assert_eq!(parse.data, Some(json!({"code": "PROXY.PARSE_ERROR"})));
        let theirs = ErrorData::new(ErrorCode(-32042), "the server's own words", None);
        assert_eq!(Error::Client(theirs.clone()).to_mcp(), theirs);
        let upstream = Error::Upstream {
            server: ServerName::new("gh"),
            source: rmcp::ServiceError::McpError(theirs.clone()),
        };
        assert_eq!(upstream.to_mcp(), theirs);
    }
}
