//! The CLI's waiting flags against the real operator: the `orchestrator-operator` binary runs as
//! a subprocess out of the cluster (as `e2e/` runs it for the demo), scoped to the test's
//! namespace, with the catalog ConfigMap there; kwok plays the nodes and completes Job pods.
//!
//! - `submit --wait` follows a task to Succeeded (exit 0) or Failed (exit 5);
//! - `add-context --wait-synced` returns once the operator rendered the change, with the new
//!   context version, which the ConfigMap and `describe` then show;
//! - a change the operator refuses ends `--wait-synced` with its reason (exit 5);
//! - revoking every tool is rendered (an empty tool set), not refused.
//!
//! Run: `e2e/cluster up`, then
//! `cargo test -p orchestrator-cli --test cluster_operator -- --ignored`.
//! (The test builds the operator with cargo first; that is a no-op when it is up to date.)

mod cluster_support;

use std::time::Duration;

use anyhow::Result;
use cluster_support::{Operator, create_catalog_configmap, ensure_crd};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::api::PostParams;
use kube::{Api, Client};
use orchestrator_crds::proxy::ProxyConfig;
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_e2e::{TestNamespace, client, wait_for};
use serde_json::{Value, json};

const CATALOG: &str = "orchestrator-catalog";

async fn setup(prefix: &str) -> Result<(Client, TestNamespace, Operator)> {
    let client = client().await?;
    ensure_crd(&client).await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    create_catalog_configmap(&client, &ns.name, CATALOG).await?;
    let operator = Operator::start(&ns.name, CATALOG)?;
    Ok((client, ns, operator))
}

/// The CLI reading the catalog from the same ConfigMap as the operator.
fn cli(ns: &str, args: &[&str]) -> cluster_support::Run {
    let mut full = vec!["--catalog-namespace", ns, "--catalog-name", CATALOG];
    full.extend_from_slice(args);
    cluster_support::run_without_catalog_file(ns, &full)
}

/// The proxy config the operator rendered into task-1001's ConfigMap.
async fn rendered_proxy(client: &Client, ns: &str) -> Result<ProxyConfig> {
    let cm: ConfigMap = Api::namespaced(client.clone(), ns)
        .get("task-1001-tools")
        .await?;
    let data = cm.data.unwrap_or_default();
    let text = data
        .get("proxy.yaml")
        .map(String::as_str)
        .unwrap_or_default();
    Ok(serde_saphyr::from_str(text)?)
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn wait_follows_the_task_and_wait_synced_returns_the_rendered_context() -> Result<()> {
    let (client, ns, operator) = setup("cli-op").await?;

    // submit --wait: the operator creates the Job, kwok runs and completes the pod.
    let out = cli(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--prompt",
            "remember things",
            "--task-id",
            "1001",
            "--tools",
            "memory:read_graph,everything:echo",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert_eq!(
        out.code,
        Some(0),
        "stdout: {}\nstderr: {}\noperator:\n{}",
        out.stdout,
        out.stderr,
        operator.logs()
    );
    assert_eq!(out.stdout, "task-1001\n");
    assert!(
        out.stderr.ends_with("task-1001: Succeeded\n"),
        "phases as they come: {}",
        out.stderr
    );
    let out = cli(&ns.name, &["task", "list", "--phase", "succeeded"]);
    assert!(
        out.ok()
            .contains("task-1001   1001   todo-api   Succeeded   2 "),
        "{}",
        out.stdout
    );

    // A no-op add-context with --wait-synced waits for the operator to have caught up...
    let out = cli(
        &ns.name,
        &[
            "task",
            "add-context",
            "task-1001",
            "--enable-tools",
            "memory:read_graph",
            "--wait-synced",
            "-o",
            "json",
        ],
    );
    let first: Value = serde_json::from_str(out.ok())?;
    assert_eq!(first["changed"], false);
    let v1 = first["contextVersion"]
        .as_i64()
        .expect("a context version once synced");

    // ...and a real change returns with the next context version, rendered into the ConfigMap.
    let out = cli(
        &ns.name,
        &[
            "task",
            "add-context",
            "--task-id",
            "1001",
            "--enable-tools",
            "memory:search_nodes",
            "--disable-tools",
            "everything:echo",
            "--wait-synced",
        ],
    );
    let text = out.ok();
    assert!(
        text.contains(&format!(
            "synced: the operator rendered context version {}\n",
            v1 + 1
        )),
        "{text}"
    );
    assert!(
        text.contains("everything: 1 tool → off\n  - echo\n"),
        "{text}"
    );
    let tr: TaskRun = Api::namespaced(client.clone(), &ns.name)
        .get("task-1001")
        .await?;
    assert_eq!(
        tr.status.as_ref().and_then(|s| s.context_version),
        Some(v1 + 1)
    );
    let proxy = rendered_proxy(&client, &ns.name).await?;
    assert_eq!(i64::try_from(proxy.context_version)?, v1 + 1);
    let memory = proxy
        .servers
        .iter()
        .find(|s| s.name == "memory")
        .expect("memory in proxy config");
    assert_eq!(memory.tools.allow, ["read_graph", "search_nodes"]);

    // describe now shows the operator's view and its events.
    let out = wait_for(
        "describe to show the ToolsUpdated event",
        Duration::from_secs(30),
        || async {
            let out = cli(&ns.name, &["task", "describe", "task-1001"]);
            Ok((out.code == Some(0) && out.stdout.contains("ToolsUpdated")).then_some(out))
        },
    )
    .await?;
    for expected in [
        "Phase:       Succeeded\n",
        &format!("Context:     version {}\n", v1 + 1),
        "Job:         task-1001\n",
        "ConfigMap:   task-1001-tools\n",
        "Effective tools (reported by the operator):\n  memory: read_graph, search_nodes\n",
    ] {
        assert!(
            out.stdout.contains(expected),
            "describe lacks {expected:?}:\n{}",
            out.stdout
        );
    }
    assert!(
        out.stdout
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["Succeeded", "True"])),
        "conditions table:\n{}",
        out.stdout
    );

    // Revoking every tool is a change like any other: the operator renders the empty set (it
    // used to block the TaskRun as NothingEnabled, leaving the broader ConfigMap in force).
    let out = cli(
        &ns.name,
        &[
            "task",
            "add-context",
            "task-1001",
            "--disable-tools",
            "memory:*,everything:*",
            "--wait-synced",
        ],
    );
    out.ok();
    assert!(
        out.stderr.contains("is offered no MCP tool now"),
        "{}",
        out.stderr
    );
    let proxy = rendered_proxy(&client, &ns.name).await?;
    assert_eq!(i64::try_from(proxy.context_version)?, v1 + 2);
    assert!(
        !proxy.servers.is_empty() && proxy.servers.iter().all(|s| !s.enabled),
        "every server switched off: {:?}",
        proxy.servers
    );
    let tr: TaskRun = Api::namespaced(client.clone(), &ns.name)
        .get("task-1001")
        .await?;
    assert_eq!(
        tr.status.as_ref().and_then(|s| s.context_version),
        Some(v1 + 2),
        "the operator reports the empty set as served context"
    );
    drop(operator);
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn failures_end_the_waits_with_exit_5() -> Result<()> {
    let (client, ns, operator) = setup("cli-opfail").await?;

    // A quota of zero pods: the Job can never start its pod, so its deadline fails it.
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}
    }))?;
    Api::<ResourceQuota>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &quota)
        .await?;
    let out = cli(
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
            "time:*",
            "--active-deadline-seconds",
            "2",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert_eq!(
        out.code,
        Some(5),
        "stdout: {}\nstderr: {}\noperator:\n{}",
        out.stdout,
        out.stderr,
        operator.logs()
    );
    assert!(
        out.stderr.ends_with(
            "error: TaskRun task-1 failed (see `orchestrator-cli task describe task-1`)\n"
        ),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("task-1: Failed\n"), "{}", out.stderr);

    // A task that stays unfinished (no deadline; the quota keeps its pod from starting).
    cli(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--prompt",
            "x",
            "--task-id",
            "2",
            "--tools",
            "memory:*",
            "--with-servers",
            "time",
        ],
    )
    .ok();

    // The CLI's catalog (a newer file) knows `time`; the operator's ConfigMap has no `time`:
    // the CLI accepts the change, the operator refuses it, and --wait-synced reports why.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut cm = cms.get(CATALOG).await?;
    let text = cm.data.clone().unwrap_or_default()["catalog.yaml"].clone();
    let mut catalog = orchestrator_crds::catalog::Catalog::parse(&text)?;
    catalog.servers.retain(|s| s.name != "time");
    cm.data = Some(
        [(
            "catalog.yaml".to_string(),
            serde_saphyr::to_string(&catalog)?,
        )]
        .into(),
    );
    cms.replace(CATALOG, &PostParams::default(), &cm).await?;
    // The operator must hold the new catalog before the change reaches it: its watch of the
    // ConfigMap and of the TaskRun race, and a reconcile that starts first renders the change
    // with the old catalog, which knows `time` (seen once in CI).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !operator
        .logs()
        .lines()
        .any(|l| l.contains("catalog loaded") && !l.contains("\"time\""))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the operator did not load the catalog without `time` within 30 s:\n{}",
            operator.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let out = cluster_support::run(
        &ns.name,
        &[
            "task",
            "add-context",
            "task-2",
            "--enable-tools",
            "time:get_current_time",
            "--wait-synced",
            "--timeout",
            "60s",
        ],
    );
    assert_eq!(
        out.code,
        Some(5),
        "stdout: {}\nstderr: {}\noperator:\n{}",
        out.stdout,
        out.stderr,
        operator.logs()
    );
    assert!(
        out.stderr
            .contains("error: the operator did not apply the change:")
            && out.stderr.contains("UnknownServer"),
        "{}",
        out.stderr
    );
    drop(operator);
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn cancel_wait_ends_with_the_operator_writing_cancelled_by_the_caller() -> Result<()> {
    let (client, ns, operator) = setup("cli-op-cancel").await?;
    // kwok leaves a pod with this agent image Running (e2e/cluster's stages): the task runs on.
    let out = cli(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "todo-api",
            "--prompt",
            "run until cancelled",
            "--task-id",
            "7",
            "--tools",
            "memory:read_graph",
            "--image",
            "e2e.orchestrator.invalid/scripted-agent:latest",
        ],
    );
    assert_eq!(out.ok(), "task-7\n");
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    wait_for("task-7 Running", Duration::from_secs(60), || async {
        let tr = api.get("task-7").await?;
        Ok(tr
            .status
            .and_then(|s| s.phase)
            .filter(|p| *p == orchestrator_crds::taskrun::Phase::Running))
    })
    .await?;

    let out = cli(
        &ns.name,
        &["task", "cancel", "task-7", "--wait", "--timeout", "60s"],
    );
    assert_eq!(
        out.code,
        Some(0),
        "stdout: {}\nstderr: {}\noperator:\n{}",
        out.stdout,
        out.stderr,
        operator.logs()
    );
    let me = orchestrator_cli::identity::whoami(&client)
        .await
        .unwrap_or_default();
    assert!(out.stdout.contains(&format!("by {me}")), "{}", out.stdout);
    assert!(
        out.stderr
            .ends_with(&format!("task-7: Cancelled by {me}\n")),
        "{}",
        out.stderr
    );
    let tr = api.get("task-7").await?;
    let status = tr.status.unwrap_or_default();
    assert_eq!(
        status.cancellation.map(|c| c.requested_by),
        Some(me.clone())
    );

    let text = cli(&ns.name, &["task", "describe", "task-7"]);
    assert!(
        text.ok().contains(&format!("Cancelled:   by {me} at ")),
        "{}",
        text.stdout
    );
    // Cancelled is final: a second cancel is refused naming the phase.
    let again = cli(&ns.name, &["task", "cancel", "task-7"]);
    assert_eq!(again.code, Some(5), "{}", again.stderr);
    assert!(
        again.stderr.contains("its phase is Cancelled"),
        "{}",
        again.stderr
    );
    // The Job is gone: logs say the pod is gone and point at describe.
    let logs = cli(&ns.name, &["task", "logs", "task-7"]);
    println!("task logs after cancel: {}", logs.stderr);
    assert_eq!(logs.code, Some(3), "{}", logs.stderr);
    assert!(
        logs.stderr.contains("deleted when the task was cancelled"),
        "{}",
        logs.stderr
    );
    ns.delete().await
}
