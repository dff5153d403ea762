//! `task add-context` against the real control plane: only the named tools change, the listing
//! shows before → after, and concurrent calls (with another writer busy on the same object) all
//! take effect.
//!
//! Run: `e2e/cluster up`, then
//! `cargo test -p orchestrator-cli --test cluster_add_context -- --ignored`.

mod cluster_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use cluster_support::{run, run_async, servers, setup, taskruns};
use kube::api::{Patch, PatchParams};
use orchestrator_crds::taskrun::McpServer;
use serde_json::{Value, json};

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
