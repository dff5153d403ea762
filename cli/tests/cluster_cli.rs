//! The real `orchestrator-cli` binary against the real control plane of `e2e/cluster`: each
//! command, add-context under concurrent writers, and the exit codes of the error cases.
//! No operator runs here (see `cluster_operator.rs` for --wait and --wait-synced), so these
//! tests judge what the CLI writes and reads, not what the operator does with it.
//!
//! Run: `e2e/cluster up`, then `cargo test -p orchestrator-cli --test cluster_cli -- --ignored`.

mod cluster_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use cluster_support::{create_catalog_configmap, ensure_crd, run, run_async};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use orchestrator_crds::taskrun::{McpServer, TaskRun};
use orchestrator_e2e::{TestNamespace, client, kubeconfig_path, kubectl};
use serde_json::{Value, json};

async fn setup(prefix: &str) -> Result<(Client, TestNamespace)> {
    let client = client().await?;
    ensure_crd(&client).await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    Ok((client, ns))
}

fn taskruns(client: &Client, ns: &str) -> Api<TaskRun> {
    Api::namespaced(client.clone(), ns)
}

fn servers(tr: &TaskRun) -> Vec<McpServer> {
    tr.spec.tool_config.mcp_servers.clone()
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn submit_then_get_list_and_describe_show_the_task() -> Result<()> {
    let (client, ns) = setup("cli-submit").await?;
    let dir = tempfile::tempdir()?;
    let task_file = dir.path().join("task.md");
    std::fs::write(
        &task_file,
        "# Task 1001\nAdd the todo-api facts to memory.\n",
    )?;

    let out = run(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--task-file",
            task_file.to_str().expect("utf-8"),
            "--task-id",
            "1001",
            "--tools",
            "memory:*,filesystem:read_*,filesystem:list_directory",
            "--deny-tools",
            "memory:delete_*",
            "--deny-internal-tools",
            "WebFetch",
        ],
    );
    assert_eq!(out.ok(), "task-1001\n", "submit prints the TaskRun's name");

    // What landed in the API is what the flags said.
    let tr = taskruns(&client, &ns.name).get("task-1001").await?;
    assert_eq!(tr.spec.task_id, 1001);
    assert_eq!(tr.spec.service_name, "todo-api");
    assert_eq!(
        tr.spec.task.prompt.as_deref(),
        Some("# Task 1001\nAdd the todo-api facts to memory.\n")
    );
    assert_eq!(
        servers(&tr),
        [
            McpServer::new("memory", &["*"], &["delete_*"]),
            McpServer::new("filesystem", &["read_*", "list_directory"], &[]),
        ]
    );
    assert_eq!(
        tr.spec.tool_config.internal_tools.permissions.deny,
        ["WebFetch"]
    );

    // A second task without --task-id gets the next id, and its name from it.
    let out = run(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "web",
            "--prompt",
            "Fix CSS",
            "--tools",
            "time:*",
        ],
    );
    assert_eq!(out.ok(), "task-1002\n");

    // get: by name and by task id; -o json is the stored object.
    let out = run(&ns.name, &["task", "get", "task-1001"]);
    let lines: Vec<&str> = out.ok().lines().collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("NAME        TASK   SERVICE    PHASE"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("task-1001   1001   todo-api   <none>"),
        "{lines:?}"
    );
    let out = run(
        &ns.name,
        &["task", "get", "--task-id", "1002", "-o", "json"],
    );
    let got: Value = serde_json::from_str(out.ok())?;
    assert_eq!(got["metadata"]["name"], "task-1002");
    assert_eq!(got["spec"]["serviceName"], "web");
    let out = run(&ns.name, &["task", "get", "task-1001", "-o", "yaml"]);
    let got: Value = serde_saphyr::from_str(out.ok())?;
    assert_eq!(got["spec"]["toolConfig"]["mcpServers"][0]["name"], "memory");

    // list: newest first, filters by service; -o json is a List.
    let out = run(&ns.name, &["task", "list"]);
    let names: Vec<&str> = out
        .ok()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        BTreeSet::from_iter(names),
        BTreeSet::from(["task-1001", "task-1002"])
    );
    let out = run(
        &ns.name,
        &["task", "list", "--service", "web", "-o", "json"],
    );
    let list: Value = serde_json::from_str(out.ok())?;
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "task-1002");
    // No operator runs here, so no task has a phase yet: a phase filter finds nothing.
    let out = run(&ns.name, &["task", "list", "--phase", "Running"]);
    assert_eq!(out.ok(), "");
    assert!(
        out.stderr.contains("No tasks found in namespace"),
        "{}",
        out.stderr
    );

    // describe: spec summary, status, conditions, tool config, effective tools, events.
    let out = run(&ns.name, &["task", "describe", "--task-id", "1001"]);
    let text = out.ok();
    for expected in [
        "Name:        task-1001\n",
        &format!("Namespace:   {}\n", ns.name),
        "Task ID:     1001\n",
        "Service:     todo-api\n",
        "Task:        inline, 2 lines: \"# Task 1001\"\n",
        "Conditions:\n  <none>\n",
        "agent built-in tools: allow all; deny WebFetch\n",
        "  memory       yes       *                        delete_*\n",
        "Effective tools (computed from the spec and the catalog; the operator has not caught up):\n",
        "  filesystem: list_directory, read_file, read_media_file, read_multiple_files, read_text_file\n",
        "  memory: add_observations, create_entities, create_relations, open_nodes, read_graph, search_nodes\n",
        "Events:\n  <none>\n",
    ] {
        assert!(
            text.contains(expected),
            "describe lacks {expected:?}:\n{text}"
        );
    }
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn add_context_changes_only_the_named_tools_and_prints_before_and_after() -> Result<()> {
    let (client, ns) = setup("cli-addctx").await?;
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
            "1001",
            "--tools",
            "filesystem:*,memory:read_graph",
        ],
    )
    .ok();
    let api = taskruns(&client, &ns.name);
    let before = api.get("task-1001").await?;

    let out = run(
        &ns.name,
        &[
            "task",
            "add-context",
            "--task-id",
            "1001",
            "--enable-tools",
            "memory:search_nodes,time:get_current_time",
            "--disable-tools",
            "filesystem:write_file,filesystem:move_file",
        ],
    );
    let text = out.ok();
    let after = api.get("task-1001").await?;
    assert_eq!(
        servers(&after),
        [
            McpServer::new("filesystem", &["*"], &["write_file", "move_file"]),
            McpServer::new("memory", &["read_graph", "search_nodes"], &[]),
            McpServer::new("time", &["get_current_time"], &[]),
        ]
    );
    assert_eq!(after.spec.task, before.spec.task, "only toolConfig changes");
    assert_eq!(
        after.metadata.generation,
        before.metadata.generation.map(|g| g + 1),
        "one write"
    );
    // The before → after listing, as a user reads it.
    for expected in [
        &format!(
            "TaskRun task-1001 in namespace {}: tools before → after\n",
            ns.name
        ),
        "filesystem: 14 tools → 12 tools\n",
        "  - move_file\n",
        "  - write_file\n",
        "    read_file\n",
        "memory: 1 tool → 2 tools\n    read_graph\n  + search_nodes\n",
        "time: off → 1 tool\n  + get_current_time\n",
        &format!(
            "updated: generation {}\n",
            after.metadata.generation.unwrap_or_default()
        ),
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }

    // The same request again changes nothing and writes nothing.
    let out = run(
        &ns.name,
        &[
            "task",
            "add-context",
            "task-1001",
            "--enable-tools",
            "memory:search_nodes,time:get_current_time",
            "--disable-tools",
            "filesystem:write_file,filesystem:move_file",
            "-o",
            "json",
        ],
    );
    let report: Value = serde_json::from_str(out.ok())?;
    assert_eq!(report["changed"], false);
    let again = api.get("task-1001").await?;
    assert_eq!(
        again.metadata.resource_version,
        after.metadata.resource_version
    );

    // Switching a server off with SERVER:*, and --dry-run writing nothing.
    let out = run(
        &ns.name,
        &[
            "task",
            "add-context",
            "task-1001",
            "--disable-tools",
            "time:*",
            "--dry-run",
        ],
    );
    assert!(
        out.ok()
            .contains("time: 1 tool → off\n  - get_current_time\ndry run: nothing written\n"),
        "{}",
        out.stdout
    );
    assert_eq!(
        api.get("task-1001").await?.metadata.resource_version,
        after.metadata.resource_version
    );
    run(
        &ns.name,
        &[
            "task",
            "add-context",
            "task-1001",
            "--disable-tools",
            "time:*",
        ],
    )
    .ok();
    let off = api.get("task-1001").await?;
    assert!(
        !servers(&off)[2].enabled,
        "time is switched off: {:?}",
        servers(&off)[2]
    );
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn concurrent_add_context_calls_all_take_effect() -> Result<()> {
    let (client, ns) = setup("cli-concurrent").await?;
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
            "7",
            "--tools",
            "memory:read_graph",
        ],
    )
    .ok();
    let api = taskruns(&client, &ns.name);

    // Meanwhile another client keeps writing the same object (as the operator does with
    // status): those writes touch no tool and must neither block add-context nor be lost.
    let stop = Arc::new(AtomicBool::new(false));
    let noise = {
        let api = api.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let patch = json!({"metadata": {"annotations": {"test/noise": n.to_string()}}});
                let _ = api
                    .patch("task-7", &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        })
    };
    let add = |tool: &str| {
        let args = [
            "task",
            "add-context",
            "--task-id",
            "7",
            "--enable-tools",
            tool,
            "-o",
            "json",
        ];
        run_async(
            ns.name.clone(),
            args.iter().map(|s| s.to_string()).collect(),
        )
    };

    // Two add-context calls at once, each enabling a different tool...
    let (a, b) = tokio::join!(add("memory:search_nodes"), add("filesystem:read_file"));
    // ...then eight at once, so that several read the same list and all but one must retry.
    let eight = [
        "memory:open_nodes",
        "filesystem:list_directory",
        "everything:echo",
        "everything:get-sum",
        "time:get_current_time",
        "time:convert_time",
        "git:git_status",
        "git:git_log",
    ];
    let rest = futures::future::join_all(eight.iter().map(|t| add(t))).await;
    stop.store(true, Ordering::Relaxed);
    let noise_writes = noise.await?;

    let mut attempts = Vec::new();
    for out in [a, b].iter().chain(&rest) {
        let report: Value = serde_json::from_str(out.ok())?;
        assert_eq!(report["changed"], true, "{report}");
        attempts.push(report["attempts"].as_u64().unwrap_or(0));
    }
    let tr = api.get("task-7").await?;
    let enabled: BTreeSet<String> = servers(&tr)
        .iter()
        .flat_map(|s| s.tools.allow.iter().map(move |t| format!("{}:{t}", s.name)))
        .collect();
    let mut expected: BTreeSet<String> = eight.iter().map(|t| t.to_string()).collect();
    expected.extend(
        [
            "memory:read_graph",
            "memory:search_nodes",
            "filesystem:read_file",
        ]
        .map(String::from),
    );
    assert_eq!(
        enabled, expected,
        "every concurrent add-context took effect"
    );
    assert_eq!(
        tr.metadata
            .annotations
            .unwrap_or_default()
            .get("test/noise"),
        Some(&noise_writes.to_string()),
        "and the other writer's last write survived too"
    );
    let retried = attempts.iter().filter(|a| **a > 1).count();
    eprintln!(
        "add-context attempts per call: {attempts:?} ({retried} of {} calls retried after losing \
         a race; {noise_writes} unrelated writes ran meanwhile)",
        attempts.len()
    );
    ns.delete().await
}

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
async fn catalog_commands_read_the_configmap_the_operator_reads() -> Result<()> {
    let (client, ns) = setup("cli-catalog").await?;
    create_catalog_configmap(&client, &ns.name, "orchestrator-catalog").await?;
    let from_cluster = |args: &[&str]| {
        let mut cmd = std::process::Command::new(cluster_support::BIN);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig_path())
            .args(["--catalog-namespace", &ns.name])
            .args(args)
            .env_remove("KUBECONFIG")
            .env_remove("ORCH_CATALOG_FILE")
            .env_remove("ORCH_CATALOG_NAMESPACE")
            .env_remove("ORCH_CATALOG_NAME");
        cmd.output().expect("the CLI runs")
    };
    let out = from_cluster(&["catalog", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        [
            "everything",
            "filesystem",
            "git",
            "github",
            "memory",
            "time"
        ]
    );
    assert!(
        text.contains("github       stdio       26      GITHUB_PERSONAL_ACCESS_TOKEN"),
        "{text}"
    );

    let out = from_cluster(&["catalog", "show", "time", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let time: Value = serde_json::from_slice(&out.stdout)?;
    let tools: Vec<&str> = time["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(tools, ["get_current_time", "convert_time"]);

    // The ConfigMap's catalog also validates add-context input.
    let out = from_cluster(&[
        "task",
        "add-context",
        "-n",
        &ns.name,
        "x",
        "--enable-tools",
        "jira:*",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("known servers: everything, filesystem"));

    // Pointing at a ConfigMap that does not exist: not found, with how to fix it.
    let out = from_cluster(&["catalog", "list", "--catalog-name", "nope"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the catalog ConfigMap {}/nope does not exist",
            ns.name
        )) && stderr.contains("--catalog-namespace and --catalog-name"),
        "{stderr}"
    );
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

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn concurrent_submits_without_a_task_id_get_distinct_ids() -> Result<()> {
    let (client, ns) = setup("cli-ids").await?;
    let submit = || {
        let args = [
            "task",
            "submit",
            "--service",
            "web",
            "--prompt",
            "x",
            "--tools",
            "time:*",
        ];
        run_async(
            ns.name.clone(),
            args.iter().map(|s| s.to_string()).collect(),
        )
    };
    let outs = futures::future::join_all((0..4).map(|_| submit())).await;
    let names: BTreeSet<String> = outs.iter().map(|o| o.ok().trim().to_string()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["task-1", "task-2", "task-3", "task-4"].map(String::from)),
        "four submits, four tasks"
    );
    let ids: BTreeSet<i64> = taskruns(&client, &ns.name)
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|t| t.spec.task_id)
        .collect();
    assert_eq!(ids, BTreeSet::from([1, 2, 3, 4]));
    ns.delete().await
}
