//! What every `tools/call` leaves behind, whatever its outcome: an audit line, the call metrics
//! and the call's span fields.

use std::time::Instant;

use rmcp::model::CallToolResponse;

use super::{CallRequest, Proxy, Snapshot};
use crate::{
    audit::{self, Outcome},
    error::Error,
    filter::{Risk, Rule, RuleDisplay},
    names::{ServerName, clip},
    router::Route,
    telemetry,
};

/// A call the proxy's rules refused: the tool it would have reached and what decided.
pub(super) struct Denial {
    pub server: ServerName,
    pub tool: String,
    pub rule: Rule,
    pub risk: Option<Risk>,
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
        let as_result = matches!(error, Error::ToolDenied { .. } | Error::UnknownTool(_));
        let outcome = match (&denied, as_result) {
            (Some(_), _) => Outcome::Denied,
            (None, true) => Outcome::ToolError,
            (None, false) => Outcome::ProtocolError,
        };
        let (server, upstream_tool, rule, risk) = match &denied {
            Some(d) => (
                Some(d.server.as_str()),
                Some(d.tool.as_str()),
                Some(
                    RuleDisplay {
                        server: &d.server,
                        rule: &d.rule,
                    }
                    .to_string(),
                ),
                d.risk,
            ),
            None => (None, None, None, None),
        };
        let tool = clip(&req.name);
        tracing::info!(%tool, session = %req.session.id, error = %error, "tools/call refused");
        let span = telemetry::call_span(&tool, req.session.id, &req.meta);
        if !span.is_none() {
            span.record("mcp.server", server.unwrap_or(""));
            span.record(
                "mcp.decision",
                if denied.is_some() {
                    "denied"
                } else {
                    "unknown"
                },
            );
            span.record("mcp.outcome", outcome.as_str());
            span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
        }
        // Unknown names are client input: keep them out of metric labels.
        let label_tool = if upstream_tool.is_some() {
            req.name.as_str()
        } else {
            "(unknown)"
        };
        self.metrics.call(
            server.unwrap_or("(none)"),
            label_tool,
            outcome.as_str(),
            started.elapsed().as_secs_f64(),
        );
        self.write_audit(
            snap,
            req,
            server,
            upstream_tool,
            risk,
            if denied.is_some() {
                "denied"
            } else {
                "unknown"
            },
            rule,
            outcome,
            Some(error.to_string()),
            started,
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

    pub(super) fn finish(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        route: &Route,
        started: Instant,
        result: &Result<CallToolResponse, Error>,
        span: &tracing::Span,
    ) {
        let (outcome, error) = match result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
                (Outcome::ToolError, None)
            }
            Ok(_) => (Outcome::Ok, None),
            Err(e) => (Outcome::ProtocolError, Some(e.to_string())),
        };
        if let Err(e) = result {
            tracing::warn!(tool = %req.name, server = %route.server.name, error = %e, "tools/call failed");
        }
        let elapsed = started.elapsed();
        if !span.is_none() {
            span.record("mcp.server", route.server.name.as_str());
            span.record("mcp.decision", "allowed");
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
            "allowed",
            Some(rule),
            outcome,
            error,
            started,
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
        error: Option<String>,
        started: Instant,
    ) {
        let config = &snap.config;
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
        };
        self.audit.record(config.audit.path.as_ref(), &record);
    }
}
