//! The contract between the orchestrator's binaries. Types only: no I/O.
//!
//! - [`taskrun`]: the `TaskRun` custom resource (`orchestrator.io/v1`) and its status.
//! - [`proxy`]: the config file the operator renders and the MCP proxy sidecar reads.
//! - [`catalog`]: the known MCP servers and how to start them.
//! - [`tools`]: the allow/deny glob semantics of a server's tools, shared by all binaries.
//! - [`policy`]: the per-call policy (risk, argument validation, definition changes, rate limits).
//! - [`condition`]: CEL conditions on tool calls (the rules, their checks).
//! - [`decision`]: the external decision point (Open Policy Agent's data API) the proxy asks.
//! - [`resolve`]: a TaskRun's `toolConfig` against the catalog (its servers, Secret env, and
//!   every problem the operator reports as a condition; `task validate` runs it too).
//! - [`approval`]: human approval of held calls (requests, decisions, verdicts, call digests).
//! - [`gateway`]: the model gateway's config (endpoint, key file, models, budget, prices).
//! - [`digest`]: hashes over canonical JSON (definition pins, call digests).
//! - [`shared`]: shared-service mode's names (the mode, the per-task ConfigMap, its annotations).

pub mod approval;
pub mod catalog;
pub mod condition;
pub mod decision;
pub mod digest;
pub mod gateway;
pub mod policy;
pub mod proxy;
pub mod resolve;
pub mod shared;
pub mod taskrun;
pub mod tools;
