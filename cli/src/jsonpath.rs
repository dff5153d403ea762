//! `-o jsonpath=TEMPLATE`: kubectl's JSONPath templates over the JSON that `-o json` prints.
//!
//! The template is text with `{...}` actions, as kubectl's:
//! - `{.a.b}`, `{.items[*].metadata.name}`, `{.items[0]}`, `{.items[-1:]}`, `{..name}`,
//!   `{.items[?(@.status.phase=="Running")].metadata.name}`, `{.metadata.labels['a.b/c']}`: a
//!   path from the current value (the object or `List` at the top, the item inside `range`);
//!   `$` is the whole value, `@` the current one. Several results are printed space-separated;
//!   strings as they are, anything else as JSON; a path that finds nothing prints nothing (as
//!   kubectl's default `--allow-missing-template-keys`).
//! - `{range .items[*]}...{end}`: the text between, once per result, with it as the current
//!   value (ranges nest).
//! - `{"\n"}`, `{'\t'}`: literal text (`\n`, `\t`, `\r`, `\\`, `\"`, `\'` escapes).
//!
//! Paths are evaluated by `jsonpath-rust` (RFC 9535, which kubectl's path syntax is a subset of
//! for these forms), after turning `.name` segments that RFC 9535 spells differently (`-`, `/`)
//! into `['name']`. Not supported, refused with a message: kubectl's `{end}`-less ranges,
//! functions other than RFC 9535's, and Go-template-only forms.

use jsonpath_rust::JsonPath;
use serde_json::Value;

use crate::error::{Error, Result};

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Text(String),
    /// An RFC 9535 path, and whether it starts at the whole value (`$`).
    Path(String, bool),
    Range(String, bool, Vec<Node>),
}

/// A parsed `-o jsonpath=` template.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    nodes: Vec<Node>,
}

fn bad(template: &str, what: impl std::fmt::Display) -> Error {
    Error::Usage(format!(
        "-o jsonpath={template}: {what}; a template is text with {{.path}} actions, e.g. \
         -o jsonpath='{{.items[*].metadata.name}}' or \
         -o jsonpath='{{range .items[*]}}{{.metadata.name}}{{\"\\n\"}}{{end}}' (docs/cli.md, \"Output\")"
    ))
}

impl Template {
    /// Parses `template`; a malformed one is a usage error (exit 2) naming what is wrong.
    pub fn parse(template: &str) -> Result<Self> {
        if template.is_empty() {
            return Err(bad(template, "the template is empty"));
        }
        let mut stack: Vec<(String, bool, Vec<Node>)> = Vec::new();
        let mut nodes = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                nodes.push(Node::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                nodes.push(Node::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = action_end(after).ok_or_else(|| bad(template, "a '{' is not closed"))?;
            let action = after[..close].trim();
            rest = &after[close + 1..];
            if action.is_empty() {
                return Err(bad(template, "an empty {} action"));
            }
            if let Some(literal) = quoted(action) {
                nodes.push(Node::Text(unescape(literal)));
            } else if action == "end" {
                let (path, absolute, outer) = stack
                    .pop()
                    .ok_or_else(|| bad(template, "{end} without a {range ...}"))?;
                let body = std::mem::replace(&mut nodes, outer);
                nodes.push(Node::Range(path, absolute, body));
            } else if let Some(path) = action.strip_prefix("range ") {
                let absolute = path.trim().starts_with('$');
                let path = rfc_path(path.trim()).map_err(|e| bad(template, e))?;
                check(&path).map_err(|e| bad(template, e))?;
                stack.push((path, absolute, std::mem::take(&mut nodes)));
            } else {
                let path = rfc_path(action).map_err(|e| bad(template, e))?;
                check(&path).map_err(|e| bad(template, e))?;
                nodes.push(Node::Path(path, action.starts_with('$')));
            }
        }
        if !stack.is_empty() {
            return Err(bad(template, "a {range ...} has no {end}"));
        }
        Ok(Self { nodes })
    }

    /// The template applied to `value`.
    pub fn render(&self, value: &Value) -> Result<String> {
        let mut out = String::new();
        render_nodes(&self.nodes, value, value, &mut out)?;
        Ok(out)
    }
}

/// Where the action starting after a `{` ends: its `}`, not one inside quotes.
fn action_end(text: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(_), '\\') if !escaped => {
                escaped = true;
                continue;
            }
            (Some(q), c) if c == q && !escaped => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '}') => return Some(i),
            _ => {}
        }
        escaped = false;
    }
    None
}

/// The text of a `"..."` or `'...'` action.
fn quoted(action: &str) -> Option<&str> {
    let first = action.chars().next()?;
    if (first == '"' || first == '\'') && action.len() >= 2 && action.ends_with(first) {
        Some(&action[1..action.len() - 1])
    } else {
        None
    }
}

fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// A kubectl path (`.a.b`, `$.a`, `@.a`, `..a`, `[*]`) as RFC 9535 (`$.a.b`): relative paths
/// start at the current value, which the caller passes as the root; dot-names with characters
/// RFC 9535's shorthand does not take become `['name']`.
fn rfc_path(path: &str) -> std::result::Result<String, String> {
    let body = if let Some(rest) = path.strip_prefix('$').or_else(|| path.strip_prefix('@')) {
        rest
    } else if path.starts_with('.') || path.starts_with('[') {
        path
    } else {
        return Err(format!(
            "{path:?} is not a path: a path starts with '.', '$' or '@', e.g. .metadata.name"
        ));
    };
    let mut out = String::from("$");
    let mut chars = body.char_indices().peekable();
    let mut depth = 0usize;
    while let Some((_, c)) = chars.next() {
        match c {
            '[' => {
                depth += 1;
                out.push(c);
            }
            ']' => {
                depth = depth.saturating_sub(1);
                out.push(c);
            }
            '.' if depth == 0 => {
                if chars.peek().map(|(_, c)| *c) == Some('.') {
                    chars.next();
                    out.push_str("..");
                }
                let mut name = String::new();
                while let Some(&(_, n)) = chars.peek() {
                    if n == '.' || n == '[' {
                        break;
                    }
                    name.push(n);
                    chars.next();
                }
                if name.is_empty() {
                    if !out.ends_with("..") && body.len() > 1 {
                        return Err(format!("{path:?} has an empty name after '.'"));
                    }
                } else if name == "*" || is_shorthand(&name) {
                    if !out.ends_with("..") {
                        out.push('.');
                    }
                    out.push_str(&name);
                } else {
                    out.push_str(&format!(
                        "['{}']",
                        name.replace('\\', "\\\\").replace('\'', "\\'")
                    ));
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Whether RFC 9535's `.name` shorthand takes `name` (letters, digits, `_`, not a digit first).
fn is_shorthand(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || !c.is_ascii())
        && chars.all(|c| c.is_alphanumeric() || c == '_' || !c.is_ascii())
}

/// Parses `path` once against null, so a bad path fails before anything is fetched.
fn check(path: &str) -> std::result::Result<(), String> {
    Value::Null
        .query(path)
        .map(|_| ())
        .map_err(|e| format!("{path:?} is not a path it can evaluate: {e}"))
}

fn render_nodes(nodes: &[Node], root: &Value, current: &Value, out: &mut String) -> Result<()> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Path(p, absolute) => {
                let found = query(p, if *absolute { root } else { current })?;
                let texts: Vec<String> = found.into_iter().map(text).collect();
                out.push_str(&texts.join(" "));
            }
            Node::Range(p, absolute, body) => {
                for item in query(p, if *absolute { root } else { current })? {
                    render_nodes(body, root, item, out)?;
                }
            }
        }
    }
    Ok(())
}

fn query<'a>(path: &str, value: &'a Value) -> Result<Vec<&'a Value>> {
    value
        .query(path)
        .map_err(|e| Error::Usage(format!("-o jsonpath: evaluating {path:?}: {e}")))
}

/// A result as kubectl prints it: a string as it is, anything else as JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"apiVersion": "v1", "kind": "List", "items": [
            {"metadata": {"name": "task-1", "labels": {"app.kubernetes.io/name": "x", "team-a": "yes"}},
             "spec": {"taskId": 1}, "status": {"phase": "Running"}},
            {"metadata": {"name": "task-2"}, "spec": {"taskId": 2}, "status": {"phase": "Succeeded"}}
        ]})
    }

    fn run(template: &str, value: &Value) -> String {
        Template::parse(template)
            .expect("parses")
            .render(value)
            .expect("renders")
    }

    #[test]
    fn kubectl_forms_print_what_kubectl_prints() {
        let l = list();
        assert_eq!(run("{.items[*].metadata.name}", &l), "task-1 task-2");
        assert_eq!(run("{.items[0].spec.taskId}", &l), "1");
        assert_eq!(run("{.items[-1:].metadata.name}", &l), "task-2");
        assert_eq!(
            run(
                "{range .items[*]}{.metadata.name}{\"\\t\"}{.status.phase}{\"\\n\"}{end}",
                &l
            ),
            "task-1\tRunning\ntask-2\tSucceeded\n"
        );
        assert_eq!(
            run("{.items[?(@.status.phase==\"Running\")].metadata.name}", &l),
            "task-1"
        );
        assert_eq!(
            run("{.items[0].metadata.labels['app.kubernetes.io/name']}", &l),
            "x"
        );
        assert_eq!(run("{.items[0].metadata.labels.team-a}", &l), "yes");
        assert_eq!(run("names: {..name}", &l), "names: task-1 task-2");
        assert_eq!(run("{.kind}/{$.apiVersion}", &l), "List/v1");
        assert_eq!(run("{.items[1].spec}", &l), "{\"taskId\":2}");
        assert_eq!(run("{.nothing.here}", &l), "", "missing keys print nothing");
        assert_eq!(
            run("{range .items[*]}[{@.metadata.name}]{end}", &l),
            "[task-1][task-2]"
        );
        assert_eq!(run("plain text", &l), "plain text");
        assert_eq!(run("{.items[-1].metadata.name}", &l), "task-2");
        assert_eq!(
            run(
                "{.items[?match(@.metadata.name, 'task-1')].spec.taskId}",
                &l
            ),
            "1"
        );
        assert_eq!(
            run("{.items[?length(@.metadata.name) == 6].spec.taskId}", &l),
            "1 2"
        );
        assert_eq!(run("{.items[0].spec['taskId','nothing']}", &l), "1");
        assert_eq!(
            run(
                "{.items[?(@.spec.taskId > 1 || @.status.phase == 'Running')].spec.taskId}",
                &l
            ),
            "1 2"
        );
        assert_eq!(
            run(
                "{.items[?(@.spec.taskId >= 1 && @.status.phase != 'Running')].metadata.name}",
                &l
            ),
            "task-2"
        );
        assert_eq!(
            run("{range .items[*]}{$.kind}:{.spec.taskId} {end}", &l),
            "List:1 List:2 "
        );
    }

    #[test]
    fn malformed_templates_are_refused_with_what_is_wrong() {
        for (template, says) in [
            ("{.items[*]", "not closed"),
            ("{range .items[*]}{.a}", "has no {end}"),
            ("{end}", "without a {range"),
            ("{}", "empty"),
            ("", "the template is empty"),
            ("{metadata.name}", "not a path"),
            ("{.items[?(@.a==]}", "not a path it can evaluate"),
        ] {
            let e = Template::parse(template).expect_err(template).to_string();
            assert!(e.contains(says), "{template}: {e}");
            assert!(e.contains("-o jsonpath="), "{e}");
            assert_eq!(
                Template::parse(template).expect_err(template).exit_code(),
                2
            );
        }
    }
}
