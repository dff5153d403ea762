//! OpenAI's Codex CLI (`runtime: codex`, `@openai/codex`): `codex exec --json`, the task on
//! stdin, with `codex-config.toml` copied into a `CODEX_HOME` of its own (docs/design/
//! agent-runtimes.md, section 1):
//! - `[mcp_servers.orchestrator]`: the proxy's URL, the token from `ORCHESTRATOR_MCP_TOKEN`
//!   (Codex has no helper for MCP headers: the script exports it once, after the same port check
//!   as Claude Code's helper in sidecar mode);
//! - `model_provider = "orchestrator"`: the task's gateway (`<gateway>/v1`, the Responses API),
//!   its key from `auth.command` (the model key helper, as Claude Code's `apiKeyHelper`);
//! - `approval_policy = "never"`, `sandbox_mode = "danger-full-access"` (the pod is the sandbox;
//!   nobody answers a prompt in a Job), update checks and analytics off;
//! - the permission rules as features turned off (the shell, `view_image`, web search,
//!   sub-agents, goals). Codex cannot limit its shell to some commands, nor turn off
//!   `apply_patch` (file edits): such rules are refused (`PermissionRuleNotSupported`).
//!
//! `--enable mcp_tool_list_changed` makes Codex re-list the proxy's tools on
//! `notifications/tools/list_changed` (off by default in 0.171.0). The report: the last agent
//! message, the summed usage of `turn.completed` (no cost: `status.usage` has the gateway's),
//! turns = Codex turns (one per `codex exec`).

use std::collections::BTreeMap;

use orchestrator_crds::taskrun::Permissions;
use serde_json::{Value, json};

use super::super::pod::{TOOLS_DIR, env};
use super::access::PROXY_SERVER_NAME;
use super::launch::{Input, Launch, script};
use super::rules::{self, Access, CommandSupport, ToolMap};
use orchestrator_crds::resolve::Problem;

/// Codex's config, copied by the script into its `CODEX_HOME` as `config.toml`.
pub const CONFIG_FILE: &str = "codex-config.toml";
/// The display name in problems.
pub const NAME: &str = "Codex CLI";
/// The model provider the config defines: the task's gateway.
const PROVIDER: &str = "orchestrator";

/// Codex's switches, each with the Claude Code tools it does the work of.
const TOOLS: ToolMap = &[
    ("shell", &["Bash"]),
    ("apply_patch", &["Edit", "Write"]),
    ("view_image", &["Read"]),
    ("web_search", &["WebSearch"]),
    ("multi_agent", &["Task"]),
    ("goals", &["TodoWrite"]),
];

/// The `sh -c` script.
pub fn default_script() -> String {
    script(include_str!("codex.sh"), "codex")
}

/// Codex's config, env and script, or the rules it cannot honour.
pub fn render(input: &Input<'_>) -> Result<Launch, Vec<Problem>> {
    let tools = access(input.permissions)?;
    let denied = |tool: &str| tools.get(tool) == Some(&Access::Denied);
    let mut features = BTreeMap::from([
        ("apps", false),
        ("plugins", false),
        ("in_app_updates", false),
    ]);
    if denied("shell") {
        features.insert("shell_tool", false);
        features.insert("unified_exec", false);
    }
    for (tool, feature) in [
        ("view_image", "view_image"),
        ("multi_agent", "multi_agent"),
        ("goals", "goals"),
    ] {
        if denied(tool) {
            features.insert(feature, false);
        }
    }
    let (program, arg) = input.access.credential_command();
    let model = input.model.unwrap_or_default();
    let mut config = json!({
        "model": model,
        "model_provider": PROVIDER,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": false,
        "analytics": {"enabled": false},
        "features": features,
        "mcp_servers": {
            PROXY_SERVER_NAME: {
                "url": input.access.mcp_url,
                "bearer_token_env_var": "ORCHESTRATOR_MCP_TOKEN",
                // Under approval_policy "never" Codex refuses MCP calls it would ask about; the
                // proxy decides on each call (its policy, approvals), so Codex runs them all.
                "default_tools_approval_mode": "approve",
            }
        },
        "model_providers": {
            PROVIDER: {
                "name": "orchestrator model gateway",
                "base_url": format!("{}/v1", input.access.model_base_url),
                "wire_api": "responses",
                "auth": {"command": program, "args": [arg]},
            }
        },
    });
    if denied("web_search") {
        config["web_search"] = json!("disabled");
    }
    let mut vars = vec![
        env(
            "ORCHESTRATOR_CODEX_CONFIG",
            &format!("{TOOLS_DIR}/{CONFIG_FILE}"),
        ),
        env("ORCHESTRATOR_MODEL", model),
    ];
    vars.extend(
        input
            .access
            .credential_helper()
            .map(|h| env("ORCHESTRATOR_CREDENTIAL_HELPER", &h)),
    );
    Ok(Launch {
        files: BTreeMap::from([(CONFIG_FILE.to_string(), toml_text(&config))]),
        env: vars,
        script: Some(default_script()),
    })
}

/// What Codex does with each of its switches, or the rules it cannot honour.
fn access(permissions: &Permissions) -> Result<BTreeMap<&'static str, Access>, Vec<Problem>> {
    let rules = rules::read(permissions, NAME, CommandSupport::None)?;
    let tools = rules::map(&rules, TOOLS, NAME)?;
    if tools.get("apply_patch") == Some(&Access::Denied) {
        let (list, rule) = rules::denied_by(permissions, "Edit");
        return Err(vec![rules::problem(
            list,
            &rule,
            NAME,
            "Codex cannot turn off apply_patch, its file edits (and its shell writes files too): \
             allow Edit and Write, or run the task with a runtime that can deny them \
             (claude-code, gemini-cli, opencode)",
        )]);
    }
    Ok(tools)
}

/// A TOML document from `value` (an object). Serializing strings, booleans and tables of them
/// cannot fail; if it ever did, Codex would refuse an empty config rather than run without it.
fn toml_text(value: &Value) -> String {
    toml::to_string(value).unwrap_or_else(|e| format!("# render error: {e}\n"))
}
