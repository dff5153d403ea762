//! The crate's error type. Errors that reach an MCP client are turned into JSON-RPC errors with a
//! stable `code` in their `data` (see [`Error::to_mcp`]).

use std::time::Duration;

use rmcp::{ErrorData, model::ErrorCode};
use serde_json::json;

use crate::names::ServerName;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tool {tool:?} is not allowed: denied by {rule}")]
    ToolDenied {
        tool: String,
        server: ServerName,
        rule: String,
    },

    #[error("unknown tool {0:?}")]
    UnknownTool(String),

    #[error("upstream server {server:?} could not be started: {reason}")]
    StartFailed { server: ServerName, reason: String },

    #[error("upstream server {server:?} is restarting after {failures} failure(s); next attempt in {}ms", retry_in.as_millis())]
    Backoff {
        server: ServerName,
        failures: u32,
        retry_in: Duration,
    },

    #[error("upstream server {server:?} {what}")]
    UpstreamGone { server: ServerName, what: String },

    #[error("upstream server {server:?} did not answer within {}s", timeout.as_secs())]
    Timeout {
        server: ServerName,
        timeout: Duration,
    },

    #[error("the proxy is shutting down")]
    ShuttingDown,

    #[error("no config is loaded yet")]
    NotReady,

    #[error("upstream server {server:?}: {source}")]
    Upstream {
        server: ServerName,
        #[source]
        source: rmcp::ServiceError,
    },

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
            Error::ToolDenied { .. } => "PROXY.TOOL_DENIED",
            Error::UnknownTool(_) => "PROXY.UNKNOWN_TOOL",
            Error::StartFailed { .. } => "PROXY.UPSTREAM_START_FAILED",
            Error::Backoff { .. } => "PROXY.UPSTREAM_BACKOFF",
            Error::UpstreamGone { .. } => "PROXY.UPSTREAM_EXITED",
            Error::Timeout { .. } => "PROXY.UPSTREAM_TIMEOUT",
            Error::ShuttingDown => "PROXY.SHUTTING_DOWN",
            Error::NotReady => "PROXY.NOT_READY",
            Error::Upstream { .. } => "PROXY.UPSTREAM_ERROR",
            Error::Io { .. } | Error::Other(_) => "PROXY.INTERNAL",
        }
    }

    /// As a JSON-RPC error for the client. Upstream JSON-RPC errors pass through unchanged, so the
    /// client sees exactly what the server said.
    pub fn to_mcp(&self) -> ErrorData {
        if let Error::Upstream {
            source: rmcp::ServiceError::McpError(e),
            ..
        } = self
        {
            return e.clone();
        }
        let code = match self {
            Error::ToolDenied { .. } | Error::UnknownTool(_) => ErrorCode::INVALID_PARAMS,
            _ => ErrorCode::INTERNAL_ERROR,
        };
        let mut data = json!({ "code": self.code() });
        if let Error::ToolDenied { server, rule, .. } = self {
            data["server"] = json!(server);
            data["rule"] = json!(rule);
        }
        ErrorData::new(code, self.to_string(), Some(data))
    }
}
