//! OpenCode (`runtime: opencode`, `opencode-ai`): `opencode run --format json -m
//! anthropic/<model>`, the task attached with `-f` (docs/design/agent-runtimes.md, section 3),
//! with `opencode.json` (`OPENCODE_CONFIG`; the script turns off project config, Claude Code's
//! files, default plugins, the models.dev fetch and the update check):
//! - `mcp.orchestrator`: the proxy (`type: remote`, no OAuth), `Authorization: Bearer
//!   {env:ORCHESTRATOR_MCP_TOKEN}`, which the script exports after the same port check as Claude
//!   Code's helper in sidecar mode (OpenCode reads it once, at start);
//! - `provider.anthropic.options`: the gateway (`<gateway>/v1`: the Messages API, which the
//!   gateway serves as for Claude Code) and the agent's credential as the key; `model` and
//!   `small_model` (its title request) the same model, so `spec.model.models` needs only one;
//! - `permission`: the rules, in order (OpenCode takes the last rule that matches; a tool whose
//!   last rule is a plain deny is not offered): `*` first, then each tool, the proxy's tools
//!   (`orchestrator_*`) allowed last; shell commands as patterns;
//! - `autoupdate: false`, `share: "disabled"`.
//!
//! The report: the last text part, the summed tokens and cost of each `step_finish` (one turn
//! each).

use std::collections::BTreeMap;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};

use super::super::pod::{TOOLS_DIR, env};
use super::access::PROXY_SERVER_NAME;
use super::launch::{Input, Launch, pretty, script};
use super::rules::{self, Access, Command, CommandSupport, ToolMap};
use orchestrator_crds::resolve::Problem;

/// OpenCode's config.
pub const CONFIG_FILE: &str = "opencode.json";
/// The display name in problems.
pub const NAME: &str = "OpenCode";

/// OpenCode's permissions, each with the Claude Code tools it does the work of.
const TOOLS: ToolMap = &[
    ("bash", &["Bash"]),
    ("edit", &["Edit", "Write"]),
    ("read", &["Read"]),
    ("glob", &["Glob"]),
    ("grep", &["Grep"]),
    ("list", &["LS"]),
    ("webfetch", &["WebFetch"]),
    ("websearch", &["WebSearch"]),
    ("task", &["Task"]),
    ("todowrite", &["TodoWrite"]),
    ("todoread", &["TodoWrite"]),
];

/// The `sh -c` script.
pub fn default_script() -> String {
    script(include_str!("opencode.sh"), "opencode")
}

/// OpenCode's config, env and script, or the rules it cannot honour.
pub fn render(input: &Input<'_>) -> Result<Launch, Vec<Problem>> {
    let rules = rules::read(input.permissions, NAME, CommandSupport::Globs)?;
    let tools = rules::map(&rules, TOOLS, NAME)?;
    let token = "{env:ORCHESTRATOR_MCP_TOKEN}";
    let model = format!("anthropic/{}", input.model.unwrap_or_default());
    let config = Json::Ordered(vec![
        ("model".into(), Json::Plain(json!(model))),
        ("small_model".into(), Json::Plain(json!(model))),
        ("autoupdate".into(), Json::Plain(json!(false))),
        ("share".into(), Json::Plain(json!("disabled"))),
        (
            "provider".into(),
            Json::Plain(json!({"anthropic": {"options": {
                "baseURL": format!("{}/v1", input.access.model_base_url),
                "apiKey": token,
            }}})),
        ),
        (
            "mcp".into(),
            Json::Plain(json!({PROXY_SERVER_NAME: {
                "type": "remote",
                "url": input.access.mcp_url,
                "headers": {"Authorization": format!("Bearer {token}")},
                "oauth": false,
                "enabled": true,
            }})),
        ),
        ("permission".into(), permission(rules.allow_all, &tools)),
    ]);
    let mut vars = vec![
        env(
            "ORCHESTRATOR_OPENCODE_CONFIG",
            &format!("{TOOLS_DIR}/{CONFIG_FILE}"),
        ),
        env("ORCHESTRATOR_MODEL", input.model.unwrap_or_default()),
    ];
    vars.extend(
        input
            .access
            .credential_helper()
            .map(|h| env("ORCHESTRATOR_CREDENTIAL_HELPER", &h)),
    );
    Ok(Launch {
        files: BTreeMap::from([(CONFIG_FILE.to_string(), pretty(&config))]),
        env: vars,
        script: Some(default_script()),
    })
}

/// `permission`, in the order OpenCode reads it (the last matching rule wins): every tool
/// allowed or denied as the rules' `*` says, each mapped tool as the rules say (the shell's
/// denied patterns after its allowed ones), the proxy's tools allowed. Without `*`, a tool of
/// OpenCode's own that maps to no Claude Code tool is denied; a path outside the workspace
/// (`external_directory`) is allowed, as Claude Code allows it.
fn permission(allow_all: bool, tools: &BTreeMap<&'static str, Access>) -> Json {
    let word = |allowed: bool| Json::Plain(json!(if allowed { "allow" } else { "deny" }));
    let mut out = vec![("*".to_string(), word(allow_all))];
    if !allow_all {
        out.push(("external_directory".into(), word(true)));
    }
    for (tool, access) in tools {
        let value = match access {
            Access::Allowed => word(true),
            Access::Denied => word(false),
            Access::Commands { base, allow, deny } => {
                let mut patterns = vec![("*".to_string(), word(*base))];
                for (commands, allowed) in [(allow, true), (deny, false)] {
                    for command in commands {
                        let globs: Vec<String> = match command {
                            Command::Prefix(p) => vec![p.clone(), format!("{p} *")],
                            Command::Exact(c) | Command::Glob(c) => vec![c.clone()],
                        };
                        patterns.extend(globs.into_iter().map(|g| (g, word(allowed))));
                    }
                }
                Json::Ordered(patterns)
            }
        };
        if *access != Access::Allowed || !allow_all {
            out.push((tool.to_string(), value));
        }
    }
    out.push((format!("{PROXY_SERVER_NAME}_*"), word(true)));
    Json::Ordered(out)
}

/// JSON whose objects may keep their keys in order (serde_json's own maps sort them).
enum Json {
    Plain(Value),
    Ordered(Vec<(String, Json)>),
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Plain(value) => value.serialize(serializer),
            Json::Ordered(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}
