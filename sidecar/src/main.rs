//! `orchestrator-mcp-proxy`: thin entry point; the work happens in the library.
use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use orchestrator_mcp_proxy::config;

/// MCP proxy sidecar: filters tools, starts upstream servers lazily, hot-reloads its config.
#[derive(Parser)]
#[command(name = "orchestrator-mcp-proxy", version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Check a config file: print every problem with its code, exit non-zero on errors.
    Validate {
        file: PathBuf,
        /// Print the problems as a JSON array.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        Some(Command::Validate { file, json }) => validate(&file, json),
        None => ExitCode::SUCCESS,
    }
}

fn validate(file: &std::path::Path, json: bool) -> ExitCode {
    let loaded = config::load_file(file);
    if json {
        match serde_json::to_string_pretty(&loaded.problems.0) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("cannot print problems: {e}"),
        }
    } else {
        for p in &loaded.problems.0 {
            println!("{p}");
        }
        if let Some(config) = &loaded.config {
            let enabled = config.servers.iter().filter(|s| s.is_startable()).count();
            println!(
                "ok: {} (contextVersion {}, {} servers, {} startable)",
                file.display(),
                config.context_version,
                config.servers.len(),
                enabled
            );
        }
    }
    if loaded.problems.has_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
