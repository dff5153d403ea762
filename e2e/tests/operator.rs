//! The operator on the real control plane (issue 4's "It must show"). Each test has a namespace
//! of its own, a catalog ConfigMap in it (from `config/catalog.yaml`), and its own operator
//! running in-process with `--namespace` set to it, so tests run in parallel without meeting.
//! kwok plays the nodes: pods bound to them run and, owned by a Job, succeed at once; a pod that
//! must stay unfinished asks for more CPU than any node has, so it stays Pending. The first test
//! enforces the "restricted" Pod Security Standard on its namespace.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskRun, limits};
use orchestrator_e2e::{TestNamespace, client, install_taskrun_crd, repo_root, wait_for};
use orchestrator_operator::Settings;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const MINUTE: Duration = Duration::from_secs(60);

/// The operator running in this process.
struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<orchestrator_operator::Result<()>>,
    bind: std::net::SocketAddr,
}

impl Operator {
    /// Starts an operator scoped to `ns` (catalog and lease there too).
    async fn start(client: &Client, ns: &str, extra: &[&str]) -> Result<Self> {
        let port = free_port()?;
        let bind = format!("127.0.0.1:{port}");
        let mut args = vec![
            "orchestrator-operator",
            "--namespace",
            ns,
            "--catalog-namespace",
            ns,
            "--lease-namespace",
            ns,
            "--bind",
            &bind,
            "--lease-duration-seconds",
            "3",
        ];
        args.extend_from_slice(extra);
        let settings = Settings::from_args(args)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(orchestrator_operator::run_with(
            client.clone(),
            settings,
            async {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            stop: Some(stop),
            task,
            bind: bind.parse()?,
        })
    }

    /// Stops it the way SIGTERM does (releases the lease).
    async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }

    /// Kills it mid-flight: nothing is released, in-flight requests are dropped.
    fn kill(self) {
        self.task.abort();
    }

    /// GET a path of its HTTP endpoint; returns the body.
    async fn get(&self, path: &str) -> Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.bind).await?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        let (head, body) = out.split_once("\r\n\r\n").context("HTTP response")?;
        if !head.starts_with("HTTP/1.1 200") {
            bail!("GET {path}: {head}");
        }
        Ok(body.to_string())
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A namespace with the CRD installed and the shipped catalog in a ConfigMap.
async fn setup(prefix: &str) -> Result<(Client, TestNamespace)> {
    let client = client().await?;
    install_taskrun_crd(&client).await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    put_catalog(
        &client,
        &ns.name,
        &std::fs::read_to_string(repo_root().join("config/catalog.yaml"))?,
    )
    .await?;
    Ok((client, ns))
}

async fn put_catalog(client: &Client, ns: &str, yaml: &str) -> Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orchestrator-catalog"},
        "data": {"catalog.yaml": yaml},
    });
    cms.patch(
        "orchestrator-catalog",
        &PatchParams::apply("orchestrator-e2e").force(),
        &Patch::Apply(cm),
    )
    .await?;
    Ok(())
}

/// A sample from `config/samples/`, renamed.
fn sample(file: &str, name: &str) -> Result<TaskRun> {
    let text = std::fs::read_to_string(repo_root().join("config/samples").join(file))?;
    let mut tr: TaskRun = serde_saphyr::from_str(&text)?;
    tr.metadata.name = Some(name.into());
    Ok(tr)
}

/// Makes the task's pod unschedulable on kwok's nodes, so its Job stays unfinished.
fn keep_pending(tr: &mut TaskRun) {
    let agent = tr.spec.agent.get_or_insert_with(Default::default);
    agent.resources =
        Some(serde_json::from_value(json!({"requests": {"cpu": "100000"}})).unwrap_or_default());
}

async fn create(client: &Client, ns: &str, tr: &TaskRun) -> Result<TaskRun> {
    let api: Api<TaskRun> = Api::namespaced(client.clone(), ns);
    Ok(api.create(&PostParams::default(), tr).await?)
}

fn condition<'a>(
    tr: &'a TaskRun,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    tr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Waits until the TaskRun's status satisfies `check`.
async fn wait_status(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&TaskRun) -> bool,
) -> Result<TaskRun> {
    let api: Api<TaskRun> = Api::namespaced(client.clone(), ns);
    wait_for(what, MINUTE, || async {
        let tr = api.get(name).await?;
        Ok(check(&tr).then_some(tr))
    })
    .await
}

async fn events_for(client: &Client, ns: &str, name: &str) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect())
}

async fn wait_event(client: &Client, ns: &str, name: &str, reason: &str) -> Result<Event> {
    wait_for(&format!("event {reason} on {name}"), MINUTE, || async {
        Ok(events_for(client, ns, name)
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason)))
    })
    .await
}

fn owned_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    tr: &TaskRun,
) -> bool {
    meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == "TaskRun"
            && Some(&o.uid) == tr.metadata.uid.as_ref()
    })
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn applied_taskrun_gets_its_configmap_and_job_and_succeeds() -> Result<()> {
    let (client, ns) = setup("op-apply").await?;
    // Pod Security Admission refuses any pod of this namespace that is not "restricted".
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let label =
        json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
    namespaces
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(label))
        .await?;
    let op = Operator::start(&client, &ns.name, &[]).await?;
    let tr = create(&client, &ns.name, &sample("taskrun.yaml", "task-1001")?).await?;

    // The ConfigMap and the Job exist, both controlled by the TaskRun.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let cm = wait_for("the ConfigMap", MINUTE, || async {
        Ok(cms.get_opt("task-1001-tools").await?)
    })
    .await?;
    let job = wait_for("the Job", MINUTE, || async {
        Ok(jobs.get_opt("task-1001").await?)
    })
    .await?;
    assert!(
        owned_by(&cm.metadata, &tr),
        "ConfigMap owner references: {:?}",
        cm.metadata.owner_references
    );
    assert!(
        owned_by(&job.metadata, &tr),
        "Job owner references: {:?}",
        job.metadata.owner_references
    );
    let data = cm.data.context("ConfigMap data")?;
    let proxy: orchestrator_crds::proxy::ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"])?;
    assert_eq!(proxy.context_version, 1);
    assert_eq!(
        proxy
            .servers
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["everything", "memory"]
    );

    // The Job controller creates the pod (admitted as "restricted") with both containers: the
    // proxy as a native sidecar.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = wait_for("the Job's pod", MINUTE, || async {
        Ok(pods
            .list(&ListParams::default().labels("job-name=task-1001"))
            .await?
            .items
            .into_iter()
            .next())
    })
    .await?;
    let spec = pod.spec.context("pod spec")?;
    let proxy_c = &spec.init_containers.as_ref().context("init containers")?[0];
    assert_eq!(
        (proxy_c.name.as_str(), proxy_c.restart_policy.as_deref()),
        ("mcp-proxy", Some("Always"))
    );
    assert_eq!(
        spec.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["agent"]
    );
    let tools = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "tools")
        .context("tools volume")?;
    assert_eq!(
        tools.config_map.as_ref().map(|c| c.name.as_str()),
        Some("task-1001-tools")
    );

    // kwok completes it; the TaskRun reaches Succeeded with every condition true.
    let done = wait_status(&client, &ns.name, "task-1001", "phase Succeeded", |t| {
        t.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded)
    })
    .await?;
    for c in ["Ready", "ConfigRendered", "JobCreated", "Succeeded"] {
        assert_eq!(
            condition(&done, c).map(|c| c.status.as_str()),
            Some("True"),
            "{c}: {:?}",
            done.status
        );
    }
    let status = done.status.context("status")?;
    assert_eq!(status.observed_generation, done.metadata.generation);
    assert_eq!(
        (
            status.job_name.as_deref(),
            status.config_map_name.as_deref()
        ),
        (Some("task-1001"), Some("task-1001-tools"))
    );
    assert_eq!(status.context_version, Some(1));
    assert_eq!(
        status
            .tools
            .iter()
            .map(|t| t.server.as_str())
            .collect::<Vec<_>>(),
        ["everything", "memory"]
    );
    assert!(status.enabled_tool_count.unwrap_or(0) > 0);
    wait_event(&client, &ns.name, "task-1001", "JobCreated").await?;
    wait_event(&client, &ns.name, "task-1001", "TaskSucceeded").await?;

    // The endpoints answer.
    assert_eq!(op.get("/healthz").await?, "ok\n");
    let metrics = op.get("/metrics").await?;
    assert!(
        metrics.contains("orchestrator_operator_reconciles_total{outcome=\"ok\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("orchestrator_operator_reconcile_duration_seconds_count"),
        "{metrics}"
    );

    op.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn tool_config_patch_rerenders_the_configmap_only() -> Result<()> {
    let (client, ns) = setup("op-patch").await?;
    let op = Operator::start(&client, &ns.name, &[]).await?;
    let mut tr = sample("taskrun.yaml", "task-1001")?;
    keep_pending(&mut tr);
    create(&client, &ns.name, &tr).await?;
    let before = wait_status(&client, &ns.name, "task-1001", "Ready", |t| {
        condition(t, "Ready").is_some_and(|c| c.status == "True")
    })
    .await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let job_before = jobs.get("task-1001").await?;
    let cm_before = cms.get("task-1001-tools").await?;

    // What add-context does: a server-side apply of toolConfig by another field manager.
    let patch = json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-1001"},
        "spec": {"toolConfig": {"mcpServers": [
            {"name": "everything", "tools": {"allow": ["echo", "get-sum", "get-*", "trigger-long-running-operation"], "deny": ["get-env", "get-tiny-image"]}},
        ]}},
    });
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    let patched = api
        .patch(
            "task-1001",
            &PatchParams::apply("orchestrator-cli"),
            &Patch::Apply(patch),
        )
        .await?;
    let generation = patched.metadata.generation;

    let after = wait_status(
        &client,
        &ns.name,
        "task-1001",
        "contextVersion 2 applied",
        |t| {
            t.status.as_ref().is_some_and(|s| {
                s.context_version == Some(2) && s.observed_generation == generation
            })
        },
    )
    .await?;
    assert_eq!(
        condition(&after, "ConfigRendered").map(|c| c.status.as_str()),
        Some("True")
    );
    let cm = cms.get("task-1001-tools").await?;
    assert_ne!(cm.data, cm_before.data, "the ConfigMap content changed");
    let proxy: orchestrator_crds::proxy::ProxyConfig =
        serde_saphyr::from_str(&cm.data.clone().unwrap_or_default()["proxy.yaml"])?;
    assert_eq!(proxy.context_version, 2);
    assert_eq!(proxy.servers[0].tools.deny, ["get-env", "get-tiny-image"]);
    assert_eq!(
        cm.annotations()
            .get("orchestrator.io/context-version")
            .map(String::as_str),
        Some("2")
    );
    let exposed = after
        .status
        .as_ref()
        .and_then(|s| s.tools.first())
        .and_then(|t| t.exposed.clone())
        .unwrap_or_default();
    assert!(
        exposed.contains(&"trigger-long-running-operation".to_string())
            && !exposed.contains(&"get-tiny-image".to_string()),
        "{exposed:?}"
    );
    let updated = wait_event(&client, &ns.name, "task-1001", "ToolsUpdated").await?;
    assert!(
        updated
            .note
            .as_deref()
            .unwrap_or_default()
            .starts_with("contextVersion 2"),
        "{:?}",
        updated.note
    );

    // The Job is untouched: same object, same generation, same pod template.
    let job_after = jobs.get("task-1001").await?;
    assert_eq!(job_after.uid(), job_before.uid());
    assert_eq!(
        job_after.metadata.generation,
        job_before.metadata.generation
    );
    assert_eq!(
        job_after.spec.map(|s| s.template),
        job_before.spec.map(|s| s.template)
    );
    assert_eq!(before.status.and_then(|s| s.context_version), Some(1));

    // Re-reconciling the same config never bumps the version again.
    let api_tr = api.get("task-1001").await?;
    assert_eq!(api_tr.status.and_then(|s| s.context_version), Some(2));

    op.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn unknown_server_gets_a_condition_and_no_job() -> Result<()> {
    let (client, ns) = setup("op-unknown").await?;
    let op = Operator::start(&client, &ns.name, &[]).await?;
    let mut tr = sample("taskrun.yaml", "task-1003")?;
    tr.spec
        .tool_config
        .mcp_servers
        .push(orchestrator_crds::taskrun::McpServer::new(
            "jira",
            &["*"],
            &[],
        ));
    create(&client, &ns.name, &tr).await?;
    let blocked = wait_status(&client, &ns.name, "task-1003", "Ready=False", |t| {
        condition(t, "Ready").is_some_and(|c| c.status == "False")
    })
    .await?;
    let ready = condition(&blocked, "Ready").context("Ready")?;
    assert_eq!(ready.reason, "UnknownServer");
    assert!(
        ready.message.contains("\"jira\"")
            && ready
                .message
                .contains("known servers: everything, filesystem, git, github, memory, time"),
        "{}",
        ready.message
    );
    assert_eq!(
        condition(&blocked, "JobCreated").map(|c| c.status.as_str()),
        Some("False")
    );
    wait_event(&client, &ns.name, "task-1003", "UnknownServer").await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    assert!(
        jobs.get_opt("task-1003").await?.is_none(),
        "no Job for an unknown server"
    );
    assert!(
        cms.get_opt("task-1003-tools").await?.is_none(),
        "no ConfigMap either"
    );

    // Fixing the spec lets it through.
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    let fix = json!({"spec": {"toolConfig": {"mcpServers": [{"name": "time"}]}}});
    api.patch("task-1003", &PatchParams::default(), &Patch::Merge(fix))
        .await?;
    wait_for("the Job after the fix", MINUTE, || async {
        Ok(jobs.get_opt("task-1003").await?)
    })
    .await?;

    op.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn invalid_objects_are_refused_by_cel_at_apply() -> Result<()> {
    let (client, ns) = setup("op-cel").await?;
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    let refused = |body: serde_json::Value, expect: &'static str| {
        let api = api.clone();
        async move {
            let tr: TaskRun = serde_json::from_value(body)?;
            match api.create(&PostParams::default(), &tr).await {
                Err(kube::Error::Api(s)) if s.code == 422 => {
                    assert!(
                        s.message.contains(expect),
                        "expected {expect:?} in: {}",
                        s.message
                    );
                    Ok(())
                }
                other => bail!("expected a 422 naming {expect:?}, got {other:?}"),
            }
        }
    };
    let base = |name: &str, spec: serde_json::Value| json!({"apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name}, "spec": spec});
    let ok = |extra: serde_json::Value| {
        let mut spec = json!({"taskId": 7, "serviceName": "todo-api", "task": {"prompt": "x"}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        spec
    };
    refused(
        base(
            "dup",
            ok(json!({"toolConfig": {"mcpServers": [{"name": "time"}, {"name": "time"}]}})),
        ),
        "spec.toolConfig.mcpServers",
    )
    .await?;
    refused(
        base(
            "empty-pattern",
            ok(json!({"toolConfig": {"mcpServers": [{"name": "time", "tools": {"allow": [""]}}]}})),
        ),
        "patterns must not be empty",
    )
    .await?;
    refused(
        base(
            "bad-server",
            ok(json!({"toolConfig": {"mcpServers": [{"name": "Time_Server"}]}})),
        ),
        "must be a DNS-1123 label",
    )
    .await?;
    refused(
        base(
            "bad-service",
            json!({"taskId": 7, "serviceName": "Todo API", "task": {"prompt": "x"}}),
        ),
        "must be a DNS-1123 label",
    )
    .await?;
    refused(
        base("two-sources", ok(json!({"task": {"prompt": "x", "configMapKeyRef": {"name": "t", "key": "task.md"}}}))),
        "exactly one of prompt, configMapKeyRef, secretKeyRef",
    )
    .await?;
    refused(
        base(&"x".repeat(58), ok(json!({}))),
        "at most 57 characters",
    )
    .await?;
    refused(
        base(
            "bad-toleration",
            ok(json!({"podTemplate": {"tolerations": [{"key": "k", "operator": "Bogus"}]}})),
        ),
        "a toleration's operator must be Exists or Equal",
    )
    .await?;
    refused(
        base(
            "keyless-toleration",
            ok(json!({"podTemplate": {"tolerations": [{"operator": "Equal", "value": "v"}]}})),
        ),
        "a toleration without a key must have operator Exists",
    )
    .await?;
    refused(
        base(
            "bad-account",
            ok(json!({"serviceAccountName": "Task Runner"})),
        ),
        "must be a DNS-1123 subdomain",
    )
    .await?;
    // Agent permission rules Claude Code could not parse (it would skip them and leave the tool
    // enabled): refused, naming the rule.
    let rules = |allow: serde_json::Value, deny: serde_json::Value| {
        ok(
            json!({"toolConfig": {"internalTools": {"permissions": {"allow": allow, "deny": deny}}}}),
        )
    };
    refused(
        base("lower-deny", rules(json!(["*"]), json!(["webfetch"]))),
        "rule \"webfetch\" names a tool in lower case",
    )
    .await?;
    refused(
        base(
            "open-paren",
            rules(json!(["*"]), json!(["WebFetch", "Bash(foo"])),
        ),
        "rule \"Bash(foo\" is malformed",
    )
    .await?;
    refused(
        base(
            "mcp-content",
            rules(json!(["mcp__github__get_issue(x)"]), json!([])),
        ),
        "gives an MCP tool a (content)",
    )
    .await?;
    refused(
        base("wild-allow", rules(json!(["Web*"]), json!([]))),
        "rule \"Web*\" puts a * in the tool name of an allow rule",
    )
    .await?;
    refused(
        base("empty-prefix", rules(json!(["*"]), json!(["Bash(:*)"]))),
        "has an empty prefix before :*",
    )
    .await?;
    assert!(
        api.list(&ListParams::default()).await?.items.is_empty(),
        "nothing was stored"
    );
    // What Claude Code accepts is accepted.
    let good: TaskRun = serde_json::from_value(base(
        "good-rules",
        rules(
            json!([
                "Read(./src/**)",
                "Bash(npm test:*)",
                "mcp__github__get_*",
                "*"
            ]),
            json!([
                "Bash(npm test:*)",
                "WebFetch",
                "Web*",
                "mcp__github__*",
                "Bash(echo (x))"
            ]),
        ),
    ))?;
    api.create(&PostParams::default(), &good).await?;
    api.delete("good-rules", &Default::default()).await?;

    // task, agent and the pod's placement are immutable once the TaskRun exists; toolConfig is
    // not.
    let created: TaskRun = serde_json::from_value(base(
        "immutable",
        ok(json!({
            "agent": {"image": "a:1"},
            "serviceAccountName": "runner",
            "podTemplate": {"nodeSelector": {"pool": "agents"}},
            "proxy": {"resources": {"limits": {"memory": "256Mi"}}},
        })),
    ))?;
    api.create(&PostParams::default(), &created).await?;
    for (patch, expect) in [
        (
            json!({"spec": {"task": {"prompt": "y"}}}),
            "spec.task is immutable",
        ),
        (
            json!({"spec": {"agent": {"image": "b:2"}}}),
            "spec.agent is immutable",
        ),
        (json!({"spec": {"taskId": 8}}), "spec.taskId is immutable"),
        (
            json!({"spec": {"podTemplate": {"nodeSelector": {"pool": "other"}}}}),
            "spec.podTemplate is immutable",
        ),
        (
            json!({"spec": {"serviceAccountName": "other"}}),
            "spec.serviceAccountName is immutable",
        ),
        (
            json!({"spec": {"proxy": {"resources": {"limits": {"memory": "1Gi"}}}}}),
            "spec.proxy is immutable",
        ),
    ] {
        match api
            .patch("immutable", &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 => {
                assert!(s.message.contains(expect), "{}", s.message)
            }
            other => bail!("expected a refusal naming {expect:?}, got {other:?}"),
        }
    }
    let tools = json!({"spec": {"toolConfig": {"mcpServers": [{"name": "time"}]}}});
    api.patch("immutable", &PatchParams::default(), &Patch::Merge(tools))
        .await?;
    ns.delete().await
}

/// The spec's size limits (docs/api.md, "Size limits"): a value over its bound is refused at
/// apply time with a message naming the field, inside the embedded Kubernetes types too.
#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn oversized_values_are_refused_naming_the_field() -> Result<()> {
    let client = client().await?;
    install_taskrun_crd(&client).await?;
    let ns = TestNamespace::create(&client, "op-limits").await?;
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    let long = |n: usize| "x".repeat(n);
    for (name, extra, field, says) in [
        (
            "prompt",
            json!({"task": {"prompt": long(limits::PROMPT_CHARS + 1)}}),
            "spec.task.prompt",
            "Too long",
        ),
        (
            "env-value",
            json!({"agent": {"env": [{"name": "A", "value": long(limits::ENV_VALUE_CHARS as usize + 1)}]}}),
            "spec.agent.env[0].value",
            "Too long",
        ),
        (
            "arg",
            json!({"agent": {"args": [long(limits::ARG_CHARS + 1)]}}),
            "spec.agent.args[0]",
            "Too long",
        ),
        (
            "quantity",
            json!({"proxy": {"resources": {"limits": {"memory": format!("1{}", "0".repeat(64))}}}}),
            "spec.proxy.resources.limits.memory",
            "Too long",
        ),
        (
            "affinity",
            json!({"podTemplate": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": long(318), "operator": "Exists"}]}]}}}}}),
            "spec.podTemplate.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key",
            "Too long",
        ),
        (
            "label-key",
            json!({"podTemplate": {"nodeSelector": {long(318): "v"}}}),
            "spec.podTemplate.nodeSelector",
            "label keys must be at most 317 characters",
        ),
        (
            "risk-key",
            json!({"toolConfig": {"mcpServers": [{"name": "time", "risk": {long(257): "read"}}]}}),
            "spec.toolConfig.mcpServers[0].risk",
            "tool names must be at most 256 characters",
        ),
    ] {
        let mut spec = json!({"taskId": 7, "serviceName": "todo-api", "task": {"prompt": "x"}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let tr: TaskRun = serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": name}, "spec": spec,
        }))?;
        match api.create(&PostParams::default(), &tr).await {
            Err(kube::Error::Api(s)) if s.code == 422 => {
                assert!(
                    s.message.contains(&format!("{field}: ")) && s.message.contains(says),
                    "{name}: expected {field:?} and {says:?} in: {}",
                    s.message
                );
            }
            Ok(_) => bail!("{name}: stored, though {field} is over its limit"),
            Err(e) => bail!("{name}: expected a 422 naming {field}, got {e}"),
        }
    }
    assert!(
        api.list(&ListParams::default()).await?.items.is_empty(),
        "nothing was stored"
    );
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn deleted_children_come_back_and_go_with_the_taskrun() -> Result<()> {
    let (client, ns) = setup("op-children").await?;
    let op = Operator::start(&client, &ns.name, &[]).await?;
    let mut tr = sample("taskrun.yaml", "task-1004")?;
    keep_pending(&mut tr);
    create(&client, &ns.name, &tr).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let job = wait_for("the Job", MINUTE, || async {
        Ok(jobs.get_opt("task-1004").await?)
    })
    .await?;
    let cm = wait_for("the ConfigMap", MINUTE, || async {
        Ok(cms.get_opt("task-1004-tools").await?)
    })
    .await?;

    cms.delete("task-1004-tools", &DeleteParams::default())
        .await?;
    let cm2 = wait_for("the ConfigMap to come back", MINUTE, || async {
        Ok(cms
            .get_opt("task-1004-tools")
            .await?
            .filter(|c| c.uid() != cm.uid()))
    })
    .await?;
    assert_eq!(cm2.data, cm.data, "recreated with the same content");
    assert_eq!(
        cm2.annotations()
            .get("orchestrator.io/context-version")
            .map(String::as_str),
        Some("1")
    );

    jobs.delete("task-1004", &DeleteParams::background())
        .await?;
    let job2 = wait_for("the Job to come back", MINUTE, || async {
        Ok(jobs
            .get_opt("task-1004")
            .await?
            .filter(|j| j.uid() != job.uid()))
    })
    .await?;
    // The same pod spec (the labels differ only by the Job controller's uid labels).
    assert!(
        job2.spec.map(|s| s.template.spec) == job.spec.map(|s| s.template.spec),
        "recreated from the same render"
    );

    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    api.delete("task-1004", &DeleteParams::default()).await?;
    wait_for(
        "the garbage collector to remove the Job and the ConfigMap",
        MINUTE,
        || async {
            let gone = jobs.get_opt("task-1004").await?.is_none()
                && cms.get_opt("task-1004-tools").await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;

    op.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn finished_taskruns_past_their_retention_go_with_their_children() -> Result<()> {
    let (client, ns) = setup("op-retention").await?;
    let op = Operator::start(&client, &ns.name, &["--max-finished-per-namespace", "2"]).await?;
    let trs: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let succeeded = |t: &TaskRun| t.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded);
    let all_gone = |name: &'static str| {
        let (trs, jobs, cms) = (trs.clone(), jobs.clone(), cms.clone());
        async move {
            let gone = trs.get_opt(name).await?.is_none()
                && jobs.get_opt(name).await?.is_none()
                && cms.get_opt(&format!("{name}-tools")).await?.is_none();
            Ok(gone.then_some(()))
        }
    };

    // An unfinished task is never deleted, whatever the limits.
    let mut pending = sample("taskrun.yaml", "task-pending")?;
    keep_pending(&mut pending);
    pending.spec.retention_seconds_after_finished = Some(0);
    create(&client, &ns.name, &pending).await?;

    // retentionSecondsAfterFinished: the TaskRun goes 2 s after its task finished, its Job and
    // ConfigMap with it; its outcome was recorded first.
    let mut short = sample("taskrun.yaml", "task-short")?;
    short.spec.retention_seconds_after_finished = Some(2);
    create(&client, &ns.name, &short).await?;
    wait_status(
        &client,
        &ns.name,
        "task-short",
        "task-short Succeeded",
        succeeded,
    )
    .await?;
    wait_for(
        "task-short, its Job and its ConfigMap to be deleted",
        MINUTE,
        || all_gone("task-short"),
    )
    .await?;

    // --max-finished-per-namespace 2: a third finished TaskRun deletes the first to finish.
    for name in ["task-first", "task-second", "task-third"] {
        create(&client, &ns.name, &sample("taskrun.yaml", name)?).await?;
        wait_status(
            &client,
            &ns.name,
            name,
            &format!("{name} Succeeded"),
            succeeded,
        )
        .await?;
    }
    wait_for(
        "task-first, its Job and its ConfigMap to be deleted",
        MINUTE,
        || all_gone("task-first"),
    )
    .await?;
    for name in ["task-second", "task-third"] {
        let tr = trs.get(name).await?;
        assert!(succeeded(&tr), "{name} is kept with its outcome");
        assert!(jobs.get_opt(name).await?.is_some(), "{name}'s Job is kept");
    }
    let tr = trs.get("task-pending").await?;
    assert_ne!(
        tr.status.and_then(|s| s.phase),
        Some(Phase::Succeeded),
        "the pending task is unfinished and kept"
    );

    let metrics = op.get("/metrics").await?;
    for line in [
        "orchestrator_operator_taskruns_deleted_total{reason=\"retention\"} 1",
        "orchestrator_operator_taskruns_deleted_total{reason=\"max_finished\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    op.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn a_restarted_operator_converges_without_duplicate_jobs() -> Result<()> {
    const N: usize = 30;
    let (client, ns) = setup("op-restart").await?;
    for i in 0..N {
        let mut tr = sample("taskrun.yaml", &format!("task-{i}"))?;
        tr.spec.task_id = i as i64;
        keep_pending(&mut tr);
        create(&client, &ns.name, &tr).await?;
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    // One reconcile at a time, so it is surely killed mid-way.
    let first = Operator::start(&client, &ns.name, &["--concurrency", "1"]).await?;
    wait_for("the first Job", MINUTE, || async {
        Ok((!jobs.list(&ListParams::default()).await?.items.is_empty()).then_some(()))
    })
    .await?;
    first.kill();
    let seen = jobs.list(&ListParams::default()).await?.items;
    assert!(
        seen.len() < N,
        "killed mid-way: {} of {N} Jobs existed",
        seen.len()
    );
    let created_before: Vec<(String, Option<String>)> =
        seen.iter().map(|j| (j.name_any(), j.uid())).collect();

    // The second replica waits for the dead one's lease to expire, then finishes the work.
    let second = Operator::start(&client, &ns.name, &[]).await?;
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns.name);
    wait_for(&format!("all {N} TaskRuns Ready"), 2 * MINUTE, || async {
        let trs = api.list(&ListParams::default()).await?.items;
        let ready = trs
            .iter()
            .filter(|t| condition(t, "Ready").is_some_and(|c| c.status == "True"))
            .count();
        Ok((ready == N).then_some(()))
    })
    .await?;
    let jobs_now = jobs.list(&ListParams::default()).await?.items;
    assert_eq!(jobs_now.len(), N, "one Job per TaskRun");
    let names: BTreeSet<String> = jobs_now.iter().map(|j| j.name_any()).collect();
    assert_eq!(names.len(), N);
    for (name, uid) in &created_before {
        let now = jobs_now
            .iter()
            .find(|j| &j.name_any() == name)
            .context("job still there")?;
        assert_eq!(&now.uid(), uid, "{name} was not recreated");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_for("one pod per Job", MINUTE, || async {
        let n = pods.list(&ListParams::default()).await?.items.len();
        Ok((n == N).then_some(()))
    })
    .await?;
    for tr in api.list(&ListParams::default()).await?.items {
        assert_eq!(
            tr.status.and_then(|s| s.context_version),
            Some(1),
            "{}: no spurious version bump",
            tr.metadata.name.unwrap_or_default()
        );
    }
    second.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn only_the_lease_holder_reconciles_and_a_standby_takes_over() -> Result<()> {
    let (client, ns) = setup("op-leader").await?;
    let a = Operator::start(&client, &ns.name, &["--identity", "replica-a"]).await?;
    wait_for("replica-a to lead", MINUTE, || async {
        Ok((a.get("/readyz").await? == "leader\n").then_some(()))
    })
    .await?;
    let b = Operator::start(&client, &ns.name, &["--identity", "replica-b"]).await?;
    // b stays a standby while a renews.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(b.get("/readyz").await?, "standby\n");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &ns.name);
    let holder =
        |l: k8s_openapi::api::coordination::v1::Lease| l.spec.and_then(|s| s.holder_identity);
    assert_eq!(
        holder(leases.get("orchestrator-operator").await?).as_deref(),
        Some("replica-a")
    );

    // a shuts down (releases the lease); b takes over and reconciles new work.
    a.stop().await?;
    wait_for("replica-b to lead", MINUTE, || async {
        Ok((b.get("/readyz").await? == "leader\n").then_some(()))
    })
    .await?;
    assert_eq!(
        holder(leases.get("orchestrator-operator").await?).as_deref(),
        Some("replica-b")
    );
    create(
        &client,
        &ns.name,
        &sample("taskrun.yaml", "task-after-failover")?,
    )
    .await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    wait_for("the Job from replica-b", MINUTE, || async {
        Ok(jobs.get_opt("task-after-failover").await?)
    })
    .await?;
    b.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn missing_secret_blocks_the_job_until_it_exists() -> Result<()> {
    let (client, ns) = setup("op-secret").await?;
    let op = Operator::start(&client, &ns.name, &[]).await?;
    create(
        &client,
        &ns.name,
        &sample("taskrun-github.yaml", "task-1002")?,
    )
    .await?;
    let blocked = wait_status(&client, &ns.name, "task-1002", "SecretNotFound", |t| {
        condition(t, "Ready").is_some_and(|c| c.reason == "SecretNotFound")
    })
    .await?;
    let msg = &condition(&blocked, "Ready").context("Ready")?.message;
    assert!(
        msg.contains("Secret")
            && msg.contains("github")
            && msg.contains("GITHUB_PERSONAL_ACCESS_TOKEN"),
        "{msg}"
    );
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    assert!(jobs.get_opt("task-1002").await?.is_none());

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let secret: Secret = serde_saphyr::from_str(&std::fs::read_to_string(
        repo_root().join("config/samples/github-secret.yaml"),
    )?)?;
    secrets.create(&PostParams::default(), &secret).await?;
    let job = wait_for("the Job once the Secret exists", MINUTE, || async {
        Ok(jobs.get_opt("task-1002").await?)
    })
    .await?;
    // The github server's own container has the token (the proxy does not).
    let github = job
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.init_containers)
        .and_then(|c| c.into_iter().find(|c| c.name == "zone-github"))
        .context("the github server's container")?;
    let token = github
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "GITHUB_PERSONAL_ACCESS_TOKEN")
        .context("token env")?;
    assert!(token.value.is_none(), "never a literal value");
    let sel = token
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .context("secretKeyRef")?;
    assert_eq!((sel.name.as_str(), sel.key.as_str()), ("github", "token"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm = cms.get("task-1002-tools").await?;
    assert!(
        !format!("{:?}", cm.data).contains("replace-with-a-github-token"),
        "the Secret's value is not in the ConfigMap"
    );
    op.stop().await?;
    ns.delete().await
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn catalog_changes_are_picked_up_and_a_bad_catalog_is_ignored() -> Result<()> {
    let (client, ns) = setup("op-catalog").await?;
    let op = Operator::start(&client, &ns.name, &[]).await?;
    let mut tr = sample("taskrun.yaml", "task-1005")?;
    tr.spec
        .tool_config
        .mcp_servers
        .push(orchestrator_crds::taskrun::McpServer::new(
            "docs",
            &["search"],
            &[],
        ));
    create(&client, &ns.name, &tr).await?;
    wait_status(&client, &ns.name, "task-1005", "UnknownServer", |t| {
        condition(t, "Ready").is_some_and(|c| c.reason == "UnknownServer")
    })
    .await?;

    // A broken catalog changes nothing.
    put_catalog(
        &client,
        &ns.name,
        "servers:\n  - name: docs\n    comand: x\n",
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = wait_status(&client, &ns.name, "task-1005", "still UnknownServer", |t| {
        condition(t, "Ready").is_some_and(|c| c.reason == "UnknownServer")
    })
    .await?;
    assert!(
        condition(&still, "Ready").is_some_and(|c| c.message.contains("known servers: everything"))
    );
    let metrics = op.get("/metrics").await?;
    assert!(
        metrics.contains("orchestrator_operator_catalog_loads_total{outcome=\"invalid\"} 1"),
        "{metrics}"
    );

    // A catalog that adds the server unblocks the TaskRun without touching it.
    let mut catalog = std::fs::read_to_string(repo_root().join("config/catalog.yaml"))?;
    catalog.push_str("\n  - name: docs\n    description: docs search\n    http: {url: \"http://127.0.0.1:9000/mcp\"}\n    tools:\n      - {name: search}\n");
    put_catalog(&client, &ns.name, &catalog).await?;
    let ready = wait_status(
        &client,
        &ns.name,
        "task-1005",
        "Ready after the catalog change",
        |t| condition(t, "Ready").is_some_and(|c| c.status == "True"),
    )
    .await?;
    let docs = ready
        .status
        .context("status")?
        .tools
        .into_iter()
        .find(|t| t.server == "docs")
        .context("docs tools")?;
    assert_eq!(docs.exposed, Some(vec!["search".to_string()]));
    op.stop().await?;
    ns.delete().await
}
