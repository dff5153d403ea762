//! `orchestrator-mcp-proxy`: the MCP proxy sidecar of an orchestrator task.
//!
//! Modules, in the order they may import each other (a module uses only those above it):
//! - foundations: [`names`] (newtypes for server, tool and exposed names), [`error`] (the one
//!   error type and its `PROXY.*` codes), [`config`] (strict parse, validation with stable
//!   codes, normalized [`config::Config`]), [`filter`] (allow/deny globs to a verdict naming the
//!   deciding rule), [`router`] (exposed tool names <-> upstream server/tool), [`audit`],
//!   [`metrics`], [`telemetry`] (one JSON line per call, Prometheus, logs and spans), [`reaper`]
//!   (orphaned grandchildren when the proxy is PID 1), `sync` (a lock helper), [`probe`],
//!   [`policy`] (definition hashes and changes, rate limits, argument validation), [`zone`]
//!   (`orchestrator-mcp-proxy zone`: a stdio server's own container, and the socket protocol
//!   the proxy starts its processes with).
//! - [`approval`]: calls held for a person's decision (`policy.requireApproval`): the pending
//!   set published for the task's Lease, and the verdicts that decide them.
//! - [`session`]: client sessions as the rest of the proxy sees them, `list_changed` fan-out.
//! - [`upstream`]: lazy-started upstream servers (stdio children, streamable HTTP), their tool
//!   lists, crash/restart handling and shutdown.
//! - [`proxy`]: the core: current config + tool table, `tools/list`, `tools/call` (enforcement,
//!   forwarding, audit), the relayed rest (prompts, resources, ...), reload, drain.
//! - [`server`]: the MCP front (streamable HTTP at `/mcp`, or stdio) and the HTTP endpoints.
//! - [`apply`] (the one decision which config is served, for both sources), [`reload`] (hot
//!   reload of the mounted config), [`api`] (the task's ConfigMap watched through the Kubernetes
//!   API, the served `contextVersion` reported on its Lease) and [`run`] (wiring and shutdown).
//! - [`cli`]: the command line, for `main.rs`.

pub mod api;
pub mod apply;
pub mod approval;
pub mod audit;
pub mod cli;
pub mod config;
pub mod error;
pub mod filter;
pub mod metrics;
pub mod names;
pub mod policy;
pub mod probe;
pub mod proxy;
pub mod reaper;
pub mod reload;
pub mod router;
pub mod run;
pub mod server;
pub mod session;
mod sync;
pub mod telemetry;
pub mod upstream;
pub mod zone;

pub use run::{Options, run};
