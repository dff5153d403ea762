//! `orchestrator-cli`: placeholder binary that only answers `--help` until its issue lands.
use clap::Parser;

/// Command line for TaskRuns (placeholder: only `--help` works yet).
#[derive(Parser)]
#[command(name = "orchestrator-cli", version)]
struct Args {}

fn main() -> anyhow::Result<()> {
    let _args = Args::parse();
    orchestrator_cli::run()
}
