//! The orchestrator operator: reconciles `TaskRun`s into a ConfigMap (the proxy and agent
//! configuration) and a Job (the agent with the MCP proxy as a native sidecar).
//!
//! - [`render`]: pure TaskRun + catalog -> ConfigMap + Job.

pub mod render;

/// Runs the program. Placeholder until the reconciler lands.
pub fn run() -> anyhow::Result<()> {
    Ok(())
}
