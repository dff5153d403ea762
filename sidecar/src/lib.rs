//! `orchestrator-mcp-proxy`: the MCP proxy sidecar of an orchestrator task.
//!
//! Modules, in the order they may import each other (a module uses only those above it;
//! `scripts/check-module-cycles` holds the code to this list):
//! - foundations, which use no other module: [`names`] (newtypes for server, tool and exposed
//!   names), `sync` (a lock helper), [`filter`] (allow/deny globs to a verdict naming the
//!   deciding rule), [`probe`] (the exec probes' HTTP GET), [`conditions`] (CEL conditions on
//!   calls: compiled, evaluated within a budget), [`decision`] (the external decision points:
//!   Open Policy Agent's data API asked about each call, failing closed), [`memory`] (the memory
//!   budget: each bound derived from the container's limit, what each pool holds, JSON's
//!   weight).
//! - built on them: [`telemetry`] (logs, spans, the OTLP resource), [`error`] (protocol, transport and internal failures, each with its `PROXY.*`
//!   code), [`config`] (strict parse, validation with stable codes, normalized
//!   [`config::Config`]), [`metrics`] (Prometheus), [`audit`] (one JSON line per call, the
//!   `GET /audit` ring, the OTLP export of the records), [`reaper`] (orphaned grandchildren when the proxy is PID 1), [`session`]
//!   (client sessions as the rest of the proxy sees them, `list_changed` fan-out).
//! - [`policy`]: definition hashes and their changes, rate limits, argument validation, and
//!   [`policy::refusal::Refusal`], why a call was refused (its text, code, audit decision and
//!   metric labels, each written once); [`approval`]: calls held for a person's decision
//!   (`policy.requireApproval`), the pending set published on the task's Lease and the verdicts
//!   that decide them; [`zone`] (`orchestrator-mcp-proxy zone`: a stdio server's own container,
//!   and the socket protocol the proxy starts its processes with).
//! - [`router`] (the exposed tool table: exposed names <-> upstream server/tool, each tool's
//!   verdict) and [`upstream`] (lazy-started upstream servers: stdio children, zoned servers,
//!   streamable HTTP; their tool lists, crash/restart handling and shutdown).
//! - [`proxy`]: the core: current config + tool tables, `tools/list`, the `tools/call` pipeline
//!   (its steps, forwarding, audit), the relayed rest (prompts, resources, ...), reload, drain.
//! - [`gateway`] (the model API served to the agent at `/model`: forwarded with the key only the
//!   proxy reads, held to the task's budget, measured and audited).
//! - [`apply`] (the one decision which config is served, for both sources) and [`server`] (the
//!   MCP front: streamable HTTP at `/mcp`, or stdio, and the HTTP endpoints).
//! - [`reload`] (hot reload of the mounted config), [`api`] (the task's ConfigMap watched
//!   through the Kubernetes API, the served `contextVersion` reported on its Lease, approvals),
//!   [`runtime`] (the one runtime of both modes: listeners, metrics listener, OTLP audit export,
//!   signals, drain), [`tenant`] (shared mode: many tasks in one process, each its own `Proxy`,
//!   chosen by the pod its bearer token was issued to), [`run`] (the wiring of each mode, handed
//!   to the runtime) and [`cli`] (the command line, for `main.rs`).

pub mod api;
pub mod apply;
pub mod approval;
pub mod audit;
pub mod cli;
pub mod conditions;
pub mod config;
pub mod decision;
pub mod error;
pub mod filter;
pub mod gateway;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod policy;
pub mod probe;
pub mod proxy;
pub mod reaper;
pub mod reload;
pub mod router;
pub mod run;
pub mod runtime;
pub mod server;
pub mod session;
mod sync;
pub mod telemetry;
pub mod tenant;
pub mod upstream;
pub mod zone;

pub use run::{Options, run};
