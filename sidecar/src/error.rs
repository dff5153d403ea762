//! The crate's error type. Every error a client (or an upstream) can see is built from it: a
//! JSON-RPC error with a stable `PROXY.*` code in its `data` (see [`Error::to_mcp`]). JSON-RPC
//! errors an upstream or a client sent pass through unchanged.

use std::time::Duration;

use orchestrator_crds::proxy::Risk;
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

    /// A rate limit refused the call; it can be made again after `retry_after`.
    #[error("tool {tool:?} is rate limited by {limit} ({rate}); retry in {:.1}s", retry_after.as_secs_f64())]
    RateLimited {
        tool: String,
        server: ServerName,
        /// The limit's config path.
        limit: String,
        /// `6/min, burst 2`.
        rate: String,
        retry_after: Duration,
    },

    /// The arguments do not match the tool's `inputSchema`; the call did not leave the proxy.
    #[error("invalid arguments for tool {tool:?} (its inputSchema; the server was not called): {}", problems.join("; "))]
    InvalidArguments {
        tool: String,
        server: ServerName,
        problems: Vec<String>,
    },

    /// `policy.requireApproval` holds this call, but as many calls as may wait already do.
    #[error(
        "tool {tool:?} needs a person's approval (policy.requireApproval), but {limit} calls already wait for one, the most a task may have; the call was not made: try again once some are decided"
    )]
    ApprovalBusy {
        tool: String,
        server: ServerName,
        limit: usize,
    },

    /// A person rejected the held call; it never reached the upstream.
    #[error("tool {tool:?} was rejected by {decided_by} (approval {id}){}; the call was not made", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    ApprovalRejected {
        tool: String,
        server: ServerName,
        id: String,
        decided_by: String,
        reason: Option<String>,
    },

    /// Nobody decided on the held call within `policy.requireApproval.timeoutSeconds`.
    #[error("tool {tool:?} was not approved within {}s (approval {id} expired); the call was not made", timeout.as_secs())]
    ApprovalExpired {
        tool: String,
        server: ServerName,
        id: String,
        timeout: Duration,
    },

    /// The call needs approval but the proxy has no Lease to ask on: nobody could see it.
    #[error(
        "tool {tool:?} needs a person's approval (policy.requireApproval), but approval needs the Kubernetes API (the task's Lease, --served-lease), which this proxy does not use; the call was not made"
    )]
    ApprovalUnavailable { tool: String, server: ServerName },

    /// Intent mode: a `call_tool_*` call without `intent.operation_type`.
    #[error(
        "intent.operation_type is required (call {variant} with intent: {{\"operation_type\": \"{operation}\"}})"
    )]
    IntentRequired {
        variant: &'static str,
        operation: &'static str,
    },

    /// Intent mode: a tool called by its own name instead of through a `call_tool_*`.
    #[error(
        "tool {tool:?} is not called by its name in intent mode (policy.toolMode: intent): call call_tool_read, call_tool_write or call_tool_destructive with \"name\": {tool:?} (retrieve_tools says which)"
    )]
    IntentDirectCall { tool: String },

    /// Intent mode: the declared operation is not the one of the `call_tool_*` called.
    #[error(
        "Intent mismatch: tool is {variant} but intent declares {declared} (for a {declared} call {fits})"
    )]
    IntentMismatch {
        variant: &'static str,
        declared: &'static str,
        /// The variant that takes the declared operation.
        fits: &'static str,
    },

    /// Intent mode: the tool's server (or its `risk` override) marks it riskier than the
    /// `call_tool_*` called.
    #[error("Tool '{tool}' is marked {marked} by server, use {fits}")]
    IntentServerMismatch {
        tool: String,
        server: ServerName,
        marked: Risk,
        fits: &'static str,
    },

    /// Intent mode: the arguments of one of the four tools themselves are wrong.
    #[error("invalid arguments for {tool}: {}", problems.join("; "))]
    IntentArguments {
        tool: &'static str,
        problems: Vec<String>,
    },

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
    /// Whether the agent sees this as a tool error result it can read and correct (a tool that is
    /// not on offer, a call the policy refuses) rather than a JSON-RPC error.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Error::ToolDenied { .. }
                | Error::UnknownTool(_)
                | Error::RateLimited { .. }
                | Error::InvalidArguments { .. }
                | Error::IntentRequired { .. }
                | Error::IntentDirectCall { .. }
                | Error::IntentMismatch { .. }
                | Error::IntentServerMismatch { .. }
                | Error::IntentArguments { .. }
                | Error::ApprovalBusy { .. }
                | Error::ApprovalRejected { .. }
                | Error::ApprovalExpired { .. }
                | Error::ApprovalUnavailable { .. }
        )
    }

    /// The audit `decision` of an intent-mode refusal, which may come before the call's tool is
    /// known (its checks of the call itself); `None` for every other error.
    pub fn decision(&self) -> Option<&'static str> {
        match self {
            Error::IntentRequired { .. } | Error::IntentDirectCall { .. } => {
                Some("intent_required")
            }
            Error::IntentMismatch { .. } | Error::IntentServerMismatch { .. } => {
                Some("intent_mismatch")
            }
            Error::IntentArguments { .. } => Some("invalid_arguments"),
            _ => None,
        }
    }

    /// The stable code carried in the JSON-RPC error `data`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::ToolDenied { .. } => "PROXY.TOOL_DENIED",
            Error::UnknownTool(_) => "PROXY.UNKNOWN_TOOL",
            Error::RateLimited { .. } => "PROXY.RATE_LIMITED",
            Error::InvalidArguments { .. } | Error::IntentArguments { .. } => {
                "PROXY.INVALID_ARGUMENTS"
            }
            Error::IntentRequired { .. } | Error::IntentDirectCall { .. } => {
                "PROXY.INTENT_REQUIRED"
            }
            Error::IntentMismatch { .. } => "PROXY.INTENT_MISMATCH",
            Error::IntentServerMismatch { .. } => "PROXY.INTENT_SERVER_MISMATCH",
            Error::ApprovalBusy { .. } => "PROXY.APPROVAL_BUSY",
            Error::ApprovalRejected { .. } => "PROXY.APPROVAL_REJECTED",
            Error::ApprovalExpired { .. } => "PROXY.APPROVAL_EXPIRED",
            Error::ApprovalUnavailable { .. } => "PROXY.APPROVAL_UNAVAILABLE",
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
            Error::Parse(_) => "PROXY.PARSE_ERROR",
            Error::InvalidRequest(_) => "PROXY.INVALID_REQUEST",
            Error::InvalidParams(_) => "PROXY.INVALID_PARAMS",
            Error::Io { .. } | Error::Other(_) => "PROXY.INTERNAL",
        }
    }

    fn json_rpc_code(&self) -> ErrorCode {
        match self {
            Error::ToolDenied { .. }
            | Error::UnknownTool(_)
            | Error::InvalidArguments { .. }
            | Error::IntentRequired { .. }
            | Error::IntentDirectCall { .. }
            | Error::IntentMismatch { .. }
            | Error::IntentServerMismatch { .. }
            | Error::IntentArguments { .. }
            | Error::NotFound { .. }
            | Error::InvalidParams(_) => ErrorCode::INVALID_PARAMS,
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
        match self {
            Error::ToolDenied { server, rule, .. } => {
                data["server"] = json!(server);
                data["rule"] = json!(rule);
            }
            Error::RateLimited {
                server,
                limit,
                retry_after,
                ..
            } => {
                data["server"] = json!(server);
                data["rule"] = json!(limit);
                data["retryAfterSeconds"] = json!(retry_after.as_secs_f64());
            }
            Error::Backoff {
                server,
                failures,
                retry_in,
                ..
            } => {
                data["server"] = json!(server);
                data["failures"] = json!(failures);
                data["retryAfterSeconds"] = json!(retry_in.as_secs_f64());
            }
            Error::InvalidArguments {
                server, problems, ..
            } => {
                data["server"] = json!(server);
                data["problems"] = json!(problems);
            }
            Error::ApprovalBusy { server, limit, .. } => {
                data["server"] = json!(server);
                data["limit"] = json!(limit);
            }
            Error::ApprovalRejected {
                server,
                id,
                decided_by,
                reason,
                ..
            } => {
                data["server"] = json!(server);
                data["approvalId"] = json!(id);
                data["decidedBy"] = json!(decided_by);
                if let Some(reason) = reason {
                    data["reason"] = json!(reason);
                }
            }
            Error::ApprovalExpired {
                server,
                id,
                timeout,
                ..
            } => {
                data["server"] = json!(server);
                data["approvalId"] = json!(id);
                data["timeoutSeconds"] = json!(timeout.as_secs());
            }
            Error::ApprovalUnavailable { server, .. } => data["server"] = json!(server),
            Error::IntentArguments { problems, .. } => data["problems"] = json!(problems),
            Error::IntentServerMismatch { server, marked, .. } => {
                data["server"] = json!(server);
                data["risk"] = json!(marked);
            }
            _ => {}
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
    fn an_approval_refusal_names_who_decided_and_why() {
        let rejected = Error::ApprovalRejected {
            tool: "fs__write_file".into(),
            server: ServerName::new("fs"),
            id: "0a1b2c3d".into(),
            decided_by: "alice@example.com".into(),
            reason: Some("not this file".into()),
        };
        assert_eq!(
            rejected.to_string(),
            "tool \"fs__write_file\" was rejected by alice@example.com (approval 0a1b2c3d): not this file; the call was not made"
        );
        assert_eq!(
            rejected.to_mcp().data,
            Some(json!({
                "code": "PROXY.APPROVAL_REJECTED", "server": "fs", "approvalId": "0a1b2c3d",
                "decidedBy": "alice@example.com", "reason": "not this file",
            }))
        );
        let expired = Error::ApprovalExpired {
            tool: "fs__write_file".into(),
            server: ServerName::new("fs"),
            id: "0a1b2c3d".into(),
            timeout: Duration::from_secs(3),
        };
        assert!(expired.to_string().contains("not approved within 3s"));
        assert_eq!(
            expired.to_mcp().data,
            Some(
                json!({"code": "PROXY.APPROVAL_EXPIRED", "server": "fs", "approvalId": "0a1b2c3d", "timeoutSeconds": 3})
            )
        );
    }

    #[test]
    fn every_error_carries_its_code_and_peer_errors_pass_unchanged() {
        let denied = Error::ToolDenied {
            tool: "gh__delete_repo".into(),
            server: ServerName::new("gh"),
            rule: "servers[gh].tools.deny[0]".into(),
        }
        .to_mcp();
        assert_eq!(denied.code, ErrorCode::INVALID_PARAMS);
        assert_eq!(
            denied.data,
            Some(
                json!({"code": "PROXY.TOOL_DENIED", "server": "gh", "rule": "servers[gh].tools.deny[0]"})
            )
        );
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

    /// The texts of the validation matrix (docs/design/approval-and-intent.md), each followed by
    /// its fix where the matrix's words lack one.
    #[test]
    fn intent_refusals_say_the_matrix_words_and_carry_their_codes() {
        let required = Error::IntentRequired {
            variant: "call_tool_read",
            operation: "read",
        };
        assert_eq!(
            required.to_string(),
            "intent.operation_type is required (call call_tool_read with intent: {\"operation_type\": \"read\"})"
        );
        let mismatch = Error::IntentMismatch {
            variant: "call_tool_read",
            declared: "write",
            fits: "call_tool_write",
        };
        assert_eq!(
            mismatch.to_string(),
            "Intent mismatch: tool is call_tool_read but intent declares write (for a write call call_tool_write)"
        );
        let server = Error::IntentServerMismatch {
            tool: "fs__write_file".into(),
            server: ServerName::new("fs"),
            marked: Risk::Destructive,
            fits: "call_tool_destructive",
        };
        assert_eq!(
            server.to_string(),
            "Tool 'fs__write_file' is marked destructive by server, use call_tool_destructive"
        );
        assert_eq!(
            server.to_mcp().data,
            Some(
                json!({"code": "PROXY.INTENT_SERVER_MISMATCH", "server": "fs", "risk": "destructive"})
            )
        );
        for (error, code, decision) in [
            (required, "PROXY.INTENT_REQUIRED", "intent_required"),
            (mismatch, "PROXY.INTENT_MISMATCH", "intent_mismatch"),
            (server, "PROXY.INTENT_SERVER_MISMATCH", "intent_mismatch"),
        ] {
            assert_eq!(error.code(), code);
            assert_eq!(error.decision(), Some(decision));
            assert!(error.is_refusal(), "{code} is a tool error result");
        }
        assert_eq!(Error::UnknownTool("x".into()).decision(), None);
    }
}
