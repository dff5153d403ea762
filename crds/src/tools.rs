//! Which of a server's tools are exposed: the `tools.allow` / `tools.deny` glob semantics that
//! every binary shares. The sidecar enforces them, the operator reports the effective tools in a
//! TaskRun's status, the CLI computes what an add-context changes; one implementation keeps the
//! three from disagreeing.
//!
//! Semantics: deny wins; an empty allow list allows everything; a disabled server allows
//! nothing. Patterns are `globset` globs (`*` matches any run of characters, `?` one, `[...]`,
//! `{a,b}`); a pattern without glob syntax matches exactly that name.

use std::fmt;

use globset::{Glob, GlobMatcher};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How much harm calling a tool can do, in order: `read` < `write` < `destructive`. A policy's
/// `maxRisk` hides and refuses the tools above it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Risk {
    /// Reads only (the server says `readOnlyHint: true` and not `destructiveHint: true`).
    Read,
    /// Changes something, but not destructively (no hint says otherwise: the default).
    Write,
    /// May destroy or overwrite (the server says `destructiveHint: true`).
    Destructive,
}

impl Risk {
    /// The class from a tool's MCP annotations: `destructiveHint` -> destructive (also with
    /// `readOnlyHint`), `readOnlyHint` -> read, neither -> write.
    pub fn from_hints(read_only: Option<bool>, destructive: Option<bool>) -> Risk {
        match (read_only, destructive) {
            (_, Some(true)) => Risk::Destructive,
            (Some(true), _) => Risk::Read,
            _ => Risk::Write,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::Destructive => "destructive",
        }
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One compiled pattern and its place in its list.
#[derive(Clone, Debug)]
struct Pattern {
    index: usize,
    text: String,
    matcher: GlobMatcher,
}

/// Why a tool is exposed or hidden.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Rule {
    /// `tools.allow[index]` matched.
    Allow { index: usize, pattern: String },
    /// No allow list: everything not denied is allowed.
    DefaultAllow,
    /// `tools.deny[index]` matched (deny wins over allow).
    Deny { index: usize, pattern: String },
    /// There is an allow list and no pattern in it matched.
    NotAllowed,
    /// The server is disabled (`enabled: false`).
    ServerDisabled,
    /// The tool's risk class is above the policy's `maxRisk` (whatever the patterns say).
    #[serde(rename_all = "camelCase")]
    AboveMaxRisk { risk: Risk, max_risk: Risk },
    /// The tool's definition differs from its pin or from the one first seen, and the policy's
    /// `onChange` is `block`; `what` says which and how (the hashes).
    DefinitionChanged { what: String },
}

/// The decision for one tool, with the rule that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum Verdict {
    Allowed { rule: Rule },
    Denied { rule: Rule },
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed { .. })
    }

    pub fn rule(&self) -> &Rule {
        match self {
            Verdict::Allowed { rule } | Verdict::Denied { rule } => rule,
        }
    }
}

/// A [`Rule`] shown with its server, as the config path a user can find it at
/// (`servers[github].tools.deny[0] "delete_*"`).
pub struct RuleDisplay<'a, S: fmt::Display> {
    pub server: S,
    pub rule: &'a Rule,
}

impl<S: fmt::Display> fmt::Display for RuleDisplay<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.server;
        match self.rule {
            Rule::Allow { index, pattern } => {
                write!(f, "servers[{s}].tools.allow[{index}] {pattern:?}")
            }
            Rule::DefaultAllow => write!(f, "servers[{s}] has no tools.allow list (allow all)"),
            Rule::Deny { index, pattern } => {
                write!(f, "servers[{s}].tools.deny[{index}] {pattern:?}")
            }
            Rule::NotAllowed => write!(f, "servers[{s}].tools.allow (no pattern matches)"),
            Rule::ServerDisabled => write!(f, "servers[{s}].enabled: false"),
            Rule::AboveMaxRisk { risk, max_risk } => write!(
                f,
                "policy.maxRisk \"{max_risk}\" (servers[{s}]: the tool is {risk})"
            ),
            Rule::DefinitionChanged { what } => write!(f, "policy.onChange \"block\" ({what})"),
        }
    }
}

/// A pattern that does not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatternError {
    /// `"allow"` or `"deny"`.
    pub list: &'static str,
    pub index: usize,
    pub pattern: String,
    pub message: String,
}

/// A server's compiled allow/deny patterns.
#[derive(Clone, Debug)]
pub struct ToolFilter {
    enabled: bool,
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
}

impl ToolFilter {
    /// Compiles the patterns; every bad pattern is reported, not just the first.
    pub fn compile(
        enabled: bool,
        allow: &[String],
        deny: &[String],
    ) -> Result<Self, Vec<PatternError>> {
        let mut errors = Vec::new();
        let allow = compile_list("allow", allow, &mut errors);
        let deny = compile_list("deny", deny, &mut errors);
        if errors.is_empty() {
            Ok(Self {
                enabled,
                allow,
                deny,
            })
        } else {
            Err(errors)
        }
    }

    /// The verdict for one tool name.
    pub fn verdict(&self, tool: &str) -> Verdict {
        if !self.enabled {
            return Verdict::Denied {
                rule: Rule::ServerDisabled,
            };
        }
        if let Some(p) = self.deny.iter().find(|p| p.matcher.is_match(tool)) {
            return Verdict::Denied {
                rule: Rule::Deny {
                    index: p.index,
                    pattern: p.text.clone(),
                },
            };
        }
        if self.allow.is_empty() {
            return Verdict::Allowed {
                rule: Rule::DefaultAllow,
            };
        }
        match self.allow.iter().find(|p| p.matcher.is_match(tool)) {
            Some(p) => Verdict::Allowed {
                rule: Rule::Allow {
                    index: p.index,
                    pattern: p.text.clone(),
                },
            },
            None => Verdict::Denied {
                rule: Rule::NotAllowed,
            },
        }
    }

    /// Whether the tool is exposed (the verdict without the reason, and without allocating).
    pub fn exposes(&self, tool: &str) -> bool {
        self.enabled
            && !self.deny.iter().any(|p| p.matcher.is_match(tool))
            && (self.allow.is_empty() || self.allow.iter().any(|p| p.matcher.is_match(tool)))
    }

    /// True when no tool name can pass: the server is disabled or a deny pattern matches every
    /// name. The sidecar never starts such a server.
    pub fn denies_everything(&self) -> bool {
        !self.enabled || self.deny.iter().any(|p| is_match_all(&p.text))
    }

    /// The allow list as literal names, when it consists only of literals (no glob syntax).
    pub fn literal_allow_list(&self) -> Option<Vec<&str>> {
        if self.allow.is_empty() || self.allow.iter().any(|p| has_glob_syntax(&p.text)) {
            return None;
        }
        Some(self.allow.iter().map(|p| p.text.as_str()).collect())
    }
}

fn compile_list(
    list: &'static str,
    patterns: &[String],
    errors: &mut Vec<PatternError>,
) -> Vec<Pattern> {
    let mut out = Vec::with_capacity(patterns.len());
    for (index, text) in patterns.iter().enumerate() {
        match compile(text) {
            Ok(matcher) => out.push(Pattern {
                index,
                text: text.clone(),
                matcher,
            }),
            Err(message) => errors.push(PatternError {
                list,
                index,
                pattern: text.clone(),
                message,
            }),
        }
    }
    out
}

fn compile(pattern: &str) -> Result<GlobMatcher, String> {
    if pattern.trim().is_empty() {
        return Err("empty pattern".into());
    }
    Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| e.kind().to_string())
}

/// Checks one pattern; the error says why it is not a valid glob.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    compile(pattern).map(|_| ())
}

/// Whether `pattern` matches `name` (a pattern that does not compile matches nothing).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    if !has_glob_syntax(pattern) {
        return pattern == name;
    }
    compile(pattern).is_ok_and(|m| m.is_match(name))
}

/// Whether the pattern uses glob syntax (otherwise it is a literal tool name).
pub fn has_glob_syntax(pattern: &str) -> bool {
    pattern.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// A pattern made only of `*`: it matches every tool.
pub fn is_match_all(pattern: &str) -> bool {
    !pattern.is_empty() && pattern.chars().all(|c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(allow: &[&str], deny: &[&str]) -> ToolFilter {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ToolFilter::compile(true, &own(allow), &own(deny)).expect("compiles")
    }

    #[test]
    fn deny_wins_and_an_empty_allow_list_allows_all() {
        let f = filter(&["list_*", "create_issue"], &["list_secrets"]);
        assert!(f.exposes("list_issues"));
        assert!(f.exposes("create_issue"));
        assert!(!f.exposes("list_secrets"));
        assert!(!f.exposes("delete_repo"));
        assert_eq!(
            f.verdict("list_secrets").rule(),
            &Rule::Deny {
                index: 0,
                pattern: "list_secrets".into()
            }
        );
        assert_eq!(f.verdict("delete_repo").rule(), &Rule::NotAllowed);
        let all = filter(&[], &["delete_*"]);
        assert_eq!(all.verdict("read").rule(), &Rule::DefaultAllow);
        assert!(!all.exposes("delete_file"));
    }

    #[test]
    fn exposes_agrees_with_verdict() {
        let f = filter(&["get-*", "echo"], &["get-env", "*tiny*"]);
        for name in ["echo", "get-sum", "get-env", "get-tiny-image", "other", ""] {
            assert_eq!(f.exposes(name), f.verdict(name).is_allowed(), "{name}");
        }
    }

    #[test]
    fn a_disabled_server_exposes_nothing() {
        let f = ToolFilter::compile(false, &[], &[]).expect("compiles");
        assert!(!f.exposes("anything"));
        assert!(f.denies_everything());
        assert_eq!(f.verdict("x").rule(), &Rule::ServerDisabled);
    }

    #[test]
    fn every_bad_pattern_is_reported() {
        let errors = ToolFilter::compile(true, &["[".into(), "ok".into()], &[" ".into()])
            .expect_err("bad patterns");
        let places: Vec<_> = errors.iter().map(|e| (e.list, e.index)).collect();
        assert_eq!(places, [("allow", 0), ("deny", 0)]);
    }

    #[test]
    fn allow_list_names_the_matching_pattern() {
        let f = filter(&["create_issue", "list_*"], &[]);
        assert_eq!(
            f.verdict("list_issues").rule(),
            &Rule::Allow {
                index: 1,
                pattern: "list_*".into()
            }
        );
    }

    #[test]
    fn glob_classes_and_alternatives_work() {
        let f = filter(&["get_{a,b}", "x?", "[rs]ead"], &[]);
        for ok in ["get_a", "get_b", "x1", "read", "sead"] {
            assert!(f.exposes(ok), "{ok}");
        }
        for no in ["get_c", "x12", "bead"] {
            assert!(!f.exposes(no), "{no}");
        }
    }

    #[test]
    fn deny_star_denies_everything() {
        assert!(filter(&[], &["*"]).denies_everything());
        assert!(!filter(&[], &["a*"]).denies_everything());
    }

    #[test]
    fn literal_allow_list_only_when_no_globs() {
        assert_eq!(
            filter(&["a", "b"], &[]).literal_allow_list(),
            Some(vec!["a", "b"])
        );
        assert_eq!(filter(&["a*"], &[]).literal_allow_list(), None);
        assert_eq!(filter(&[], &[]).literal_allow_list(), None);
    }

    #[test]
    fn single_pattern_matching() {
        assert!(glob_matches("read_*", "read_file"));
        assert!(glob_matches("read_file", "read_file"));
        assert!(!glob_matches("read_file", "read_files"));
        assert!(!glob_matches("[", "["));
        assert!(is_match_all("**") && !is_match_all("*a"));
        assert!(has_glob_syntax("a{b,c}") && !has_glob_syntax("a-b_c"));
    }

    #[test]
    fn rules_display_as_config_paths() {
        let rule = Rule::Deny {
            index: 1,
            pattern: "delete_*".into(),
        };
        let shown = RuleDisplay {
            server: "github",
            rule: &rule,
        };
        assert_eq!(
            shown.to_string(),
            "servers[github].tools.deny[1] \"delete_*\""
        );
    }
}
