//! Shared mode (`orchestrator-mcp-proxy shared`): one process serves many tasks, each isolated
//! in its own [`crate::proxy::Proxy`] (sessions, limits, approvals, upstreams, audit), chosen only
//! by the pod its caller's bearer token was issued to. Children, in the order they may import
//! each other: [`auth`] (bearer token -> TokenReview -> the pod the token was issued to,
//! cached), [`secrets`] (the task's Secret values its HTTP headers name, read through the API),
//! [`registry`] (one tenant per labelled ConfigMap, indexed by the task's pod uid),
//! [`watch`] (the label-selected ConfigMap watch feeding the registry) and [`dispatch`] (the
//! HTTP front: authenticate, map, check the peer, hand the request to the tenant's own MCP
//! service), then [`mode`] (shared mode as `crate::runtime` runs it: the registry, the watch
//! and the front, started and stopped together).

pub mod auth;
pub mod dispatch;
pub mod mode;
pub mod registry;
pub mod secrets;
pub mod watch;
