//! `orchestrator-operator`: placeholder binary that only answers `--help` until its issue lands.
use clap::Parser;

/// Kubernetes operator for TaskRuns (placeholder: only `--help` works yet).
#[derive(Parser)]
#[command(name = "orchestrator-operator", version)]
struct Args {}

fn main() -> anyhow::Result<()> {
    let _args = Args::parse();
    orchestrator_operator::run()
}
