//! [`Refusal`]: why a `tools/call` went no further than one step of the call path (see
//! `proxy::call`). Each reason says here, once, everything the proxy does with it: its text, its
//! `PROXY.*` code and data (in the tool error result the agent reads, or the JSON-RPC error of a
//! failure), its audit `decision` and outcome, and its metric labels.
//!
//! A refusal by policy is a tool error result, which the agent can read and correct (as most MCP
//! servers answer unknown tools); a call that could not go on because something failed (an
//! upstream that did not start, shutdown, the client's cancellation while a person decided) is
//! a JSON-RPC error, as [`Error`] says.

use std::time::Duration;

use orchestrator_crds::proxy::Risk;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, MetaObject};
use serde_json::{Value, json};

use crate::{audit::Outcome, error::Error, names::ServerName};

/// Why a call was refused, with what the reason's text and data need.
#[derive(Debug)]
pub enum Reason {
    /// A rule hides the tool (patterns, `maxRisk`, a changed definition), or withdrew it while
    /// the call waited for approval: the refusal's `rule` says which.
    Denied,
    /// No tool of that name.
    Unknown,
    /// A rate limit refused the call; it can be made again after `retry_after`.
    RateLimited {
        /// The limit's config path.
        limit: String,
        /// `6/min, burst 2`.
        rate: String,
        retry_after: Duration,
    },
    /// The arguments do not match the tool's `inputSchema`; the call did not leave the proxy.
    InvalidArguments { problems: Vec<String> },
    /// A `deny` condition of `policy.conditions` holds for the call (the refusal's `rule` names
    /// it); `message` is the condition's.
    ConditionDenied {
        name: String,
        message: Option<String>,
    },
    /// A condition could not be evaluated on the call (a missing argument, a value of another
    /// type, its budget): refused, as a condition that cannot say yes.
    ConditionFailed { name: String, error: String },
    /// A decision point refused the call (the refusal's `rule` names it), with its reason.
    DecisionDenied { reason: Option<String> },
    /// A decision point gave no decision (unreachable, an error, too slow, no result): refused.
    DecisionFailed { error: String },
    /// `policy.requireApproval` holds this call, but as many calls as may wait already do.
    ApprovalBusy { limit: usize },
    /// A person rejected the held call; it never reached the upstream.
    ApprovalRejected {
        id: String,
        decided_by: String,
        reason: Option<String>,
    },
    /// Nobody decided on the held call within `policy.requireApproval.timeoutSeconds`.
    ApprovalExpired { id: String, timeout: Duration },
    /// The call needs approval but the proxy has no Lease to ask on: nobody could see it.
    ApprovalUnavailable,
    /// The call needs approval, but its request would take `bytes` to show, more than `limit`
    /// (`MAX_REQUEST_BYTES`): it is not held blind.
    ApprovalTooLarge { bytes: usize, limit: usize },
    /// The decision on approval `id` names another call (`named`, a digest) than the one held
    /// (`held`): the call is not made.
    ApprovalMismatch {
        id: String,
        named: String,
        held: String,
    },
    /// Intent mode: a `call_tool_*` call without `intent.operation_type`.
    IntentRequired {
        variant: &'static str,
        operation: &'static str,
    },
    /// Intent mode: a tool called by its own name instead of through a `call_tool_*`.
    IntentDirectCall,
    /// Intent mode: the declared operation is not the one of the `call_tool_*` called.
    IntentMismatch {
        variant: &'static str,
        declared: &'static str,
        /// The variant that takes the declared operation.
        fits: &'static str,
    },
    /// Intent mode: the tool's server (or its `risk` override) marks it riskier than the
    /// `call_tool_*` called.
    IntentServerMismatch {
        marked: Risk,
        fits: &'static str,
        /// Nothing says the tool only reads: `marked` is the proxy's class, not the server's.
        unannotated: bool,
    },
    /// Intent mode: the arguments of one of its own tools are wrong.
    IntentArguments {
        tool: &'static str,
        problems: Vec<String>,
    },
    /// The call waited for a person and its client cancelled it, or shutdown cut it off.
    Withdrawn(Error),
    /// The call could not be decided: the proxy or an upstream failed (a server whose list would
    /// say did not start, shutdown began).
    Failed(Error),
}

/// The tool a refused call would have reached.
#[derive(Clone, Debug)]
pub struct Target {
    pub server: ServerName,
    /// The upstream's name of the tool.
    pub tool: String,
    /// Its class, when its server's list is known.
    pub risk: Option<Risk>,
    /// Whether an upstream listed it (only listed names become metric labels); `None`: ask the
    /// table.
    pub listed: Option<bool>,
}

/// What the audit record of a call held for approval names.
#[derive(Clone, Debug)]
pub struct ApprovalNote {
    pub id: String,
    /// Who decided (approved, rejected); `None` when nobody did.
    pub decided_by: Option<String>,
    /// The digest of the call held (what a decision must name).
    pub digest: String,
    /// The context version the call was held at (part of the digest).
    pub context_version: u64,
}

/// A call that went no further: why, the tool it would have reached and what decided (boxed:
/// steps return it on their cold path, and `Result<_, Refusal>` stays small).
#[derive(Debug)]
pub struct Refusal(Box<Refused>);

/// What a [`Refusal`] holds.
#[derive(Debug)]
pub struct Refused {
    pub reason: Reason,
    pub target: Option<Target>,
    /// What decided, as a config path (`servers[fs].tools.deny[0] "write_*"`).
    pub rule: Option<String>,
    /// The approval request that held the call, when one did.
    pub approval: Option<ApprovalNote>,
}

impl std::ops::Deref for Refusal {
    type Target = Refused;

    fn deref(&self) -> &Refused {
        &self.0
    }
}

impl From<Error> for Refusal {
    fn from(error: Error) -> Self {
        Refusal::new(Reason::Failed(error))
    }
}

impl Refusal {
    pub fn new(reason: Reason) -> Self {
        Self(Box::new(Refused {
            reason,
            target: None,
            rule: None,
            approval: None,
        }))
    }

    /// The refusal of a call to `target`, decided by `rule`.
    pub fn of(reason: Reason, target: Target, rule: String) -> Self {
        Self(Box::new(Refused {
            reason,
            target: Some(target),
            rule: Some(rule),
            approval: None,
        }))
    }

    /// The same refusal, of a call that an approval request held.
    pub fn held(mut self, approval: Option<ApprovalNote>) -> Self {
        self.0.approval = approval;
        self
    }

    /// Whether the call named no tool the proxy knows.
    pub fn is_unknown(&self) -> bool {
        matches!(self.reason, Reason::Unknown)
    }

    /// The audit record's `decision`.
    pub fn decision(&self) -> &'static str {
        match &self.reason {
            Reason::Denied
            | Reason::ConditionDenied { .. }
            | Reason::ConditionFailed { .. }
            | Reason::DecisionDenied { .. }
            | Reason::DecisionFailed { .. } => "denied",
            Reason::Unknown | Reason::Failed(_) => "unknown",
            Reason::RateLimited { .. } => "rate_limited",
            Reason::InvalidArguments { .. } | Reason::IntentArguments { .. } => "invalid_arguments",
            Reason::ApprovalBusy { .. } => "approval_busy",
            Reason::ApprovalRejected { .. } => "rejected",
            Reason::ApprovalExpired { .. } => "expired",
            Reason::ApprovalUnavailable => "approval_unavailable",
            Reason::ApprovalTooLarge { .. } => "approval_too_large",
            Reason::ApprovalMismatch { .. } => "approval_mismatch",
            Reason::IntentRequired { .. } | Reason::IntentDirectCall => "intent_required",
            Reason::IntentMismatch { .. } | Reason::IntentServerMismatch { .. } => {
                "intent_mismatch"
            }
            Reason::Withdrawn(_) => "withdrawn",
        }
    }

    /// The audit record's `outcome`.
    pub fn outcome(&self) -> Outcome {
        match &self.reason {
            Reason::Unknown => Outcome::ToolError,
            Reason::Withdrawn(_) | Reason::Failed(_) => Outcome::ProtocolError,
            _ => Outcome::Denied,
        }
    }

    /// The `outcome` label of `mcp_proxy_tool_calls_total`: a refusal by policy counts under its
    /// decision (`rate_limited`, ...).
    pub fn metric_outcome(&self) -> &'static str {
        match self.outcome() {
            Outcome::Denied => self.decision(),
            other => other.as_str(),
        }
    }

    /// The `outcome` label of `mcp_proxy_approvals_total`, for a held call's end.
    pub fn approval_outcome(&self) -> Option<&'static str> {
        match &self.reason {
            Reason::ApprovalBusy { .. } => Some("busy"),
            Reason::ApprovalRejected { .. } => Some("rejected"),
            Reason::ApprovalExpired { .. } => Some("expired"),
            Reason::ApprovalUnavailable => Some("unavailable"),
            Reason::ApprovalTooLarge { .. } => Some("too_large"),
            Reason::ApprovalMismatch { .. } => Some("mismatch"),
            Reason::Withdrawn(_) => Some("withdrawn"),
            _ => None,
        }
    }

    /// The stable code of the answer.
    pub fn code(&self) -> &'static str {
        match &self.reason {
            Reason::Denied => "PROXY.TOOL_DENIED",
            Reason::ConditionDenied { .. } => "PROXY.CONDITION_DENIED",
            Reason::ConditionFailed { .. } => "PROXY.CONDITION_FAILED",
            Reason::DecisionDenied { .. } => "PROXY.DECISION_DENIED",
            Reason::DecisionFailed { .. } => "PROXY.DECISION_FAILED",
            Reason::Unknown => "PROXY.UNKNOWN_TOOL",
            Reason::RateLimited { .. } => "PROXY.RATE_LIMITED",
            Reason::InvalidArguments { .. } | Reason::IntentArguments { .. } => {
                "PROXY.INVALID_ARGUMENTS"
            }
            Reason::ApprovalBusy { .. } => "PROXY.APPROVAL_BUSY",
            Reason::ApprovalRejected { .. } => "PROXY.APPROVAL_REJECTED",
            Reason::ApprovalExpired { .. } => "PROXY.APPROVAL_EXPIRED",
            Reason::ApprovalUnavailable => "PROXY.APPROVAL_UNAVAILABLE",
            Reason::ApprovalTooLarge { .. } => "PROXY.APPROVAL_TOO_LARGE",
            Reason::ApprovalMismatch { .. } => "PROXY.APPROVAL_MISMATCH",
            Reason::IntentRequired { .. } | Reason::IntentDirectCall => "PROXY.INTENT_REQUIRED",
            Reason::IntentMismatch { .. } => "PROXY.INTENT_MISMATCH",
            Reason::IntentServerMismatch { .. } => "PROXY.INTENT_SERVER_MISMATCH",
            Reason::Withdrawn(e) | Reason::Failed(e) => e.code(),
        }
    }

    /// What the agent reads, for a call of `tool` (the name it called).
    pub fn text(&self, tool: &str) -> String {
        let rule = self.rule.as_deref().unwrap_or_default();
        match &self.reason {
            Reason::Denied => format!("tool {tool:?} is not allowed: denied by {rule}"),
            Reason::Unknown => format!("unknown tool {tool:?}"),
            Reason::ConditionDenied { name, message } => format!(
                "tool {tool:?} is not allowed for this call: condition {name:?} ({rule}) holds{}; the call was not made",
                message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ),
            Reason::ConditionFailed { name, error } => format!(
                "tool {tool:?} is not allowed for this call: condition {name:?} ({rule}) could not be evaluated on it ({error}), and a condition that cannot say is a refusal; the call was not made"
            ),
            Reason::DecisionDenied { reason } => format!(
                "tool {tool:?} is not allowed for this call: the policy service ({rule}) refused it{}; the call was not made",
                reason
                    .as_deref()
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            Reason::DecisionFailed { error } => format!(
                "tool {tool:?} is not allowed for this call: {error} ({rule}), and a call the policy service has not allowed is refused; the call was not made"
            ),
            Reason::RateLimited {
                limit,
                rate,
                retry_after,
            } => format!(
                "tool {tool:?} is rate limited by {limit} ({rate}); retry in {:.1}s",
                retry_after.as_secs_f64()
            ),
            Reason::InvalidArguments { problems } => format!(
                "invalid arguments for tool {tool:?} (its inputSchema; the server was not called): {}",
                problems.join("; ")
            ),
            Reason::ApprovalBusy { limit } => format!(
                "tool {tool:?} needs a person's approval (policy.requireApproval), but {limit} calls already wait for one, the most a task may have; the call was not made: try again once some are decided"
            ),
            Reason::ApprovalRejected {
                id,
                decided_by,
                reason,
            } => format!(
                "tool {tool:?} was rejected by {decided_by} (approval {id}){}; the call was not made",
                reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            Reason::ApprovalExpired { id, timeout } => format!(
                "tool {tool:?} was not approved within {}s (approval {id} expired); the call was not made",
                timeout.as_secs()
            ),
            Reason::ApprovalUnavailable => format!(
                "tool {tool:?} needs a person's approval (policy.requireApproval), but approval needs the Kubernetes API (the task's Lease, --served-lease), which this proxy does not use; the call was not made"
            ),
            Reason::ApprovalTooLarge { bytes, limit } => format!(
                "tool {tool:?} needs a person's approval (policy.requireApproval), and its call would take {bytes} bytes to show, more than the {limit} a request may hold; the call was not made: send smaller arguments (e.g. write the file in parts)"
            ),
            Reason::ApprovalMismatch { id, named, held } => format!(
                "approval {id} names another call ({}), not this one ({}); the call to tool {tool:?} was not made",
                short(named),
                short(held)
            ),
            Reason::IntentRequired { variant, operation } => format!(
                "intent.operation_type is required (call {variant} with intent: {{\"operation_type\": \"{operation}\"}})"
            ),
            Reason::IntentDirectCall => format!(
                "tool {tool:?} is not called by its name in intent mode (policy.toolMode: intent): call call_tool_read, call_tool_write or call_tool_destructive with \"name\": {tool:?} (retrieve_tools says which)"
            ),
            Reason::IntentMismatch {
                variant,
                declared,
                fits,
            } => format!(
                "Intent mismatch: tool is {variant} but intent declares {declared} (for a {declared} call {fits})"
            ),
            Reason::IntentServerMismatch {
                marked,
                fits,
                unannotated: false,
            } => format!("Tool '{tool}' is marked {marked} by server, use {fits}"),
            Reason::IntentServerMismatch {
                marked,
                fits,
                unannotated: true,
            } => format!(
                "Tool '{tool}' is not annotated as read-only by its server, so the proxy classes it {marked}; use {fits}"
            ),
            Reason::IntentArguments { tool, problems } => {
                format!("invalid arguments for {tool}: {}", problems.join("; "))
            }
            Reason::Withdrawn(e) | Reason::Failed(e) => e.to_string(),
        }
    }

    /// The machine-readable part of a refusal by policy: its code and what it names.
    pub fn data(&self) -> Value {
        let mut data = json!({ "code": self.code() });
        let server = self.target.as_ref().map(|t| t.server.as_str());
        match &self.reason {
            Reason::Denied => {
                data["server"] = json!(server);
                data["rule"] = json!(self.rule);
            }
            Reason::RateLimited {
                limit, retry_after, ..
            } => {
                data["server"] = json!(server);
                data["rule"] = json!(limit);
                data["retryAfterSeconds"] = json!(retry_after.as_secs_f64());
            }
            Reason::InvalidArguments { problems } => {
                data["server"] = json!(server);
                data["problems"] = json!(problems);
            }
            Reason::ConditionDenied { name, message } => {
                data["server"] = json!(server);
                data["rule"] = json!(self.rule);
                data["condition"] = json!(name);
                if let Some(message) = message {
                    data["message"] = json!(message);
                }
            }
            Reason::ConditionFailed { name, error } => {
                data["server"] = json!(server);
                data["rule"] = json!(self.rule);
                data["condition"] = json!(name);
                data["error"] = json!(error);
            }
            Reason::DecisionDenied { reason } => {
                data["server"] = json!(server);
                data["rule"] = json!(self.rule);
                if let Some(reason) = reason {
                    data["reason"] = json!(reason);
                }
            }
            Reason::DecisionFailed { error } => {
                data["server"] = json!(server);
                data["rule"] = json!(self.rule);
                data["error"] = json!(error);
            }
            Reason::ApprovalBusy { limit } => {
                data["server"] = json!(server);
                data["limit"] = json!(limit);
            }
            Reason::ApprovalRejected {
                id,
                decided_by,
                reason,
            } => {
                data["server"] = json!(server);
                data["approvalId"] = json!(id);
                data["decidedBy"] = json!(decided_by);
                if let Some(reason) = reason {
                    data["reason"] = json!(reason);
                }
            }
            Reason::ApprovalExpired { id, timeout } => {
                data["server"] = json!(server);
                data["approvalId"] = json!(id);
                data["timeoutSeconds"] = json!(timeout.as_secs());
            }
            Reason::ApprovalUnavailable => data["server"] = json!(server),
            Reason::ApprovalTooLarge { bytes, limit } => {
                data["server"] = json!(server);
                data["bytes"] = json!(bytes);
                data["limit"] = json!(limit);
            }
            Reason::ApprovalMismatch { id, named, held } => {
                data["server"] = json!(server);
                data["approvalId"] = json!(id);
                data["named"] = json!(named);
                data["held"] = json!(held);
            }
            Reason::IntentArguments { problems, .. } => data["problems"] = json!(problems),
            Reason::IntentServerMismatch { marked, .. } => {
                data["server"] = json!(server);
                data["risk"] = json!(marked);
            }
            Reason::Withdrawn(e) | Reason::Failed(e) => {
                return e.to_mcp().data.unwrap_or_default();
            }
            Reason::Unknown
            | Reason::IntentRequired { .. }
            | Reason::IntentDirectCall
            | Reason::IntentMismatch { .. } => {}
        }
        data
    }

    /// The answer to the call of `tool`: a tool error result the agent can read, or, for a call
    /// that failed, the JSON-RPC error.
    pub fn answer(self, tool: &str) -> Result<CallToolResponse, Error> {
        let (text, data) = (self.text(tool), self.data());
        match self.0.reason {
            Reason::Withdrawn(e) | Reason::Failed(e) => Err(e),
            _ => {
                let mut meta = MetaObject::new();
                meta.insert("io.orchestrator/proxy".into(), data);
                let result =
                    CallToolResult::error(vec![ContentBlock::text(text)]).with_meta(Some(meta));
                Ok(CallToolResponse::Complete(result))
            }
        }
    }
}

/// A digest as a person reads it: `sha256:` and its first 12 hex digits.
fn short(digest: &str) -> String {
    match digest.get(..19) {
        Some(head) if digest.len() > 19 => format!("{head}…"),
        _ if digest.is_empty() => "no digest".to_string(),
        _ => digest.to_string(),
    }
}

#[cfg(test)]
mod tests;
