//! `orchestrator-operator`: parses flags and runs the operator (see the library).
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let settings = orchestrator_operator::Settings::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(orchestrator_operator::run(settings));
    // Stopped: a task still busy (a request in flight, the approval webhook's tries) does not
    // hold up the exit for long.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}
