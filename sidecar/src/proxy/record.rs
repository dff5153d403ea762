//! What every `tools/call` leaves behind, whatever its outcome: an audit line, the call metrics
//! and the call's span fields.

use std::time::Instant;

use orchestrator_crds::proxy::OnChange;
use rmcp::model::CallToolResponse;

use super::{CallRequest, Proxy, Snapshot};
use crate::{
    audit::{self, Outcome, redact},
    error::Error,
    filter::{Risk, Rule, RuleDisplay},
    names::{ServerName, clip},
    router::{DefinitionChange, Route, exposed_name},
    telemetry,
};

/// A call the proxy's rules refused: the tool it would have reached and what decided.
pub(super) struct Denial {
    pub server: ServerName,
    pub tool: String,
    /// What decided, as a config path (`servers[fs].tools.deny[0] "write_*"`).
    pub rule: String,
    pub risk: Option<Risk>,
    /// The audit record's `decision`: `denied`, `rate_limited`, `invalid_arguments`, or one of
    /// the approval outcomes (`rejected`, `expired`, ...).
    pub decision: &'static str,
    /// The approval request that held the call, when one did.
    pub approval: Option<ApprovalNote>,
}

/// What the audit record of a call held for approval names.
#[derive(Clone, Debug)]
pub(super) struct ApprovalNote {
    pub id: String,
    /// Who decided (approved, rejected); `None` when nobody did.
    pub decided_by: Option<String>,
}

impl Denial {
    /// A tool hidden by a rule (patterns, `maxRisk`, a changed definition).
    pub fn by_rule(server: ServerName, tool: String, rule: &Rule, risk: Option<Risk>) -> Self {
        let rule = RuleDisplay {
            server: &server,
            rule,
        }
        .to_string();
        Self {
            server,
            tool,
            rule,
            risk,
            decision: "denied",
            approval: None,
        }
    }

    /// An exposed tool's call refused by the call policy (rate limit, argument validation).
    pub fn by_policy(route: &Route, rule: String, decision: &'static str) -> Self {
        Self {
            server: route.server.name.clone(),
            tool: route.tool.as_str().to_string(),
            rule,
            risk: Some(route.risk),
            decision,
            approval: None,
        }
    }

    /// The same refusal, of a call that an approval request held.
    pub fn held(self, approval: Option<ApprovalNote>) -> Self {
        Self { approval, ..self }
    }
}

/// An error's text as given, and without the call's argument values (an upstream's message may
/// echo what it was sent): the log always gets the second, the audit record the first only where
/// the configuration records arguments.
pub(super) struct ErrorText {
    given: String,
    /// `None`: the text held no argument value.
    redacted: Option<String>,
}

impl ErrorText {
    fn of(given: String, req: &CallRequest) -> Self {
        let redacted = match redact::without_values(&given, req.arguments.as_ref()) {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(r) => Some(r),
        };
        Self { given, redacted }
    }

    fn redacted(&self) -> &str {
        self.redacted.as_deref().unwrap_or(&self.given)
    }

    fn for_record(self, include_arguments: bool) -> String {
        match self.redacted {
            Some(redacted) if !include_arguments => redacted,
            _ => self.given,
        }
    }
}

impl Proxy {
    /// Records a call refused by the proxy itself and returns its error.
    pub(super) fn refuse(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        started: Instant,
        error: Error,
        denied: Option<Denial>,
    ) -> Result<CallToolResponse, Error> {
        // A tool that is not on offer is the agent's mistake to see and correct: it gets a tool
        // error result it can read (as most MCP servers answer unknown tools). Failures of the
        // proxy itself stay JSON-RPC errors.
        let as_result = error.is_refusal();
        let outcome = match (&denied, as_result) {
            (Some(_), true) => Outcome::Denied,
            // A held call that ended without a decision (cancelled, shutdown).
            (Some(_), false) => Outcome::ProtocolError,
            // Intent mode's checks of the call itself refuse before its tool is known.
            (None, true) if error.decision().is_some() => Outcome::Denied,
            (None, true) => Outcome::ToolError,
            (None, false) => Outcome::ProtocolError,
        };
        let (server, upstream_tool, rule, risk, decision) = match &denied {
            Some(d) => (
                Some(d.server.as_str()),
                Some(d.tool.as_str()),
                Some(d.rule.clone()),
                d.risk,
                d.decision,
            ),
            None => (
                None,
                None,
                None,
                None,
                error.decision().unwrap_or("unknown"),
            ),
        };
        let tool = clip(&req.name);
        let text = ErrorText::of(error.to_string(), req);
        tracing::info!(%tool, session = %req.session.id, error = %text.redacted(), "tools/call refused");
        let span = telemetry::call_span(&tool, req.session.id, &req.meta);
        if !span.is_none() {
            span.record("mcp.server", server.unwrap_or(""));
            span.record("mcp.decision", decision);
            span.record("mcp.outcome", outcome.as_str());
            span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
        }
        // A name no upstream listed is client input, whatever server prefix it carries (a
        // refusal by rule names the server without its list): one fixed label for all of them.
        let label_tool = if snap.is_listed(&req.name) {
            req.name.as_str()
        } else {
            "(unknown)"
        };
        // Refusals by the call policy count under their own outcome (`rate_limited`, ...).
        let label_outcome = match outcome {
            Outcome::Denied => decision,
            other => other.as_str(),
        };
        self.metrics.call(
            server.unwrap_or("(none)"),
            label_tool,
            label_outcome,
            started.elapsed().as_secs_f64(),
        );
        self.write_audit(
            snap,
            req,
            server,
            upstream_tool,
            risk,
            decision,
            rule,
            outcome,
            Some(text),
            started,
            denied.as_ref().and_then(|d| d.approval.as_ref()),
        );
        if !as_result {
            return Err(error);
        }
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert(
            "io.orchestrator/proxy".into(),
            error.to_mcp().data.unwrap_or_default(),
        );
        let result = rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(
            error.to_string(),
        )])
        .with_meta(Some(meta));
        Ok(CallToolResponse::Complete(result))
    }

    /// A tool definition that is not the approved one: a warning, a metric and an audit record
    /// (decision `quarantined` under `onChange: block`, `alerted` under `alert`).
    pub(super) fn report_definition_change(&self, snap: &Snapshot, c: &DefinitionChange) {
        let what = c.change.describe(c.server.as_str(), c.tool.as_str());
        let (decision, action) = match c.on_change {
            OnChange::Block => ("quarantined", "block"),
            OnChange::Alert => ("alerted", "alert"),
        };
        tracing::warn!(server = %c.server, tool = %c.tool, definition = %c.change.seen(), action, "{what}");
        self.metrics
            .definition_changed(&c.server, c.tool.as_str(), action);
        let _ = self.task_events.try_send(super::TaskEvent {
            task: snap.config.task_name.clone(),
            reason: "ToolDefinitionChanged",
            action: match c.on_change {
                OnChange::Block => "Quarantine",
                OnChange::Alert => "Alert",
            },
            note: format!("{what}; policy.onChange {}", c.on_change),
        });
        let config = &snap.config;
        let exposed = exposed_name(config.tool_prefix, &c.server, c.tool.as_str());
        let record = audit::Record {
            ts: audit::timestamp(),
            task: &config.task_name,
            namespace: &config.task_namespace,
            context_version: config.context_version,
            session: String::new(),
            client: String::new(),
            protocol: None,
            request_id: String::new(),
            tool: exposed.as_str(),
            server: Some(c.server.as_str()),
            upstream_tool: Some(c.tool.as_str()),
            risk: None,
            decision,
            approval_id: None,
            decided_by: None,
            rule: Some(format!("policy.onChange \"{}\" ({what})", c.on_change)),
            outcome: Outcome::DefinitionChanged,
            error: None,
            duration_ms: 0.0,
            argument_bytes: 0,
            arguments: None,
            intent: None,
        };
        self.audit.record(config.audit.path.as_ref(), &record);
    }

    /// Records a call that was forwarded (after a person approved it, when `approved`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        route: &Route,
        started: Instant,
        result: &Result<CallToolResponse, Error>,
        span: &tracing::Span,
        approved: Option<&ApprovalNote>,
    ) {
        let decision = if approved.is_some() {
            "approved"
        } else {
            "allowed"
        };
        let (outcome, error) = match result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
                (Outcome::ToolError, None)
            }
            Ok(_) => (Outcome::Ok, None),
            Err(e) => (
                Outcome::ProtocolError,
                Some(ErrorText::of(e.to_string(), req)),
            ),
        };
        if let Some(e) = &error {
            tracing::warn!(tool = %clip(&req.name), server = %route.server.name, error = %e.redacted(), "tools/call failed");
        }
        let elapsed = started.elapsed();
        if !span.is_none() {
            span.record("mcp.server", route.server.name.as_str());
            span.record("mcp.decision", decision);
            span.record("mcp.outcome", outcome.as_str());
            span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        }
        self.metrics.call(
            route.server.name.as_str(),
            &req.name,
            outcome.as_str(),
            elapsed.as_secs_f64(),
        );
        let rule = route.server.filter.verdict(route.tool.as_str());
        let rule = RuleDisplay {
            server: &route.server.name,
            rule: rule.rule(),
        }
        .to_string();
        self.write_audit(
            snap,
            req,
            Some(route.server.name.as_str()),
            Some(route.tool.as_str()),
            Some(route.risk),
            decision,
            Some(rule),
            outcome,
            error,
            started,
            approved,
        );
    }

    /// Records a call the proxy answered itself (intent mode's `retrieve_tools`): no server.
    pub(super) fn answered(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        started: Instant,
        result: &CallToolResponse,
    ) {
        let outcome = match result {
            CallToolResponse::Complete(r) if r.is_error == Some(true) => Outcome::ToolError,
            _ => Outcome::Ok,
        };
        self.metrics.call(
            "(proxy)",
            &req.name,
            outcome.as_str(),
            started.elapsed().as_secs_f64(),
        );
        self.write_audit(
            snap, req, None, None, None, "allowed", None, outcome, None, started, None,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn write_audit(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        server: Option<&str>,
        upstream_tool: Option<&str>,
        risk: Option<Risk>,
        decision: &'static str,
        rule: Option<String>,
        outcome: Outcome,
        error: Option<ErrorText>,
        started: Instant,
        approval: Option<&ApprovalNote>,
    ) {
        let config = &snap.config;
        // Where the configuration keeps argument values out of the record, they are kept out of
        // the error text too, whoever wrote it (an upstream may echo what it was sent).
        let error = error.map(|e| e.for_record(config.audit.include_arguments));
        let argument_bytes = req
            .arguments
            .as_ref()
            .map(|a| serde_json::to_vec(a).map(|v| v.len()).unwrap_or(0))
            .unwrap_or(0);
        let record = audit::Record {
            ts: audit::timestamp(),
            task: &config.task_name,
            namespace: &config.task_namespace,
            context_version: config.context_version,
            session: req.session.id.to_string(),
            client: audit::client_identity(
                &config.task_namespace,
                &config.task_name,
                req.session.client_info.as_ref(),
            ),
            protocol: req.session.protocol.as_ref().map(|p| p.as_str()),
            request_id: clip(&req.request_id.to_string()).into_owned(),
            tool: &clip(&req.name),
            server,
            upstream_tool,
            risk: risk.map(Risk::as_str),
            decision,
            approval_id: approval.map(|a| a.id.as_str()),
            decided_by: approval.and_then(|a| a.decided_by.as_deref()),
            rule,
            outcome,
            error,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            argument_bytes,
            arguments: if config.audit.include_arguments {
                req.arguments.as_ref()
            } else {
                None
            },
            intent: req.intent.as_ref().map(|declared| declared.audit()),
        };
        self.audit.record(config.audit.path.as_ref(), &record);
    }
}
