//! Tool filtering: a server's `tools.allow` / `tools.deny` glob patterns, compiled once, turned
//! into a [`Verdict`] that carries the rule that decided it (so a refusal can name its reason).
//!
//! Semantics: deny wins; an empty allow list allows everything; a disabled server allows nothing.

use std::fmt;

use globset::{Glob, GlobMatcher};

use crate::names::ServerName;

/// One compiled pattern and where it came from.
#[derive(Clone, Debug)]
struct Pattern {
    index: usize,
    text: String,
    matcher: GlobMatcher,
}

/// Why a tool is exposed or hidden.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
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
}

/// The decision for one tool, with the rule that made it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
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

/// A [`Rule`] shown with the server it belongs to, as config paths a user can find in the file.
pub struct RuleDisplay<'a> {
    pub server: &'a ServerName,
    pub rule: &'a Rule,
}

impl fmt::Display for RuleDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.server;
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
        }
    }
}

/// A server's compiled filter.
#[derive(Clone, Debug)]
pub struct ToolFilter {
    enabled: bool,
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
}

/// A pattern that failed to compile, for the config validator.
#[derive(Debug)]
pub struct PatternError {
    pub list: &'static str,
    pub index: usize,
    pub message: String,
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

    /// The verdict for one upstream tool name.
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

    /// True when no tool name can pass: the server is disabled or a deny pattern matches every
    /// name. Such a server is never started.
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
        if text.trim().is_empty() {
            errors.push(PatternError {
                list,
                index,
                message: "empty pattern".into(),
            });
            continue;
        }
        match Glob::new(text) {
            Ok(glob) => out.push(Pattern {
                index,
                text: text.clone(),
                matcher: glob.compile_matcher(),
            }),
            Err(e) => errors.push(PatternError {
                list,
                index,
                message: e.kind().to_string(),
            }),
        }
    }
    out
}

/// Glob metacharacters understood by `globset`.
pub fn has_glob_syntax(pattern: &str) -> bool {
    pattern.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

fn is_match_all(pattern: &str) -> bool {
    !pattern.is_empty() && pattern.chars().all(|c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(allow: &[&str], deny: &[&str]) -> ToolFilter {
        let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        let deny: Vec<String> = deny.iter().map(|s| s.to_string()).collect();
        ToolFilter::compile(true, &allow, &deny).expect("patterns compile")
    }

    #[test]
    fn empty_allow_list_allows_everything_not_denied() {
        let f = filter(&[], &["delete_*"]);
        assert_eq!(
            f.verdict("create_issue"),
            Verdict::Allowed {
                rule: Rule::DefaultAllow
            }
        );
        assert_eq!(
            f.verdict("delete_repo"),
            Verdict::Denied {
                rule: Rule::Deny {
                    index: 0,
                    pattern: "delete_*".into()
                }
            }
        );
    }

    #[test]
    fn deny_wins_over_allow() {
        let f = filter(&["*"], &["list_secrets"]);
        assert_eq!(
            f.verdict("list_secrets"),
            Verdict::Denied {
                rule: Rule::Deny {
                    index: 0,
                    pattern: "list_secrets".into()
                }
            }
        );
        assert!(f.verdict("list_issues").is_allowed());
    }

    #[test]
    fn allow_list_names_the_matching_pattern() {
        let f = filter(&["create_issue", "list_*"], &[]);
        assert_eq!(
            f.verdict("list_issues"),
            Verdict::Allowed {
                rule: Rule::Allow {
                    index: 1,
                    pattern: "list_*".into()
                }
            }
        );
        assert_eq!(
            f.verdict("merge_pr"),
            Verdict::Denied {
                rule: Rule::NotAllowed
            }
        );
    }

    #[test]
    fn glob_classes_and_alternatives_work() {
        let f = filter(&["get_{a,b}", "x?", "[rs]ead"], &[]);
        for ok in ["get_a", "get_b", "x1", "read", "sead"] {
            assert!(f.verdict(ok).is_allowed(), "{ok}");
        }
        for no in ["get_c", "x12", "bead"] {
            assert!(!f.verdict(no).is_allowed(), "{no}");
        }
    }

    #[test]
    fn disabled_server_denies_and_says_so() {
        let f = ToolFilter::compile(false, &[], &[]).expect("compiles");
        assert_eq!(
            f.verdict("anything"),
            Verdict::Denied {
                rule: Rule::ServerDisabled
            }
        );
        assert!(f.denies_everything());
    }

    #[test]
    fn deny_star_denies_everything() {
        assert!(filter(&[], &["*"]).denies_everything());
        assert!(!filter(&[], &["a*"]).denies_everything());
    }

    #[test]
    fn bad_patterns_are_all_reported() {
        let errs = ToolFilter::compile(true, &["a[".into(), "".into()], &["{x".into()])
            .expect_err("bad patterns");
        let where_: Vec<_> = errs.iter().map(|e| (e.list, e.index)).collect();
        assert_eq!(where_, vec![("allow", 0), ("allow", 1), ("deny", 0)]);
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
    fn rule_display_points_into_the_config() {
        let s = ServerName::new("github");
        let r = Rule::Deny {
            index: 0,
            pattern: "delete_*".into(),
        };
        assert_eq!(
            RuleDisplay {
                server: &s,
                rule: &r
            }
            .to_string(),
            "servers[github].tools.deny[0] \"delete_*\""
        );
    }
}
