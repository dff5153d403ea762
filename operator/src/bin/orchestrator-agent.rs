//! `orchestrator-agent`: the agent images' helper, run by the default agent script (not by the
//! operator). `orchestrator-agent result --runtime R --exit-code N [--note TEXT]
//! --termination-log PATH OUTPUT` reads what the runtime printed (OUTPUT) and writes the final
//! text to stdout and the TaskResult JSON to the termination log (`orchestrator_operator::report`).
//! Exit codes: 0 a result was read; 3 there was none (the report says so; the script then logs
//! OUTPUT as it was); 1 OUTPUT could not be read or the log not written; 2 bad arguments.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use orchestrator_crds::taskrun::AgentRuntime;
use orchestrator_operator::report::{self, Outcome};

/// The most bytes of a runtime's output read (the rest is not looked at).
const OUTPUT_BYTES: u64 = 64 << 20;

#[derive(Parser)]
#[command(
    name = "orchestrator-agent",
    version,
    about = "The agent images' helper for the default agent script"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Turn a runtime's output into the final text (stdout) and the TaskResult (termination log).
    Result(ResultArgs),
}

#[derive(clap::Args)]
struct ResultArgs {
    /// The runtime that printed OUTPUT.
    #[arg(long, value_enum)]
    runtime: Runtime,
    /// The runtime's exit code.
    #[arg(long, allow_negative_numbers = true)]
    exit_code: i32,
    /// What the script says when the runtime did not run (the report's text when there is no result).
    #[arg(long, default_value = "")]
    note: String,
    /// Where the report goes (the pod's /dev/termination-log).
    #[arg(long)]
    termination_log: PathBuf,
    /// The file holding what the runtime printed.
    output: PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
enum Runtime {
    ClaudeCode,
    Codex,
    GeminiCli,
    Opencode,
}

impl From<Runtime> for AgentRuntime {
    fn from(r: Runtime) -> Self {
        match r {
            Runtime::ClaudeCode => AgentRuntime::ClaudeCode,
            Runtime::Codex => AgentRuntime::Codex,
            Runtime::GeminiCli => AgentRuntime::GeminiCli,
            Runtime::Opencode => AgentRuntime::Opencode,
        }
    }
}

fn main() -> ExitCode {
    let Command::Result(args) = Cli::parse().command;
    match result(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("orchestrator-agent result: {e}");
            ExitCode::from(1)
        }
    }
}

fn result(args: &ResultArgs) -> Result<ExitCode, String> {
    let mut output = Vec::new();
    std::fs::File::open(&args.output)
        .and_then(|f| f.take(OUTPUT_BYTES).read_to_end(&mut output))
        .map_err(|e| format!("reading {}: {e}", args.output.display()))?;
    let outcome = report::reduce(
        args.runtime.into(),
        &output,
        args.exit_code,
        Some(&args.note),
    );
    let (message, text, code) = match outcome {
        Outcome::Result { text, message } => (message, text, 0),
        Outcome::NoResult { message } => (message, None, 3),
    };
    std::fs::write(&args.termination_log, message)
        .map_err(|e| format!("writing {}: {e}", args.termination_log.display()))?;
    if let Some(text) = text {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("writing the final text: {e}"))?;
    }
    Ok(ExitCode::from(code))
}
