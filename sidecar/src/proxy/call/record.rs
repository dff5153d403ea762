//! What every `tools/call` leaves behind, whatever its outcome: an audit line, the call metrics
//! and the call's span fields ([`Ledger`]); also the record of a changed tool definition.

use std::time::Instant;

use orchestrator_crds::proxy::OnChange;
use rmcp::model::CallToolResponse;

use super::super::{CallRequest, Snapshot, TaskEvent};
use crate::{
    audit::{self, Audit, Outcome, redact},
    error::Error,
    filter::{Risk, RuleDisplay},
    metrics::Metrics,
    names::clip,
    policy::refusal::{ApprovalNote, Refusal},
    router::{DefinitionChange, Route, exposed_name},
    telemetry,
};

/// An error's text as given, and without the call's argument values (an upstream's message may
/// echo what it was sent): the log always gets the second, the audit record the first only where
/// the configuration records arguments.
struct ErrorText {
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

/// What records calls: the audit log and the metrics (the call's span is its own), and the
/// stream of events about the task.
pub(in crate::proxy) struct Ledger<'a> {
    pub audit: &'a Audit,
    pub metrics: &'a Metrics,
    pub task_events: &'a tokio::sync::mpsc::Sender<TaskEvent>,
}

impl Ledger<'_> {
    /// Records a call refused at one of the call path's steps: a log line, the span's fields,
    /// the call metric and the audit record, each as the refusal says.
    pub fn refused(&self, snap: &Snapshot, req: &CallRequest, started: Instant, refusal: &Refusal) {
        let target = refusal.target.as_ref();
        let server = target.map(|t| t.server.as_str());
        let decision = refusal.decision();
        let outcome = refusal.outcome();
        let tool = clip(&req.name);
        let text = ErrorText::of(refusal.text(&tool), req);
        tracing::info!(%tool, session = %req.session.id, error = %text.redacted(), "tools/call refused");
        let span = telemetry::call_span(
            &req.name,
            req.session.id,
            req.session.protocol.as_ref().map(|p| p.as_str()),
            &req.request_id.to_string(),
            &req.meta,
        );
        telemetry::record_call(
            &span,
            server,
            decision,
            outcome.as_str(),
            Some(refusal.code()),
            started.elapsed().as_secs_f64() * 1000.0,
        );
        // A name no upstream listed is client input, whatever server prefix it carries (a
        // refusal by rule names the server without its list): one fixed label for all of them.
        let listed = target
            .and_then(|t| t.listed)
            .unwrap_or_else(|| snap.is_listed(&req.name));
        let label_tool = if listed {
            req.name.as_str()
        } else {
            "(unknown)"
        };
        self.metrics.call(
            server.unwrap_or("(none)"),
            label_tool,
            refusal.metric_outcome(),
            started.elapsed().as_secs_f64(),
        );
        self.write_audit(
            snap,
            req,
            Decided {
                server,
                upstream_tool: target.map(|t| t.tool.as_str()),
                risk: target.and_then(|t| t.risk),
                decision,
                rule: refusal.rule.clone(),
                approval: refusal.approval.as_ref(),
            },
            outcome,
            Some(text),
            started,
        );
    }

    /// A tool definition that is not the approved one: a warning, a metric and an audit record
    /// (decision `quarantined` under `onChange: block`, `alerted` under `alert`).
    pub fn definition_changed(&self, snap: &Snapshot, c: &DefinitionChange) {
        let what = c.change.describe(c.server.as_str(), c.tool.as_str());
        let (decision, action) = match c.on_change {
            OnChange::Block => ("quarantined", "block"),
            OnChange::Alert => ("alerted", "alert"),
        };
        tracing::warn!(server = %c.server, tool = %c.tool, definition = %c.change.seen(), action, "{what}");
        self.metrics
            .definition_changed(&c.server, c.tool.as_str(), action);
        let _ = self.task_events.try_send(TaskEvent {
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
            record_type: audit::RecordType::DefinitionChange,
            ts: audit::timestamp(),
            task: &config.task_name,
            namespace: &config.task_namespace,
            created_by: config.task_created_by.as_deref(),
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
            approval_digest: None,
            decided_by: None,
            rule: Some(format!("policy.onChange \"{}\" ({what})", c.on_change)),
            outcome: Outcome::DefinitionChanged,
            error: None,
            duration_ms: 0.0,
            argument_bytes: 0,
            arguments: None,
            intent: None,
            model: None,
        };
        self.audit.record(config.audit.path.as_ref(), &record);
    }

    /// Records a call that was forwarded (after a person approved it, when `approved`).
    #[allow(clippy::too_many_arguments)]
    pub fn forwarded(
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
        let error_type = match result {
            Ok(_) if outcome == Outcome::ToolError => Some("tool_error".to_string()),
            Ok(_) => None,
            Err(e) => Some(error_type(e)),
        };
        telemetry::record_call(
            span,
            Some(route.server.name.as_str()),
            decision,
            outcome.as_str(),
            error_type.as_deref(),
            elapsed.as_secs_f64() * 1000.0,
        );
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
        let decided = Decided {
            server: Some(route.server.name.as_str()),
            upstream_tool: Some(route.tool.as_str()),
            risk: Some(route.risk),
            decision,
            rule: Some(rule),
            approval: approved,
        };
        self.write_audit(snap, req, decided, outcome, error, started);
    }

    /// Records a call the proxy answered itself (intent mode's `retrieve_tools`): no server.
    pub fn answered(
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
        let decided = Decided {
            server: None,
            upstream_tool: None,
            risk: None,
            decision: "allowed",
            rule: None,
            approval: None,
        };
        self.write_audit(snap, req, decided, outcome, None, started);
    }

    fn write_audit(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        decided: Decided<'_>,
        outcome: Outcome,
        error: Option<ErrorText>,
        started: Instant,
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
            record_type: audit::RecordType::ToolCall,
            ts: audit::timestamp(),
            task: &config.task_name,
            namespace: &config.task_namespace,
            created_by: config.task_created_by.as_deref(),
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
            server: decided.server,
            upstream_tool: decided.upstream_tool,
            risk: decided.risk.map(Risk::as_str),
            decision: decided.decision,
            approval_id: decided.approval.map(|a| a.id.as_str()),
            approval_digest: decided.approval.map(|a| a.digest.as_str()),
            decided_by: decided.approval.and_then(|a| a.decided_by.as_deref()),
            rule: decided.rule,
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
            model: None,
        };
        self.audit.record(config.audit.path.as_ref(), &record);
    }

    /// Shared mode: the `tool_call_started` line of a call about to be forwarded, awaited until
    /// written (`audit::started`). Elsewhere nothing.
    pub async fn started(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        route: &Route,
        approved: Option<&ApprovalNote>,
    ) {
        if !self.audit.writes_started() {
            return;
        }
        let config = &snap.config;
        let record = audit::started::Started {
            record_type: audit::RecordType::ToolCallStarted,
            ts: audit::timestamp(),
            task: &config.task_name,
            namespace: &config.task_namespace,
            created_by: config.task_created_by.as_deref(),
            context_version: config.context_version,
            session: req.session.id.to_string(),
            request_id: clip(&req.request_id.to_string()).into_owned(),
            tool: &clip(&req.name),
            server: route.server.name.as_str(),
            upstream_tool: route.tool.as_str(),
            arguments_digest: audit::started::arguments_digest(req.arguments.as_ref()),
            approval_id: approved.map(|a| a.id.as_str()),
        };
        self.audit
            .started(config.audit.path.as_ref(), &record)
            .await;
    }
}

/// A failed call's `error.type` (MCP semantic conventions): the JSON-RPC error code the upstream
/// answered, as a string, or the proxy's own code (`PROXY.UPSTREAM_TIMEOUT`, ...).
fn error_type(e: &Error) -> String {
    match e {
        Error::Upstream {
            source: rmcp::ServiceError::McpError(data),
            ..
        } => data.code.0.to_string(),
        other => other.code().to_string(),
    }
}

/// What the audit record says was decided about a call, and on which tool.
struct Decided<'a> {
    server: Option<&'a str>,
    upstream_tool: Option<&'a str>,
    risk: Option<Risk>,
    decision: &'static str,
    rule: Option<String>,
    approval: Option<&'a ApprovalNote>,
}
