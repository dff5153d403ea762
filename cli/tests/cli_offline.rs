//! The real `orchestrator-cli` binary, run as a user runs it, for what needs no cluster: help
//! texts, shell completions, and bad input refused (exit 2) before any connection is made.
//!
//! "Before any connection" is shown by pointing --kubeconfig at a file that does not exist:
//! a command that got as far as connecting would fail with exit 1 and a kubeconfig message.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator-cli");

fn catalog() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/catalog.yaml")
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("ORCH_CATALOG_FILE")
        .env_remove("ORCH_CATALOG_NAMESPACE")
        .env_remove("ORCH_CATALOG_NAME")
        .output()
        .expect("the binary runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_command_has_help_with_examples() {
    for cmd in [
        vec![],
        vec!["task"],
        vec!["task", "submit"],
        vec!["task", "add-context"],
        vec!["task", "get"],
        vec!["task", "list"],
        vec!["task", "describe"],
        vec!["task", "validate"],
        vec!["catalog"],
        vec!["catalog", "list"],
        vec!["catalog", "show"],
        vec!["catalog", "docs"],
        vec!["completions"],
        vec!["version"],
    ] {
        let mut args = cmd.clone();
        args.push("--help");
        let out = run(&args);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{cmd:?} --help failed: {stderr}");
        assert!(
            stdout.contains("Usage: orchestrator-cli"),
            "{cmd:?}: {stdout}"
        );
        let leaf = !matches!(cmd.as_slice(), ["task"] | ["catalog"]);
        if leaf {
            assert!(
                stdout.contains("Examples:"),
                "{cmd:?} --help has no examples:\n{stdout}"
            );
        }
    }
}

#[test]
fn completions_are_valid_shell_scripts() {
    let out = run(&["completions", "bash"]);
    let (script, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(script.contains("add-context"), "completes subcommands");
    assert!(script.contains("--enable-tools"), "completes flags");
    // bash itself parses the script.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("orchestrator-cli.bash");
    std::fs::write(&path, &script).expect("write");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("bash runs");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = run(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let out = run(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "unknown shell is a usage error");
}

#[test]
fn bad_input_exits_2_before_connecting() {
    let nowhere = "/nonexistent/kubeconfig";
    let catalog = catalog();
    let catalog = catalog.to_str().expect("utf-8 path");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["task", "add-context", "t", "--enable-tools", "github"],
            r#""github": no tool given; write "github:TOOL", or "github:*" for all its tools"#,
        ),
        (
            vec![
                "task",
                "add-context",
                "t",
                "--enable-tools",
                "github:a",
                "--disable-tools",
                "github:a",
            ],
            "the same tool is both enabled and disabled",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--tools",
                "time:*",
                "--deny-internal-tools",
                "WebFetch,webfetch",
            ],
            "--deny-internal-tools: rule \"webfetch\" names a tool in lower case",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--tools",
                "time:*",
                "--deny-internal-tools",
                "Bash(foo",
            ],
            "--deny-internal-tools: rule \"Bash(foo\" is malformed",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "Todo_API",
                "--prompt",
                "x",
                "--tools",
                "time:*",
            ],
            "--service \"Todo_API\": must be a DNS-1123 label",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "  ",
                "--tools",
                "time:*",
            ],
            "--prompt is empty",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--task-file",
                "/nonexistent/task.md",
                "--tools",
                "time:*",
            ],
            "--task-file /nonexistent/task.md",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--tools",
                "fs:read,:x",
            ],
            r#"":x": the server name before ':' is empty"#,
        ),
        (
            // Unknown servers are judged against the catalog (a file here): still no connection.
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--tools",
                "gitlab:*",
                "--catalog",
                catalog,
                "--dry-run",
            ],
            "unknown MCP server:\n  gitlab:* in --tools\nknown servers: everything, filesystem, git, github, memory, time",
        ),
        (vec!["task", "get"], "required arguments were not provided"),
        (
            vec!["task", "submit", "--service", "todo-api", "--prompt", "x"],
            "required arguments were not provided:\n  --tools <SERVER:TOOL,...>",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--tools",
                "time:*",
                "--deny-tools",
                "time:*",
                "--catalog",
                catalog,
            ],
            "the same tool is both enabled and disabled",
        ),
        (
            vec!["task", "list", "--phase", "Runing"],
            "invalid value 'Runing' for '--phase",
        ),
    ];
    for (args, expected) in cases {
        let mut full = args.clone();
        full.extend(["--kubeconfig", nowhere]);
        let out = run(&full);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
        assert!(
            !stderr.contains("reading kubeconfig"),
            "{args:?} must fail before connecting: {stderr}"
        );
    }
}

#[test]
fn every_duration_flag_takes_the_same_forms_and_names_itself_when_wrong() {
    let nowhere = "/nonexistent/kubeconfig";
    let flags: [&[&str]; 5] = [
        &["task", "cancel", "t", "--wait", "--timeout"],
        &["task", "delete", "t", "--wait", "--timeout"],
        &[
            "task",
            "add-context",
            "t",
            "--enable-tools",
            "time:*",
            "--timeout",
        ],
        &[
            "task",
            "submit",
            "--service",
            "s",
            "--prompt",
            "x",
            "--tools",
            "time:*",
            "--wait",
            "--timeout",
        ],
        &["task", "audit", "t", "--since"],
    ];
    for flag in flags {
        let name = flag[flag.len() - 1];
        // Accepted: the command gets as far as connecting (exit 1, the kubeconfig).
        for good in ["1.5h", "1h30m", "500ms", "90s", "2d", "90"] {
            let mut args = flag.to_vec();
            args.extend([good, "--kubeconfig", nowhere]);
            let out = run(&args);
            let (_, stderr) = text(&out);
            assert!(
                stderr.contains("reading kubeconfig"),
                "{name} {good} must be accepted: {stderr}"
            );
        }
        let mut args = flag.to_vec();
        args.extend(["1.5x", "--kubeconfig", nowhere]);
        let out = run(&args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("invalid value '1.5x' for '{name} <")),
            "{stderr}"
        );
        assert!(stderr.contains("500ms, 90s, 1.5h, 1h30m, 2d"), "{stderr}");
    }
}

#[test]
fn a_missing_kubeconfig_is_reported_in_words_with_exit_1() {
    let out = run(&["task", "list", "--kubeconfig", "/nonexistent/kubeconfig"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: reading kubeconfig /nonexistent/kubeconfig"),
        "{stderr}"
    );
}

/// `task submit --dry-run -o json` of a small task with `extra` flags: its output.
fn submit_dry_run(extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = dir.path().join("task.md");
    std::fs::write(&task, "# Fix the login bug\n").expect("write");
    let catalog = catalog();
    let mut args = vec![
        "task",
        "submit",
        "--service",
        "todo-api",
        "--task-file",
        task.to_str().expect("utf-8"),
        "--task-id",
        "7",
        "--tools",
        "github:*",
        "--catalog",
        catalog.to_str().expect("utf-8"),
        "--dry-run",
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn submit_names_the_model_credential_and_the_output_budget() {
    let args = |model| submit_dry_run(&["--model-secret", model, "--max-output-tokens", "5000"]);
    let out = args("anthropic/api-key");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let tr: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(
        tr["spec"]["model"],
        serde_json::json!({"secretKeyRef": {"name": "anthropic", "key": "api-key"}})
    );
    assert_eq!(
        tr["spec"]["budget"],
        serde_json::json!({"outputTokens": 5000})
    );
    let out = args("no-key-here");
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("is not SECRET/KEY"), "{stderr}");
}

#[test]
fn submit_places_the_pod_with_node_selector_and_tolerations() {
    let out = submit_dry_run(&[
        "--node-selector",
        "pool=gpu",
        "--toleration",
        "dedicated=agents:NoSchedule",
        "--toleration",
        "spot",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let tr: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(
        tr["spec"]["podTemplate"],
        serde_json::json!({
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Exists"},
            ],
        })
    );
    // Without them: no podTemplate at all.
    let tr: serde_json::Value = serde_json::from_str(&text(&submit_dry_run(&[])).0).expect("JSON");
    assert!(tr["spec"].get("podTemplate").is_none(), "{tr}");
    for (flag, bad, says) in [
        ("--node-selector", "pool", "expected KEY=VALUE"),
        (
            "--toleration",
            "dedicated=agents:Sometimes",
            "is not one of NoSchedule",
        ),
        ("--toleration", "=agents", "a taint's key first"),
    ] {
        let out = submit_dry_run(&[flag, bad]);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{flag} {bad}");
        assert!(stderr.contains(says) && stderr.contains(flag), "{stderr}");
    }
}

#[test]
fn dry_run_prints_the_taskrun_it_would_create() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = dir.path().join("task.md");
    std::fs::write(&task, "# Fix the login bug\n").expect("write");
    let catalog = catalog();
    let out = run(&[
        "task",
        "submit",
        "--service",
        "todo-api",
        "--task-file",
        task.to_str().expect("utf-8"),
        "--task-id",
        "1001",
        "--tools",
        "github:*,filesystem:read_*,filesystem:list_directory",
        "--deny-tools",
        "filesystem:read_media_file",
        "--deny-internal-tools",
        "WebFetch",
        "--catalog",
        catalog.to_str().expect("utf-8"),
        "--dry-run",
        "-o",
        "json",
        "-n",
        "team-a",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let tr: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(
        tr,
        serde_json::json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "task-1001", "namespace": "team-a"},
            "spec": {
                "taskId": 1001, "serviceName": "todo-api",
                "task": {"prompt": "# Fix the login bug\n"},
                "toolConfig": {
                    "internalTools": {"permissions": {"allow": ["*"], "deny": ["WebFetch"]}},
                    "mcpServers": [
                        {"name": "github", "enabled": true, "tools": {"allow": ["*"]}},
                        {"name": "filesystem", "enabled": true, "tools": {
                            "allow": ["read_*", "list_directory"], "deny": ["read_media_file"]}}
                    ]
                }
            }
        })
    );
}

/// Every TaskRun the repository ships as a sample passes `task validate --offline` against the
/// shipped catalog; a broken copy of one fails with exit 2, naming the field.
#[test]
fn the_shipped_samples_validate_offline_and_a_broken_one_does_not() {
    let samples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let mut files: Vec<String> = std::fs::read_dir(&samples)
        .expect("config/samples")
        .filter_map(|e| Some(e.ok()?.path().to_str()?.to_string()))
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    files.sort();
    let catalog = catalog();
    let mut args = vec![
        "task",
        "validate",
        "--offline",
        "--catalog",
        catalog.to_str().expect("utf-8"),
    ];
    args.extend(files.iter().map(String::as_str));
    let out = run(&args);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let valid = stdout.lines().filter(|l| l.ends_with(": valid")).count();
    assert!(valid >= 5, "{stdout}");
    assert!(
        stderr.contains("not TaskRuns, not checked:") && stderr.contains("Secret"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let broken = dir.path().join("broken.yaml");
    let sample = std::fs::read_to_string(samples.join("taskrun.yaml")).expect("the sample");
    std::fs::write(
        &broken,
        sample.replace(
            "    mcpServers:\n",
            "    policy:\n      conditions: [{name: r, when: 'args.x +'}]\n    mcpServers:\n",
        ),
    )
    .expect("written");
    let out = run(&[
        "task",
        "validate",
        "--offline",
        "--catalog",
        catalog.to_str().expect("utf-8"),
        broken.to_str().expect("utf-8"),
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("InvalidCondition: spec.toolConfig.policy.conditions[0].when"),
        "{stdout}"
    );
    assert!(
        stderr.contains("1 of 1 TaskRuns would not be accepted"),
        "{stderr}"
    );
}
