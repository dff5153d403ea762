//! The agent's report: what `orchestrator-agent result` (the agent images' small binary,
//! `src/bin/orchestrator-agent.rs`) makes of a runtime's output at the end of the default agent
//! script (`render::runtime::launch`): the final text for the log (stdout) and one JSON object
//! under `MESSAGE_BYTES` (4096) for the termination log, the same fields for every runtime, which the
//! operator reads back with `TaskResult::from_termination_message`.
//!
//! The output is the agent's: any bytes at all. Whatever it is, the report is valid JSON that
//! fits, every count is a whole number the runtime printed as one (else left out), every string
//! is clipped where it fits (never inside a character or an escape), and output that holds no
//! result is reported as `error_no_result` with the script logging the output as it was.
//!
//! The children, in the order they may import each other:
//! - [`fields`]: the report ([`fields::Report`]: fields clipped to fit) and reading JSON
//!   output (one object, counts, costs, paths);
//! - [`runtimes`]: each runtime's reducer (its output format to a report);
//! - `tests`: the report's bounds and JSON reading (each runtime's script with this binary:
//!   `tests/agent_scripts.rs`).

pub mod fields;
pub mod runtimes;

use orchestrator_crds::taskrun::AgentRuntime;

use crate::report::fields::Report;

/// What `orchestrator-agent result` does with a runtime's output.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// A result: the final text (for stdout, when there is one) and the termination message.
    Result {
        text: Option<String>,
        message: String,
    },
    /// No result in the output: the termination message says so; the script logs the output.
    NoResult { message: String },
}

/// Reads `output` (what `runtime` printed, having exited with `code`); `note`: what the script
/// says when the runtime did not run (its own words, used when there is no result).
pub fn reduce(runtime: AgentRuntime, output: &[u8], code: i32, note: Option<&str>) -> Outcome {
    let output = String::from_utf8_lossy(output);
    let read = match runtime {
        AgentRuntime::ClaudeCode => runtimes::claude_code(&output),
        AgentRuntime::Codex => runtimes::codex(&output, code),
        AgentRuntime::GeminiCli => runtimes::gemini(&output, code),
        AgentRuntime::Opencode => runtimes::opencode(&output, code),
        AgentRuntime::Custom => None,
    };
    match read {
        Some(report) => Outcome::Result {
            text: report.text.clone(),
            message: report.message(),
        },
        None => Outcome::NoResult {
            message: no_result(runtime, code, note),
        },
    }
}

/// The report of a run that printed no result.
pub fn no_result(runtime: AgentRuntime, code: i32, note: Option<&str>) -> String {
    let text = match note.filter(|n| !n.is_empty()) {
        Some(note) => note.to_string(),
        None => format!(
            "{} exited with code {code} without a JSON result (its output is in the log)",
            display(runtime)
        ),
    };
    let mut report = Report::default();
    report.short("subtype", "error_no_result");
    report.flag("isError", true);
    report.text = Some(text);
    report.message()
}

/// The runtime's name as its users know it.
pub fn display(runtime: AgentRuntime) -> &'static str {
    match runtime {
        AgentRuntime::ClaudeCode => "Claude Code",
        AgentRuntime::Codex => "Codex",
        AgentRuntime::GeminiCli => "Gemini CLI",
        AgentRuntime::Opencode => "OpenCode",
        AgentRuntime::Custom => "The agent command",
    }
}

#[cfg(test)]
mod tests;
