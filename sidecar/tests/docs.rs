//! The documentation and the examples stay true: every example config loads without errors, and
//! every problem code the validator can emit is documented.

use std::path::PathBuf;

use orchestrator_mcp_proxy::config::{Code, load_file};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn example_configs_load_without_errors() {
    let dir = repo().join("config/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("config/examples exists") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if !(name.starts_with("proxy") && name.ends_with(".yaml")) {
            continue;
        }
        let loaded = load_file(&path);
        assert!(
            !loaded.problems.has_errors(),
            "{name}:\n{}",
            loaded.problems
        );
        seen += 1;
    }
    assert!(
        seen >= 3,
        "expected the proxy examples in {}",
        dir.display()
    );
}

#[test]
fn every_problem_code_is_documented() {
    let doc =
        std::fs::read_to_string(repo().join("docs/proxy-config.md")).expect("docs/proxy-config.md");
    for code in Code::ALL {
        assert!(
            doc.contains(&format!("`{}`", code.as_str())),
            "{code} is not in docs/proxy-config.md"
        );
    }
}
