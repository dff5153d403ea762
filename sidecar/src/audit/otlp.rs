//! `--audit-otlp`: each audit record also leaves as an OTLP log record, event name
//! `mcp.audit.<recordType>` (`mcp.audit.tool_call`, `mcp.audit.definition_change`,
//! `mcp.audit.tool_call_started`), its body the
//! record's fields as a map (the same keys as the JSON line), the resource that of the traces
//! (`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`). Sent to `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_ENDPOINT`, in `OTEL_EXPORTER_OTLP_LOGS_PROTOCOL` or
//! `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, the default, `http/protobuf`, `http/json`).
//!
//! Bounded: at most [`QUEUE`] records (or `OTEL_BLRP_MAX_QUEUE_SIZE`, when smaller) wait for the
//! collector, counting the batch being sent; past that a record is dropped from
//! the export (its stdout or file line is still written) and counted in
//! `mcp_proxy_audit_otlp_dropped_total`. A slow collector never holds up a call. What is queued
//! is sent at shutdown ([`AuditExport::shutdown`]).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::SystemTime,
};

use opentelemetry::{
    Key,
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    logs::{
        BatchConfigBuilder, LogBatch, LogExporter, SdkLogger, SdkLoggerProvider,
        log_processor_with_async_runtime::BatchLogProcessor,
    },
    runtime::TokioCurrentThread,
};

use super::{Record, RecordType};
use crate::{metrics::Metrics, telemetry};

/// Records waiting for the collector at most (queued or being sent).
pub const QUEUE: usize = 2048;

/// The queue's bound: `OTEL_BLRP_MAX_QUEUE_SIZE` when it is a number from 1 to [`QUEUE`].
fn queue_bound() -> usize {
    std::env::var("OTEL_BLRP_MAX_QUEUE_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=QUEUE).contains(n))
        .unwrap_or(QUEUE)
}

/// The export of audit records as OTLP log records.
pub struct AuditExport {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
    /// Records handed to the SDK and not yet sent (or failed).
    queued: Arc<AtomicUsize>,
    /// At most this many records queued.
    bound: usize,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for AuditExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditExport")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl AuditExport {
    /// The export configured from the standard OTLP variables. Call inside the runtime. `Err`
    /// names what is missing or wrong.
    pub fn from_env(metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let endpoint = [
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()));
        if endpoint.is_none() {
            anyhow::bail!(
                "--audit-otlp (MCP_PROXY_AUDIT_OTLP) needs a collector: set OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT"
            );
        }
        let protocol = telemetry::protocol("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL");
        // The endpoint and headers are read from the standard variables by the exporter itself.
        let built = match protocol.as_str() {
            "grpc" => opentelemetry_otlp::LogExporter::builder()
                .with_tonic()
                .build(),
            "http/protobuf" => opentelemetry_otlp::LogExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build(),
            "http/json" => opentelemetry_otlp::LogExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpJson)
                .build(),
            other => anyhow::bail!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported for --audit-otlp: use grpc, http/protobuf or http/json"
            ),
        };
        let exporter = built.map_err(|e| {
            anyhow::anyhow!(
                "cannot set up the OTLP log exporter ({protocol}) for --audit-otlp: {e}"
            )
        })?;
        let queued = Arc::new(AtomicUsize::new(0));
        let counted = Counted {
            inner: exporter,
            queued: queued.clone(),
        };
        // The SDK's queue holds what the gate lets through, so it never drops on its own, and
        // keeps room for its own flush and shutdown messages.
        let bound = queue_bound();
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(bound + 16)
            .build();
        // Exports run on their own thread and runtime (as the traces'), so shutdown can block on
        // the final flush.
        let processor = BatchLogProcessor::builder(counted, TokioCurrentThread)
            .with_batch_config(config)
            .build();
        let provider = SdkLoggerProvider::builder()
            .with_log_processor(processor)
            .with_resource(telemetry::resource())
            .build();
        let logger = provider.logger("orchestrator-mcp-proxy.audit");
        tracing::info!(%protocol, "exporting each audit record as an OTLP log record");
        Ok(Self {
            provider,
            logger,
            queued,
            bound,
            metrics,
        })
    }

    /// Hands one record to the export, or drops and counts it when the queue is full.
    pub fn export(&self, record: &Record<'_>) {
        match serde_json::to_value(record) {
            Ok(value) => self.export_value(record.record_type, value),
            Err(e) => tracing::error!(error = %e, "cannot serialize an audit record for OTLP"),
        }
    }

    /// Exports a record already made a JSON object (`record_type`'s).
    pub fn export_value(&self, record_type: RecordType, value: serde_json::Value) {
        let taken = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.bound).then_some(n + 1)
            });
        if taken.is_err() {
            self.metrics.audit_otlp_dropped();
            return;
        }
        let body = any_value(value);
        let mut log = self.logger.create_log_record();
        log.set_event_name(event_name(record_type));
        log.set_timestamp(SystemTime::now());
        log.set_observed_timestamp(SystemTime::now());
        log.set_severity_number(Severity::Info);
        log.set_severity_text("INFO");
        log.add_attribute("orchestrator.audit.record_type", record_type.as_str());
        if let Some(body) = body {
            log.set_body(body);
        }
        self.logger.emit(log);
    }

    /// Sends what is queued and stops the exporter. Blocks: call on a blocking thread.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing the OTLP audit export");
        }
    }
}

/// The log record's event name for a record type.
pub fn event_name(record_type: RecordType) -> &'static str {
    match record_type {
        RecordType::ToolCall => "mcp.audit.tool_call",
        RecordType::DefinitionChange => "mcp.audit.definition_change",
        RecordType::ToolCallStarted => "mcp.audit.tool_call_started",
        RecordType::ModelRequest => "mcp.audit.model_request",
        RecordType::AgentToolUse => "mcp.audit.agent_tool_use",
    }
}

/// A JSON value as an OTLP value (`null` has none: the key is left out).
fn any_value(value: serde_json::Value) -> Option<AnyValue> {
    use serde_json::Value;
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => AnyValue::Boolean(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AnyValue::Int(i),
            None => AnyValue::Double(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => AnyValue::String(s.into()),
        Value::Array(items) => {
            AnyValue::ListAny(Box::new(items.into_iter().filter_map(any_value).collect()))
        }
        Value::Object(map) => AnyValue::Map(Box::new(
            map.into_iter()
                .filter_map(|(k, v)| Some((Key::new(k), any_value(v)?)))
                .collect::<HashMap<_, _>>(),
        )),
    })
}

/// The OTLP exporter, counting down the records it is done with (sent or failed).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
}

impl<E: LogExporter> LogExporter for Counted<E> {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        // Counted down however the export ends: the SDK drops it at its export timeout.
        let _done = Done {
            queued: &self.queued,
            n: batch.iter().count(),
        };
        self.inner.export(batch).await
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// Takes `n` records off the queue count when dropped.
struct Done<'a> {
    queued: &'a AtomicUsize,
    n: usize,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        let _ = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(self.n))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_becomes_a_map_without_nulls_keeping_numbers_typed() {
        let value = serde_json::json!({
            "recordType": "tool_call", "durationMs": 1.5, "argumentBytes": 20,
            "error": null, "arguments": {"list": [1, "a"]}
        });
        let Some(AnyValue::Map(map)) = any_value(value) else {
            panic!("not a map");
        };
        assert_eq!(
            map.get(&Key::from_static_str("argumentBytes")),
            Some(&AnyValue::Int(20))
        );
        assert_eq!(
            map.get(&Key::from_static_str("durationMs")),
            Some(&AnyValue::Double(1.5))
        );
        assert!(!map.contains_key(&Key::from_static_str("error")));
        assert_eq!(
            event_name(RecordType::DefinitionChange),
            "mcp.audit.definition_change"
        );
    }
}
