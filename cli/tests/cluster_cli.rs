//! The real `orchestrator-cli` binary against the real control plane of `e2e/cluster`: submit,
//! get, list, describe and the catalog commands. No operator runs here (see
//! `cluster_operator.rs` for --wait and --wait-synced), so these tests judge what the CLI writes
//! and reads, not what the operator does with it.
//!
//! Run: `e2e/cluster up`, then `cargo test -p orchestrator-cli --test cluster_cli -- --ignored`.

mod cluster_support;

use std::collections::BTreeSet;

use anyhow::Result;
use cluster_support::{create_catalog_configmap, run, run_async, servers, setup, taskruns};
use kube::api::PostParams;
use orchestrator_crds::taskrun::{McpServer, TaskRun};
use orchestrator_e2e::{kubeconfig_path, repo_root};
use serde_json::Value;

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

/// `task validate`: the operator's checks against the cluster's catalog and the API server's
/// dry run (schema, strict fields) in one answer per TaskRun; nothing is created; a TaskRun
/// that exists is checked as an update of it.
#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn validate_reports_the_operators_and_the_api_servers_problems_and_writes_nothing()
-> Result<()> {
    let (client, ns) = setup("cli-validate").await?;
    create_catalog_configmap(&client, &ns.name, "orchestrator-catalog").await?;
    let sample = std::fs::read_to_string(repo_root().join("config/samples/taskrun.yaml"))?;
    let renamed = |name: &str| sample.replace("name: task-1001", &format!("name: {name}"));
    let docs = [
        sample.clone(),
        // Only the operator can judge CEL: the API server takes it.
        renamed("bad-cel").replace(
            "  toolConfig:\n",
            "  toolConfig:\n    policy:\n      conditions:\n        - {name: no-secrets, when: 'args.message.contains('}\n",
        ),
        // Only the API server judges these: a misspelt field (strict validation names it
        // instead of dropping the policy) and the schema's minimum.
        renamed("misspelt").replace("  toolConfig:\n", "  toolConfig:\n    polcy: {}\n"),
        renamed("negative").replace("taskId: 1001", "taskId: -5"),
        // The catalog read from the cluster's ConfigMap.
        renamed("unknown").replace("- name: memory", "- name: memroy"),
    ];
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("tasks.yaml");
    std::fs::write(&file, docs.join("---\n"))?;
    let file = file.to_str().expect("utf-8");
    let validate = |extra: &[&str]| {
        let mut args = vec!["--catalog-namespace", &ns.name, "task", "validate", file];
        args.extend_from_slice(extra);
        cluster_support::run_without_catalog_file(&ns.name, &args)
    };
    let out = validate(&["-o", "json"]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("4 of 5 TaskRuns would not be accepted"),
        "{}",
        out.stderr
    );
    let reports: Vec<Value> = serde_json::from_str(&out.stdout)?;
    let found: Vec<(&str, Vec<&str>)> = reports
        .iter()
        .map(|r| {
            let reasons = r["problems"].as_array().expect("problems").iter();
            (
                r["name"].as_str().unwrap_or(""),
                reasons.filter_map(|p| p["reason"].as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("task-1001", vec![]),
            ("bad-cel", vec!["InvalidCondition"]),
            ("misspelt", vec!["BadRequest"]),
            ("negative", vec!["Invalid"]),
            ("unknown", vec!["UnknownServer"]),
        ]
    );
    let message = |i: usize| reports[i]["problems"][0]["message"].as_str().unwrap_or("");
    assert!(message(1).contains("no-secrets"), "{}", message(1));
    assert!(
        message(2).contains("spec.toolConfig.polcy"),
        "{}",
        message(2)
    );
    assert!(message(3).contains("spec.taskId"), "{}", message(3));
    assert_eq!(
        reports[0]["checked"],
        serde_json::json!(["operator", "apiServer"])
    );
    // A dry run: nothing was created.
    assert!(
        taskruns(&client, &ns.name)
            .list(&Default::default())
            .await?
            .items
            .is_empty()
    );

    // The valid one, applied: the file is still valid, and says the TaskRun exists.
    let tr: TaskRun = serde_saphyr::from_str(&sample)?;
    taskruns(&client, &ns.name)
        .create(&PostParams::default(), &tr)
        .await?;
    std::fs::write(file, &sample)?;
    let out = validate(&[]);
    let text = out.ok();
    assert!(text.contains("TaskRun task-1001 in "), "{text}");
    assert!(text.contains(": valid\n"), "{text}");
    assert!(
        text.contains("note: a TaskRun named task-1001 exists in namespace"),
        "{text}"
    );
    Ok(())
}
