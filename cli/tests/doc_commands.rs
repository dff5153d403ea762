//! Every `orchestrator-cli` command the docs, the README, the chart's notes and the alerts'
//! runbooks tell a person to run exists: each command path found in their code (markdown code
//! spans and blocks, the runbooks' backquoted commands) is run with `--help` by the real binary,
//! which exits 2 on an unknown subcommand.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator-cli");

/// Global flags that take a value (the value is not a subcommand).
const VALUED_FLAGS: [&str; 11] = [
    "-n",
    "--namespace",
    "--kubeconfig",
    "--context",
    "--as",
    "--as-group",
    "--catalog",
    "--catalog-namespace",
    "--catalog-name",
    "-o",
    "--output",
];
/// Commands whose subcommand is part of the path.
const GROUPS: [&str; 2] = ["task", "catalog"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The code of a markdown text: fenced blocks and inline code spans (which may wrap lines).
fn markdown_code(text: &str) -> Vec<String> {
    let mut code = Vec::new();
    let mut prose = String::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut block, fence) {
            (None, true) => block = Some(String::new()),
            (Some(b), true) => {
                code.push(std::mem::take(b));
                block = None;
            }
            (Some(b), false) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, false) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    code.extend(backquoted(&prose));
    code
}

/// The `...` spans of a text.
fn backquoted(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The command paths (`task describe`, `catalog list`, `console`) of every `orchestrator-cli`
/// invocation in `code`.
fn command_paths(code: &str) -> BTreeSet<Vec<String>> {
    let words: Vec<&str> = code.split_whitespace().collect();
    let mut paths = BTreeSet::new();
    for (i, _) in words
        .iter()
        .enumerate()
        .filter(|(_, w)| **w == "orchestrator-cli")
    {
        let mut path = Vec::new();
        let mut rest = words[i + 1..].iter();
        while let Some(word) = rest.next() {
            if word.starts_with('-') {
                if VALUED_FLAGS.contains(word) {
                    rest.next();
                }
                continue;
            }
            let is_name = word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && word.starts_with(|c: char| c.is_ascii_lowercase());
            if !is_name {
                break;
            }
            path.push(word.to_string());
            if !GROUPS.contains(&path[0].as_str()) || path.len() == 2 {
                break;
            }
        }
        if !path.is_empty() {
            paths.insert(path);
        }
    }
    paths
}

/// Each path the binary does not know, with what it said.
fn unknown(paths: &BTreeSet<Vec<String>>) -> Vec<String> {
    paths
        .iter()
        .filter_map(|path| {
            let out = Command::new(BIN)
                .args(path)
                .arg("--help")
                .env_remove("KUBECONFIG")
                .output()
                .expect("the binary runs");
            (!out.status.success()).then(|| {
                format!(
                    "orchestrator-cli {}: {}",
                    path.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .next()
                        .unwrap_or("")
                )
            })
        })
        .collect()
}

fn files() -> Vec<PathBuf> {
    let mut files = vec![
        repo().join("README.md"),
        repo().join("charts/orchestrator/templates/NOTES.txt"),
        repo().join("charts/orchestrator/files/alerts.yaml"),
        repo().join("charts/orchestrator/values.yaml"),
    ];
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn code_of(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("readable");
    match path.extension().and_then(|e| e.to_str()) {
        Some("md") => markdown_code(&text),
        // Runbooks and notes: their commands are backquoted; NOTES.txt's are indented lines.
        Some("txt") => vec![text],
        _ => backquoted(&text),
    }
}

#[test]
fn every_command_the_docs_and_runbooks_name_exists() {
    let mut paths = BTreeSet::new();
    for file in files() {
        for code in code_of(&file) {
            paths.extend(command_paths(&code));
        }
    }
    // The docs do name the commands (the extraction is not finding nothing).
    for known in [
        &["task", "add-context"][..],
        &["task", "validate"],
        &["catalog", "discover"],
        &["console"],
    ] {
        let known: Vec<String> = known.iter().map(|s| s.to_string()).collect();
        assert!(paths.contains(&known), "no doc names {known:?}: {paths:?}");
    }
    let unknown = unknown(&paths);
    assert!(
        unknown.is_empty(),
        "commands the docs name that do not exist:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn a_command_that_does_not_exist_is_found_wherever_it_is_written() {
    let runbook = "A catalog error: run `orchestrator-cli catalog\n            validate`, then \
                   `orchestrator-cli -n team-a task describe TASK`.";
    let paths: BTreeSet<Vec<String>> = backquoted(runbook)
        .iter()
        .flat_map(|c| command_paths(c))
        .collect();
    let want: BTreeSet<Vec<String>> = [vec!["catalog", "validate"], vec!["task", "describe"]]
        .into_iter()
        .map(|p| p.into_iter().map(String::from).collect())
        .collect();
    assert_eq!(paths, want);
    let missing = unknown(&paths);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].starts_with("orchestrator-cli catalog validate: error: unrecognized subcommand"),
        "{missing:?}"
    );
    let doc = "Run it:\n```sh\norchestrator-cli tasks list\n```\nor `orchestrator-cli task get X`.";
    let paths: BTreeSet<Vec<String>> = markdown_code(doc)
        .iter()
        .flat_map(|c| command_paths(c))
        .collect();
    assert_eq!(unknown(&paths).len(), 1, "{paths:?}");
}
