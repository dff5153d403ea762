//! `catalog discover` and `catalog pin`, the real binary against the real reference servers
//! (`@modelcontextprotocol/server-filesystem` and `server-everything` from npm, installed by
//! `e2e/setup`), started the way the proxy starts them: from a catalog's stdio command.
//!
//! Run: `e2e/setup`, then `cargo test -p orchestrator-cli --test catalog_discover -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator-cli");

fn tools_dir() -> PathBuf {
    std::env::var_os("ORCH_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/orchestrator/tools")
        })
}

/// A catalog whose servers run the installed reference servers; `filesystem` lists `extra`
/// tools besides two real ones, and `pins` on its tools.
fn catalog(dir: &Path, extra: &[&str], pins: &[(&str, &str)]) -> PathBuf {
    let t = tools_dir();
    let node = t.join("node/node_modules/.bin/node");
    let mods = t.join("node/node_modules/@modelcontextprotocol");
    assert!(
        node.exists(),
        "{} is missing: run e2e/setup",
        node.display()
    );
    let mut listed: Vec<String> = ["read_text_file", "write_file"]
        .iter()
        .chain(extra)
        .map(|name| match pins.iter().find(|(n, _)| n == name) {
            Some((_, pin)) => format!("      - {{name: {name}, pin: \"{pin}\"}}"),
            None => format!("      - {{name: {name}}}"),
        })
        .collect();
    listed.sort();
    let text = format!(
        "servers:\n  - name: filesystem\n    stdio:\n      command: {node}\n      args: [{fs}, /workspace]\n    tools:\n{tools}\n  - name: everything\n    stdio:\n      command: {node}\n      args: [{every}, stdio]\n",
        node = node.display(),
        fs = mods.join("server-filesystem/dist/index.js").display(),
        every = mods.join("server-everything/dist/index.js").display(),
        tools = listed.join("\n"),
    );
    let path = dir.join("catalog.yaml");
    std::fs::write(&path, text).expect("write catalog");
    path
}

fn run(catalog: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--catalog")
        .arg(catalog)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("the binary runs")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
#[ignore = "needs the MCP reference servers (e2e/setup)"]
fn discover_lists_the_real_tools_and_flags_a_tool_the_server_no_longer_has() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stale = catalog(dir.path(), &["format_disk"], &[]);

    let out = run(&stale, &["catalog", "discover", "filesystem", "--check"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("In the catalog but not offered by the server: format_disk"),
        "{stdout}"
    );
    assert!(stderr.contains("does not match the server"), "{stderr}");
    assert!(
        !stdout.contains("Secure MCP Filesystem Server"),
        "the server's stderr stays out of the output"
    );

    let found = json(&run(
        &stale,
        &["catalog", "discover", "filesystem", "-o", "json"],
    ));
    assert_eq!(found["gone"], serde_json::json!(["format_disk"]));
    let tools = found["tools"].as_array().expect("tools");
    let by_name = |name: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {tools:?}"))
    };
    // The server's own annotations give the classes.
    assert_eq!(by_name("read_text_file")["risk"], "read");
    assert_eq!(by_name("read_text_file")["catalog"], "listed");
    assert_eq!(by_name("write_file")["risk"], "destructive");
    assert_eq!(by_name("create_directory")["risk"], "write");
    assert_eq!(by_name("create_directory")["catalog"], "new");
    for t in tools {
        let hash = t["definition"].as_str().expect("definition");
        assert!(hash.starts_with("sha256:") && hash.len() == 71, "{t}");
    }

    // `catalog pin` prints the same hashes; a catalog carrying them (and every tool, and not the
    // gone one) matches the server.
    let pins = json(&run(
        &stale,
        &["catalog", "pin", "filesystem", "-o", "json"],
    ));
    let pins: Vec<(String, String)> = pins
        .as_array()
        .expect("pins")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("name").to_string(),
                p["pin"].as_str().expect("pin").to_string(),
            )
        })
        .collect();
    assert_eq!(pins.len(), tools.len());
    for (name, pin) in &pins {
        assert_eq!(by_name(name)["definition"], pin.as_str());
    }
    let others: Vec<&str> = pins
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !["read_text_file", "write_file"].contains(n))
        .collect();
    let pin_refs: Vec<(&str, &str)> = pins.iter().map(|(n, p)| (n.as_str(), p.as_str())).collect();
    let current = catalog(dir.path(), &others, &pin_refs);
    let out = run(&current, &["catalog", "discover", "filesystem", "--check"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("differs"));

    // A pin that is not the server's definition is flagged.
    let mut wrong = pin_refs.clone();
    let zero = format!("sha256:{}", "0".repeat(64));
    wrong[0].1 = &zero;
    let mismatched = catalog(dir.path(), &others, &wrong);
    let found = json(&run(
        &mismatched,
        &["catalog", "discover", "filesystem", "-o", "json"],
    ));
    let flagged: Vec<&Value> = found["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter(|t| t["pin"] == "differs")
        .collect();
    assert_eq!(flagged.len(), 1, "{found}");
    assert_eq!(flagged[0]["name"], wrong[0].0);

    // A server the catalog lists no tools for: every tool is new.
    let every = json(&run(
        &current,
        &["catalog", "discover", "everything", "-o", "json"],
    ));
    let names: Vec<&str> = every["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"get-sum"),
        "{names:?}"
    );
}

#[test]
#[ignore = "needs the MCP reference servers (e2e/setup)"]
fn write_brings_the_catalog_file_in_line_and_pin_write_pins_every_tool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = catalog(dir.path(), &["format_disk"], &[]);
    let text = format!(
        "# Our catalog: this comment stays.\n{}",
        std::fs::read_to_string(&path).expect("read")
    );
    std::fs::write(&path, &text).expect("write");
    let path_arg = path.to_str().expect("utf-8");

    let out = run(
        &path,
        &["catalog", "discover", "filesystem", "--write", path_arg],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(&path).expect("read");
    assert!(
        written.starts_with("# Our catalog: this comment stays.\n"),
        "{written}"
    );
    assert!(!written.contains("format_disk"), "{written}");
    assert!(
        written.contains("- {name: create_directory, description: "),
        "{written}"
    );
    // The everything server's entry is as it was.
    let everything = |t: &str| t[t.find("  - name: everything").expect("everything")..].to_string();
    assert_eq!(everything(&written), everything(&text));
    let out = run(&path, &["catalog", "discover", "filesystem", "--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = run(
        &path,
        &["catalog", "pin", "filesystem", "--write", path_arg],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = json(&run(
        &path,
        &["catalog", "discover", "filesystem", "-o", "json"],
    ));
    let tools = found["tools"].as_array().expect("tools");
    assert!(tools.len() >= 10, "{found}");
    assert!(
        tools
            .iter()
            .all(|t| t["pin"] == "matches" && t["catalog"] == "listed"),
        "{found}"
    );
}

#[test]
fn an_unknown_server_is_named_with_the_known_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("catalog.yaml");
    std::fs::write(&path, "servers:\n  - {name: a, stdio: {command: x}}\n").expect("write");
    let out = run(&path, &["catalog", "discover", "nope"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("known servers: a"));
    let out = run(&path, &["catalog", "pin", "a"]);
    assert_eq!(out.status.code(), Some(5));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("servers[a].stdio.command"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
