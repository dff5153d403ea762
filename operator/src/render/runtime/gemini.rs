//! Google's Gemini CLI (`runtime: gemini-cli`, `@google/gemini-cli`): `gemini -p ... -m <model>
//! -o json --admin-policy <policy>`, the task on stdin (docs/design/agent-runtimes.md,
//! section 2):
//! - `gemini-settings.json`, the system settings (they win over a workspace's
//!   `.gemini/settings.json`), the same for every task: the proxy as `mcpServers.orchestrator`
//!   (`httpUrl: ${ORCHESTRATOR_MCP_URL}`, the pod's env, `Authorization: Bearer ${ORCHESTRATOR_MCP_TOKEN}`,
//!   trusted; Gemini CLI expands the env in settings) and the only server allowed
//!   (`mcp.allowed`); the API key auth type; usage statistics, telemetry, auto-update,
//!   extensions, skills and hooks off; the workspace's `.env` ignored and the model variables
//!   excluded from any project env (a repository's `.env` could otherwise send the agent's
//!   credential elsewhere); folder trust off (headless, an untrusted folder would refuse to run,
//!   and one Gemini CLI counts as untrusted gets no MCP server). Gemini CLI reads system
//!   settings only from a file whose every directory is root's and writable by nobody else; the
//!   ConfigMap's mount is group-writable (fsGroup), so the agent-gemini image holds this file as
//!   `/etc/gemini-cli/settings.json` and the script refuses to start when that file is not the
//!   ConfigMap's (an image of another release);
//! - `gemini-policy.toml`, the admin policy (the highest tier, not `--yolo`): the proxy's tools
//!   allowed, the permission rules as allow and deny rules (a denied tool is not offered; shell
//!   commands by prefix: `commandPrefix`, or exactly);
//! - env `GOOGLE_GEMINI_BASE_URL` (the gateway); the script exports `GEMINI_API_KEY` and
//!   `ORCHESTRATOR_MCP_TOKEN` (both the agent's credential, read once at start).
//!
//! The report: `response`, the tokens of `stats.models.*` (no cost: `status.usage` has the
//! gateway's), turns = `roles.main.totalRequests`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::super::pod::{TOOLS_DIR, env};
use super::access::PROXY_SERVER_NAME;
use super::launch::{Input, Launch, script};
use super::rules::{self, Access, Command, CommandSupport, ToolMap};
use orchestrator_crds::resolve::Problem;

/// The system settings file.
pub const SETTINGS_FILE: &str = "gemini-settings.json";
/// Its content, the same for every task (what differs comes from the env, which Gemini CLI
/// expands in settings): the agent-gemini image holds it as `/etc/gemini-cli/settings.json`,
/// root's, the only place Gemini CLI reads system settings from in a pod (see the module's doc).
pub const SETTINGS: &str = include_str!("gemini-settings.json");
/// The admin policy.
pub const POLICY_FILE: &str = "gemini-policy.toml";
/// The display name in problems.
pub const NAME: &str = "Gemini CLI";

/// Gemini CLI's built-in tools, each with the Claude Code tools it does the work of.
const TOOLS: ToolMap = &[
    ("run_shell_command", &["Bash"]),
    ("replace", &["Edit"]),
    ("write_file", &["Write"]),
    ("read_file", &["Read"]),
    ("read_many_files", &["Read"]),
    ("glob", &["Glob"]),
    ("grep_search", &["Grep"]),
    ("list_directory", &["LS"]),
    ("web_fetch", &["WebFetch"]),
    ("google_web_search", &["WebSearch"]),
    ("invoke_agent", &["Task"]),
    ("write_todos", &["TodoWrite"]),
];

/// Policy priorities within the admin tier: a higher one wins.
const ALLOW_ALL: u32 = 100;
const ALLOW: u32 = 500;
const DENY_OTHER_COMMANDS: u32 = 600;
const ALLOW_COMMAND: u32 = 700;
const DENY_COMMAND: u32 = 800;
const DENY: u32 = 900;

/// The `sh -c` script.
pub fn default_script() -> String {
    script(include_str!("gemini.sh"), "gemini-cli")
}

/// Gemini CLI's files, env and script, or the rules it cannot honour.
pub fn render(input: &Input<'_>) -> Result<Launch, Vec<Problem>> {
    let rules = rules::read(input.permissions, NAME, CommandSupport::Prefixes)?;
    let tools = rules::map(&rules, TOOLS, NAME)?;
    let policy = json!({ "rule": policy_rules(rules.allow_all, &tools) });
    let mut vars = vec![
        env(
            "ORCHESTRATOR_GEMINI_SETTINGS",
            &format!("{TOOLS_DIR}/{SETTINGS_FILE}"),
        ),
        env(
            "ORCHESTRATOR_GEMINI_POLICY",
            &format!("{TOOLS_DIR}/{POLICY_FILE}"),
        ),
        env("ORCHESTRATOR_MODEL", input.model.unwrap_or_default()),
        env("GOOGLE_GEMINI_BASE_URL", &input.access.model_base_url),
    ];
    vars.extend(
        input
            .access
            .credential_helper()
            .map(|h| env("ORCHESTRATOR_CREDENTIAL_HELPER", &h)),
    );
    Ok(Launch {
        files: BTreeMap::from([
            (SETTINGS_FILE.to_string(), SETTINGS.to_string()),
            (
                POLICY_FILE.to_string(),
                toml::to_string(&policy).unwrap_or_else(|e| format!("# render error: {e}\n")),
            ),
        ]),
        env: vars,
        script: Some(default_script()),
    })
}

/// The admin policy's rules: the proxy's tools allowed (the proxy decides which exist), then
/// each tool as the permission rules say. In headless mode Gemini CLI denies what no rule
/// allows; a deny rule without arguments hides the tool from the model. Gemini CLI skips a
/// policy file it cannot validate as a whole (every rule needs `toolName`, a priority in
/// 0..=999, `commandPrefix`/`commandRegex` only with the single tool `run_shell_command`):
/// `config_tests` holds the rendered rules to that.
fn policy_rules(allow_all: bool, tools: &BTreeMap<&'static str, Access>) -> Vec<Value> {
    let mut out = vec![json!({
        "toolName": "*",
        "mcpName": PROXY_SERVER_NAME,
        "decision": "allow",
        "priority": ALLOW,
    })];
    if allow_all {
        out.push(json!({
            "toolName": "*",
            "decision": "allow",
            "priority": ALLOW_ALL,
            "allowRedirection": true,
        }));
    }
    let named = |want: fn(&Access) -> bool| -> Vec<&str> {
        tools
            .iter()
            .filter(|(_, a)| want(a))
            .map(|(t, _)| *t)
            .collect()
    };
    let denied = named(|a| *a == Access::Denied);
    if !denied.is_empty() {
        out.push(json!({"toolName": denied, "decision": "deny", "priority": DENY}));
    }
    let allowed = named(|a| *a == Access::Allowed);
    if !allow_all && !allowed.is_empty() {
        out.push(json!({
            "toolName": allowed,
            "decision": "allow",
            "priority": ALLOW,
            "allowRedirection": true,
        }));
    }
    if let Some(Access::Commands { base, allow, deny }) = tools.get("run_shell_command") {
        let shell = "run_shell_command";
        if *base && !allow_all {
            out.push(json!({
                "toolName": shell, "decision": "allow", "priority": ALLOW, "allowRedirection": true,
            }));
        }
        if !*base {
            // Offered (a rule with an argument pattern does not hide the tool), refused unless
            // an allowed command matches.
            out.push(json!({
                "toolName": shell, "commandRegex": ".*", "decision": "deny",
                "priority": DENY_OTHER_COMMANDS,
            }));
        }
        for (commands, decision, priority) in [
            (allow, "allow", ALLOW_COMMAND),
            (deny, "deny", DENY_COMMAND),
        ] {
            for command in commands {
                let mut rule =
                    json!({"toolName": shell, "decision": decision, "priority": priority});
                match command {
                    Command::Prefix(prefix) => rule["commandPrefix"] = json!(prefix),
                    Command::Exact(command) => rule["commandRegex"] = json!(exact(command)),
                    // Refused by `rules::read` (prefixes only).
                    Command::Glob(_) => continue,
                }
                if decision == "allow" {
                    rule["allowRedirection"] = json!(true);
                }
                out.push(rule);
            }
        }
    }
    out
}

/// `commandRegex` for exactly `command`: Gemini CLI matches it after `"command":"` in the JSON of
/// the call's arguments, so the command is written as JSON writes it, regex-escaped, and then
/// the string must end.
fn exact(command: &str) -> String {
    let json = serde_json::to_string(command).unwrap_or_default();
    let inner = json
        .strip_prefix('"')
        .and_then(|j| j.strip_suffix('"'))
        .unwrap_or_default();
    let mut regex = String::new();
    for c in inner.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            regex.push('\\');
        }
        regex.push(c);
    }
    regex + "\""
}
