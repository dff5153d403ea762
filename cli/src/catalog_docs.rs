//! `catalog docs`: a markdown reference of every server of the catalog and its tools (what
//! `docs/catalog.md` is; `scripts/check-generated` fails when it no longer matches
//! `config/catalog.yaml`).

use std::path::Path;

use orchestrator_crds::catalog::{Catalog, CatalogServer, WorkspaceAccess};

use crate::args::Global;
use crate::catalog::{load, risk_text, transport};
use crate::error::{Error, Result};
use crate::output;

/// How `docs/catalog.md` is made; the generated text says so.
pub const REGENERATE: &str =
    "orchestrator-cli catalog docs --catalog config/catalog.yaml > docs/catalog.md";

/// `catalog docs [--check FILE]`: prints the reference, or fails when FILE differs from it.
pub async fn run(global: &Global, check: Option<&Path>) -> Result<()> {
    let catalog = load(global, None).await?;
    let text = render(&catalog);
    let Some(path) = check else {
        return output::print(&text);
    };
    let current = std::fs::read_to_string(path)
        .map_err(|e| Error::Catalog(format!("reading {}: {e}", path.display())))?;
    if current == text {
        return Ok(());
    }
    Err(Error::Catalog(format!(
        "{} does not match the catalog (first difference at line {}); regenerate it with `{REGENERATE}` \
         (from the repository, `cargo run -q -p orchestrator-cli --` for `orchestrator-cli`)",
        path.display(),
        first_difference(&current, &text),
    )))
}

/// The 1-based number of the first line where `a` and `b` differ.
fn first_difference(a: &str, b: &str) -> usize {
    let mut lines = a.lines().zip(b.lines());
    lines
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.lines().count().min(b.lines().count()))
        + 1
}

/// The markdown reference: a summary table, then one section per server (how it starts, the
/// Secrets it needs, its tools), in the catalog's order.
pub fn render(catalog: &Catalog) -> String {
    let tools: usize = catalog.servers.iter().map(|s| s.tools.len()).sum();
    let mut out = String::from("# The MCP server catalog\n\n");
    out.push_str(&format!(
        "<!-- Generated from config/catalog.yaml by `{REGENERATE}`; do not edit by hand \
         (scripts/check-generated fails when the two differ). -->\n\n"
    ));
    out.push_str(&format!(
        "The servers a TaskRun may name in `spec.toolConfig.mcpServers`: {} servers, {tools} tools \
         listed. A TaskRun's allow and deny globs choose among a server's tools; \
         `orchestrator-cli catalog show SERVER` prints the same from the cluster's catalog.\n\n",
        catalog.servers.len()
    ));
    out.push_str("| server | transport | tools | secrets | description |\n|---|---|---|---|---|\n");
    for s in &catalog.servers {
        let secrets: Vec<String> = s.secret_env.iter().map(|e| code(&e.name)).collect();
        out.push_str(&format!(
            "| [{}](#{}) | {} | {} | {} | {} |\n",
            s.name,
            s.name,
            transport(s),
            if s.tools.is_empty() {
                "not listed".to_string()
            } else {
                s.tools.len().to_string()
            },
            if secrets.is_empty() {
                "-".to_string()
            } else {
                secrets.join(", ")
            },
            cell(&s.description),
        ));
    }
    for s in &catalog.servers {
        out.push('\n');
        server_section(&mut out, s);
    }
    out
}

fn server_section(out: &mut String, s: &CatalogServer) {
    out.push_str(&format!("## {}\n\n", s.name));
    if !s.description.is_empty() {
        out.push_str(&format!("{}\n\n", s.description.trim()));
    }
    if let Some(stdio) = &s.stdio {
        let mut cmd = vec![stdio.command.clone()];
        cmd.extend(stdio.args.iter().cloned());
        out.push_str(&format!(
            "- Starts as: {} (stdio, in its own container of the task pod, on first use)\n",
            code(&cmd.join(" "))
        ));
        let workspace = match stdio.workspace {
            WorkspaceAccess::None => "not mounted",
            WorkspaceAccess::ReadOnly => "read-only",
            WorkspaceAccess::ReadWrite => "read-write",
        };
        out.push_str(&format!("- The task's /workspace: {workspace}\n"));
        for (k, v) in &stdio.env {
            out.push_str(&format!("- Env: {}\n", code(&format!("{k}={v}"))));
        }
        if let Some(cwd) = &stdio.cwd {
            out.push_str(&format!("- Working directory: {}\n", code(cwd)));
        }
    }
    if let Some(http) = &s.http {
        out.push_str(&format!(
            "- Reached at: {} (streamable HTTP)\n",
            code(&http.url)
        ));
        for (header, env) in &http.headers_from_env {
            out.push_str(&format!(
                "- Header {} from the Secret env {}\n",
                code(header),
                code(env)
            ));
        }
    }
    for e in &s.secret_env {
        let from = match &e.secret_name {
            Some(name) => format!("Secret {}, key {}", code(name), code(&e.secret_key)),
            None => format!(
                "key {} of the Secret the TaskRun names",
                code(&e.secret_key)
            ),
        };
        let optional = if e.optional { ", optional" } else { "" };
        let what = if e.description.is_empty() {
            String::new()
        } else {
            format!(": {}", e.description.trim())
        };
        out.push_str(&format!(
            "- Secret env {} ({from}{optional}){what}\n",
            code(&e.name)
        ));
    }
    out.push('\n');
    if s.tools.is_empty() {
        out.push_str("Tools: not listed in the catalog (the server decides).\n");
        return;
    }
    out.push_str(&format!(
        "Tools ({}); risk `-`: the class comes from the server's annotations:\n\n\
         | tool | category | risk | description |\n|---|---|---|---|\n",
        s.tools.len()
    ));
    for t in &s.tools {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            code(&t.name),
            t.category.as_deref().unwrap_or("-"),
            risk_text(t.risk),
            cell(&t.description),
        ));
    }
}

/// Text for a table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Inline code; backticks inside are replaced (a catalog value never needs them).
fn code(text: &str) -> String {
    format!("`{}`", text.replace('`', "'").replace('|', "\\|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(yaml: &str) -> Catalog {
        Catalog::parse(yaml).expect("a valid catalog")
    }

    #[test]
    fn every_server_and_tool_of_the_catalog_is_in_the_reference() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/catalog.yaml"
        ))
        .expect("config/catalog.yaml");
        let c = catalog(&text);
        let doc = render(&c);
        for s in &c.servers {
            assert!(
                doc.contains(&format!("\n## {}\n", s.name)),
                "no section for {}",
                s.name
            );
            for t in &s.tools {
                assert!(
                    doc.contains(&format!("| `{}` |", t.name)),
                    "{}: no row for {}",
                    s.name,
                    t.name
                );
            }
        }
    }

    #[test]
    fn table_cells_stay_one_line_and_pipes_are_escaped() {
        let c = catalog(
            "servers:\n  - name: s\n    description: \"a | b\\n c\"\n    stdio: {command: x}\n    tools:\n      - {name: t, description: \"one\\ntwo | three\"}\n",
        );
        let doc = render(&c);
        assert!(doc.contains("| a \\| b c |"), "{doc}");
        assert!(doc.contains("| `t` | - | - | one two \\| three |"), "{doc}");
    }

    #[test]
    fn the_first_differing_line_is_named() {
        assert_eq!(first_difference("a\nb\nc\n", "a\nx\nc\n"), 2);
        assert_eq!(first_difference("a\n", "a\nb\n"), 2);
    }
}
