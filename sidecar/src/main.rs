//! `orchestrator-mcp-proxy`: thin entry point; the work happens in the library.
use std::process::ExitCode;

use clap::Parser;
use orchestrator_mcp_proxy::{cli::Args, telemetry};

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(command) = &args.command {
        return command.run(args.log_format);
    }
    let options = match args.options() {
        Ok(options) => options,
        Err(code) => return code,
    };
    let runtime = match args.runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        // Inside the runtime: the OTLP exporter needs it.
        let telemetry = telemetry::init(args.log_format);
        let result = orchestrator_mcp_proxy::run(options).await;
        telemetry.shutdown().await;
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
