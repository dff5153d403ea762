//! A response passed on and measured: the bytes go to the agent as they arrive; a copy is read
//! for the usage (the stream's events, or the whole JSON message up to [`MAX_MEASURED`]), and
//! when the body ends, fails or is dropped (the agent went away) the request is settled: the
//! ledger, the metrics and the audit lines.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use axum::body::Bytes;
use futures::{Stream, StreamExt};

use super::{
    Gateway,
    api::{Api, Call, Route, Tally},
    ledger::{Reservation, Tokens, cost},
    sse::Scanner,
};
use crate::{
    audit::{self, Outcome, RecordType, model::ModelFields},
    config::{Config, GatewayConfig, PriceNanos},
};

/// The largest whole (non-streamed) answer read for its usage; a larger one is passed on and
/// charged what it reserved.
pub const MAX_MEASURED: usize = 8 * 1024 * 1024;

type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// What a forwarded request is settled with.
pub(super) struct Measure {
    pub gateway: Arc<Gateway>,
    pub config: Arc<Config>,
    pub gateway_config: Arc<GatewayConfig>,
    pub api: &'static dyn Api,
    pub route: Route,
    pub asked_model: String,
    pub streamed: bool,
    pub price: Option<PriceNanos>,
    pub reservation: Option<Reservation>,
    pub started: Instant,
}

impl Measure {
    /// The endpoint never answered: nothing was used.
    pub fn failed(self) {
        let mut watch = Watch::new(self, 0, false);
        watch.failed = true;
        watch.finish();
    }

    /// The answer's body, passed on and measured.
    pub fn stream(
        self,
        status: u16,
        event_stream: bool,
        chunks: impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    ) -> Metered {
        Metered {
            chunks: Box::pin(chunks),
            watch: Some(Watch::new(self, status, event_stream)),
        }
    }
}

pub(super) struct Metered {
    chunks: Chunks,
    watch: Option<Watch>,
}

struct Watch {
    measure: Measure,
    status: u16,
    event_stream: bool,
    scanner: Scanner,
    tally: Tally,
    body: Vec<u8>,
    over: bool,
    failed: bool,
}

impl Stream for Metered {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.chunks.poll_next_unpin(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(watch) = self.watch.as_mut() {
                    watch.see(chunk);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(mut watch) = self.watch.take() {
                    watch.failed = true;
                    watch.finish();
                }
            }
            Poll::Ready(None) => {
                if let Some(watch) = self.watch.take() {
                    watch.finish();
                }
            }
            Poll::Pending => {}
        }
        next
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        // The agent went away before the body's end. After the stream's last event (its usage
        // read: a client may close as soon as it has it, as Codex does) the answer was whole;
        // before it, what was cut is not known.
        if let Some(mut watch) = self.watch.take() {
            watch.failed = !(watch.event_stream && watch.tally.complete && watch.tally.usage_seen);
            watch.finish();
        }
    }
}

impl Watch {
    fn new(measure: Measure, status: u16, event_stream: bool) -> Self {
        Self {
            measure,
            status,
            event_stream,
            scanner: Scanner::default(),
            tally: Tally::default(),
            body: Vec::new(),
            over: false,
            failed: false,
        }
    }

    fn see(&mut self, chunk: &[u8]) {
        if !(200..300).contains(&self.status) {
            return;
        }
        if self.measure.route.call != Call::Generate {
            return;
        }
        if self.event_stream {
            let (tally, api) = (&mut self.tally, self.measure.api);
            self.scanner
                .feed(chunk, |event| api.event(tally, &event.data));
        } else if !self.over {
            if self.body.len() + chunk.len() > MAX_MEASURED {
                self.over = true;
                self.body = Vec::new();
            } else {
                self.body.extend_from_slice(chunk);
            }
        }
    }

    fn finish(mut self) {
        let ok_status = (200..300).contains(&self.status);
        if ok_status && !self.event_stream && !self.over && !self.failed {
            let generate = self.measure.route.call == Call::Generate;
            match serde_json::from_slice::<serde_json::Value>(&self.body) {
                Ok(message) if generate => self.measure.api.message(&mut self.tally, &message),
                _ => {}
            }
        }
        let m = &mut self.measure;
        let known = self.tally.usage_seen && self.tally.complete && !self.failed;
        // The model the endpoint answered as; a request it did not serve is under "-".
        let model = self.tally.model.clone();
        let price = model
            .as_deref()
            .and_then(|name| m.gateway_config.price(name))
            .or(m.price);
        let tokens = self.tally.tokens;
        let cost_nanos = price.map(|p| cost(&tokens, p));
        match m.reservation.take() {
            Some(reservation) if known => reservation.settle(&tokens, cost_nanos.unwrap_or(0)),
            // An error status, or no answer: the API charges nothing.
            Some(reservation) if !ok_status || self.status == 0 => {
                reservation.settle(&Tokens::default(), 0)
            }
            // Cut or unreadable: charged its worst case.
            Some(reservation) => drop(reservation),
            None => {}
        }
        m.gateway.publish();
        let generate = m.route.call == Call::Generate;
        let outcome = match (ok_status, known || !generate) {
            _ if self.failed || self.status == 0 => "failed",
            (false, _) => "api_error",
            (true, true) => "ok",
            (true, false) => "failed",
        };
        let label = model.as_deref().unwrap_or("-");
        let seconds = m.started.elapsed().as_secs_f64();
        let task = m.gateway.proxy.metrics.model_task();
        let metrics = &m.gateway.proxy.metrics.model;
        metrics.request(
            &task,
            label,
            outcome,
            seconds,
            [
                tokens.input_tokens,
                tokens.output_tokens,
                tokens.cache_creation_input_tokens,
                tokens.cache_read_input_tokens,
            ],
        );
        if let Some(nanos) = cost_nanos.filter(|n| *n > 0 && known) {
            metrics.cost(&task, label, nanos as f64 / 1e9);
        }
        let fields = |tool_use_id: Option<String>| ModelFields {
            provider: m.gateway_config.provider.as_str(),
            model: model
                .clone()
                .unwrap_or_else(|| crate::names::clip(&m.asked_model).into_owned()),
            endpoint: m.route.endpoint,
            status: self.status,
            streamed: m.streamed,
            input_tokens: tokens.input_tokens,
            output_tokens: tokens.output_tokens,
            cache_creation_input_tokens: tokens.cache_creation_input_tokens,
            cache_read_input_tokens: tokens.cache_read_input_tokens,
            cost_usd: cost_nanos
                .filter(|_| known)
                .map(orchestrator_crds::gateway::format_usd_nanos),
            stop_reason: self.tally.stop_reason.clone(),
            tool_use_id,
            usage_unknown: ok_status && !known && generate,
        };
        let config = &m.config;
        let outcome_of = if outcome == "ok" {
            Outcome::Ok
        } else {
            Outcome::ProtocolError
        };
        let base = |record_type, tool: &str, fields, arguments, argument_bytes| {
            let record = audit::Record {
                record_type,
                ts: audit::timestamp(),
                task: &config.task_name,
                namespace: &config.task_namespace,
                created_by: config.task_created_by.as_deref(),
                context_version: config.context_version,
                session: String::new(),
                client: String::new(),
                protocol: None,
                request_id: String::new(),
                tool,
                server: None,
                upstream_tool: None,
                risk: None,
                decision: if record_type == RecordType::ModelRequest {
                    "forwarded"
                } else {
                    "requested"
                },
                approval_id: None,
                approval_digest: None,
                decided_by: None,
                rule: None,
                outcome: outcome_of,
                error: (outcome != "ok").then(|| outcome.to_string()),
                duration_ms: seconds * 1000.0,
                argument_bytes,
                arguments,
                intent: None,
                model: Some(fields),
            };
            m.gateway
                .proxy
                .audit
                .record(config.audit.path.as_ref(), &record);
        };
        base(RecordType::ModelRequest, "", fields(None), None, 0);
        if self.tally.tool_uses_dropped > 0 {
            tracing::warn!(
                dropped = self.tally.tool_uses_dropped,
                "an answer asked for more tool uses than are audited one by one"
            );
        }
        // MCP tools are not among them: the proxy records those when the agent calls them.
        for tool_use in &self.tally.tool_uses {
            let arguments = tool_use
                .input
                .as_ref()
                .filter(|_| config.audit.include_arguments);
            base(
                RecordType::AgentToolUse,
                &tool_use.name,
                fields(Some(tool_use.id.clone()).filter(|id| !id.is_empty())),
                arguments,
                tool_use.input_bytes,
            );
        }
    }
}
