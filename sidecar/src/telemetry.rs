//! Logs and traces. Logs go to stderr (stdout may be the MCP transport), as JSON when asked.
//!
//! A span per `tools/call` exists only when OTLP export is configured
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): otherwise no
//! exporter, no layer and no span is created, so tracing costs one atomic load per call. The
//! protocol follows `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, the default, `http/protobuf` or
//! `http/json`). Spans are children of the client's trace context when the request carries a
//! W3C `traceparent` in `_meta`, and the upstream gets the proxy span's context.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicBool, Ordering},
};

use opentelemetry::{
    propagation::{Extractor, TextMapPropagator},
    trace::TracerProvider as _,
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    runtime::TokioCurrentThread,
    trace::{SdkTracerProvider, span_processor_with_async_runtime::BatchSpanProcessor},
};
use rmcp::model::RequestMetaObject;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Target of the per-call spans (the only spans exported).
pub const CALL_TARGET: &str = "orchestrator_mcp_proxy::call";

static TRACING_ON: AtomicBool = AtomicBool::new(false);

/// Whether call spans are recorded (OTLP export is configured).
pub fn tracing_on() -> bool {
    TRACING_ON.load(Ordering::Relaxed)
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Keeps the exporter alive; flushes pending spans at [`Telemetry::shutdown`] (or when dropped).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is pending. Runs the blocking flush on a blocking thread so the runtime keeps
    /// serving the exporter's own connection tasks meanwhile (the gRPC client lives on it).
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(e)) = flushed {
                eprintln!("flushing traces: {e}");
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("flushing traces: {e}");
        }
    }
}

/// Installs the stderr logger and, when configured, the OTLP exporter. Call inside the runtime.
/// `RUST_LOG` overrides the default log filter.
pub fn init(format: LogFormat) -> Telemetry {
    use std::io::IsTerminal;

    use tracing_subscriber::{
        EnvFilter, Layer,
        filter::{FilterExt, Targets},
        fmt,
        prelude::*,
    };
    // rmcp logs every message at info and every error response at warn; kube's client logs
    // every failed request of a retrying watch at error. The proxy logs what matters itself
    // (once per state change).
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,rmcp=error,kube_client=off,kube_runtime=off"));
    let ansi = std::io::stderr().is_terminal();
    let logs = match format {
        LogFormat::Text => fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let provider = exporter();
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("orchestrator-mcp-proxy"))
            .with_filter(Targets::new().with_target(CALL_TARGET, tracing::Level::INFO))
    });
    let registry = tracing_subscriber::registry().with(logs.with_filter(filter.and(ClientGone)));
    // Not `.with(Option<layer>)`: an absent layer declares interest in every callsite, which
    // makes the registry create every span and dispatch every event of rmcp (its per-message
    // trace events included), only for the log filter to drop them.
    let result = match otel {
        Some(otel) => registry.with(otel).try_init(),
        None => registry.try_init(),
    };
    if result.is_err() {
        eprintln!("a logger was already installed");
    }
    if provider.is_some() {
        TRACING_ON.store(true, Ordering::Relaxed);
        tracing::info!("exporting a span per tools/call over OTLP");
    }
    Telemetry { provider }
}

/// rmcp's error events that only mean the client is gone: a response it could not deliver
/// because the client ended its session (a 2026-07-28 listen stream that closes, a session
/// deleted with a request still running) is not a failure of the proxy.
const CLIENT_GONE: &[&str] = &[
    "failed to send pending response during drain",
    "fail to response message",
];

/// Keeps the [`CLIENT_GONE`] events of rmcp out of the log.
struct ClientGone;

impl<S> tracing_subscriber::layer::Filter<S> for ClientGone {
    fn enabled(
        &self,
        _: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR || !meta.target().starts_with("rmcp::") {
            return true;
        }
        let mut message = Message(None);
        event.record(&mut message);
        !message.0.is_some_and(|m| CLIENT_GONE.contains(&m.as_str()))
    }
}

/// The `message` field of an event.
struct Message(Option<String>);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = Some(value.to_string());
        }
    }
}

fn exporter() -> Option<SdkTracerProvider> {
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()));
    if !configured {
        return None;
    }
    let protocol = protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
    // The endpoint and headers are read from the standard variables by the exporter itself.
    let built = match protocol.as_str() {
        "grpc" => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build(),
        "http/protobuf" => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build(),
        "http/json" => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .build(),
        other => {
            eprintln!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported (grpc, http/protobuf, http/json); not exporting traces"
            );
            return None;
        }
    };
    let exporter = match built {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cannot set up the OTLP exporter ({protocol}): {e}; not exporting traces");
            return None;
        }
    };
    // Exports run on their own thread and runtime, so a current-thread proxy runtime can block
    // on the final flush without deadlocking.
    let processor = BatchSpanProcessor::builder(exporter, TokioCurrentThread).build();
    Some(
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource())
            .build(),
    )
}

/// The OTLP protocol of a signal: its own variable (`signal_var`, e.g.
/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`), else `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`.
pub fn protocol(signal_var: &str) -> String {
    [signal_var, "OTEL_EXPORTER_OTLP_PROTOCOL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .map_or_else(|| "grpc".into(), |s| s.trim().to_string())
}

/// The default `service.name`, when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES`
/// names one.
pub const SERVICE_NAME: &str = "orchestrator-mcp-proxy";

/// The resource of everything the proxy exports: `OTEL_RESOURCE_ATTRIBUTES` (in a task pod the
/// operator renders `k8s.pod.name`, `k8s.namespace.name` and the task there), `service.name` from
/// `OTEL_SERVICE_NAME`, else from those attributes, else [`SERVICE_NAME`].
pub fn resource() -> Resource {
    let service_name = opentelemetry::Key::from_static_str("service.name");
    let detected = Resource::builder().build();
    let from_env = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let named = detected
        .get(&service_name)
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    match from_env {
        // The SDK lets a service.name in OTEL_RESOURCE_ATTRIBUTES win; the spec gives
        // OTEL_SERVICE_NAME precedence.
        Some(name) => Resource::builder().with_service_name(name).build(),
        None if named => detected,
        None => Resource::builder().with_service_name(SERVICE_NAME).build(),
    }
}

/// The span of one `tools/call`, child of the client's trace context when it sent one, named
/// and attributed per OpenTelemetry's MCP semantic conventions (`tools/call {gen_ai.tool.name}`,
/// kind server); the proxy's own attributes carry the `orchestrator.` prefix. `tool` is clipped
/// here. `Span::none()` when tracing is off.
pub fn call_span(
    tool: &str,
    session: impl std::fmt::Display,
    protocol: Option<&str>,
    request_id: &str,
    meta: &RequestMetaObject,
) -> Span {
    if !tracing_on() {
        return Span::none();
    }
    let tool = crate::names::clip(tool);
    let span = tracing::info_span!(
        target: CALL_TARGET,
        "tools/call",
        otel.name = %format!("tools/call {tool}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        "mcp.method.name" = "tools/call",
        "gen_ai.operation.name" = "execute_tool",
        "gen_ai.tool.name" = %tool,
        "mcp.session.id" = %session,
        "mcp.protocol.version" = protocol,
        "jsonrpc.request.id" = %crate::names::clip(request_id),
        "error.type" = tracing::field::Empty,
        "orchestrator.server" = tracing::field::Empty,
        "orchestrator.decision" = tracing::field::Empty,
        "orchestrator.outcome" = tracing::field::Empty,
        "orchestrator.duration_ms" = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&MetaCarrier(meta));
    let _ = span.set_parent(parent);
    span
}

/// What became of a call, on its span: the server, the decision and outcome, and for a failure
/// `error.type` (and the span's status: error). No-op when tracing is off.
pub fn record_call(
    span: &Span,
    server: Option<&str>,
    decision: &str,
    outcome: &str,
    error_type: Option<&str>,
    duration_ms: f64,
) {
    if span.is_none() {
        return;
    }
    span.record("orchestrator.server", server.unwrap_or(""));
    span.record("orchestrator.decision", decision);
    span.record("orchestrator.outcome", outcome);
    span.record("orchestrator.duration_ms", duration_ms);
    if let Some(error_type) = error_type {
        span.record("error.type", error_type);
        span.record("otel.status_code", "error");
    }
}

/// Replaces the client's trace context in the upstream's `_meta` with the call span's, so the
/// upstream's work is a child of the proxy's span. No-op when tracing is off.
pub fn inject(span: &Span, meta: &mut RequestMetaObject) {
    if !tracing_on() || span.is_none() {
        return;
    }
    let mut fields = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut fields);
    for (k, v) in fields {
        meta.0.0.insert(k, serde_json::Value::String(v));
    }
}

struct MetaCarrier<'a>(&'a RequestMetaObject);

impl Extractor for MetaCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.0.0.get(key).and_then(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.0.0.keys().map(String::as_str).collect()
    }
}
