//! Logging and tracing: logs to stderr (text or JSON), and when an OTLP endpoint is configured a
//! span per reconcile exported over OTLP/gRPC. Without an endpoint no exporter exists at all.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::error::{Error, Result};

/// Keeps the exporter alive; flushes pending spans when dropped.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
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

/// Installs the global subscriber. Call once, inside the Tokio runtime (the exporter needs it).
pub fn init(otlp_endpoint: Option<&str>, json: bool) -> Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    };
    let (otel, provider) = match otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| Error::Telemetry(format!("OTLP exporter for {endpoint}: {e}")))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name("orchestrator-operator")
                        .build(),
                )
                .build();
            let tracer = provider.tracer("orchestrator-operator");
            // The operator's spans are exported whatever the log level (RUST_LOG filters logs).
            let spans = Targets::new().with_target("orchestrator_operator", LevelFilter::INFO);
            (
                Some(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(spans),
                ),
                Some(provider),
            )
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| Error::Telemetry(e.to_string()))?;
    Ok(Telemetry { provider })
}
