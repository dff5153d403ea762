//! `toolConfig.internalTools.permissions` (Claude Code's rule syntax) read as what Claude Code
//! would do with each of its built-in tools, so that another runtime can render the same: for
//! each tool the runtimes map, allowed, denied, or (the shell only) limited to some commands.
//!
//! Claude Code's meaning, headless: a tool named by a bare `deny` rule is not offered; `*` in
//! `allow` (ours) allows every tool not denied; otherwise a tool that asks before it runs (Bash,
//! the edit tools, WebFetch, WebSearch) runs only when an `allow` rule names it, and the
//! read-only ones (Read, Glob, Grep, LS, Task, TodoWrite) always. `Bash(...)` rules allow or deny
//! the commands they match. The proxy's tools (`mcp__...`) are the proxy's to decide.
//!
//! What a runtime cannot honour is a [`Problem`] naming the rule and the runtime
//! ([`NOT_SUPPORTED`]), never a rule dropped.

use std::collections::BTreeMap;

use orchestrator_crds::taskrun::Permissions;
use orchestrator_crds::tools::glob_matches;

use super::access::PROXY_SERVER_NAME;
use orchestrator_crds::resolve::Problem;

/// The condition reason of a rule a runtime cannot honour.
pub const NOT_SUPPORTED: &str = "PermissionRuleNotSupported";

/// Claude Code's built-in tools that the runtimes map, and whether Claude Code asks before
/// running each (headless, such a tool runs only when allowed).
pub const TOOLS: &[(&str, bool)] = &[
    ("Bash", true),
    ("Edit", true),
    ("Write", true),
    ("NotebookEdit", true),
    ("Read", false),
    ("Glob", false),
    ("Grep", false),
    ("LS", false),
    ("WebFetch", true),
    ("WebSearch", true),
    ("Task", false),
    ("TodoWrite", false),
];

/// A shell command pattern of a `Bash(...)` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `Bash(git status:*)` or `Bash(git status *)`: the command and any arguments.
    Prefix(String),
    /// `Bash(npm test)`: this command exactly.
    Exact(String),
    /// `Bash(git * main)`: a `*` elsewhere (any text).
    Glob(String),
}

impl Command {
    fn parse(content: &str) -> Command {
        let content = content.trim();
        if let Some(prefix) = content.strip_suffix(":*") {
            return Command::Prefix(prefix.trim().to_string());
        }
        if let Some(prefix) = content.strip_suffix(" *")
            && !prefix.contains('*')
        {
            return Command::Prefix(prefix.trim().to_string());
        }
        if content.contains('*') {
            Command::Glob(content.to_string())
        } else {
            Command::Exact(content.to_string())
        }
    }
}

/// What Claude Code would let the agent do with one built-in tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    Allowed,
    Denied,
    /// The shell, for some commands: the tool is offered, and a command runs when it matches
    /// an `allow` pattern or `base` allows it, and matches no `deny` pattern.
    Commands {
        base: bool,
        allow: Vec<Command>,
        deny: Vec<Command>,
    },
}

/// The rules as Claude Code would apply them, for a runtime that is not Claude Code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// `*` in `allow`.
    pub allow_all: bool,
    /// Each tool of [`TOOLS`].
    pub tools: BTreeMap<&'static str, Access>,
}

impl Rules {
    /// The access of `tool` (one of [`TOOLS`]; any other is denied).
    pub fn get(&self, tool: &str) -> &Access {
        self.tools.get(tool).unwrap_or(&Access::Denied)
    }
}

/// A problem with `rule` (in `list`, `allow` or `deny`) for `runtime` (its display name).
pub fn problem(list: &str, rule: &str, runtime: &str, why: &str) -> Problem {
    Problem {
        reason: NOT_SUPPORTED,
        message: format!(
            "spec.toolConfig.internalTools.permissions.{list}: rule {rule:?} cannot be honoured by \
             {runtime}: {why} (docs/api.md, \"Built-in tools per runtime\")"
        ),
    }
}

/// Reads `permissions` for `runtime` (its display name). `commands`: whether the runtime can
/// limit its shell to some commands, and how (`Glob` patterns too, or prefixes and exact
/// commands only). Refuses what no runtime but Claude Code can honour: a `(...)` on a tool other
/// than Bash, a deny rule for the proxy's tools, a deny rule for a tool no runtime maps.
pub fn read(
    permissions: &Permissions,
    runtime: &str,
    commands: CommandSupport,
) -> Result<Rules, Vec<Problem>> {
    let allow_all = permissions.allow.iter().any(|r| r == "*");
    let mut problems = Vec::new();
    // Per tool: denied outright, allowed outright, and the command patterns of each list.
    let mut denied: BTreeMap<&str, bool> = BTreeMap::new();
    let mut allowed: BTreeMap<&str, bool> = BTreeMap::new();
    let mut allow_commands: Vec<Command> = Vec::new();
    let mut deny_commands: Vec<Command> = Vec::new();
    for (list, rules) in [("allow", &permissions.allow), ("deny", &permissions.deny)] {
        let deny = list == "deny";
        for rule in rules.iter().filter(|r| *r != "*" || deny) {
            let (name, content) = match rule.split_once('(') {
                Some((name, rest)) => (name, Some(rest.strip_suffix(')').unwrap_or(rest))),
                None => (rule.as_str(), None),
            };
            if name.starts_with("mcp__") || (deny && name.contains('*') && proxy_tool(name)) {
                // Allowing one of the proxy's tools is the proxy's business (its patterns).
                if deny && proxy_tool(name) {
                    problems.push(problem(
                        list,
                        rule,
                        runtime,
                        &format!(
                            "it would hide tools of the proxy ({PROXY_SERVER_NAME}), and only Claude \
                             Code reads such rules; deny the tool in \
                             spec.toolConfig.mcpServers[].tools.deny instead, which the proxy \
                             enforces for every runtime"
                        ),
                    ));
                }
                if name.starts_with("mcp__") {
                    continue;
                }
            }
            let matching: Vec<&'static str> = TOOLS
                .iter()
                .map(|(t, _)| *t)
                .filter(|t| {
                    if name.contains('*') {
                        glob_matches(name, t)
                    } else {
                        name == *t
                    }
                })
                .collect();
            if matching.is_empty() {
                if deny && !name.contains('*') {
                    problems.push(problem(
                        list,
                        rule,
                        runtime,
                        &format!(
                            "{name} is not one of the Claude Code tools mapped to other runtimes ({})",
                            TOOLS.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                continue;
            }
            match content {
                None => {
                    for tool in matching {
                        *(if deny { &mut denied } else { &mut allowed })
                            .entry(tool)
                            .or_default() = true;
                    }
                }
                Some(content) if name == "Bash" => {
                    let command = Command::parse(content);
                    if let Some(why) = commands.refuses(&command) {
                        problems.push(problem(list, rule, runtime, why));
                        continue;
                    }
                    if deny {
                        deny_commands.push(command);
                    } else {
                        allow_commands.push(command);
                    }
                }
                Some(_) => problems.push(problem(
                    list,
                    rule,
                    runtime,
                    &format!(
                        "it limits {name} to what matches its (...), and {runtime} can only turn \
                         {name} on or off; write a rule without (...)"
                    ),
                )),
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let tools = TOOLS
        .iter()
        .map(|&(tool, asks)| {
            let base = allow_all || allowed.contains_key(tool) || !asks;
            let access = if denied.contains_key(tool) {
                Access::Denied
            } else if tool == "Bash" && (!deny_commands.is_empty() || !allow_commands.is_empty()) {
                match (base, allow_commands.is_empty(), deny_commands.is_empty()) {
                    (true, _, true) => Access::Allowed,
                    (false, true, _) => Access::Denied,
                    _ => Access::Commands {
                        base,
                        allow: if base {
                            Vec::new()
                        } else {
                            allow_commands.clone()
                        },
                        deny: deny_commands.clone(),
                    },
                }
            } else if base {
                Access::Allowed
            } else {
                Access::Denied
            };
            (tool, access)
        })
        .collect();
    Ok(Rules { allow_all, tools })
}

/// A runtime's tools, each with the Claude Code tools it does the work of (a Claude Code tool
/// none of them does is simply absent: nothing to turn off).
pub type ToolMap = &'static [(&'static str, &'static [&'static str])];

/// The access of each of a runtime's tools (`map`): the one its Claude Code tools share. When
/// the rules treat them differently the runtime cannot follow them: a problem naming the tools.
pub fn map(
    rules: &Rules,
    map: ToolMap,
    runtime: &str,
) -> Result<BTreeMap<&'static str, Access>, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut tools = BTreeMap::new();
    for &(tool, claude) in map.iter().filter(|(_, claude)| !claude.is_empty()) {
        let first = claude.first().map(|c| rules.get(c));
        let differ = claude.iter().any(|c| Some(rules.get(c)) != first);
        match first {
            Some(access) if !differ => {
                tools.insert(tool, access.clone());
            }
            _ => problems.push(Problem {
                reason: NOT_SUPPORTED,
                message: format!(
                    "spec.toolConfig.internalTools.permissions: {runtime}'s {tool} tool does the work \
                     of Claude Code's {} together, and the rules treat them differently ({}): \
                     allow or deny them together (docs/api.md, \"Built-in tools per runtime\")",
                    claude.join(" and "),
                    claude
                        .iter()
                        .map(|c| format!("{c} {}", rules.get(c).word()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }
    if problems.is_empty() {
        Ok(tools)
    } else {
        Err(problems)
    }
}

/// The rule that denies `tool` (one of [`TOOLS`]) and its list, for a problem: a deny rule
/// naming it, else the allow list that does not allow it.
pub fn denied_by(permissions: &Permissions, tool: &str) -> (&'static str, String) {
    permissions
        .deny
        .iter()
        .find(|r| {
            let name = r.split_once('(').map_or(r.as_str(), |(n, _)| n);
            name == tool || (name.contains('*') && glob_matches(name, tool))
        })
        .map(|r| ("deny", r.clone()))
        .unwrap_or_else(|| {
            (
                "allow",
                format!("{:?} (no \"*\" and no {tool})", permissions.allow),
            )
        })
}

impl Access {
    fn word(&self) -> &'static str {
        match self {
            Access::Allowed => "allowed",
            Access::Denied => "denied",
            Access::Commands { .. } => "limited to some commands",
        }
    }
}

/// How a runtime can limit its shell to some commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandSupport {
    /// Not at all: the shell is on or off.
    None,
    /// Prefixes and exact commands.
    Prefixes,
    /// Prefixes, exact commands and `*` anywhere.
    Globs,
}

impl CommandSupport {
    fn refuses(self, command: &Command) -> Option<&'static str> {
        match (self, command) {
            (CommandSupport::None, _) => Some(
                "its shell is all or nothing: allow or deny Bash as a whole, or run the task with \
                 a runtime that limits commands (claude-code, gemini-cli, opencode)",
            ),
            (CommandSupport::Prefixes, Command::Glob(_)) => Some(
                "it matches shell commands by prefix only: write the rule as Bash(<command>:*) or \
                 Bash(<command>), with no * inside",
            ),
            _ => None,
        }
    }
}

/// Whether a deny rule's tool name (maybe a glob) covers tools of the proxy.
fn proxy_tool(name: &str) -> bool {
    let probe = format!("mcp__{PROXY_SERVER_NAME}__probe");
    name == format!("mcp__{PROXY_SERVER_NAME}")
        || name.starts_with(&format!("mcp__{PROXY_SERVER_NAME}__"))
        || (name.contains('*') && glob_matches(name, &probe))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(
        allow: &[&str],
        deny: &[&str],
        commands: CommandSupport,
    ) -> Result<Rules, Vec<Problem>> {
        let permissions = Permissions {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        read(&permissions, "Runtime X", commands)
    }

    fn access(allow: &[&str], deny: &[&str], tool: &str) -> Access {
        rules(allow, deny, CommandSupport::Globs)
            .unwrap_or_else(|p| panic!("{p:?}"))
            .get(tool)
            .clone()
    }

    #[test]
    fn allow_all_allows_every_tool_not_denied() {
        let r = rules(&["*"], &["WebFetch", "Edit"], CommandSupport::None).expect("reads");
        assert!(r.allow_all);
        assert_eq!(r.get("WebFetch"), &Access::Denied);
        assert_eq!(r.get("Edit"), &Access::Denied);
        assert_eq!(r.get("Write"), &Access::Allowed);
        assert_eq!(r.get("Bash"), &Access::Allowed);
    }

    #[test]
    fn without_allow_all_only_tools_that_do_not_ask_run_unless_allowed() {
        for (tool, want) in [
            ("Bash", Access::Denied),
            ("Edit", Access::Denied),
            ("WebSearch", Access::Denied),
            ("Read", Access::Allowed),
            ("Grep", Access::Allowed),
            ("Task", Access::Allowed),
            ("WebFetch", Access::Allowed),
        ] {
            assert_eq!(access(&["WebFetch"], &[], tool), want, "{tool}");
        }
    }

    #[test]
    fn bash_rules_become_command_patterns() {
        assert_eq!(
            access(&["Bash(git status:*)", "Bash(npm test)"], &[], "Bash"),
            Access::Commands {
                base: false,
                allow: vec![
                    Command::Prefix("git status".into()),
                    Command::Exact("npm test".into())
                ],
                deny: vec![],
            }
        );
        assert_eq!(
            access(&["*"], &["Bash(rm *)", "Bash(git * --force)"], "Bash"),
            Access::Commands {
                base: true,
                allow: vec![],
                deny: vec![
                    Command::Prefix("rm".into()),
                    Command::Glob("git * --force".into())
                ],
            }
        );
        // A bare deny wins over its patterns; a deny pattern without any allowed command denies.
        assert_eq!(access(&["Bash(ls:*)"], &["Bash"], "Bash"), Access::Denied);
        assert_eq!(access(&[], &["Bash(rm:*)"], "Bash"), Access::Denied);
    }

    #[test]
    fn a_deny_glob_covers_the_tools_it_matches() {
        assert_eq!(access(&["*"], &["Web*"], "WebFetch"), Access::Denied);
        assert_eq!(access(&["*"], &["Web*"], "WebSearch"), Access::Denied);
        assert_eq!(access(&["*"], &["Web*"], "Bash"), Access::Allowed);
    }

    #[test]
    fn what_the_runtime_cannot_honour_is_refused_naming_rule_and_runtime() {
        let messages = |allow: &[&str], deny: &[&str], c| {
            rules(allow, deny, c)
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    assert_eq!(p.reason, NOT_SUPPORTED);
                    p.message
                })
                .collect::<Vec<_>>()
        };
        let m = messages(&["Bash(git status:*)"], &[], CommandSupport::None);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("permissions.allow: rule \"Bash(git status:*)\"")
                && m[0].contains("Runtime X")
                && m[0].contains("all or nothing"),
            "{m:?}"
        );
        let m = messages(&["*"], &["Bash(git * main)"], CommandSupport::Prefixes);
        assert!(m.len() == 1 && m[0].contains("by prefix only"), "{m:?}");
        let m = messages(
            &["*"],
            &["Edit(src/**)", "Read(~/.ssh/**)"],
            CommandSupport::Globs,
        );
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].contains("\"Edit(src/**)\"") && m[0].contains("on or off"),
            "{m:?}"
        );
        let m = messages(
            &["*"],
            &[
                "mcp__orchestrator__github__delete_repo",
                "mcp__*",
                "KillShell",
            ],
            CommandSupport::Globs,
        );
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[0].contains("tools.deny"), "{m:?}");
        assert!(m[2].contains("KillShell is not one of"), "{m:?}");
    }

    #[test]
    fn runtime_tools_that_do_the_work_of_several_claude_tools_need_them_treated_alike() {
        const MAP: ToolMap = &[
            ("edit", &["Edit", "Write"]),
            ("read", &["Read"]),
            ("list", &[]),
        ];
        let r = rules(&["*"], &["Edit", "Write"], CommandSupport::None).expect("reads");
        let tools = map(&r, MAP, "Runtime X").expect("maps");
        assert_eq!(tools["edit"], Access::Denied);
        assert_eq!(tools["read"], Access::Allowed);
        assert!(!tools.contains_key("list"));
        let r = rules(&["*"], &["Write"], CommandSupport::None).expect("reads");
        let problems = map(&r, MAP, "Runtime X").err().unwrap_or_default();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].message.contains("Runtime X's edit tool")
                && problems[0].message.contains("Edit allowed, Write denied"),
            "{problems:?}"
        );
        let p = Permissions {
            allow: vec!["Read".into()],
            deny: vec!["Web*".into()],
        };
        assert_eq!(denied_by(&p, "WebFetch"), ("deny", "Web*".to_string()));
        assert_eq!(denied_by(&p, "Edit").0, "allow");
    }

    #[test]
    fn rules_for_other_mcp_servers_and_allows_of_unmapped_tools_name_nothing_to_refuse() {
        let r = rules(
            &["*", "mcp__orchestrator__github__get_issue", "SlashCommand"],
            &["mcp__github__create_issue"],
            CommandSupport::None,
        )
        .expect("reads");
        assert!(r.tools.values().all(|a| *a == Access::Allowed));
    }
}
