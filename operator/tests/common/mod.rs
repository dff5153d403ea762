//! What the chart tests share: the chart rendered by `helm template`, with helm from the
//! control-plane build (`e2e/controlplane/build` prints its bin directory).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

fn helm() -> PathBuf {
    let out = Command::new(repo_root().join("e2e/controlplane/build"))
        .output()
        .expect("e2e/controlplane/build runs");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("a bin dir").trim()).join("helm")
}

/// The chart rendered with `set` (release `r` in namespace `sys`), one JSON value per object.
pub fn rendered(set: &[&str]) -> Result<Vec<Value>, String> {
    let mut args = vec!["template", "r", "charts/orchestrator", "-n", "sys"];
    args.extend(["--kube-version", "1.35.4"]);
    for s in set {
        args.extend(["--set", s]);
    }
    let out = Command::new(helm())
        .current_dir(repo_root())
        .args(&args)
        .output()
        .expect("helm runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter(|d| d.contains("kind:"))
        .map(|d| serde_saphyr::from_str(d).expect("a YAML object"))
        .collect())
}
