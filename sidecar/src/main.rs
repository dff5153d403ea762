//! `orchestrator-mcp-proxy`: placeholder binary that only answers `--help` until its issue lands.
use clap::Parser;

/// MCP proxy sidecar (placeholder: only `--help` works yet).
#[derive(Parser)]
#[command(name = "orchestrator-mcp-proxy", version)]
struct Args {}

fn main() -> anyhow::Result<()> {
    let _args = Args::parse();
    orchestrator_mcp_proxy::run()
}
