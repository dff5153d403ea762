//! `orchestrator-mcp-proxy`: the MCP proxy sidecar of an orchestrator task.
//!
//! Module map (one concern each):
//! - [`config`]: strict parse, validation with stable codes, normalized [`config::Config`].
//! - [`filter`]: allow/deny globs to a verdict naming the deciding rule.
//! - [`router`]: exposed tool names <-> upstream server/tool.
//! - [`names`]: newtypes for server, upstream tool and exposed tool names.

pub mod config;
pub mod filter;
pub mod names;
pub mod router;
