//! `spec.agent.runtime` and `spec.agent.model`: which agent CLI runs the task, and the model it
//! asks for. The operator renders each runtime's config (its MCP client pointed at the task's
//! proxy only, its built-in tools limited from `toolConfig.internalTools`, its model endpoint set
//! to the task's model gateway) and its default command; `custom` runs `spec.agent.command` with
//! nothing rendered for it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::gateway::Provider;

/// The most characters of `spec.agent.model`.
pub const MODEL_CHARS: usize = 128;

/// The agent CLI that runs the task: `claude-code`, `codex`, `gemini-cli`, `opencode` (the
/// operator renders its config and runs its default command) or `custom` (`spec.agent.command`
/// runs; nothing is rendered for it). Unset: `custom` when `command` or `args` is set, else
/// `claude-code`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum AgentRuntime {
    /// Claude Code (`@anthropic-ai/claude-code`), headless: the Anthropic Messages API.
    ClaudeCode,
    /// OpenAI's Codex CLI (`@openai/codex`), `codex exec`: the OpenAI Responses API.
    Codex,
    /// Google's Gemini CLI (`@google/gemini-cli`), `gemini -p`: the Gemini API.
    GeminiCli,
    /// OpenCode (`opencode-ai`), `opencode run`, with its `anthropic` provider: the Anthropic
    /// Messages API.
    Opencode,
    /// `spec.agent.command`, with no config rendered for it.
    Custom,
}

impl AgentRuntime {
    /// Every runtime, in the order the docs list them.
    pub const ALL: [AgentRuntime; 5] = [
        AgentRuntime::ClaudeCode,
        AgentRuntime::Codex,
        AgentRuntime::GeminiCli,
        AgentRuntime::Opencode,
        AgentRuntime::Custom,
    ];

    /// The name in `spec.agent.runtime`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentRuntime::ClaudeCode => "claude-code",
            AgentRuntime::Codex => "codex",
            AgentRuntime::GeminiCli => "gemini-cli",
            AgentRuntime::Opencode => "opencode",
            AgentRuntime::Custom => "custom",
        }
    }

    /// The runtime of an agent whose `runtime` is `set`, and which sets a `command` or `args` of
    /// its own (`own_command`): unset means `custom` with a command or args of its own (what
    /// such a TaskRun ran before runtimes existed), else `claude-code`.
    pub fn effective(set: Option<AgentRuntime>, own_command: bool) -> AgentRuntime {
        match set {
            Some(runtime) => runtime,
            None if own_command => AgentRuntime::Custom,
            None => AgentRuntime::ClaudeCode,
        }
    }

    /// The model API the runtime speaks, which the task's gateway serves.
    pub fn provider(self) -> Provider {
        match self {
            AgentRuntime::Codex => Provider::OpenAi,
            AgentRuntime::GeminiCli => Provider::Gemini,
            AgentRuntime::ClaudeCode | AgentRuntime::Opencode | AgentRuntime::Custom => {
                Provider::Anthropic
            }
        }
    }

    /// The model asked for when `spec.agent.model` is unset. Claude Code has none of ours: it
    /// picks its own (and `ANTHROPIC_MODEL` is left unset); a custom command gets none.
    pub fn default_model(self) -> Option<&'static str> {
        match self {
            AgentRuntime::Codex => Some("gpt-5.5"),
            AgentRuntime::GeminiCli => Some("gemini-2.5-pro"),
            AgentRuntime::Opencode => Some("claude-sonnet-4-5"),
            AgentRuntime::ClaudeCode | AgentRuntime::Custom => None,
        }
    }
}

/// The endpoint of `provider` when `spec.model.endpoint` (or the operator's `--model-endpoint`)
/// is unset.
pub fn default_endpoint(provider: Provider) -> &'static str {
    match provider {
        Provider::Anthropic => "https://api.anthropic.com",
        Provider::OpenAi => "https://api.openai.com",
        Provider::Gemini => "https://generativelanguage.googleapis.com",
    }
}

/// The CEL rules of `spec.agent` that tie `runtime` to `command` and `args`.
pub fn cel() -> serde_json::Value {
    serde_json::json!([
        {
            "rule": "!has(self.runtime) || self.runtime == 'custom' || (!has(self.command) && !has(self.args))",
            "messageExpression": "'spec.agent.command and spec.agent.args replace the command the operator renders for runtime ' + self.runtime + ': remove them to run ' + self.runtime + ' as rendered, or set spec.agent.runtime: custom to run a command of your own'",
            "fieldPath": ".runtime"
        },
        {
            "rule": "!has(self.runtime) || self.runtime != 'custom' || has(self.command)",
            "message": "spec.agent.runtime: custom runs spec.agent.command, which is unset: set spec.agent.command, or choose a runtime the operator renders (claude-code, codex, gemini-cli, opencode)",
            "fieldPath": ".command"
        }
    ])
}

/// What is wrong with a `spec.agent.model` value, as the CEL rule says it.
pub const MODEL_RULE: &str = "self.matches('^[A-Za-z0-9][-A-Za-z0-9._@]*$')";
pub const MODEL_MESSAGE: &str = "spec.agent.model must be a model name: letters, digits, '-', '.', '_' and '@', starting with a letter or digit (e.g. gpt-5.5, gemini-2.5-pro, claude-sonnet-4-5)";

/// Whether `model` passes [`MODEL_RULE`] (the operator checks it again for a TaskRun stored
/// under an older CRD: the name reaches command lines, URL paths and config files).
pub fn model_name_ok(model: &str) -> bool {
    let mut chars = model.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._@".contains(c))
        && model.len() <= MODEL_CHARS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_spec_spelling() {
        for runtime in AgentRuntime::ALL {
            let text = serde_json::to_string(&runtime).unwrap_or_default();
            assert_eq!(text, format!("\"{}\"", runtime.as_str()));
            let back: AgentRuntime = serde_json::from_str(&text).expect("parses back");
            assert_eq!(back, runtime);
        }
        assert!(serde_json::from_str::<AgentRuntime>("\"gemini\"").is_err());
    }

    #[test]
    fn unset_is_custom_with_a_command_of_its_own_and_claude_code_without() {
        assert_eq!(AgentRuntime::effective(None, true), AgentRuntime::Custom);
        assert_eq!(
            AgentRuntime::effective(None, false),
            AgentRuntime::ClaudeCode
        );
        assert_eq!(
            AgentRuntime::effective(Some(AgentRuntime::Codex), false),
            AgentRuntime::Codex
        );
    }

    #[test]
    fn each_runtime_speaks_its_providers_api_at_its_default_endpoint() {
        let endpoints: Vec<_> = AgentRuntime::ALL
            .iter()
            .map(|r| (r.as_str(), default_endpoint(r.provider())))
            .collect();
        assert_eq!(
            endpoints,
            [
                ("claude-code", "https://api.anthropic.com"),
                ("codex", "https://api.openai.com"),
                ("gemini-cli", "https://generativelanguage.googleapis.com"),
                ("opencode", "https://api.anthropic.com"),
                ("custom", "https://api.anthropic.com"),
            ]
        );
    }

    #[test]
    fn model_names_are_plain() {
        for ok in [
            "gpt-5.5",
            "gemini-2.5-pro",
            "claude-sonnet-4-5@20250929",
            "o3",
        ] {
            assert!(model_name_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "-x",
            "a b",
            "a/b",
            "models/x:generateContent",
            "x\"y",
            "$(id)",
            &"a".repeat(MODEL_CHARS + 1),
        ] {
            assert!(!model_name_ok(bad), "{bad}");
        }
    }
}
