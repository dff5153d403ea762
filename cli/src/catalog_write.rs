//! `--write FILE` for `catalog discover` and `catalog pin`: rewrites one server's `tools:` list in
//! a catalog file in place, one flow-style entry per tool, and leaves every other line as it was
//! (comments included). The new text is parsed back and must hold exactly the intended tools and
//! every other server unchanged, or nothing is written.

use std::path::Path;

use orchestrator_crds::catalog::{Catalog, CatalogTool};

use crate::error::{Error, Result};

/// Writes `tools` as server `server`'s list in the catalog file at `path`.
pub fn write(path: &Path, server: &str, tools: &[CatalogTool]) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Catalog(format!("reading {}: {e}", path.display())))?;
    let before =
        Catalog::parse(&text).map_err(|e| Error::Catalog(format!("{}: {e}", path.display())))?;
    let new = replace_tools(&text, server, tools).ok_or_else(|| {
        Error::Catalog(format!(
            "cannot find the entry `- name: {server}` in {}; add its tools by hand (`-o yaml` prints them)",
            path.display()
        ))
    })?;
    let after = Catalog::parse(&new).map_err(|e| {
        Error::Catalog(format!(
            "{}: the rewritten file would not parse ({e}); nothing written",
            path.display()
        ))
    })?;
    let same_elsewhere = before.servers.len() == after.servers.len()
        && before.servers.iter().zip(&after.servers).all(|(b, a)| {
            if b.name == server {
                a.name == server && a.tools == tools
            } else {
                a == b
            }
        });
    if !same_elsewhere {
        return Err(Error::Catalog(format!(
            "{}: rewriting the tools of {server} would change more than them (an unusual layout?); nothing written",
            path.display()
        )));
    }
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, &new)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::Catalog(format!("writing {}: {e}", path.display())))
}

/// `text` with the `tools:` list of the entry `- name: SERVER` replaced (or added); `None` when
/// there is no such entry.
fn replace_tools(text: &str, server: &str, tools: &[CatalogTool]) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let is_entry = |l: &str| {
        let t = l.trim_start();
        t.strip_prefix("- name:").is_some_and(|rest| {
            let name = rest.split('#').next().unwrap_or("").trim();
            name.trim_matches(|c| c == '"' || c == '\'') == server
        })
    };
    let start = lines.iter().position(|l| is_entry(l))?;
    let dash = indent(lines[start]);
    let key = dash + 2;
    // The entry runs until the next line (not blank, not a comment) at or left of its dash.
    let end = (start + 1..lines.len())
        .find(|&i| {
            let l = lines[i];
            !l.trim().is_empty() && !l.trim_start().starts_with('#') && indent(l) <= dash
        })
        .unwrap_or(lines.len());
    let pad = " ".repeat(key);
    let mut block = vec![format!("{pad}tools:")];
    block.extend(tools.iter().map(|t| format!("{pad}  - {}", flow(t))));
    let tools_at = (start + 1..end)
        .find(|&i| indent(lines[i]) == key && lines[i].trim_start().starts_with("tools:"));
    let mut out: Vec<String> = Vec::with_capacity(lines.len() + tools.len());
    match tools_at {
        Some(at) => {
            // The list: the lines after `tools:` indented deeper, or `- ` items at its level.
            let list_end = (at + 1..end)
                .find(|&i| {
                    let l = lines[i];
                    let t = l.trim_start();
                    let in_list = t.is_empty()
                        || t.starts_with('#')
                        || indent(l) > key
                        || (indent(l) == key && t.starts_with("- "));
                    !in_list
                })
                .unwrap_or(end);
            // Keep trailing blank lines and comments after the list where they were.
            let mut last = list_end;
            while last > at + 1 && {
                let t = lines[last - 1].trim_start();
                t.is_empty() || (t.starts_with('#') && indent(lines[last - 1]) <= key)
            } {
                last -= 1;
            }
            out.extend(lines[..at].iter().map(|l| l.to_string()));
            out.extend(block);
            out.extend(lines[last..].iter().map(|l| l.to_string()));
        }
        None => {
            let mut last = end;
            while last > start + 1 && lines[last - 1].trim().is_empty() {
                last -= 1;
            }
            out.extend(lines[..last].iter().map(|l| l.to_string()));
            out.extend(block);
            out.extend(lines[last..].iter().map(|l| l.to_string()));
        }
    }
    let mut joined = out.join("\n");
    if text.ends_with('\n') {
        joined.push('\n');
    }
    Some(joined)
}

/// `{name: x, description: "...", category: y, risk: z, pin: "sha256:...", definition: {...}}`.
fn flow(t: &CatalogTool) -> String {
    let mut parts = vec![format!("name: {}", scalar(&t.name))];
    if !t.description.is_empty() {
        parts.push(format!("description: {}", quoted(&t.description)));
    }
    if let Some(c) = &t.category {
        parts.push(format!("category: {}", scalar(c)));
    }
    if let Some(r) = t.risk {
        parts.push(format!("risk: {r}"));
    }
    if let Some(p) = &t.pin {
        parts.push(format!("pin: {}", quoted(p)));
    }
    if let Some(d) = &t.definition {
        // JSON is YAML's flow style: the definition as the server listed it, on one line.
        parts.push(format!("definition: {d}"));
    }
    format!("{{{}}}", parts.join(", "))
}

/// Plain when it is a simple word YAML reads back as the same string, else double-quoted.
fn scalar(s: &str) -> String {
    let simple = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if simple { s.to_string() } else { quoted(s) }
}

/// A double-quoted YAML string (JSON's escaping is YAML's).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# The catalog. This comment stays.
servers:
  - name: fs   # the files
    stdio:
      command: mcp-server-filesystem   # pinned in the image
    tools:
      - {name: read_file, category: read}
      - {name: gone}

    # A comment between entries stays too.
  - name: time
    stdio: {command: mcp-server-time}
";

    fn tool(name: &str) -> CatalogTool {
        CatalogTool {
            name: name.into(),
            description: String::new(),
            category: None,
            risk: None,
            pin: None,
            definition: None,
        }
    }

    #[test]
    fn a_pinned_definition_is_written_on_one_line_and_reads_back_the_same() {
        let definition = serde_json::json!({
            "name": "read_file",
            "title": "Read: a file # not a comment",
            "description": "Reads \"a\" file,\n{with} [brackets] & ünïcode 🙂 and \\ backslashes",
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string", "minLength": 1}}, "required": ["path"]},
            "annotations": {"readOnlyHint": true},
            "_meta": {"n": 12345678901234i64, "f": 0.5, "nothing": null},
        });
        let mut read = tool("read_file");
        read.pin = Some(orchestrator_crds::policy::definition_hash(&definition));
        read.definition = Some(definition);
        let new = replace_tools(FILE, "fs", std::slice::from_ref(&read)).expect("found");
        let parsed = Catalog::parse(&new).expect("parses");
        assert_eq!(parsed.get("fs").expect("fs").tools, vec![read]);
    }

    #[test]
    fn the_tools_list_is_replaced_or_added_and_everything_else_stays() {
        let mut read = tool("read_file");
        read.category = Some("read".into());
        read.pin = Some(format!("sha256:{}", "a".repeat(64)));
        let mut yes = tool("yes");
        yes.description = "Says \"yes\": always.".into();
        let new = replace_tools(FILE, "fs", &[read.clone(), yes.clone()]).expect("found");
        assert!(
            new.starts_with("# The catalog. This comment stays.\n"),
            "{new}"
        );
        assert!(new.contains("  - name: fs   # the files\n"), "{new}");
        assert!(new.contains("command: mcp-server-filesystem   # pinned in the image"));
        assert!(
            new.contains("\n\n    # A comment between entries stays too.\n  - name: time"),
            "{new}"
        );
        assert!(!new.contains("gone"));
        let parsed = Catalog::parse(&new).expect("parses");
        assert_eq!(parsed.get("fs").expect("fs").tools, vec![read, yes]);
        assert_eq!(
            parsed.get("time"),
            Catalog::parse(FILE).expect("parses").get("time")
        );

        let added = replace_tools(FILE, "time", &[tool("get_current_time")]).expect("found");
        let parsed = Catalog::parse(&added).expect("parses");
        assert_eq!(
            parsed.get("time").expect("time").tools,
            vec![tool("get_current_time")]
        );
        assert_eq!(
            parsed.get("fs"),
            Catalog::parse(FILE).expect("parses").get("fs")
        );
        assert_eq!(replace_tools(FILE, "nope", &[]), None);
    }
}
