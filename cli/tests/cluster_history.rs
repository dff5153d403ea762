//! Who changed a task's tools, against the real control plane and the real operator (run out of
//! the cluster, as `cluster_operator.rs` runs it): two users, `alice` and `bob` (the e2e admin
//! impersonating them with `--as`, each allowed by a Role to change TaskRuns), each run
//! `task add-context`; `status.contextHistory` names alice for the first change and bob for the
//! second, `task describe` shows both, and a later `kubectl edit`-like write without the
//! annotation is credited to its field manager, not to bob whose annotation it left behind.
//!
//! Run: `e2e/cluster up`, then
//! `cargo test -p orchestrator-cli --test cluster_history -- --ignored`.

mod cluster_support;

use std::time::Duration;

use anyhow::{Result, bail};
use cluster_support::{Operator, create_catalog_configmap, ensure_crd};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::history::{ContextChange, Source};
use orchestrator_e2e::{TestNamespace, client, wait_for};
use serde_json::json;

const CATALOG: &str = "orchestrator-catalog";

/// The CLI as `user` (None: the e2e admin itself), reading the catalog the operator reads.
fn cli(ns: &str, user: Option<&str>, args: &[&str]) -> cluster_support::Run {
    let mut full = vec!["--catalog-namespace", ns, "--catalog-name", CATALOG];
    if let Some(user) = user {
        full.extend(["--as", user]);
    }
    full.extend_from_slice(args);
    cluster_support::run_without_catalog_file(ns, &full)
}

/// Lets `users` read the catalog and change TaskRuns in `ns` (and read their events).
async fn grant(client: &Client, ns: &str, users: &[&str]) -> Result<()> {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "taskrun-editor"},
        "rules": [
            {"apiGroups": ["orchestrator.io"], "resources": ["taskruns"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["list"]}
        ]
    }))?;
    let subjects: Vec<_> = users
        .iter()
        .map(|u| json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u}))
        .collect();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "taskrun-editors"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "taskrun-editor"},
        "subjects": subjects
    }))?;
    let pp = PostParams::default();
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &role)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &binding)
        .await?;
    Ok(())
}

/// The history once it records `version`.
async fn history_with(api: &Api<TaskRun>, version: i64) -> Result<Vec<ContextChange>> {
    wait_for(
        &format!("contextVersion {version} in the history"),
        Duration::from_secs(60),
        || async {
            let tr = api.get("task-1001").await?;
            let history = tr.status.map(|s| s.context_history).unwrap_or_default();
            Ok(history
                .iter()
                .any(|e| e.context_version == version)
                .then_some(history))
        },
    )
    .await
}

fn entry(history: &[ContextChange], version: i64) -> Result<&ContextChange> {
    match history.iter().find(|e| e.context_version == version) {
        Some(e) => Ok(e),
        None => bail!("no entry for contextVersion {version} in {history:?}"),
    }
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn the_history_names_who_granted_each_tool_and_when() -> Result<()> {
    let client = client().await?;
    ensure_crd(&client).await?;
    let ns = TestNamespace::create(&client, "cli-history").await?;
    create_catalog_configmap(&client, &ns.name, CATALOG).await?;
    grant(&client, &ns.name, &["alice", "bob"]).await?;
    let operator = Operator::start(&ns.name, CATALOG)?;
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);

    // The admin submits: version 1 names the admin (as the API server knows it).
    let out = cli(
        &ns.name,
        None,
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
            "filesystem:read_file",
            // Listed now, enabled later by add-context (a running task cannot gain a server).
            "--with-servers",
            "time,memory",
        ],
    );
    out.ok();
    let admin = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default();
    let history = history_with(&api, 1).await?;
    let first = entry(&history, 1)?;
    assert_eq!(
        (first.requested_by.as_str(), first.source),
        (admin.as_str(), Source::Annotation),
        "{first:?}"
    );
    assert_eq!(first.added, ["filesystem/read_file"]);

    // alice grants a tool, then bob grants another and revokes one.
    for (user, args) in [
        (
            "alice",
            ["--enable-tools", "time:get_current_time"].as_slice(),
        ),
        (
            "bob",
            [
                "--enable-tools",
                "memory:read_graph",
                "--disable-tools",
                "time:get_current_time",
            ]
            .as_slice(),
        ),
    ] {
        let mut full = vec!["task", "add-context", "task-1001", "--wait-synced"];
        full.extend_from_slice(args);
        let out = cli(&ns.name, Some(user), &full);
        assert_eq!(
            out.code,
            Some(0),
            "{user}: stdout: {}\nstderr: {}\noperator:\n{}",
            out.stdout,
            out.stderr,
            operator.logs()
        );
        assert!(!out.stderr.contains("could not ask"), "{}", out.stderr);
    }
    let history = history_with(&api, 3).await?;
    let by_alice = entry(&history, 2)?;
    assert_eq!(
        (by_alice.requested_by.as_str(), by_alice.source),
        ("alice", Source::Annotation)
    );
    assert_eq!(by_alice.added, ["time/get_current_time"]);
    assert!(by_alice.removed.is_empty(), "{by_alice:?}");
    let by_bob = entry(&history, 3)?;
    assert_eq!(
        (by_bob.requested_by.as_str(), by_bob.source),
        ("bob", Source::Annotation)
    );
    assert_eq!(
        (by_bob.added.as_slice(), by_bob.removed.as_slice()),
        (
            ["memory/read_graph".to_string()].as_slice(),
            ["time/get_current_time".to_string()].as_slice()
        )
    );
    assert!(by_alice.time <= by_bob.time);

    // describe (here as alice) shows who did what, and the event says it too.
    let out = wait_for(
        "describe to show bob's ToolsUpdated event",
        Duration::from_secs(30),
        || async {
            let out = cli(&ns.name, Some("alice"), &["task", "describe", "task-1001"]);
            Ok(
                (out.code == Some(0) && out.stdout.contains("contextVersion 3 by bob"))
                    .then_some(out),
            )
        },
    )
    .await?;
    let text = &out.stdout;
    println!("task describe, as alice:\n{text}");
    let line = |version: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(version))
            .unwrap_or_default()
            .to_string()
    };
    assert!(text.contains("Context history:\n"), "{text}");
    assert!(
        line("2").contains(" alice ") && line("2").ends_with("+time/get_current_time"),
        "{text}"
    );
    assert!(
        line("3").contains(" bob ")
            && line("3").ends_with("+memory/read_graph -time/get_current_time"),
        "{text}"
    );
    assert!(
        text.contains("contextVersion 2 by alice: +time/get_current_time"),
        "{text}"
    );

    // A write without the annotation (as `kubectl edit` makes): bob's annotation is still on
    // the object, but names an older generation; the change goes to its field manager.
    api.patch(
        "task-1001",
        &PatchParams {
            field_manager: Some("kubectl-edit".into()),
            ..Default::default()
        },
        &Patch::<()>::Json(serde_json::from_value(json!([
            {"op": "add", "path": "/spec/toolConfig/mcpServers/0/tools/allow",
             "value": ["read_file", "list_directory"]}
        ]))?),
    )
    .await?;
    let history = history_with(&api, 4).await?;
    let edited = entry(&history, 4)?;
    assert_eq!(
        (edited.requested_by.as_str(), edited.source),
        ("kubectl-edit", Source::FieldManager),
        "{edited:?}"
    );
    assert_eq!(edited.added, ["filesystem/list_directory"]);
    assert_eq!(history.len(), 4, "one entry per version: {history:?}");
    drop(operator);
    ns.delete().await
}
