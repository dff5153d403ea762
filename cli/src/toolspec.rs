//! `server:tool` specs as users type them (`--tools`, `--enable-tools`, `--disable-tools`):
//! parsing, with every syntax problem reported at once, and the check against the catalog.
//!
//! A spec names one catalog server and one tool pattern: a tool name (`github:create_issue`) or
//! a glob over the server's tool names (`filesystem:read_*`, `github:*`,
//! `filesystem:{read,write}_file`). Lists are comma-separated; commas inside `{...}` belong to
//! the glob.

use std::fmt;

use orchestrator_crds::catalog::{Catalog, is_dns1123_label};
// The sidecar's glob semantics, shared through the crds crate.
use orchestrator_crds::tools::{check_pattern, has_glob_syntax};
pub use orchestrator_crds::tools::{glob_matches, is_match_all};

use crate::error::{Error, Result};

/// One `server:pattern` item.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ToolSpec {
    /// The catalog server (a DNS-1123 label).
    pub server: String,
    /// A tool name or a glob over tool names.
    pub pattern: String,
}

impl fmt::Display for ToolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.server, self.pattern)
    }
}

impl ToolSpec {
    /// True when the pattern is a plain tool name (no glob syntax).
    pub fn is_literal(&self) -> bool {
        is_literal(&self.pattern)
    }
}

/// True when the pattern is a plain tool name (no glob syntax).
pub fn is_literal(pattern: &str) -> bool {
    !has_glob_syntax(pattern)
}

/// Parses the values of one flag (each value may hold a comma-separated list). Empty items
/// (a trailing comma) are skipped; every malformed item is reported, naming the flag.
pub fn parse_specs(flag: &str, values: &[String]) -> Result<Vec<ToolSpec>> {
    let mut specs = Vec::new();
    let mut problems = Vec::new();
    for value in values {
        for item in split_list(value) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            match parse_one(item) {
                Ok(spec) => {
                    if !specs.contains(&spec) {
                        specs.push(spec);
                    }
                }
                Err(why) => problems.push(format!("  {item:?}: {why}")),
            }
        }
    }
    if problems.is_empty() {
        Ok(specs)
    } else {
        Err(Error::Usage(format!(
            "invalid {flag} (expected SERVER:TOOL items separated by commas, e.g. \
             \"github:create_issue,filesystem:read_*\"):\n{}",
            problems.join("\n")
        )))
    }
}

fn parse_one(item: &str) -> std::result::Result<ToolSpec, String> {
    let Some((server, pattern)) = item.split_once(':') else {
        return Err(if is_dns1123_label(item) {
            format!("no tool given; write \"{item}:TOOL\", or \"{item}:*\" for all its tools")
        } else {
            "missing ':' between server and tool".to_string()
        });
    };
    let (server, pattern) = (server.trim(), pattern.trim());
    if server.is_empty() {
        return Err("the server name before ':' is empty".into());
    }
    if !is_dns1123_label(server) {
        return Err(format!(
            "server {server:?} is not a valid name (lowercase letters, digits and '-')"
        ));
    }
    if pattern.is_empty() {
        return Err(format!(
            "the tool after ':' is empty; write \"{server}:TOOL\", or \"{server}:*\" for all its tools"
        ));
    }
    if pattern.contains(':') {
        return Err("more than one ':'; write one SERVER:TOOL per item".into());
    }
    if pattern.chars().any(char::is_whitespace) {
        return Err("tool names and patterns contain no spaces".into());
    }
    if pattern.len() > 256 {
        return Err("the tool pattern is longer than 256 characters".into());
    }
    if !is_literal(pattern) {
        check_pattern(pattern).map_err(|e| format!("invalid glob pattern: {e}"))?;
    }
    Ok(ToolSpec {
        server: server.to_string(),
        pattern: pattern.to_string(),
    })
}

/// Splits on commas that are not inside `{...}` (glob alternatives).
fn split_list(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in value.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out
}

/// Refuses specs naming servers the catalog does not know, listing the known ones.
pub fn check_servers<'a>(
    catalog: &Catalog,
    specs: impl IntoIterator<Item = (&'a str, &'a ToolSpec)>,
) -> Result<()> {
    let mut unknown: Vec<String> = Vec::new();
    for (flag, spec) in specs {
        if catalog.get(&spec.server).is_none() {
            let line = format!("  {spec} in {flag}");
            if !unknown.contains(&line) {
                unknown.push(line);
            }
        }
    }
    if unknown.is_empty() {
        return Ok(());
    }
    let known = catalog.names();
    let known = if known.is_empty() {
        "the catalog is empty".to_string()
    } else {
        format!("known servers: {}", known.join(", "))
    };
    Err(Error::Usage(format!(
        "unknown MCP server{}:\n{}\n{known} (see `orchestrator-cli catalog list`)",
        if unknown.len() == 1 { "" } else { "s" },
        unknown.join("\n")
    )))
}

/// Tool-level hints: a name the catalog does not list for its server, or a glob matching none
/// of the listed tools. Not errors: the catalog's tool lists may be incomplete.
pub fn catalog_notes(catalog: &Catalog, specs: &[ToolSpec]) -> Vec<String> {
    let mut notes = Vec::new();
    for spec in specs {
        let Some(server) = catalog.get(&spec.server) else {
            continue;
        };
        if server.tools.is_empty() || is_match_all(&spec.pattern) {
            continue;
        }
        let hit = server
            .tools
            .iter()
            .any(|t| glob_matches(&spec.pattern, &t.name));
        if !hit {
            let what = if spec.is_literal() {
                "is not a tool the catalog lists"
            } else {
                "matches none of the tools the catalog lists"
            };
            let known: Vec<&str> = server.tools.iter().map(|t| t.name.as_str()).collect();
            notes.push(format!(
                "{spec} {what} for {} (known: {}); applied as given",
                spec.server,
                known.join(", ")
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<ToolSpec>> {
        parse_specs("--tools", &[s.to_string()])
    }

    fn spec(server: &str, pattern: &str) -> ToolSpec {
        ToolSpec {
            server: server.into(),
            pattern: pattern.into(),
        }
    }

    #[test]
    fn parses_names_globs_and_lists() {
        let specs =
            parse("github:*, filesystem:read_file,filesystem:{read,write}_*,").expect("valid");
        assert_eq!(
            specs,
            [
                spec("github", "*"),
                spec("filesystem", "read_file"),
                spec("filesystem", "{read,write}_*"),
            ]
        );
        assert!(specs[1].is_literal());
        assert!(!specs[2].is_literal());
    }

    #[test]
    fn repeated_flags_and_duplicates_merge() {
        let specs = parse_specs(
            "--enable-tools",
            &["github:a,github:b".into(), "github:a".into()],
        )
        .expect("valid");
        assert_eq!(specs, [spec("github", "a"), spec("github", "b")]);
    }

    #[test]
    fn every_syntax_error_is_reported_with_a_fix() {
        let err = parse("github,:x,fs:,Bad_Server:x,a:b:c,a:read file,a:[oops")
            .expect_err("all invalid")
            .to_string();
        for expected in [
            r#""github": no tool given; write "github:TOOL", or "github:*" for all its tools"#,
            r#"":x": the server name before ':' is empty"#,
            r#""fs:": the tool after ':' is empty"#,
            r#""Bad_Server:x": server "Bad_Server" is not a valid name"#,
            r#""a:b:c": more than one ':'"#,
            r#""a:read file": tool names and patterns contain no spaces"#,
            r#""a:[oops": invalid glob pattern"#,
        ] {
            assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
        }
        assert!(err.starts_with("invalid --tools"), "{err}");
        assert_eq!(
            parse("x").map_err(|e| e.exit_code()).expect_err("usage"),
            2,
            "syntax errors are usage errors"
        );
    }

    #[test]
    fn globs_match_like_the_sidecar() {
        assert!(glob_matches("*", "anything_at_all"));
        assert!(glob_matches("read_*", "read_file"));
        assert!(!glob_matches("read_*", "write_file"));
        assert!(glob_matches("{read,write}_file", "write_file"));
        assert!(glob_matches("get_?", "get_a"));
        assert!(glob_matches("create_issue", "create_issue"));
        assert!(!glob_matches("create_issue", "create_issues"));
        assert!(is_match_all("**") && !is_match_all("a*"));
    }

    #[test]
    fn unknown_servers_are_refused_listing_the_known_ones() {
        let catalog = Catalog::parse(
            "servers:\n  - {name: time, stdio: {command: t}}\n  - {name: git, stdio: {command: g}}\n",
        )
        .expect("valid");
        let a = spec("gti", "log");
        let b = spec("time", "now");
        let err = check_servers(&catalog, [("--enable-tools", &a), ("--tools", &b)])
            .expect_err("unknown")
            .to_string();
        assert_eq!(
            err,
            "unknown MCP server:\n  gti:log in --enable-tools\nknown servers: git, time \
             (see `orchestrator-cli catalog list`)"
        );
    }

    #[test]
    fn names_missing_from_the_catalog_are_noted_not_refused() {
        let catalog = Catalog::parse(
            "servers:\n  - name: git\n    stdio: {command: g}\n    tools: [{name: git_log}, {name: git_diff}]\n",
        )
        .expect("valid");
        let notes = catalog_notes(
            &catalog,
            &[
                spec("git", "git_lg"),
                spec("git", "git_*"),
                spec("git", "x*"),
            ],
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("git:git_lg is not a tool the catalog lists for git"));
        assert!(notes[1].starts_with("git:x* matches none of the tools"));
    }
}
