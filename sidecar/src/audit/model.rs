//! The fields of the gateway's records (`crate::gateway`): a `model_request` line per request
//! the agent's runtime sent through the gateway, and an `agent_tool_use` line per tool use of
//! the agent's own tools (Bash, Edit, Codex's `exec_command` and `apply_patch`, Gemini CLI's
//! `run_shell_command`, ...) the model asked for in a response, so a reader sees those next to
//! the MCP calls, in order.

use serde::Serialize;

/// Flattened into [`super::Record`] (record types `model_request` and `agent_tool_use`).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelFields {
    /// The API (`gateway.provider`): `anthropic`, `openai` or `gemini`.
    pub provider: &'static str,
    /// The model asked for (as the response named it, when it did).
    pub model: String,
    /// The API path forwarded (`/v1/messages`, `/v1/responses`, a Gemini model as `{model}`:
    /// `/v1beta/models/{model}:streamGenerateContent`).
    pub endpoint: &'static str,
    /// The endpoint's HTTP status (0: never answered).
    pub status: u16,
    pub streamed: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    /// Priced with the gateway's table; absent when the model has no price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// `agent_tool_use`: the tool use's id (the agent's result names it); absent when the API
    /// gave none (Gemini's calls may have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// The usage could not be read (a cut stream, an unreadable body): the request was charged
    /// what it reserved.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub usage_unknown: bool,
}
