//! Shared mode (`orchestrator-mcp-proxy shared`): one process serves many tasks, each isolated
//! in its own [`crate::proxy::Proxy`]. Children, in the order they may import each other:
//! [`auth`] (bearer token -> TokenReview -> the pod the token was issued to, cached).

pub mod auth;
