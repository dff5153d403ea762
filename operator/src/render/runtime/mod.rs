//! The agent's runtime (`spec.agent.runtime`): what the operator renders for each agent CLI, and
//! what it refuses. Every runtime's MCP config names the task's proxy only, its model endpoint is
//! the task's model gateway, its built-in tools are limited from `toolConfig.internalTools` as far
//! as it allows (what it cannot honour is refused, never dropped), and its default script writes
//! the same TaskResult to the termination log. docs/api.md, "Agent runtimes", has the table.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! - [`access`]: how the agent reaches its proxy and proves itself to it (URLs, credential
//!   helpers);
//! - [`rules`]: the permission rules read as Claude Code would apply them, for the others;
//! - [`launch`]: what a runtime gives the agent container ([`Launch`]) and how its script is put
//!   together (`prelude.sh`, then the run part, then `orchestrator-agent result`, whose
//!   reducers are `crate::report`);
//! - [`claude_code`], [`codex`], [`gemini`], [`opencode`]: one runtime each, with its run part
//!   (`<runtime>.sh`);
//! - `config_tests`: each rendered config parsed and checked to name nothing but the task's
//!   proxy. (Each script run against a stand-in CLI with the real helper: `tests/agent_scripts.rs`.)

pub mod access;
pub mod claude_code;
pub mod codex;
pub mod gemini;
pub mod launch;
pub mod opencode;
pub mod rules;

use orchestrator_crds::gateway::Provider;
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::model::ModelSpec;
use orchestrator_crds::taskrun::runtime::{AgentRuntime, model_name_ok};
use orchestrator_crds::tools::glob_matches;

pub use access::{PROXY_SERVER_NAME, ProxyAccess};
pub use launch::Launch;

use orchestrator_crds::resolve::Problem;

/// The condition reason of a runtime that does not fit the rest of the spec.
pub const INVALID_RUNTIME: &str = "InvalidAgentRuntime";
/// The condition reason of a runtime without the model credential it needs.
pub const NO_MODEL_CREDENTIAL: &str = "NoModelCredential";
/// The condition reason of a model the task's credential does not allow.
pub const MODEL_NOT_ALLOWED: &str = "ModelNotAllowed";

/// What is wrong with the runtime given the rest of the spec and the task's model credential
/// (`model`: `spec.model`, else the operator's default): the API server refuses most of it
/// already (CEL), a TaskRun stored under an older CRD is refused here.
pub fn check(tr: &TaskRun, model: Option<&ModelSpec>) -> Vec<Problem> {
    let spec = &tr.spec;
    let runtime = spec.runtime();
    let mut problems = Vec::new();
    let agent = spec.agent.clone().unwrap_or_default();
    let own_command = agent.command.is_some() || agent.args.is_some();
    if runtime != AgentRuntime::Custom && own_command {
        problems.push(Problem {
            reason: INVALID_RUNTIME,
            message: format!(
                "spec.agent.command and spec.agent.args replace the command the operator renders \
                 for runtime {0}: remove them to run {0} as rendered, or set spec.agent.runtime: \
                 custom to run a command of your own",
                runtime.as_str()
            ),
        });
    }
    // Unset with `args` alone runs the image's entrypoint with them, as before runtimes existed.
    if agent.runtime == Some(AgentRuntime::Custom) && agent.command.is_none() {
        problems.push(Problem {
            reason: INVALID_RUNTIME,
            message: "spec.agent.runtime: custom runs spec.agent.command, which is unset: set \
                      spec.agent.command, or choose a runtime the operator renders (claude-code, \
                      codex, gemini-cli, opencode)"
                .into(),
        });
    }
    if let Some(name) = agent.model.as_deref().filter(|m| !model_name_ok(m)) {
        problems.push(Problem {
            reason: INVALID_RUNTIME,
            message: format!(
                "spec.agent.model {name:?}: {}",
                orchestrator_crds::taskrun::runtime::MODEL_MESSAGE
            ),
        });
    }
    let needs_gateway = matches!(
        runtime,
        AgentRuntime::Codex | AgentRuntime::GeminiCli | AgentRuntime::Opencode
    );
    match model {
        None if needs_gateway => problems.push(Problem {
            reason: NO_MODEL_CREDENTIAL,
            message: format!(
                "runtime {} reaches its model only through the task's proxy, and the task has no \
                 model credential: set spec.model.secretKeyRef to a Secret key holding a {} API \
                 key (or configure the operator's default, chart value model.secretName)",
                runtime.as_str(),
                api_name(runtime)
            ),
        }),
        // The operator's default credential is for the Anthropic API (the chart's `model`).
        Some(_) if spec.model.is_none() && runtime.provider() != Provider::Anthropic => {
            problems.push(Problem {
                reason: NO_MODEL_CREDENTIAL,
                message: format!(
                    "runtime {} speaks the {} API, and the operator's default model credential \
                     is for the Anthropic API: set spec.model.secretKeyRef to a Secret key holding \
                     a {} API key (spec.model.endpoint defaults to {})",
                    runtime.as_str(),
                    api_name(runtime),
                    api_name(runtime),
                    orchestrator_crds::taskrun::runtime::default_endpoint(runtime.provider())
                ),
            });
        }
        _ => {}
    }
    if let (Some(credential), Some(name)) = (model, spec.agent_model())
        && !credential.models.is_empty()
        && !credential.models.iter().any(|g| glob_matches(g, name))
    {
        let source = if agent.model.is_some() {
            "spec.agent.model"
        } else {
            "the runtime's default model (spec.agent.model is unset)"
        };
        problems.push(Problem {
            reason: MODEL_NOT_ALLOWED,
            message: format!(
                "{source} {name:?} matches none of spec.model.models ({}): the gateway would refuse \
                 every request; set spec.agent.model to a model those globs allow, or add it to \
                 spec.model.models",
                credential.models.join(", ")
            ),
        });
    }
    problems
}

/// What the runtime's files, env and script are, or the permission rules it cannot honour.
/// `gateway`: the task's proxy serves the model (checked by [`check`] for the runtimes that
/// need it).
pub fn render(tr: &TaskRun, access: &ProxyAccess, gateway: bool) -> Result<Launch, Vec<Problem>> {
    let spec = &tr.spec;
    let input = launch::Input {
        permissions: &spec.tool_config.internal_tools.permissions,
        access,
        model: spec.agent_model(),
        gateway,
    };
    match spec.runtime() {
        AgentRuntime::ClaudeCode => Ok(claude_code::render(&input, true)),
        AgentRuntime::Custom => Ok(claude_code::render(&input, false)),
        AgentRuntime::Codex => codex::render(&input),
        AgentRuntime::GeminiCli => gemini::render(&input),
        AgentRuntime::Opencode => opencode::render(&input),
    }
}

fn api_name(runtime: AgentRuntime) -> &'static str {
    match runtime {
        AgentRuntime::Codex => "OpenAI",
        AgentRuntime::GeminiCli => "Gemini",
        _ => "Anthropic",
    }
}

#[cfg(test)]
mod config_tests;
