//! The real `orchestrator-cli` binary against the real control plane of `e2e/cluster`: `task
//! cancel`, `task delete`, `task list -l` and `--watch`, `task approvals -A [--watch]`, `task
//! logs`. No operator runs here: where a command reads what the operator writes (the phase, the
//! approvals, the Job's name), the test writes that status itself through the status subresource,
//! so these tests judge what the CLI writes and reads.
//!
//! Run: `e2e/cluster up`, then
//! `cargo test -p orchestrator-cli --test cluster_lifecycle -- --ignored`.

mod cluster_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cluster_support::{cli, run, setup, taskruns};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::result::CANCEL_ANNOTATION;
use orchestrator_e2e::{TestNamespace, wait_for};
use serde_json::{Value, json};

/// Creates TaskRun `name` in `ns` with `labels`.
async fn create(client: &Client, ns: &str, name: &str, labels: Value) -> Result<TaskRun> {
    let tr: TaskRun = serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taskId": 1, "serviceName": "web", "task": {"prompt": "x"}},
    }))?;
    Ok(taskruns(client, ns)
        .create(&PostParams::default(), &tr)
        .await?)
}

/// Writes `status` (merged) as the operator would.
async fn set_status(client: &Client, ns: &str, name: &str, status: Value) -> Result<()> {
    taskruns(client, ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    Ok(())
}

/// A running CLI whose stdout lines arrive on a channel; killed on drop.
struct Watching {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watching {
    fn start(ns: &str, args: &[&str]) -> Result<Self> {
        Self::start_reading(ns, args, false)
    }

    /// Reads the CLI's stdout, or (`stderr`) its stderr.
    fn start_reading(ns: &str, args: &[&str], stderr: bool) -> Result<Self> {
        let mut child = cli(ns, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout: Box<dyn std::io::Read + Send> = if stderr {
            Box::new(child.stderr.take().context("stderr")?)
        } else {
            Box::new(child.stdout.take().context("stdout")?)
        };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// The next line for which `pred` holds (within 30 s).
    fn expect(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return Ok(line);
                    }
                }
                Err(_) => bail!(
                    "no line with {what}; printed so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The user the e2e admin credentials are, as the API server says (the CLI's own check).
async fn me(client: &Client) -> Result<String> {
    orchestrator_cli::identity::whoami(client)
        .await
        .context("SelfSubjectReview")
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn cancel_names_the_caller_once_and_refuses_a_finished_task() -> Result<()> {
    let (client, ns) = setup("cli-cancel").await?;
    let api = taskruns(&client, &ns.name);
    create(&client, &ns.name, "t-run", json!({})).await?;
    set_status(
        &client,
        &ns.name,
        "t-run",
        json!({"phase": "Running", "jobName": "t-run"}),
    )
    .await?;

    let out = run(&ns.name, &["task", "cancel", "t-run"]);
    let me = me(&client).await?;
    assert!(
        out.ok()
            .contains(&format!("cancel requested: TaskRun t-run, by {me}")),
        "{}",
        out.stdout
    );
    let tr = api.get("t-run").await?;
    let value = tr
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CANCEL_ANNOTATION))
        .cloned();
    assert_eq!(value, Some(json!({"user": me}).to_string()));

    // A second cancel writes nothing: the first name stands.
    let again = run(&ns.name, &["task", "cancel", "t-run"]);
    again.ok();
    assert!(
        again
            .stderr
            .contains(&format!("{me} asked to cancel it already")),
        "{}",
        again.stderr
    );
    assert_eq!(
        api.get("t-run").await?.metadata.resource_version,
        tr.metadata.resource_version
    );

    // describe shows the request until the operator acts, then who and when; get shows the phase.
    let text = run(&ns.name, &["task", "describe", "t-run"]);
    assert!(
        text.ok()
            .contains(&format!("Cancelled:   requested by {me}; the operator")),
        "{}",
        text.stdout
    );
    set_status(
        &client,
        &ns.name,
        "t-run",
        json!({"phase": "Cancelled", "completionTime": "2026-01-01T00:00:00Z",
               "cancellation": {"requestedBy": me, "time": "2026-01-01T00:00:00Z"}}),
    )
    .await?;
    let text = run(&ns.name, &["task", "describe", "t-run"]);
    assert!(
        text.ok()
            .contains(&format!("Cancelled:   by {me} at 2026-01-01T00:00:00Z")),
        "{}",
        text.stdout
    );
    assert!(
        run(&ns.name, &["task", "get", "t-run"])
            .ok()
            .contains(" Cancelled ")
    );

    // A finished task: refused naming its phase, nothing written.
    create(&client, &ns.name, "t-done", json!({})).await?;
    set_status(&client, &ns.name, "t-done", json!({"phase": "Succeeded"})).await?;
    let before = api.get("t-done").await?.metadata.resource_version;
    let out = run(&ns.name, &["task", "cancel", "t-done"]);
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    assert!(
        out.stderr.contains("its phase is Succeeded"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("nothing was written"), "{}", out.stderr);
    assert_eq!(api.get("t-done").await?.metadata.resource_version, before);

    // Two cancels at once on a fresh task: exactly one writes, the other sees it.
    create(&client, &ns.name, "t-race", json!({})).await?;
    set_status(&client, &ns.name, "t-race", json!({"phase": "Running"})).await?;
    let piped =
        |mut c: std::process::Command| c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let a = piped(cli(&ns.name, &["task", "cancel", "t-race"]))?;
    let b = piped(cli(&ns.name, &["task", "cancel", "t-race"]))?;
    let (a, b) = (a.wait_with_output()?, b.wait_with_output()?);
    assert!(a.status.success() && b.status.success());
    let wrote = [&a, &b]
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stdout).contains("cancel requested"))
        .count();
    assert_eq!(wrote, 1, "one cancel writes, the other finds it written");
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn delete_waits_until_the_taskrun_is_gone() -> Result<()> {
    let (client, ns) = setup("cli-delete").await?;
    create(&client, &ns.name, "t-del", json!({})).await?;
    let out = run(
        &ns.name,
        &["task", "delete", "t-del", "--wait", "--timeout", "30s"],
    );
    assert_eq!(out.ok(), "taskrun t-del deleted\n");
    assert!(
        taskruns(&client, &ns.name)
            .get_opt("t-del")
            .await?
            .is_none()
    );
    let again = run(&ns.name, &["task", "delete", "t-del"]);
    assert_eq!(again.code, Some(3), "{}", again.stderr);
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn list_selects_by_label_and_watch_sees_changes() -> Result<()> {
    let (client, ns) = setup("cli-watch").await?;
    create(&client, &ns.name, "t-a", json!({"team": "a"})).await?;
    create(&client, &ns.name, "t-b", json!({"team": "b"})).await?;
    let out = run(&ns.name, &["task", "list", "-l", "team=a"]);
    let names: Vec<&str> = out
        .ok()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["t-a"]);
    let bad = run(&ns.name, &["task", "list", "-l", "team in ("]);
    assert_eq!(
        bad.code,
        Some(1),
        "a selector the API server refuses: {}",
        bad.stderr
    );

    // --watch prints the API server's table, as `task list` does (-o wide: its priority columns).
    let wide = run(&ns.name, &["task", "list", "-o", "wide", "-l", "team=a"]);
    let wide = wide.ok();
    let header = wide.lines().next().unwrap_or_default().to_string();
    assert!(header.contains(" PROXY "), "{wide}");
    let mut watch = Watching::start(
        &ns.name,
        &["task", "list", "--watch", "-o", "wide", "-l", "team=a"],
    )?;
    watch.expect("the first table", |l| l.starts_with("t-a "))?;
    assert_eq!(watch.seen[0], header, "the watch's columns are the list's");
    create(&client, &ns.name, "t-a2", json!({"team": "a"})).await?;
    watch.expect("the new TaskRun", |l| l.starts_with("t-a2 "))?;
    create(&client, &ns.name, "t-b2", json!({"team": "b"})).await?;
    set_status(&client, &ns.name, "t-a2", json!({"phase": "Running"})).await?;
    let row = watch.expect("t-a2 Running", |l| {
        l.starts_with("t-a2 ") && l.contains("Running")
    })?;
    println!("watch printed:\n{}", watch.seen.join("\n"));
    assert!(
        !watch.seen.iter().any(|l| l.starts_with("t-b")),
        "the selector holds"
    );
    taskruns(&client, &ns.name)
        .delete("t-a2", &Default::default())
        .await?;
    watch.expect("t-a2 Deleted", |l| {
        l.starts_with("t-a2 ") && l.contains("Deleted")
    })?;
    assert!(row.contains("Running"));
    drop(watch);
    ns.delete().await
}

fn approval(id: &str, state: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now();
    json!({"id": id, "server": "github", "tool": "merge_pr", "state": state,
        "digest": format!("sha256:{}", "ab".repeat(32)), "contextVersion": 1,
        "requestedAt": now.to_string(),
        "expiresAt": (now + Duration::from_secs(300)).to_string()})
}

/// Lets `user` read TaskRuns in `ns` only.
async fn reader(client: &Client, ns: &str, user: &str) -> Result<()> {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "taskrun-reader"},
        "rules": [{"apiGroups": ["orchestrator.io"], "resources": ["taskruns"],
                   "verbs": ["get", "list", "watch"]}]
    }))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "taskrun-readers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "taskrun-reader"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]
    }))?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn the_approvals_inbox_spans_namespaces_and_falls_back_on_403() -> Result<()> {
    let (client, one) = setup("cli-inbox-a").await?;
    let two = TestNamespace::create(&client, "cli-inbox-b").await?;
    let label = format!("inbox={}", one.name);
    let labels = json!({"inbox": one.name});
    create(&client, &one.name, "t-1", labels.clone()).await?;
    create(&client, &two.name, "t-2", labels.clone()).await?;
    set_status(
        &client,
        &one.name,
        "t-1",
        json!({"phase": "Running",
        "approvals": [approval("a1", "Pending"), approval("a0", "Approved")]}),
    )
    .await?;
    set_status(
        &client,
        &two.name,
        "t-2",
        json!({"phase": "Running",
        "approvals": [approval("b1", "Pending")]}),
    )
    .await?;

    let out = run(&one.name, &["task", "approvals", "-A", "-l", &label]);
    let text = out.ok();
    println!("{text}{}", out.stderr);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAMESPACE", "TASK", "ID", "TOOL", "AGE", "EXPIRES"]
    );
    let mut got: Vec<(&str, &str, &str)> = rows[1..].iter().map(|r| (r[0], r[1], r[2])).collect();
    got.sort();
    let mut want = vec![
        (one.name.as_str(), "t-1", "a1"),
        (two.name.as_str(), "t-2", "b1"),
    ];
    want.sort();
    assert_eq!(
        got, want,
        "pending calls of both namespaces, not the decided one"
    );
    assert!(
        out.stderr.contains("task approvals t-1 --show a1")
            || out.stderr.contains("task approvals t-2 --show b1")
    );

    // A user who may list TaskRuns in one namespace only: told so, shown that namespace.
    reader(&client, &one.name, "carol").await?;
    let out = run(
        &one.name,
        &["--as", "carol", "task", "approvals", "-A", "-l", &label],
    );
    let text = out.ok();
    assert!(
        out.stderr
            .contains("you may not list TaskRuns in all namespaces"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains(&format!("showing namespace {} only", one.name)),
        "{}",
        out.stderr
    );
    assert!(text.contains(" a1 ") && !text.contains(" b1 "), "{text}");

    // --watch: the calls waiting now, a new one as it appears, and a decision.
    let mut watch = Watching::start(
        &one.name,
        &["task", "approvals", "-A", "--watch", "-l", &label],
    )?;
    watch.expect("a1", |l| l.contains(" a1 ") && l.contains("Pending"))?;
    watch.expect("b1", |l| l.contains(" b1 ") && l.contains("Pending"))?;
    let mut decided = approval("b1", "Approved");
    decided["decidedBy"] = json!("alice");
    set_status(
        &client,
        &two.name,
        "t-2",
        json!({"approvals": [decided, approval("b2", "Pending")]}),
    )
    .await?;
    watch.expect("b1 decided", |l| {
        l.contains(" b1 ") && l.contains("Approved by alice")
    })?;
    watch.expect("b2 waiting", |l| {
        l.contains(" b2 ") && l.contains("Pending")
    })?;
    println!("watch printed:\n{}", watch.seen.join("\n"));
    drop(watch);
    two.delete().await?;
    one.delete().await
}

/// The agent image the real node has (loaded by `e2e/cluster up`).
async fn agent_image(client: &Client) -> Result<String> {
    let node = Api::<Node>::all(client.clone()).get("vm").await?;
    node.status
        .and_then(|s| s.images)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|i| i.names.unwrap_or_default())
        .find(|n| n.starts_with("orchestrator.local/orchestrator-agent:"))
        .context("the real node has no agent image")
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn logs_print_the_agent_and_say_when_the_pod_is_gone() -> Result<()> {
    let (client, ns) = setup("cli-logs").await?;
    // Not started: no Job yet.
    create(&client, &ns.name, "t-new", json!({})).await?;
    set_status(&client, &ns.name, "t-new", json!({"phase": "Pending"})).await?;
    let out = run(&ns.name, &["task", "logs", "t-new"]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("has no Job yet"), "{}", out.stderr);

    // Finished, its pod cleaned up: says so and points at describe.
    create(&client, &ns.name, "t-old", json!({})).await?;
    set_status(
        &client,
        &ns.name,
        "t-old",
        json!({"phase": "Succeeded", "jobName": "t-old"}),
    )
    .await?;
    let out = run(&ns.name, &["task", "logs", "t-old"]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("the pod of TaskRun t-old is gone"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("orchestrator-cli task describe t-old"),
        "{}",
        out.stderr
    );

    // A pod of the Job on the real node: its agent's log, whole (-f: until it ends).
    let image = agent_image(&client).await?;
    create(&client, &ns.name, "t-live", json!({})).await?;
    set_status(
        &client,
        &ns.name,
        "t-live",
        json!({"phase": "Running", "jobName": "t-live"}),
    )
    .await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "t-live-abcde", "labels": {"batch.kubernetes.io/job-name": "t-live"}},
        "spec": {"nodeName": "vm", "restartPolicy": "Never", "containers": [{
            "name": "agent", "image": image, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "echo 'the answer is 42'; printf 'ansi \\033[2J end\\n'"]}]},
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    pods.create(&PostParams::default(), &pod).await?;
    let out = run(&ns.name, &["task", "logs", "t-live", "-f"]);
    println!("task logs -f:\n{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.ok(),
        "the answer is 42\nansi \u{1b}[2J end\n",
        "a pipe gets the bytes as they are"
    );
    wait_for("the pod to end", Duration::from_secs(60), || async {
        let p = pods.get("t-live-abcde").await?;
        Ok(p.status.and_then(|s| s.phase).filter(|p| p == "Succeeded"))
    })
    .await?;
    let out = run(&ns.name, &["task", "logs", "t-live", "--tail", "1"]);
    assert_eq!(out.ok(), "ansi \u{1b}[2J end\n");
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn submit_wait_shows_a_waiting_call_once_and_exits_5_when_cancelled() -> Result<()> {
    let (client, ns) = setup("cli-wait").await?;
    let mut wait = Watching::start_reading(
        &ns.name,
        &[
            "task",
            "submit",
            "--service",
            "web",
            "--prompt",
            "x",
            "--tools",
            "memory:*",
            "--name",
            "t-wait",
            "--wait",
        ],
        true,
    )?;
    let api = taskruns(&client, &ns.name);
    wait_for("the TaskRun", Duration::from_secs(30), || async {
        Ok(api.get_opt("t-wait").await?)
    })
    .await?;
    set_status(&client, &ns.name, "t-wait", json!({"phase": "Running"})).await?;
    wait.expect("Running", |l| l == "t-wait: Running")?;
    set_status(
        &client,
        &ns.name,
        "t-wait",
        json!({"approvals": [approval("c1", "Pending")]}),
    )
    .await?;
    let line = wait.expect("the waiting call", |l| l.contains("waiting for approval"))?;
    assert!(line.contains("call c1 to github/merge_pr"), "{line}");
    assert!(
        line.contains(&format!(
            "orchestrator-cli -n {} task approvals t-wait --show c1",
            ns.name
        )),
        "{line}"
    );
    // Another status write with the call still pending: not shown again.
    set_status(
        &client,
        &ns.name,
        "t-wait",
        json!({"servedContextVersion": 1}),
    )
    .await?;
    set_status(
        &client,
        &ns.name,
        "t-wait",
        json!({"phase": "Cancelled", "cancellation": {"requestedBy": "alice",
            "time": "2026-01-01T00:00:00Z"}}),
    )
    .await?;
    wait.expect("Cancelled", |l| l == "t-wait: Cancelled by alice")?;
    let line = wait.expect("the error", |l| l.starts_with("error:"))?;
    assert!(line.contains("TaskRun t-wait was cancelled"), "{line}");
    let status = wait.child.wait()?;
    assert_eq!(status.code(), Some(5));
    let shown = wait
        .seen
        .iter()
        .filter(|l| l.contains("waiting for approval"))
        .count();
    assert_eq!(shown, 1, "each waiting call once: {:?}", wait.seen);
    ns.delete().await
}
