//! Failure paths against the real control plane: each error case's exit code and message, with
//! nothing written; an RBAC refusal shown in words; kubeconfig, `$KUBECONFIG`, `--context` and
//! namespace resolution.
//!
//! Run: `e2e/cluster up`, then `cargo test -p orchestrator-cli --test cluster_errors -- --ignored`.

mod cluster_support;

use std::collections::BTreeSet;

use anyhow::Result;
use cluster_support::{run, setup, taskruns};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_e2e::{kubeconfig_path, kubectl};
use serde_json::{Value, json};

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn error_cases_exit_with_their_codes_and_write_nothing() -> Result<()> {
    let (client, ns) = setup("cli-errors").await?;
    run(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--prompt",
            "x",
            "--task-id",
            "1",
            "--tools",
            "memory:*",
            "--deny-tools",
            "memory:delete_*",
        ],
    )
    .ok();
    // A second TaskRun of task 1 (a re-run) makes --task-id 1 ambiguous.
    run(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--prompt",
            "x",
            "--task-id",
            "1",
            "--name",
            "task-1-rerun",
            "--tools",
            "time:*",
        ],
    )
    .ok();
    let api = taskruns(&client, &ns.name);
    let version = |tr: TaskRun| tr.metadata.resource_version;
    let before = version(api.get("task-1").await?);

    let no_name = format!("TaskRun no-such-task not found in namespace {}", ns.name);
    let no_id = format!("no TaskRun with task id 404 in namespace {}", ns.name);
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["task", "add-context", "task-1", "--enable-tools", "memory"],
            2,
            "\"memory\": no tool given; write \"memory:TOOL\", or \"memory:*\" for all its tools",
        ),
        (
            vec![
                "task",
                "add-context",
                "task-1",
                "--enable-tools",
                "gitlab:merge,memory:read_graph",
            ],
            2,
            "unknown MCP server:\n  gitlab:merge in --enable-tools\nknown servers: everything, filesystem, git, github, memory, time",
        ),
        (
            vec![
                "task",
                "add-context",
                "task-1",
                "--enable-tools",
                "memory:read_graph",
                "--disable-tools",
                "memory:read_*",
            ],
            2,
            "the same tool is both enabled and disabled:\n  memory:read_graph (enabled) vs memory:read_* (disabled)",
        ),
        (
            vec![
                "task",
                "add-context",
                "task-1",
                "--enable-tools",
                "memory:delete_entities",
            ],
            2,
            "cannot enable memory:delete_entities: the deny pattern \"delete_*\" of server memory hides it",
        ),
        (
            vec![
                "task",
                "add-context",
                "no-such-task",
                "--enable-tools",
                "memory:read_graph",
            ],
            3,
            &no_name,
        ),
        (
            vec![
                "task",
                "add-context",
                "--task-id",
                "404",
                "--enable-tools",
                "memory:read_graph",
            ],
            3,
            &no_id,
        ),
        (
            vec![
                "task",
                "add-context",
                "--task-id",
                "1",
                "--enable-tools",
                "memory:read_graph",
            ],
            2,
            "task id 1 matches 2 TaskRuns",
        ),
        (
            vec!["task", "describe", "nope"],
            3,
            "TaskRun nope not found",
        ),
        (
            vec!["task", "get", "--task-id", "99"],
            3,
            "no TaskRun with task id 99",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--task-id",
                "1",
                "--tools",
                "time:*",
            ],
            2,
            "a TaskRun named task-1 already exists",
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
                "github:*,jira:*",
            ],
            2,
            "unknown MCP server:\n  jira:* in --tools",
        ),
        (
            vec![
                "task",
                "submit",
                "--service",
                "todo-api",
                "--prompt",
                "x",
                "--wait",
                "--timeout",
                "1s",
                "--name",
                "waits",
                "--tools",
                "time:*",
            ],
            4,
            "timed out after 1s waiting for TaskRun waits to finish",
        ),
        (
            vec!["catalog", "show", "jira"],
            3,
            "the catalog has no server \"jira\"; known servers:",
        ),
    ];
    for (args, code, message) in cases {
        let out = run(&ns.name, &args);
        assert_eq!(
            out.code,
            Some(code),
            "{args:?}\nstdout: {}\nstderr: {}",
            out.stdout,
            out.stderr
        );
        assert!(
            out.stderr.starts_with("error: "),
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(message),
            "{args:?}: expected {message:?} in:\n{}",
            out.stderr
        );
    }
    assert_eq!(
        version(api.get("task-1").await?),
        before,
        "no failed command wrote to task-1"
    );
    let names: BTreeSet<String> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|t| t.metadata.name)
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["task-1".into(), "task-1-rerun".into(), "waits".into()]),
        "refused submits created nothing (the timed-out one was created, then waited on)"
    );

    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn api_refusals_are_shown_in_words() -> Result<()> {
    let (_client, ns) = setup("cli-rbac").await?;
    // A ServiceAccount with no RBAC rights, and a kubeconfig that authenticates as it.
    let out = kubectl(&["create", "serviceaccount", "nobody", "-n", &ns.name])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(&["create", "token", "nobody", "-n", &ns.name])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)?.trim().to_string();
    let mut config: Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig_path())?)?;
    for user in config["users"].as_array_mut().into_iter().flatten() {
        user["user"] = json!({"token": token});
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, serde_json::to_string(&config)?)?;

    let out = std::process::Command::new(cluster_support::BIN)
        .arg("--kubeconfig")
        .arg(&path)
        .args(["task", "list", "-n", &ns.name])
        .env_remove("KUBECONFIG")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let expected = format!(
        "error: listing TaskRuns in namespace {0}: taskruns.orchestrator.io is forbidden: User \
         \"system:serviceaccount:{0}:nobody\" cannot list resource \"taskruns\" in API group \
         \"orchestrator.io\" in the namespace \"{0}\" — your user lacks RBAC permission for this \
         (Forbidden HTTP 403)\n",
        ns.name
    );
    assert_eq!(stderr, expected);
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn kubeconfig_context_and_namespace_resolve_like_kubectl() -> Result<()> {
    let (_client, ns) = setup("cli-kubeconfig").await?;
    run(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--prompt",
            "x",
            "--task-id",
            "3",
            "--tools",
            "time:*",
        ],
    )
    .ok();
    // The e2e kubeconfig plus a context that points nowhere (the current one) and a context
    // whose namespace is the test's.
    let mut config: Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig_path())?)?;
    let real = config["contexts"][0]["context"].clone();
    config["clusters"]
        .as_array_mut()
        .expect("clusters")
        .push(json!({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}}));
    let contexts = config["contexts"].as_array_mut().expect("contexts");
    contexts
        .push(json!({"name": "nowhere", "context": {"cluster": "nowhere", "user": real["user"]}}));
    let mut team = real.clone();
    team["namespace"] = json!(ns.name);
    contexts.push(json!({"name": "team", "context": team}));
    config["current-context"] = json!("nowhere");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("config");
    std::fs::write(&path, serde_json::to_string(&config)?)?;

    let user = |env_kubeconfig: bool, args: &[&str]| {
        let mut cmd = std::process::Command::new(cluster_support::BIN);
        if env_kubeconfig {
            cmd.env("KUBECONFIG", &path);
        } else {
            cmd.env_remove("KUBECONFIG").arg("--kubeconfig").arg(&path);
        }
        cmd.args(args).env_remove("ORCH_CATALOG_FILE");
        cmd.output().expect("the CLI runs")
    };
    // $KUBECONFIG is read, and its current context is used: that cluster is unreachable.
    let out = user(true, &["task", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: listing TaskRuns in namespace default: ")
            && stderr.contains("(is the cluster reachable? check --kubeconfig and --context)"),
        "{stderr}"
    );
    // --context picks another context, and its namespace is the default one.
    let out = user(
        true,
        &["--context", "team", "task", "get", "task-3", "-o", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tr: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(tr["metadata"]["namespace"], ns.name.as_str());
    // -n wins over the context's namespace; --kubeconfig works like $KUBECONFIG.
    let out = user(
        false,
        &[
            "task",
            "get",
            "task-3",
            "--context",
            "team",
            "-n",
            "default",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("TaskRun task-3 not found in namespace default")
    );
    // An unknown context is a clear kubeconfig error.
    let out = user(false, &["task", "list", "--context", "prod"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("prod"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ns.delete().await
}
