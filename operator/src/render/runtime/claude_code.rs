//! Claude Code (`runtime: claude-code`, the default): headless (`claude -p --output-format
//! json`), the proxy its only MCP server (`--strict-mcp-config`), the permission rules as they
//! are written (its own syntax), the task on stdin. Its files are also what a `custom` command
//! gets (as before runtimes existed), without the script.
//!
//! - `mcp-config.json`: the proxy, type `http`, with a `headersHelper` that prints the agent's
//!   credential (Claude Code runs it at every connection, so a renewed token is picked up).
//! - `settings.json`: `permissions.allow/deny` (`*` becomes `defaultMode: bypassPermissions`:
//!   nobody could answer a prompt in a Job), and with a model gateway `apiKeyHelper`.
//! - env: the files' paths, with a gateway `ANTHROPIC_BASE_URL` (the proxy's `/model`, no key),
//!   with `spec.agent.model` `ANTHROPIC_MODEL`.
//! - The report comes from Claude Code's JSON result (`crate::report::runtimes`): `subtype`,
//!   `is_error`, `result`, `num_turns`, `usage.*`, `total_cost_usd`, `duration_ms`, `session_id`.

use std::collections::BTreeMap;

use orchestrator_crds::taskrun::Permissions;
use serde_json::json;

use super::super::pod::{TOOLS_DIR, env};
use super::access::PROXY_SERVER_NAME;
use super::launch::{Input, Launch, pretty, script};

/// The agent's MCP client config (Claude Code `--mcp-config`).
pub const MCP_CONFIG_FILE: &str = "mcp-config.json";
/// The agent's settings with its built-in tool permissions (Claude Code `--settings`).
pub const SETTINGS_FILE: &str = "settings.json";

/// The `sh -c` script.
pub fn default_script() -> String {
    script(include_str!("claude_code.sh"), "claude-code")
}

/// Claude Code's files, env and script (`with_script` false: a custom command's).
pub fn render(input: &Input<'_>, with_script: bool) -> Launch {
    let mut settings = settings(input.permissions);
    let mut vars = vec![
        env(
            "ORCHESTRATOR_MCP_CONFIG",
            &format!("{TOOLS_DIR}/{MCP_CONFIG_FILE}"),
        ),
        env(
            "ORCHESTRATOR_SETTINGS",
            &format!("{TOOLS_DIR}/{SETTINGS_FILE}"),
        ),
    ];
    if input.gateway {
        let (program, arg) = input.access.credential_command();
        settings["apiKeyHelper"] = json!(format!("{program} {arg}"));
        vars.push(env("ANTHROPIC_BASE_URL", &input.access.model_base_url));
    }
    if let Some(model) = input.model {
        vars.push(env("ANTHROPIC_MODEL", model));
    }
    let mcp_config = json!({
        "mcpServers": {
            PROXY_SERVER_NAME: {
                "type": "http",
                "url": input.access.mcp_url,
                "headersHelper": input.access.headers_helper(),
            }
        }
    });
    Launch {
        files: BTreeMap::from([
            (MCP_CONFIG_FILE.to_string(), pretty(&mcp_config)),
            (SETTINGS_FILE.to_string(), pretty(&settings)),
        ]),
        env: vars,
        script: with_script.then(default_script),
    }
}

/// Claude Code permission settings for the built-in tools. `*` in `allow` (the default) means
/// every tool not denied: permission prompts are bypassed (nobody could answer them in a Job)
/// and deny rules still apply. The proxy's tools are always allowed here: the proxy itself
/// decides which of them exist.
fn settings(p: &Permissions) -> serde_json::Value {
    let allow_all = p.allow.iter().any(|a| a == "*");
    let mut allow: Vec<String> = p.allow.iter().filter(|a| *a != "*").cloned().collect();
    allow.push(format!("mcp__{PROXY_SERVER_NAME}"));
    let mut permissions = json!({ "allow": allow, "deny": p.deny });
    if allow_all {
        permissions["defaultMode"] = json!("bypassPermissions");
    }
    json!({ "permissions": permissions })
}
