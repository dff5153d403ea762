//! The CLI as the kubectl plugin `kubectl orchestrator`, offline: run through a
//! `kubectl-orchestrator` link it names itself as kubectl users type it, and the krew manifest
//! the release fills is one krew accepts. (Through a real kubectl against the cluster:
//! cluster_cli.rs, `kubectl_finds_the_plugin_on_path`.)

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator-cli");

fn manifest_template() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("krew/orchestrator.yaml");
    std::fs::read_to_string(&path).expect("cli/krew/orchestrator.yaml")
}

#[test]
fn through_a_kubectl_orchestrator_link_the_usage_says_kubectl_orchestrator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("kubectl-orchestrator");
    std::os::unix::fs::symlink(BIN, &link).expect("symlink");

    let out = Command::new(&link).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(
        help.contains("Usage: kubectl orchestrator [OPTIONS] <COMMAND>"),
        "{help}"
    );
    assert!(
        help.contains("  kubectl orchestrator task list --phase Running"),
        "{help}"
    );
    assert!(!help.contains("orchestrator-cli "), "{help}");

    // A usage error names the plugin too.
    let out = Command::new(&link)
        .args(["task", "get"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Usage: kubectl orchestrator task get <NAME>"),
        "{err}"
    );

    // Under its own name nothing changes.
    let out = Command::new(BIN).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Usage: orchestrator-cli [OPTIONS] <COMMAND>"),
        "{help}"
    );
}

#[test]
fn the_krew_manifest_filled_in_is_a_plugin_krew_accepts() {
    let template = manifest_template();
    for placeholder in [
        "@VERSION@",
        "@RELEASE_URL@",
        "@SHA256_LINUX_AMD64@",
        "@SHA256_LINUX_ARM64@",
        "@HOMEPAGE@",
    ] {
        assert!(
            template.contains(placeholder),
            "{placeholder} is documented and used"
        );
    }
    let filled = template
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
        .replace(
            "@RELEASE_URL@",
            "https://example.invalid/releases/download/v0.2.0",
        )
        .replace("@SHA256_LINUX_AMD64@", &"ab".repeat(32))
        .replace("@SHA256_LINUX_ARM64@", &"cd".repeat(32))
        .replace("@HOMEPAGE@", "https://example.invalid/orchestrator");
    let without_comments: String = filled
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !without_comments.contains('@'),
        "a placeholder is left:\n{filled}"
    );
    let m: serde_json::Value = serde_saphyr::from_str(&filled).expect("the manifest is YAML");

    // What krew's validation checks (krew's pkg/index/validation).
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(
        m["metadata"]["name"], "orchestrator",
        "kubectl orchestrator"
    );
    let version = m["spec"]["version"].as_str().expect("spec.version");
    assert_eq!(version, format!("v{}", env!("CARGO_PKG_VERSION")));
    assert!(
        m["spec"]["shortDescription"]
            .as_str()
            .is_some_and(|d| !d.is_empty() && d.len() <= 50),
        "shortDescription: short (krew-index asks for about 50 characters at most)"
    );
    let platforms = m["spec"]["platforms"].as_array().expect("platforms");
    assert!(!platforms.is_empty());
    for p in platforms {
        assert!(p["selector"]["matchLabels"]["os"].is_string(), "{p}");
        let uri = p["uri"].as_str().expect("uri");
        assert!(
            uri.starts_with("https://") && (uri.ends_with(".tar.gz") || uri.ends_with(".zip")),
            "krew installs archives: {uri}"
        );
        let sha = p["sha256"].as_str().expect("sha256");
        assert!(
            sha.len() == 64 && sha.chars().all(|c| c.is_ascii_hexdigit()),
            "{sha}"
        );
        assert_eq!(p["bin"], "kubectl-orchestrator");
        let files = p["files"].as_array().expect("files");
        assert!(
            files.iter().any(|f| f["from"] == "kubectl-orchestrator"),
            "{p}"
        );
    }
}
