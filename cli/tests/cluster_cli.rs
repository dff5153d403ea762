//! The real `orchestrator-cli` binary against the real control plane of `e2e/cluster`: submit,
//! get, list, describe and the catalog commands; the output formats (`-o wide|name|jsonpath`,
//! `--no-headers`, the API server's table, compared with kubectl's), `version`, the kubectl
//! plugin through a real kubectl, and shell completion from the cluster. No operator runs here (see
//! `cluster_operator.rs` for --wait and --wait-synced), so these tests judge what the CLI writes
//! and reads, not what the operator does with it.
//!
//! Run: `e2e/cluster up`, then `cargo test -p orchestrator-cli --test cluster_cli -- --ignored`.

mod cluster_support;

use std::collections::BTreeSet;

use anyhow::Result;
use cluster_support::{BIN, create_catalog_configmap, run, run_async, servers, setup, taskruns};
use kube::api::{Patch, PatchParams, PostParams};
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
    // The API server's table: no phase yet is an empty cell, as kubectl shows it.
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cells[..3], ["task-1001", "1001", "todo-api"], "{lines:?}");
    assert_eq!(cells.len(), 4, "name, task, service and age: {lines:?}");
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

/// A TaskRun made with the CLI (`task submit --task-id ID`), then given the status the operator
/// would write.
async fn task_with_status(client: &kube::Client, ns: &str, id: u32, status: Value) -> Result<()> {
    let id_text = id.to_string();
    let out = run(
        ns,
        &[
            "task",
            "submit",
            "--service",
            "web",
            "--prompt",
            "x",
            "--tools",
            "time:*",
            "--task-id",
            &id_text,
        ],
    );
    assert_eq!(out.ok(), format!("task-{id}\n"));
    taskruns(client, ns)
        .patch_status(
            &format!("task-{id}"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await?;
    Ok(())
}

/// kubectl's own output against the e2e cluster (its stdout; asserts it ran).
fn kubectl(args: &[&str]) -> String {
    let out = orchestrator_e2e::kubectl(args).expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first line's words (a table's header).
fn header(text: &str) -> Vec<String> {
    text.lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Each line's first word.
fn first_words(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn list_and_get_print_the_api_servers_table_and_every_output_format() -> Result<()> {
    let (client, ns) = setup("cli-output").await?;
    let n = ns.name.as_str();
    task_with_status(
        &client,
        n,
        1,
        serde_json::json!({"phase": "Running",
        "proxyMode": "sidecar", "enabledToolCount": 3, "contextVersion": 1}),
    )
    .await?;
    task_with_status(
        &client,
        n,
        2,
        serde_json::json!({"phase": "Succeeded",
        "proxyMode": "shared", "result": {"subtype": "success", "turns": 4, "costUsd": "0.0100"}}),
    )
    .await?;

    // The columns are the API server's (the CRD's printer columns), as kubectl prints them.
    let ours = run(n, &["task", "list"]);
    let theirs = kubectl(&["-n", n, "get", "taskruns.orchestrator.io"]);
    assert_eq!(
        header(ours.ok()),
        header(&theirs),
        "ours:\n{}\nkubectl:\n{theirs}",
        ours.stdout
    );
    assert_eq!(
        header(ours.ok()),
        [
            "NAME", "TASK", "SERVICE", "PHASE", "TOOLS", "CONTEXT", "SERVED", "RESULT", "TURNS",
            "COST", "AGE"
        ]
    );
    let mut rows: Vec<Vec<&str>> = ours
        .ok()
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    rows.sort();
    assert_eq!(
        rows[0][..5],
        ["task-1", "1", "web", "Running", "3"],
        "{}",
        ours.stdout
    );
    assert_eq!(
        rows[1][..7],
        ["task-2", "2", "web", "Succeeded", "success", "4", "0.0100"],
        "{}",
        ours.stdout
    );

    // -o wide adds the columns of priority > 0 (PROXY), as kubectl's -o wide does.
    let wide = run(n, &["task", "list", "-o", "wide"]);
    let theirs = kubectl(&["-n", n, "get", "taskruns.orchestrator.io", "-o", "wide"]);
    assert_eq!(
        header(wide.ok()),
        header(&theirs),
        "ours:\n{}\nkubectl:\n{theirs}",
        wide.stdout
    );
    assert!(header(wide.ok()).contains(&"PROXY".to_string()));
    assert!(
        wide.ok()
            .lines()
            .any(|l| l.starts_with("task-1 ") && l.contains(" sidecar ")),
        "{}",
        wide.stdout
    );
    let one = run(n, &["task", "get", "task-2", "-o", "wide"]);
    assert!(
        one.ok()
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains(" shared ")),
        "{}",
        one.stdout
    );

    // -A: NAMESPACE first, as kubectl -A.
    let all = run(n, &["task", "list", "-A", "--no-headers"]);
    assert!(
        all.ok()
            .lines()
            .any(|l| l.starts_with(&format!("{n} ")) && l.contains(" task-1 ")),
        "{}",
        all.stdout
    );

    // --no-headers: only the rows.
    let bare = run(n, &["task", "list", "--no-headers"]);
    let mut names = first_words(bare.ok());
    names.sort();
    assert_eq!(names, ["task-1", "task-2"], "{}", bare.stdout);
    let bare = run(n, &["task", "get", "task-1", "--no-headers", "-o", "wide"]);
    assert_eq!(bare.ok().lines().count(), 1, "{}", bare.stdout);
    assert!(bare.ok().starts_with("task-1 "), "{}", bare.stdout);

    // -o name: what kubectl -o name prints.
    let names = run(n, &["task", "list", "-o", "name"]);
    let mut ours: Vec<&str> = names.ok().lines().collect();
    ours.sort();
    let theirs = kubectl(&["-n", n, "get", "taskruns.orchestrator.io", "-o", "name"]);
    let mut kubectl_names: Vec<&str> = theirs.lines().collect();
    kubectl_names.sort();
    assert_eq!(ours, kubectl_names);
    assert_eq!(
        ours,
        [
            "taskrun.orchestrator.io/task-1",
            "taskrun.orchestrator.io/task-2"
        ]
    );
    let one = run(n, &["task", "get", "task-1", "-o", "name"]);
    assert_eq!(one.ok(), "taskrun.orchestrator.io/task-1\n");

    // -o jsonpath: the same text as kubectl's for the same template.
    for template in [
        "{.items[*].metadata.name}",
        "{range .items[*]}{.metadata.name}{\"\\t\"}{.status.phase}{\"\\n\"}{end}",
        "{.items[?(@.status.phase==\"Running\")].spec.taskId}",
    ] {
        let arg = format!("jsonpath={template}");
        let ours = run(n, &["task", "list", "-o", &arg]);
        let theirs = kubectl(&["-n", n, "get", "taskruns.orchestrator.io", "-o", &arg]);
        // Order: ours newest first, kubectl's by name; compare as sets of words/lines.
        let mut a: Vec<&str> = ours.ok().split_whitespace().collect();
        let mut b: Vec<&str> = theirs.split_whitespace().collect();
        a.sort();
        b.sort();
        assert_eq!(
            a, b,
            "{template}: ours {:?}, kubectl {theirs:?}",
            ours.stdout
        );
    }
    let id = run(
        n,
        &[
            "task",
            "get",
            "task-2",
            "-o",
            "jsonpath={.spec.taskId} {.status.result.subtype}",
        ],
    );
    assert_eq!(id.ok(), "2 success");

    // A template kubectl would refuse is refused before anything is read (exit 2).
    let bad = run(
        n,
        &[
            "task",
            "list",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}",
        ],
    );
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(bad.stderr.contains("has no {end}"), "{}", bad.stderr);
    let bad = run(n, &["task", "list", "-o", "jsonpaht={.a}"]);
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr
            .contains("table, wide, json, yaml, name, jsonpath=TEMPLATE"),
        "{}",
        bad.stderr
    );
    // -o name of what is not an API object is refused, naming what to use.
    let bad = run(n, &["task", "approvals", "task-1", "-o", "name"]);
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(bad.stderr.contains("-o jsonpath"), "{}", bad.stderr);

    // The category and the short name: kubectl get orchestrator / otr list them.
    let listed = kubectl(&["-n", n, "get", "orchestrator", "-o", "name"]);
    assert!(
        listed.contains("taskrun.orchestrator.io/task-1"),
        "{listed}"
    );
    let listed = kubectl(&["-n", n, "get", "otr", "-o", "name"]);
    assert!(
        listed.contains("taskrun.orchestrator.io/task-2"),
        "{listed}"
    );
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn version_shows_the_client_kubernetes_the_operator_and_the_crds() -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let (client, ns) = setup("cli-version").await?;
    let n = ns.name.as_str();

    // Nothing labelled as the chart's operator in the namespace named: the CLI looks further
    // (and finds one only if a chart is installed elsewhere); either way it says which.
    let before = run(n, &["version", "--catalog-namespace", n]);
    let text = before.ok();
    assert!(
        text.starts_with(&format!(
            "Client:      orchestrator-cli {} (API orchestrator.io/v1)\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    let k8s = orchestrator_e2e::pinned_version("K8S_VERSION")?;
    assert!(
        text.contains(&format!("Kubernetes:  v{}", k8s.trim_start_matches('v'))),
        "{text}"
    );
    assert!(
        text.contains("CRDs:        taskruns.orchestrator.io: served v1, storage v1, stored v1"),
        "{text}"
    );
    assert!(
        text.contains("             toolapprovals.orchestrator.io: served v1, storage v1"),
        "{text}"
    );
    let operator_line = text
        .lines()
        .find(|l| l.starts_with("Operator:"))
        .expect("an operator line");
    assert!(
        operator_line.contains("not installed: no Deployment labelled app.kubernetes.io/part-of=orchestrator,app.kubernetes.io/component=operator")
            || operator_line.contains("(Deployment "),
        "{text}"
    );

    // The chart's operator Deployment (its labels, as _helpers.tpl writes them).
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orchestrator-operator", "labels": {
            "app.kubernetes.io/name": "orchestrator", "app.kubernetes.io/instance": "orchestrator",
            "app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "orchestrator",
            "app.kubernetes.io/version": "9.9.9-test"}},
        "spec": {"replicas": 0,
            "selector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/component": "operator"}},
                "spec": {"containers": [{"name": "operator", "image": "example.invalid/orchestrator-operator:9.9.9-test"}]}}}
    }))?;
    kube::Api::<Deployment>::namespaced(client.clone(), n)
        .create(&PostParams::default(), &deployment)
        .await?;
    let after = run(n, &["version", "--catalog-namespace", n]);
    assert!(
        after.ok().contains(&format!(
            "Operator:    9.9.9-test (Deployment {n}/orchestrator-operator, image example.invalid/orchestrator-operator:9.9.9-test, 0/0 ready)\n"
        )),
        "{}",
        after.stdout
    );
    let json: Value =
        serde_json::from_str(run(n, &["version", "--catalog-namespace", n, "-o", "json"]).ok())?;
    assert_eq!(json["client"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["operator"]["deployments"][0]["version"], "9.9.9-test");
    assert_eq!(json["operator"]["deployments"][0]["namespace"], n);
    assert_eq!(json["crds"][0]["name"], "taskruns.orchestrator.io");
    assert_eq!(json["crds"][0]["served"], serde_json::json!(["v1"]));
    assert_eq!(json["crds"][0]["storage"], "v1");
    let yaml: Value =
        serde_saphyr::from_str(run(n, &["version", "--catalog-namespace", n, "-o", "yaml"]).ok())?;
    assert_eq!(yaml, json);
    let one = run(
        n,
        &[
            "version",
            "--catalog-namespace",
            n,
            "-o",
            "jsonpath={.operator.deployments[0].version}",
        ],
    );
    assert_eq!(one.ok(), "9.9.9-test");

    // A user who may read neither: each part says so, and the command still succeeds.
    let nobody = run(n, &["--as", "nobody", "version", "--catalog-namespace", n]);
    let text = nobody.ok();
    assert!(
        text.contains(&format!(
            "Operator:    not readable: you may not list deployments in namespace {n}"
        )),
        "{text}"
    );
    assert!(
        text.contains("not readable: you may not list deployments in all namespaces"),
        "{text}"
    );
    assert!(text.contains("taskruns.orchestrator.io: not readable: you may not get customresourcedefinition taskruns.orchestrator.io"), "{text}");

    // --client reads nothing: it works with a kubeconfig that leads nowhere.
    let offline = std::process::Command::new(BIN)
        .args(["--kubeconfig", "/nonexistent", "version", "--client"])
        .output()?;
    assert!(offline.status.success());
    assert_eq!(
        String::from_utf8_lossy(&offline.stdout),
        format!(
            "Client:      orchestrator-cli {} (API orchestrator.io/v1)\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn kubectl_finds_the_plugin_on_path() -> Result<()> {
    let (client, ns) = setup("cli-plugin").await?;
    let n = ns.name.as_str();
    task_with_status(&client, n, 5, serde_json::json!({"phase": "Running"})).await?;
    // The install: the binary (or a link to it) named kubectl-orchestrator, on PATH.
    let dir = tempfile::tempdir()?;
    std::os::unix::fs::symlink(BIN, dir.path().join("kubectl-orchestrator"))?;
    // And for `kubectl orchestrator <TAB>`: kubectl's plugin completion runs this name.
    std::os::unix::fs::symlink(BIN, dir.path().join("kubectl_complete-orchestrator"))?;
    let kubectl_dir = orchestrator_e2e::bin_dir()?;
    let path = format!(
        "{}:{}:{}",
        dir.path().display(),
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        std::process::Command::new(kubectl_dir.join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env_remove("KUBECONFIG")
            .output()
            .expect("kubectl runs")
    };
    let listed = kubectl(&["plugin", "list"]);
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(
        stdout.contains(&format!("{}/kubectl-orchestrator", dir.path().display())),
        "{stdout}"
    );

    let kubeconfig = orchestrator_e2e::kubeconfig_path();
    let k = kubeconfig.to_str().expect("utf-8");
    let out = kubectl(&[
        "orchestrator",
        "--kubeconfig",
        k,
        "-n",
        n,
        "version",
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(json["client"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["crds"][0]["storage"], "v1");
    let out = kubectl(&[
        "orchestrator",
        "--kubeconfig",
        k,
        "-n",
        n,
        "task",
        "list",
        "-o",
        "name",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "taskrun.orchestrator.io/task-5\n"
    );
    // Its help names it as typed.
    let out = kubectl(&["orchestrator", "task", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Usage: kubectl orchestrator task [OPTIONS] <COMMAND>"),
        "{help}"
    );
    // kubectl's own completion of the plugin's arguments (what a shell's kubectl completion
    // asks): the namespace's task, in Cobra's protocol, ending in "no file names".
    let out = kubectl(&[
        "__complete",
        "orchestrator",
        "--kubeconfig",
        k,
        "-n",
        n,
        "task",
        "get",
        "",
    ]);
    let offered = String::from_utf8_lossy(&out.stdout);
    assert!(
        offered.lines().any(|l| l == "task-5\ttask 5 (Running)"),
        "{offered}"
    );
    assert!(offered.ends_with(":4\n"), "{offered}");
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn completion_offers_the_namespaces_tasks_and_a_tasks_approval_ids() -> Result<()> {
    let (client, ns) = setup("cli-complete").await?;
    let n = ns.name.as_str();
    let now = k8s_openapi::jiff::Timestamp::now();
    let approval = |id: &str, state: &str| {
        serde_json::json!({"id": id, "server": "github",
        "tool": "merge_pr", "state": state, "digest": format!("sha256:{}", "ab".repeat(32)),
        "contextVersion": 1, "requestedAt": now.to_string(),
        "expiresAt": (now + std::time::Duration::from_secs(300)).to_string()})
    };
    task_with_status(
        &client,
        n,
        11,
        serde_json::json!({"phase": "Running",
        "approvals": [approval("3f9a0c1e", "Pending"), approval("77b01d2a", "Rejected")]}),
    )
    .await?;
    task_with_status(&client, n, 12, serde_json::json!({"phase": "Succeeded"})).await?;
    let kubeconfig = orchestrator_e2e::kubeconfig_path();
    let k = kubeconfig.to_str().expect("utf-8");
    // What a shell asks (fish's protocol: one candidate a line, TAB, its help).
    let complete = |words: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("--")
            .args(words)
            .env("COMPLETE", "fish")
            .env_remove("KUBECONFIG")
            .output()
            .expect("the CLI runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let offered = complete(&[
        "orchestrator-cli",
        "--kubeconfig",
        k,
        "-n",
        n,
        "task",
        "describe",
        "task-1",
    ]);
    assert!(
        offered.lines().any(|l| l == "task-11\ttask 11 (Running)"),
        "{offered}"
    );
    assert!(
        offered.lines().any(|l| l == "task-12\ttask 12 (Succeeded)"),
        "{offered}"
    );
    // Approve offers the pending calls only; --show every one.
    let offered = complete(&[
        "orchestrator-cli",
        "--kubeconfig",
        k,
        "-n",
        n,
        "task",
        "approve",
        "task-11",
        "",
    ]);
    let ids: Vec<&str> = offered.lines().filter(|l| !l.starts_with('-')).collect();
    assert_eq!(ids, ["3f9a0c1e\tgithub/merge_pr (Pending)"], "{offered}");
    let offered = complete(&[
        "orchestrator-cli",
        "--kubeconfig",
        k,
        "-n",
        n,
        "task",
        "approvals",
        "task-11",
        "--show",
        "",
    ]);
    assert!(
        offered.contains("3f9a0c1e\t") && offered.contains("77b01d2a\t"),
        "{offered}"
    );
    // Another namespace has other tasks: none of these.
    let offered = complete(&[
        "orchestrator-cli",
        "--kubeconfig",
        k,
        "-n",
        "default",
        "task",
        "get",
        "task-1",
    ]);
    assert!(!offered.contains("task-11"), "{offered}");
    // The registration a shell sources names the binary.
    let script = std::process::Command::new(BIN)
        .env("COMPLETE", "bash")
        .output()?;
    assert!(String::from_utf8_lossy(&script.stdout).contains("orchestrator-cli"));
    ns.delete().await
}
