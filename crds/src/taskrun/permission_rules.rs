//! The grammar of the agent's permission rules (`toolConfig.internalTools.permissions`), checked
//! at admission (CEL in the CRD) and by the CLI, with one text per problem.
//!
//! Claude Code skips a rule it cannot parse, silently in headless mode, so a TaskRun that denies
//! `webfetch` or `Bash(foo` would leave the tool enabled: fail-open. The checks below refuse what
//! Claude Code's own settings validator refuses. Source: `@anthropic-ai/claude-code` 2.1.331 from
//! npm, the settings schema's rule validator in the bundled CLI (`bin/claude.exe`, the function
//! that returns "Permission rule cannot be empty", "Malformed Tool(content) rule", "Empty
//! parentheses", "MCP rules do not support patterns in parentheses", "Wildcard tool name ... is
//! not supported in allow rules", "Tool names must start with uppercase", "Prefix cannot be empty
//! before :*"), with its parser: a rule is bare (no parentheses) or `Tool(content)`, split at the
//! first `(` and the last `)`, which must end the rule. Finer warnings it only logs (wildcards in
//! Bash commands) are left to it.
//!
//! `*` alone in `allow` is ours (every tool not denied; rendered as `bypassPermissions`), never
//! handed to the agent as a rule.

/// Which list a rule is in: allow rules may not widen with a wildcard tool name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum List {
    Allow,
    Deny,
}

/// One check: the CEL predicate that is true for a bad rule `p`, the same in Rust, the text.
struct Check {
    cel_bad: &'static str,
    bad: fn(&str) -> bool,
    problem: &'static str,
    allow_only: bool,
}

const CHECKS: &[Check] = &[
    Check {
        cel_bad: "p.matches('^[ \\t\\n\\r]*$')",
        bad: |p| p.trim().is_empty(),
        problem: "is empty",
        allow_only: false,
    },
    Check {
        cel_bad: "(p.contains('(') || p.contains(')')) && !p.matches('^[^()]+[(].+[)]$')",
        bad: |p| (p.contains('(') || p.contains(')')) && !well_formed_call(p),
        problem: "is malformed: write Tool or Tool(content), the content ending at the rule's last \")\", e.g. Bash(npm test:*)",
        allow_only: false,
    },
    Check {
        cel_bad: "p.matches('^[a-z]') && !p.matches('^[^(]*_')",
        bad: |p| p.starts_with(|c: char| c.is_ascii_lowercase()) && !tool_name(p).contains('_'),
        problem: "names a tool in lower case: write tool names as the agent spells them (WebFetch, Bash, Read) or as MCP names (mcp__server__tool)",
        allow_only: false,
    },
    Check {
        cel_bad: "p.startsWith('mcp__') && p.contains('(')",
        bad: |p| p.starts_with("mcp__") && p.contains('('),
        problem: "gives an MCP tool a (content): MCP rules are mcp__server__tool, or mcp__server__* for all tools of a server",
        allow_only: false,
    },
    Check {
        cel_bad: "p.matches('^Bash[(][ \\t]*:[*][)]$')",
        bad: |p| {
            p.strip_prefix("Bash(")
                .and_then(|r| r.strip_suffix(":*)"))
                .is_some_and(|prefix| prefix.trim().is_empty())
        },
        problem: "has an empty prefix before :*, e.g. Bash(npm test:*)",
        allow_only: false,
    },
    Check {
        cel_bad: "p != '*' && p.matches('^[^(]*[*]') && !p.matches('^mcp__[^*(]+__[^(]*$')",
        bad: |p| p != "*" && tool_name(p).contains('*') && !mcp_glob(p),
        problem: "puts a * in the tool name of an allow rule: only \"*\" alone (every tool) or a glob after mcp__server__ (e.g. mcp__github__get_*) may widen an allow list; deny rules may use * anywhere",
        allow_only: true,
    },
];

/// The rule's tool name: everything before the first `(`.
fn tool_name(rule: &str) -> &str {
    rule.split_once('(').map_or(rule, |(name, _)| name)
}

/// `Tool(content)`: a name without parentheses, a non-empty content, the rule ending at `)`.
fn well_formed_call(rule: &str) -> bool {
    let Some((name, rest)) = rule.split_once('(') else {
        return false;
    };
    !name.is_empty()
        && !name.contains(')')
        && rest
            .strip_suffix(')')
            .is_some_and(|content| !content.is_empty() && !content.contains('\n'))
}

/// `mcp__<server>__<tool glob>` with a literal server name.
fn mcp_glob(rule: &str) -> bool {
    let Some(rest) = rule.strip_prefix("mcp__") else {
        return false;
    };
    // The server is the text up to some later "__" (the regex may pick any), without * or (.
    rest.match_indices("__").any(|(i, _)| {
        let (server, tool) = (&rest[..i], &rest[i + 2..]);
        !server.is_empty() && !server.contains(['*', '(']) && !tool.contains('(')
    })
}

/// What is wrong with `rule` in `list`, as a sentence naming it; `None` when the agent accepts it.
pub fn problem(rule: &str, list: List) -> Option<String> {
    CHECKS
        .iter()
        .filter(|c| list == List::Allow || !c.allow_only)
        .find(|c| (c.bad)(rule))
        .map(|c| format!("rule {rule:?} {}", c.problem))
}

/// The CRD's `x-kubernetes-validations` for a list: one rule per check, its message naming the
/// first bad rule (CEL `messageExpression`) and why Claude Code would skip it.
pub fn cel(list: List) -> serde_json::Value {
    let rules: Vec<serde_json::Value> = CHECKS
        .iter()
        .filter(|c| list == List::Allow || !c.allow_only)
        .map(|c| {
            let text = format!(
                "{} (Claude Code would skip this rule and leave the tool enabled)",
                c.problem
            )
            .replace('\\', "\\\\")
            .replace('\'', "\\'");
            serde_json::json!({
                "rule": format!("self.all(p, !({}))", c.cel_bad),
                "messageExpression": format!(
                    "'rule \"' + self.filter(p, {})[0] + '\" {text}'",
                    c.cel_bad
                ),
            })
        })
        .collect();
    serde_json::Value::Array(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules and whether Claude Code 2.1.331's validator accepts them, per list.
    pub const CASES: &[(&str, bool, bool)] = &[
        // (rule, valid in allow, valid in deny)
        ("WebFetch", true, true),
        ("Bash", true, true),
        ("Bash(npm test:*)", true, true),
        ("Bash(git status *)", true, true),
        ("Read(./src/**)", true, true),
        ("WebFetch(domain:example.com)", true, true),
        ("Bash(echo (x))", true, true),
        ("mcp__github", true, true),
        ("mcp__github__get_issue", true, true),
        ("mcp__github__get_*", true, true),
        ("mcp__my_server__tool", true, true),
        ("*", true, true),
        ("webfetch", false, false),
        ("bash(npm test:*)", false, false),
        ("Bash(foo", false, false),
        ("Bash)", false, false),
        ("Bash()", false, false),
        ("(npm)", false, false),
        ("Bash(x) y", false, false),
        ("", false, false),
        ("   ", false, false),
        ("mcp__github__get_issue(x)", false, false),
        ("Bash(:*)", false, false),
        ("Web*", false, true),
        ("mcp__*", false, true),
        ("mcp__git*__x", false, true),
    ];

    #[test]
    fn the_rust_checks_agree_with_claude_codes_validator() {
        for &(rule, allow, deny) in CASES {
            assert_eq!(
                problem(rule, List::Allow).is_none(),
                allow,
                "allow {rule:?}"
            );
            assert_eq!(problem(rule, List::Deny).is_none(), deny, "deny {rule:?}");
        }
    }

    #[test]
    fn a_problem_names_the_rule_and_the_fix() {
        let p = problem("webfetch", List::Deny).unwrap_or_default();
        assert!(p.contains("\"webfetch\"") && p.contains("WebFetch"), "{p}");
        let p = problem("Bash(foo", List::Deny).unwrap_or_default();
        assert!(
            p.contains("malformed") && p.contains("Bash(npm test:*)"),
            "{p}"
        );
    }

    #[test]
    fn every_check_has_a_cel_rule_and_a_message_naming_the_rule() {
        let allow = cel(List::Allow);
        let deny = cel(List::Deny);
        assert_eq!(allow.as_array().map(Vec::len), Some(CHECKS.len()));
        assert_eq!(deny.as_array().map(Vec::len), Some(CHECKS.len() - 1));
        for rule in allow.as_array().into_iter().flatten() {
            let message = rule["messageExpression"].as_str().unwrap_or_default();
            assert!(message.contains("self.filter(p, "), "{message}");
        }
    }
}
