//! `orchestrator-mcp-proxy`: the MCP proxy sidecar of an orchestrator task.
//!
//! Module map (one concern each):
//! - [`config`]: strict parse, validation with stable codes, normalized [`config::Config`].
//! - [`filter`]: allow/deny globs to a verdict naming the deciding rule.
//! - [`router`]: exposed tool names <-> upstream server/tool.
//! - [`names`]: newtypes for server, upstream tool and exposed tool names.
//! - [`upstream`]: lazy-started upstream servers (stdio children, streamable HTTP), their tool
//!   lists, crash/restart handling and shutdown.
//! - [`proxy`]: the core: current config + tool table, `tools/list`, reload, drain; its
//!   `tools/call` path (enforcement, forwarding, audit) lives in `call`.
//! - [`server`]: the MCP front (streamable HTTP at `/mcp`, or stdio) and the HTTP endpoints.
//! - [`bridge`]: initialize-era upstreams asking 2026-07-28 clients (input_required rounds).
//! - [`passthrough`]: prompts, resources, completions, logging level relayed to upstreams.
//! - [`session`]: client sessions and `list_changed` fan-out.
//! - [`reload`]: hot reload of the mounted config (kubelet `..data` swap).
//! - [`audit`], [`metrics`], [`telemetry`]: one JSON line per call, Prometheus, logs and spans.
//! - [`probe`]: the exec-probe HTTP check (`orchestrator-mcp-proxy probe URL`).
//! - [`reaper`]: reaps orphaned grandchildren when the proxy is PID 1.
//! - [`run`]: wiring and shutdown.

pub mod audit;
pub mod bridge;
mod call;
pub mod config;
pub mod error;
pub mod filter;
pub mod metrics;
pub mod names;
pub mod passthrough;
pub mod probe;
pub mod proxy;
pub mod reaper;
pub mod reload;
pub mod router;
pub mod run;
pub mod server;
pub mod session;
pub mod telemetry;
pub mod upstream;

/// Locks a mutex, taking the data even if a panicking thread poisoned it (the proxy's maps
/// stay usable; a panic is reported where it happened).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub use run::{Options, run};
