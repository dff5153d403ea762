//! The flags both proxy modes take (the sidecar's command line and `shared`'s), declared once and
//! flattened into each. `--metrics-listen` and `--audit-otlp` are common too, but each mode words
//! and places them its own way, so each declares them and hands them to [`CommonArgs::settings`].

use std::{net::SocketAddr, time::Duration};

use clap::Args;

use crate::runtime;

// The help is the sidecar's; `shared` rewords `--max-sessions` and
// `--header-read-timeout-seconds` (`mut_arg` on `SharedArgs`).
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Seconds calls in flight may take to finish after SIGTERM.
    #[arg(long, default_value_t = 10)]
    shutdown_grace_seconds: u64,
    /// Seconds an upstream may take to start and complete the MCP handshake.
    #[arg(long, default_value_t = 60)]
    start_timeout_seconds: u64,
    /// Seconds after which an HTTP session with no message in either direction is closed
    /// (0: never).
    #[arg(long, default_value_t = 24 * 3600)]
    session_idle_seconds: u64,
    /// Initialize-era HTTP sessions open at once; over it `initialize` gets a JSON-RPC error
    /// (PROXY.TOO_MANY_SESSIONS). A sidecar serves one agent, which opens one or a few.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions: u64,
    /// Seconds an HTTP request's headers may take to arrive before its connection is closed
    /// (also how long an idle keep-alive connection stays open).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_seconds: u64,
}

impl CommonArgs {
    /// The runtime's settings from these flags and the two each mode declares itself.
    pub fn settings(
        &self,
        metrics_listen: Option<SocketAddr>,
        audit_otlp: bool,
    ) -> runtime::Settings {
        runtime::Settings {
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            start_timeout: Duration::from_secs(self.start_timeout_seconds),
            session_idle: Duration::from_secs(self.session_idle_seconds),
            max_sessions: usize::try_from(self.max_sessions).unwrap_or(usize::MAX),
            header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
            metrics_listen,
            audit_otlp,
        }
    }
}
