//! The flags both proxy modes take (the sidecar's command line and `shared`'s), declared once and
//! flattened into each. `--metrics-listen` and `--audit-otlp` are common too, but each mode words
//! and places them its own way, so each declares them and hands them to [`CommonArgs::settings`].

use std::{net::SocketAddr, time::Duration};

use clap::Args;

use crate::{memory, runtime};

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
    /// The container's memory limit, in bytes (the operator passes `limits.memory` through the
    /// Downward API); every bound below is derived from it unless set. Default: 256 MiB.
    #[arg(long, env = "MCP_PROXY_MEMORY_LIMIT", value_parser = clap::value_parser!(u64).range(16 * 1024 * 1024..))]
    memory_limit_bytes: Option<u64>,
    /// Parsed bytes of large request bodies held at once (default: an eighth of the limit);
    /// beyond it a body gets 503, or 413 when it alone is larger.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1024 * 1024..))]
    max_bodies_bytes: Option<u64>,
    /// Parsed bytes of one message from an upstream (a result, a page of a tool list; default:
    /// a 32nd of the limit); a larger one is answered with an error naming it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(64 * 1024..))]
    max_result_bytes: Option<u64>,
    /// Tools one server may list (default: one per 64 KiB of the limit); a longer list is
    /// refused.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_list_tools: Option<u64>,
    /// Serialized bytes of one server's tool list (default: a 64th of the limit); a larger list
    /// is refused.
    #[arg(long, value_parser = clap::value_parser!(u64).range(64 * 1024..))]
    max_list_bytes: Option<u64>,
    /// The largest inputSchema compiled (default: a 1024th of the limit); calls to a tool with a
    /// larger one are refused.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1024..))]
    max_schema_bytes: Option<u64>,
    /// Schema bytes compiled into validators at once (default: a 16th of the limit); past it the
    /// compiled ones are dropped and compiled again when called.
    #[arg(long, value_parser = clap::value_parser!(u64).range(64 * 1024..))]
    max_validators_bytes: Option<u64>,
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
            memory: self.memory(),
        }
    }

    /// The memory bounds: derived from the limit, then each one set overriding its share.
    fn memory(&self) -> memory::Bounds {
        let mut b =
            memory::Bounds::for_limit(self.memory_limit_bytes.unwrap_or(memory::DEFAULT_LIMIT));
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        for (flag, bound) in [
            (self.max_bodies_bytes, &mut b.bodies),
            (self.max_result_bytes, &mut b.result),
            (self.max_list_tools, &mut b.list_tools),
            (self.max_list_bytes, &mut b.list_bytes),
            (self.max_schema_bytes, &mut b.schema),
            (self.max_validators_bytes, &mut b.validators),
        ] {
            if let Some(v) = flag {
                *bound = size(v);
            }
        }
        b
    }
}
