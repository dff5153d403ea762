//! Logs and traces. Logs go to stderr (stdout may be the MCP transport), as JSON when asked.
//! A span per `tools/call` is created only when OTLP export is on (`OTEL_EXPORTER_OTLP_ENDPOINT`
//! set), so tracing costs nothing otherwise.

use std::sync::atomic::{AtomicBool, Ordering};

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

/// Installs the stderr logger. `RUST_LOG` overrides the default filter.
pub fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;

    use tracing_subscriber::{EnvFilter, fmt, prelude::*};
    // rmcp logs every message at info and every error response at warn; the proxy logs what
    // matters itself.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=error"));
    let registry = tracing_subscriber::registry().with(filter);
    let ansi = std::io::stderr().is_terminal();
    let result = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_ansi(ansi).with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if result.is_err() {
        eprintln!("a logger was already installed");
    }
    let _ = &TRACING_ON;
}
