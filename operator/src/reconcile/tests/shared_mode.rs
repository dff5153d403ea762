//! Shared-service mode: which mode a task gets (the TaskRun, then its Namespace's label, then
//! the flag; the recorded mode afterwards), what a shared task is refused for, and the life of
//! its ConfigMap in the shared proxy's namespace (applied, bound to the task's pod, deleted when
//! the task ends, swept when its TaskRun is gone).

use orchestrator_crds::shared::{
    CONFIG_LABEL, TASK_PHASE_ANNOTATION, TASK_POD_IP_ANNOTATION, TASK_POD_UID_ANNOTATION,
    TASK_UID_ANNOTATION,
};
use orchestrator_crds::taskrun::result::CANCEL_ANNOTATION;

use super::*;
use crate::namespaces::Watched;
use crate::render::SharedProxy;
use crate::render::shared::SHARED_PROXY_UNAVAILABLE;

const NAME: &str = "task-2001";
const PROXY_NS: &str = "orchestrator-system";
const JOB_UID: &str = "7c2e0d11-0000-4000-8000-000000002001";
const POD_UID: &str = "5d1f0000-0000-4000-8000-0000000000a1";

fn proxy() -> SharedProxy {
    SharedProxy {
        url: "http://orchestrator-mcp-proxy.orchestrator-system.svc:8080/mcp".into(),
        namespace: PROXY_NS.into(),
        service_account: "orchestrator-mcp-proxy".into(),
        audience: "orchestrator.io/mcp-proxy".into(),
    }
}

/// The shipped catalog plus an HTTP server.
fn catalog_with_http() -> Catalog {
    let tracker = r#"
  - name: tracker
    description: "An issue tracker over streamable HTTP"
    http:
      url: https://tracker.example.com/mcp
      headersFromEnv: {Authorization: TRACKER_TOKEN}
    secretEnv:
      - {name: TRACKER_TOKEN, secretKey: token, optional: true}
"#;
    Catalog::parse(&format!(
        "{}{tracker}",
        include_str!("../../../../config/catalog.yaml")
    ))
    .expect("catalog with tracker")
}

fn harness(shared: bool, default_mode: ProxyMode) -> Harness {
    Harness::with(catalog_with_http(), shared.then(proxy), default_mode)
}

/// A TaskRun of `servers`, in `mode` when given.
fn task(mode: Option<&str>, servers: Value) -> TaskRun {
    let mut spec = json!({"taskId": 2001, "serviceName": "todo-api", "task": {"prompt": "Triage."},
                          "toolConfig": {"mcpServers": servers}});
    if let Some(mode) = mode {
        spec["proxy"] = json!({"mode": mode});
    }
    let mut tr: TaskRun = serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": NAME, "namespace": NS, "uid": "0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c2001",
                     "generation": 1},
        "spec": spec
    }))
    .expect("a TaskRun");
    tr.metadata.generation = Some(1);
    tr
}

fn http_task(mode: Option<&str>) -> TaskRun {
    task(mode, json!([{"name": "tracker"}]))
}

fn label_namespace(h: &Harness, mode: &str) {
    h.fake.put(
        &format!("/api/v1/namespaces/{NS}"),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": NS, "labels": {"orchestrator.io/proxy-mode": mode}}}),
    );
}

fn shared_path() -> String {
    format!("/api/v1/namespaces/{PROXY_NS}/configmaps/task.{NS}.{NAME}")
}

/// The shared proxy's ConfigMap as its watch would show it.
fn sync_shared(h: &Harness) {
    if let Some(cm) = h.fake.get(&shared_path()) {
        let cm: ConfigMap = serde_json::from_value(cm).expect("a ConfigMap");
        h.shared_config_maps
            .apply(&watcher::Event::Apply(cm), shared::facts);
    }
}

fn job_containers(h: &Harness) -> Vec<String> {
    let job = h.fake.get(&path("jobs", NAME)).expect("the Job");
    let spec = &job["spec"]["template"]["spec"];
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[k].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

/// The Job as the server holds it, with its uid and `status`; the watches see it.
fn job_is(h: &mut Harness, status: Value) {
    let mut job = h.fake.get(&path("jobs", NAME)).expect("the Job");
    job["metadata"]["uid"] = json!(JOB_UID);
    job["status"] = status;
    h.fake.put(&path("jobs", NAME), job);
    h.sync_caches(NAME);
}

fn the_pod_runs(h: &Harness, ip: Option<&str>) {
    let mut status = json!({"phase": "Running"});
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
    }
    h.fake.put(
        &path("pods", "task-2001-abcde"),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "task-2001-abcde", "namespace": NS, "uid": POD_UID,
                "labels": {"batch.kubernetes.io/controller-uid": JOB_UID},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": NAME,
                                     "uid": JOB_UID, "controller": true}]},
            "status": status}),
    );
}

#[tokio::test]
async fn the_namespace_label_makes_a_task_shared_and_it_gets_no_proxy_container() {
    let mut h = harness(true, ProxyMode::Sidecar);
    label_namespace(&h, "shared");
    let tr = http_task(None);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    let status = written_status(&writes);
    assert_eq!(status.proxy_mode, Some(ProxyMode::Shared));
    assert_eq!(condition(&status, ct::READY).0, "True");
    assert_eq!(job_containers(&h), ["agent"]);
    // The shared proxy's RoleBinding, and its ConfigMap (no pod bound yet).
    assert!(
        h.fake
            .get(&path("rolebindings", "task-2001-shared-proxy"))
            .is_some()
    );
    let cm = h.fake.get(&shared_path()).expect("the shared ConfigMap");
    assert_eq!(cm["metadata"]["labels"][CONFIG_LABEL], "true");
    let annotations = &cm["metadata"]["annotations"];
    assert_eq!(annotations[TASK_PHASE_ANNOTATION], "Pending");
    assert_eq!(
        annotations[TASK_UID_ANNOTATION],
        "0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c2001"
    );
    assert!(annotations.get(TASK_POD_UID_ANNOTATION).is_none());
    // The task's own ConfigMap has no proxy config.
    let own = h
        .fake
        .get(&path("configmaps", &crate::render::config_map_name(NAME)))
        .expect("the task's ConfigMap");
    assert!(own["data"].get("proxy.yaml").is_none(), "{own}");

    // The pod runs and has its IP: the ConfigMap names it (the pod the Lease is bound to).
    let started = k8s_openapi::jiff::Timestamp::now().to_string();
    job_is(&mut h, json!({"active": 1, "startTime": started}));
    sync_shared(&h);
    the_pod_runs(&h, None);
    let tr = h.with_written_status(&tr);
    let action = h.reconcile(&tr).await;
    assert_eq!(
        action,
        Action::requeue(POD_RETRY),
        "no IP yet: looked at again soon"
    );
    sync_shared(&h);
    sync_lease(&mut h, NAME);
    the_pod_runs(&h, Some("10.244.0.17"));
    h.fake.take_writes();
    let action = h.reconcile(&h.with_written_status(&tr)).await;
    assert_eq!(action, Action::requeue(RESYNC));
    let cm = h.fake.get(&shared_path()).expect("the shared ConfigMap");
    let annotations = &cm["metadata"]["annotations"];
    assert_eq!(annotations[TASK_POD_UID_ANNOTATION], POD_UID);
    assert_eq!(annotations[TASK_POD_IP_ANNOTATION], "10.244.0.17");
    assert_eq!(annotations[TASK_PHASE_ANNOTATION], "Running");
    let lease = h.fake.get(&path("leases", NAME)).expect("the Lease");
    assert_eq!(
        lease["metadata"]["annotations"][orchestrator_crds::approval::BINDING_UID_ANNOTATION],
        POD_UID
    );
    assert_eq!(
        lease["metadata"]["annotations"][orchestrator_crds::shared::LEASE_MODE_ANNOTATION],
        "shared"
    );
    // A Job that started over two minutes ago whose pod has no IP (unschedulable, say): looked
    // at every minute, not every 2 s.
    let mut late = h.with_written_status(&tr);
    job_is(
        &mut h,
        json!({"active": 1, "startTime": "2026-01-01T00:00:00Z"}),
    );
    the_pod_runs(&h, None);
    h.shared_config_maps
        .apply(&watcher::Event::<ConfigMap>::Init, shared::facts);
    h.shared_config_maps
        .apply(&watcher::Event::<ConfigMap>::InitDone, shared::facts);
    late.metadata.generation = Some(1);
    assert_eq!(h.reconcile(&late).await, Action::requeue(RESYNC));
    the_pod_runs(&h, Some("10.244.0.17"));
    h.reconcile(&late).await;
    sync_shared(&h);

    // Nothing changes: nothing is written again, and the running pod is not nudged.
    sync_shared(&h);
    h.fake.take_writes();
    h.reconcile(&h.with_written_status(&tr)).await;
    let writes = h.fake.take_writes();
    assert!(
        writes.iter().all(|w| !w.path.contains("/pods/")),
        "{:?}",
        kinds(&writes)
    );
    assert!(
        writes.iter().all(|w| w.path != shared_path()),
        "{:?}",
        kinds(&writes)
    );
}

#[tokio::test]
async fn the_taskrun_wins_over_the_label_and_the_recorded_mode_over_both() {
    // spec.proxy.mode sidecar over a Namespace labelled shared and a shared default.
    let h = harness(true, ProxyMode::Shared);
    label_namespace(&h, "shared");
    h.reconcile(&http_task(Some("sidecar"))).await;
    let status = written_status(&h.fake.take_writes());
    assert_eq!(status.proxy_mode, Some(ProxyMode::Sidecar));
    assert!(job_containers(&h).contains(&"mcp-proxy".to_string()));
    assert!(h.fake.get(&shared_path()).is_none());

    // Without the TaskRun saying, the flag decides where no label is.
    let h = harness(true, ProxyMode::Shared);
    h.reconcile(&http_task(None)).await;
    assert_eq!(
        written_status(&h.fake.take_writes()).proxy_mode,
        Some(ProxyMode::Shared)
    );

    // Recorded sidecar: the Namespace relabelled shared later changes nothing, and the label is
    // not even read.
    let h = harness(true, ProxyMode::Sidecar);
    h.reconcile(&http_task(None)).await;
    let first = h.with_written_status(&http_task(None));
    assert_eq!(
        first.status.as_ref().and_then(|s| s.proxy_mode),
        Some(ProxyMode::Sidecar)
    );
    label_namespace(&h, "shared");
    h.fake.take_reads();
    let mut changed = first.clone();
    changed.spec.tool_config.mcp_servers[0].tools.allow = vec!["list_*".into()];
    changed.metadata.generation = Some(2);
    h.reconcile(&changed).await;
    let status = written_status(&h.fake.take_writes());
    assert_eq!(status.proxy_mode, Some(ProxyMode::Sidecar));
    assert!(
        h.fake
            .take_reads()
            .iter()
            .all(|r| r != &format!("/api/v1/namespaces/{NS}")),
        "the label is read once, before the mode is recorded"
    );
}

#[tokio::test]
async fn a_shared_task_without_a_shared_proxy_gets_no_job_and_says_why() {
    let h = harness(false, ProxyMode::Sidecar);
    h.reconcile(&http_task(Some("shared"))).await;
    let writes = h.fake.take_writes();
    assert!(
        writes.iter().all(|w| !w.path.contains("/jobs")),
        "{:?}",
        kinds(&writes)
    );
    let status = written_status(&writes);
    let (ready, reason, message) = condition(&status, ct::READY);
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", SHARED_PROXY_UNAVAILABLE)
    );
    assert!(message.contains("--shared-proxy-url"), "{message}");
    assert_eq!(status.proxy_mode, Some(ProxyMode::Shared));
    assert_eq!(
        events(&writes),
        [("Warning".into(), SHARED_PROXY_UNAVAILABLE.into())]
    );
}

fn zone_keys_path() -> String {
    path("secrets", &format!("{NAME}-zone-keys"))
}

#[tokio::test]
async fn a_shared_task_with_a_stdio_server_gets_its_zone_keys_once_before_its_job() {
    let mut h = harness(true, ProxyMode::Sidecar);
    let tr = task(
        Some("shared"),
        json!([{"name": "tracker"}, {"name": "memory"}]),
    );
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    let kinds = kinds(&writes);
    let secret_at = kinds.iter().position(|k| k == "POST secrets");
    let job_at = kinds.iter().position(|k| k == "PATCH jobs");
    assert!(
        matches!((secret_at, job_at), (Some(s), Some(j)) if s < j),
        "the keys before the Job: {kinds:?}"
    );
    assert_eq!(condition(&written_status(&writes), ct::READY).0, "True");
    assert!(job_containers(&h).contains(&"zone-memory".to_string()));
    let secret = h.fake.get(&zone_keys_path()).expect("the zone keys");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["kind"], "TaskRun");
    let key = secret["stringData"]["memory"]
        .as_str()
        .expect("memory's key")
        .to_string();
    assert!(
        key.len() == 64 && key.bytes().all(|c| c.is_ascii_hexdigit()),
        "{key}"
    );
    // The shared proxy's config names the zone's port and key; the Role lets it read them.
    let cm = h.fake.get(&shared_path()).expect("the shared ConfigMap");
    let config: orchestrator_crds::proxy::ProxyConfig =
        serde_saphyr::from_str(cm["data"]["proxy.yaml"].as_str().expect("proxy.yaml"))
            .expect("a proxy config");
    let memory = config
        .servers
        .iter()
        .find(|s| s.name == "memory")
        .and_then(|s| s.stdio.clone())
        .expect("memory over stdio");
    assert_eq!(memory.zone_port, Some(9100));
    assert_eq!(
        memory.zone_key.map(|k| (k.name, k.key)),
        Some((format!("{NAME}-zone-keys"), "memory".to_string()))
    );
    let role = h.fake.get(&path("roles", NAME)).expect("the Role");
    assert!(
        role["rules"]
            .to_string()
            .contains(&format!("{NAME}-zone-keys")),
        "{role}"
    );

    // The Job gone before the watch saw it (a crash, a deleted Job): the next reconcile creates
    // the Job again, and the keys stay as they were (a create of an existing Secret is refused).
    h.fake.lock().objects.remove(&path("jobs", NAME));
    h.fake.take_writes();
    h.reconcile(&h.with_written_status(&tr)).await;
    let writes = h.fake.take_writes();
    let kinds = kinds_of(&writes);
    assert!(
        kinds.contains(&"POST secrets".to_string()) && kinds.contains(&"PATCH jobs".to_string()),
        "{kinds:?}"
    );
    let again = h.fake.get(&zone_keys_path()).expect("the zone keys");
    assert_eq!(again["stringData"]["memory"].as_str(), Some(key.as_str()));

    // Running, then a stdio server added (add-context): refused as in sidecar mode (no container
    // can be added to the pod), the tools stay.
    h.sync_caches(NAME);
    sync_shared(&h);
    let mut added = h.with_written_status(&tr);
    added
        .spec
        .tool_config
        .mcp_servers
        .push(serde_json::from_value(json!({"name": "time"})).expect("a server"));
    added.metadata.generation = Some(2);
    h.fake.take_writes();
    h.reconcile(&added).await;
    let writes = h.fake.take_writes();
    assert!(
        writes.iter().all(|w| !w.path.contains("/secrets")),
        "{:?}",
        kinds_of(&writes)
    );
    let status = written_status(&writes);
    assert_eq!(condition(&status, ct::READY).1, "ServerNotInPod");
    assert_eq!(status.context_version, Some(1), "the tools in force stay");
}

/// A tenant who may create Secrets makes the task's zone-keys Secret first, with keys it knows
/// (with a zone's key it would start that server, with its Secrets, from anywhere that reaches
/// the pod). Not this TaskRun's (no owner, an owner reference that is not the controller, an
/// earlier TaskRun's): the task is blocked naming the Secret and the fix, the Secret is not
/// used nor changed, and no Job is created; deleted, the task starts with keys of its own.
#[tokio::test]
async fn a_zone_keys_secret_the_taskrun_does_not_own_blocks_it_and_no_job_is_made() {
    let tr = task(Some("shared"), json!([{"name": "memory"}]));
    let uid = tr.metadata.uid.clone().expect("a uid");
    let known = "00".repeat(32);
    for (owners, says) in [
        (json!(null), "it has no controller"),
        (
            json!([{"apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "name": NAME,
                    "uid": uid, "controller": false}]),
            "it has no controller",
        ),
        (
            json!([{"apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "name": NAME,
                    "uid": "0b6a3c9e-0000-0000-0000-000000000000", "controller": true}]),
            "an earlier TaskRun",
        ),
    ] {
        let h = harness(true, ProxyMode::Sidecar);
        let planted = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{NAME}-zone-keys"), "namespace": NS,
                         "resourceVersion": "7", "ownerReferences": owners},
            "stringData": {"memory": known}});
        h.fake.put(&zone_keys_path(), planted.clone());

        let action = h.reconcile(&tr).await;
        let writes = h.fake.take_writes();
        assert_eq!(
            kinds(&writes),
            ["POST events", "PATCH taskruns/status"],
            "{says}"
        );
        assert_eq!(
            h.fake.get(&zone_keys_path()),
            Some(planted),
            "left as it was"
        );
        assert!(h.fake.get(&path("jobs", NAME)).is_none(), "no Job");
        let status = written_status(&writes);
        let (ready, reason, message) = condition(&status, ct::READY);
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "NameTaken"));
        assert!(
            message.starts_with(&format!(
                "Secret {NS}/{NAME}-zone-keys exists and is not this TaskRun's"
            )) && message.contains(says)
                && message.contains("rename the TaskRun")
                && message.contains(&format!("kubectl -n {NS} delete secret {NAME}-zone-keys"))
                && message.contains("zone keys must be ones the operator drew"),
            "{message}"
        );
        assert_eq!(condition(&status, ct::JOB_CREATED).0, "False");
        assert_eq!(events(&writes), [("Warning".into(), "NameTaken".into())]);
        assert_eq!(action, Action::requeue(SECRET_RETRY));

        // Deleted, as the message says: the task starts, with keys the operator drew.
        h.fake.lock().objects.remove(&zone_keys_path());
        h.reconcile(&h.with_written_status(&tr)).await;
        let kinds = kinds(&h.fake.take_writes());
        let secret_at = kinds.iter().position(|k| k == "POST secrets");
        let job_at = kinds.iter().position(|k| k == "PATCH jobs");
        assert!(
            matches!((secret_at, job_at), (Some(s), Some(j)) if s < j),
            "{kinds:?}"
        );
        let drawn = h.fake.get(&zone_keys_path()).expect("the zone keys");
        assert_ne!(drawn["stringData"]["memory"].as_str(), Some(known.as_str()));
        assert_eq!(drawn["metadata"]["ownerReferences"][0]["uid"], json!(uid));
    }
}

/// The same Secret made between the check and the create (the create answers 409): the create
/// fails naming it, and the Job is not created.
#[tokio::test]
async fn a_zone_keys_secret_made_just_before_the_create_is_not_used() {
    let h = harness(true, ProxyMode::Sidecar);
    let tr = task(Some("shared"), json!([{"name": "memory"}]));
    let plan =
        crate::render::render_mode(&tr, &catalog_with_http(), &h.ctx.render, ProxyMode::Shared)
            .expect("renders");
    h.fake.put(
        &zone_keys_path(),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": format!("{NAME}-zone-keys"), "namespace": NS},
               "stringData": {"memory": "00".repeat(32)}}),
    );
    let failed = crate::reconcile::placement::zone_keys::create_if_missing(&h.ctx, NS, &tr, &plan)
        .await
        .expect_err("not its Secret");
    assert!(
        matches!(&failed, crate::error::Error::Taken(m)
            if m.starts_with(&format!("Secret {NS}/{NAME}-zone-keys exists and is not this TaskRun's"))),
        "{failed}"
    );
    // Its own Secret, made by an earlier reconcile, is kept as it is.
    let plan_secret = plan.zone_keys_secret(|| "11".repeat(32)).expect("a Secret");
    h.fake.put(
        &zone_keys_path(),
        serde_json::to_value(&plan_secret).expect("serializes"),
    );
    crate::reconcile::placement::zone_keys::create_if_missing(&h.ctx, NS, &tr, &plan)
        .await
        .expect("its own Secret");
    let kept = h.fake.get(&zone_keys_path()).expect("the zone keys");
    assert_eq!(
        kept["stringData"]["memory"].as_str(),
        Some("11".repeat(32).as_str())
    );
}

fn kinds_of(writes: &[Write]) -> Vec<String> {
    kinds(writes)
}

#[tokio::test]
async fn the_shared_config_map_goes_when_the_task_succeeds() {
    let mut h = harness(true, ProxyMode::Shared);
    let tr = http_task(None);
    h.reconcile(&tr).await;
    sync_shared(&h);
    assert!(h.fake.get(&shared_path()).is_some());
    job_is(
        &mut h,
        json!({"succeeded": 1, "startTime": "2026-01-01T00:00:00Z",
               "completionTime": "2026-01-01T00:05:00Z",
               "conditions": [{"type": "Complete", "status": "True"}]}),
    );
    h.fake.take_writes();
    h.reconcile(&h.with_written_status(&tr)).await;
    let writes = h.fake.take_writes();
    let deleted = writes
        .iter()
        .position(|w| w.method == Method::DELETE && w.path == shared_path())
        .expect("the shared ConfigMap deleted");
    let recorded = writes
        .iter()
        .rposition(|w| w.path.ends_with("/status"))
        .expect("the outcome recorded");
    assert!(deleted < recorded, "{:?}", kinds(&writes));
    assert_eq!(written_status(&writes).phase, Some(Phase::Succeeded));
    assert!(h.fake.get(&shared_path()).is_none());
}

#[tokio::test]
async fn a_cancelled_shared_task_says_terminating_then_its_config_map_goes_before_its_job() {
    let mut h = harness(true, ProxyMode::Shared);
    let tr = http_task(None);
    h.reconcile(&tr).await;
    sync_shared(&h);
    job_is(
        &mut h,
        json!({"active": 1, "startTime": "2026-01-01T00:00:00Z"}),
    );
    let mut cancelled = h.with_written_status(&tr);
    cancelled.metadata.annotations = Some(
        [(
            CANCEL_ANNOTATION.to_string(),
            r#"{"user":"alice"}"#.to_string(),
        )]
        .into(),
    );
    h.fake.take_writes();
    h.reconcile(&cancelled).await;
    let writes = h.fake.take_writes();
    let order: Vec<String> = writes
        .iter()
        .filter(|w| w.method != Method::POST)
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    let terminating = format!("PATCH {}", shared_path());
    let gone = format!("DELETE {}", shared_path());
    let job = format!("DELETE {}", path("jobs", NAME));
    let at = |s: &str| order.iter().position(|o| o == s).unwrap_or(usize::MAX);
    assert!(
        at(&terminating) < at(&gone) && at(&gone) < at(&job) && at(&job) < usize::MAX,
        "{order:?}"
    );
    let patch = writes
        .iter()
        .find(|w| w.method == Method::PATCH && w.path == shared_path())
        .expect("the Terminating patch");
    assert_eq!(
        patch.body["metadata"]["annotations"][TASK_PHASE_ANNOTATION],
        "Terminating"
    );
    assert_eq!(written_status(&writes).phase, Some(Phase::Cancelled));
}

#[tokio::test]
async fn a_running_shared_tasks_role_follows_the_secrets_its_config_names() {
    let mut h = harness(true, ProxyMode::Shared);
    let secret = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
               "data": {"token": "dA=="}})
    };
    h.fake
        .put(&path("secrets", "tracker-a"), secret("tracker-a"));
    h.fake
        .put(&path("secrets", "tracker-b"), secret("tracker-b"));
    let with = |name: &str| {
        task(
            None,
            json!([{"name": "tracker", "secretRefs": [{"env": "TRACKER_TOKEN", "name": name}]}]),
        )
    };
    let tr = with("tracker-a");
    h.reconcile(&tr).await;
    h.sync_caches(NAME);
    sync_shared(&h);
    let names = |h: &Harness| {
        let role = h.fake.get(&path("roles", NAME)).expect("the Role");
        role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["resources"] == json!(["secrets"]))
            .map(|r| r["resourceNames"].clone())
    };
    assert_eq!(names(&h), Some(json!(["tracker-a"])));
    let cm = h.fake.get(&shared_path()).expect("the shared ConfigMap");
    let proxy = cm["data"]["proxy.yaml"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(proxy.contains("name: tracker-a"), "{proxy}");
    // add-context points the server at another Secret: the shared proxy may read that one now,
    // and no longer the first.
    let mut changed = h.with_written_status(&with("tracker-b"));
    changed.metadata.generation = Some(2);
    h.reconcile(&changed).await;
    assert_eq!(names(&h), Some(json!(["tracker-b"])));
}

#[test]
fn the_sweep_takes_the_config_maps_of_gone_or_finished_tasks_and_leaves_the_rest() {
    let facts = |uid: &str| {
        Arc::new(shared::SharedFacts::of(
            &serde_json::from_value::<ConfigMap>(json!({
                "metadata": {"name": "x", "resourceVersion": "7",
                             "annotations": {TASK_UID_ANNOTATION: uid}}}))
            .expect("a ConfigMap"),
        ))
    };
    let tr = |ns: &str, uid: &str, phase: &str| {
        Arc::new(
            serde_json::from_value::<TaskRun>(json!({
                "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
                "metadata": {"name": "t", "namespace": ns, "uid": uid},
                "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"}},
                "status": {"phase": phase}
            }))
            .expect("a TaskRun"),
        )
    };
    let cms = vec![
        (
            "orchestrator-system/task.team-a.live".into(),
            facts("u-live"),
        ),
        (
            "orchestrator-system/task.team-a.gone".into(),
            facts("u-gone"),
        ),
        (
            "orchestrator-system/task.team-a.done".into(),
            facts("u-done"),
        ),
        // Another operator's namespace (with --namespace team-a): not ours to judge.
        (
            "orchestrator-system/task.team-b.other".into(),
            facts("u-other"),
        ),
    ];
    let taskruns = [
        tr("team-a", "u-live", "Running"),
        tr("team-a", "u-done", "Succeeded"),
    ];
    let only_a = Watched::Only(vec!["team-a".into()]);
    let swept = retention::orphaned_shared(&cms, &taskruns, &only_a);
    assert_eq!(
        swept,
        [
            ("task.team-a.gone".to_string(), Some("7".to_string())),
            ("task.team-a.done".to_string(), Some("7".to_string()))
        ]
    );
    let all = retention::orphaned_shared(&cms, &taskruns, &Watched::All);
    assert_eq!(all.len(), 3, "{all:?}");
}

#[tokio::test]
async fn an_orphan_is_deleted_only_at_the_version_the_sweep_saw() {
    let h = harness(true, ProxyMode::Shared);
    h.fake
        .put(&shared_path(), json!({"metadata": {"name": "x"}}));
    let name = format!("task.{NS}.{NAME}");
    let deleted = crate::reconcile::placement::shared::delete_orphan(
        &h.ctx.client,
        PROXY_NS,
        &name,
        Some("7"),
    )
    .await
    .expect("deleted");
    assert!(deleted);
    let writes = h.fake.take_writes();
    assert_eq!(writes[0].method, Method::DELETE);
    assert_eq!(
        writes[0].body["preconditions"]["resourceVersion"],
        json!("7")
    );
    // Gone already: not an error.
    assert!(
        !crate::reconcile::placement::shared::delete_orphan(&h.ctx.client, PROXY_NS, &name, None)
            .await
            .expect("404 is fine")
    );
}
