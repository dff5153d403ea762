//! `orchestrator-cli`: parses the command line, sets up logging on stderr, runs the command and
//! turns its error into a message and an exit code (see `orchestrator_cli::error`).
use std::process::ExitCode;

fn main() -> ExitCode {
    // As `orchestrator-cli` or as the kubectl plugin; answers COMPLETE=<shell> and exits.
    let cli = orchestrator_cli::invocation::parse();
    // kube's own error logs repeat what our error message says; show them only with -v.
    let level = match cli.global.verbose {
        0 => "warn,kube_client=off,kube_runtime=off",
        1 => "info,kube_client=warn,kube_runtime=warn",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .init();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(orchestrator_cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
