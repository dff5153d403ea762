//! `orchestrator-operator`: parses flags and runs the operator (see the library).
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let settings = orchestrator_operator::Settings::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(orchestrator_operator::run(settings))
}
