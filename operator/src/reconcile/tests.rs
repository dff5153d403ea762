//! Reconcile scenarios against a scripted API server (tower-test's mock service behind a real
//! kube `Client`): what the operator writes, in which order, and what it leaves alone. The real
//! control plane shows the same end to end (`e2e/tests/`); here each write is seen exactly.
//!
//! The scripted server keeps objects by path: a GET answers what it holds (404 otherwise), a
//! server-side apply stores and echoes the object, an event is created. Every write is recorded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::client::Body;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::watcher;
use orchestrator_crds::approval::{
    Approval, ApprovalState, Decision, REQUESTS_ANNOTATION, ToolApproval, VERDICTS_KEY, Verdict,
    object_name,
};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::history::REQUESTED_BY_ANNOTATION;
use orchestrator_crds::taskrun::{Phase, TaskRun, TaskRunStatus, conditions as ct};
use serde_json::{Value, json};
use tower_test::mock;

use orchestrator_crds::shared::ProxyMode;

use super::context::{POD_RETRY, RESYNC, SECRET_RETRY};
use super::facts::{
    DecisionFacts, JobState, LeaseFacts, SharedFacts, children, decision, lease, shared,
};
use super::ttl::Ttl;
use super::*;
use crate::catalog::CatalogStore;
use crate::metrics::Metrics;
use crate::render::RenderSettings;
use crate::render::{CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION, DEFAULT_SIDECAR_PORT};

const NS: &str = "team-a";

/// One write the operator made: method, path, body.
#[derive(Clone, Debug)]
struct Write {
    method: Method,
    path: String,
    body: Value,
}

#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    writes: Vec<Write>,
    /// Each read (a GET, or a dry run that changes nothing), by path.
    reads: Vec<String>,
}

/// The scripted API server, shared with the task that answers the client.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Server>>);

impl Fake {
    fn lock(&self) -> std::sync::MutexGuard<'_, Server> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, path: &str, object: Value) {
        self.lock().objects.insert(path.to_string(), object);
    }

    fn get(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// The writes since the last call.
    fn take_writes(&self) -> Vec<Write> {
        std::mem::take(&mut self.lock().writes)
    }

    /// The reads since the last call.
    fn take_reads(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().reads)
    }

    fn answer(
        &self,
        method: &Method,
        path: &str,
        (merge, dry_run): (bool, bool),
        body: Value,
    ) -> (StatusCode, Value) {
        let mut server = self.lock();
        if *method == Method::GET || dry_run {
            server.reads.push(path.to_string());
        }
        // A dry run changes nothing: the object as the patch would leave it, or 404.
        if dry_run {
            return match server.objects.get(path) {
                Some(object) => {
                    let mut object = object.clone();
                    if merge {
                        json_patch::merge(&mut object, &body);
                    }
                    (StatusCode::OK, object)
                }
                None => (StatusCode::NOT_FOUND, not_found(path)),
            };
        }
        if *method == Method::GET && path.ends_with("/pods") {
            // A list (the only one reconcile makes; the label selector is the Job's).
            let prefix = format!("{path}/");
            let items: Vec<Value> = server
                .objects
                .iter()
                .filter(|(p, _)| p.starts_with(&prefix))
                .map(|(_, o)| o.clone())
                .collect();
            return (
                StatusCode::OK,
                json!({"kind": "PodList", "apiVersion": "v1",
                                           "metadata": {}, "items": items}),
            );
        }
        if *method == Method::GET {
            return match server.objects.get(path) {
                Some(object) => (StatusCode::OK, object.clone()),
                None => (StatusCode::NOT_FOUND, not_found(path)),
            };
        }
        server.writes.push(Write {
            method: method.clone(),
            path: path.to_string(),
            body: body.clone(),
        });
        match *method {
            // A merge patch changes the object the server holds.
            Method::PATCH if merge => match server.objects.get_mut(path) {
                Some(object) => {
                    json_patch::merge(object, &body);
                    (StatusCode::OK, object.clone())
                }
                None => (StatusCode::NOT_FOUND, not_found(path)),
            },
            // A status apply names only the status; the server answers the whole object. The
            // history and the approvals are each applied alone under their own field manager,
            // and the other status applies leave them (as server-side apply does).
            Method::PATCH if path.ends_with("/status") => {
                const ALONE: [&str; 2] = ["contextHistory", "approvals"];
                let object = path.trim_end_matches("/status");
                let whole = server.objects.entry(object.to_string()).or_default();
                let status = body["status"].clone();
                let alone = status
                    .as_object()
                    .filter(|only| only.len() == 1)
                    .and_then(|only| only.keys().next())
                    .filter(|key| ALONE.contains(&key.as_str()));
                match alone {
                    Some(key) if whole["status"].is_object() => {
                        whole["status"][key] = status[key].clone();
                    }
                    _ => {
                        let mut status = status.clone();
                        for key in ALONE {
                            let kept = whole["status"][key].clone();
                            if status.get(key).is_none() && !kept.is_null() {
                                status[key] = kept;
                            }
                        }
                        whole["status"] = status;
                    }
                }
                (StatusCode::OK, whole.clone())
            }
            // The verdicts are applied alone under their own field manager, and the
            // operator's other ConfigMap applies leave them.
            Method::PATCH if path.contains("/configmaps/") => {
                let whole = server.objects.entry(path.to_string()).or_default();
                let verdicts = whole["data"][VERDICTS_KEY].clone();
                let alone = body["data"]
                    .as_object()
                    .is_some_and(|d| d.len() == 1 && d.contains_key(VERDICTS_KEY));
                if alone && whole.is_object() {
                    whole["data"][VERDICTS_KEY] = body["data"][VERDICTS_KEY].clone();
                } else {
                    *whole = body;
                    if !verdicts.is_null() {
                        whole["data"][VERDICTS_KEY] = verdicts;
                    }
                }
                (StatusCode::OK, whole.clone())
            }
            Method::PATCH => {
                server.objects.insert(path.to_string(), body.clone());
                (StatusCode::OK, body)
            }
            // A created Secret is kept, and a second create of its name refused (409).
            Method::POST if path.ends_with("/secrets") => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let object = format!("{path}/{name}");
                if server.objects.contains_key(&object) {
                    return (
                        StatusCode::CONFLICT,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "code": 409, "reason": "AlreadyExists",
                               "message": format!("{object} already exists")}),
                    );
                }
                server.objects.insert(object, body.clone());
                (StatusCode::CREATED, body)
            }
            Method::POST => (StatusCode::CREATED, body),
            // The garbage collector is not played: children stay until a test removes them.
            Method::DELETE => match server.objects.remove(path) {
                Some(object) => (StatusCode::OK, object),
                None => (StatusCode::NOT_FOUND, not_found(path)),
            },
            _ => (StatusCode::METHOD_NOT_ALLOWED, not_found(path)),
        }
    }
}

fn not_found(path: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
           "reason": "NotFound", "message": format!("{path} not found")})
}

fn catalog() -> Catalog {
    Catalog::parse(include_str!("../../../config/catalog.yaml")).expect("shipped catalog is valid")
}

/// A sample as the API server hands it to the operator: namespaced, with a uid and generation.
fn sample(yaml: &str) -> TaskRun {
    let mut tr: TaskRun = serde_saphyr::from_str(yaml).expect("sample parses");
    tr.metadata.namespace = Some(NS.into());
    tr.metadata.uid = Some("0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c1001".into());
    tr.metadata.generation = Some(1);
    tr
}

fn path(kind: &str, name: &str) -> String {
    match kind {
        "jobs" => format!("/apis/batch/v1/namespaces/{NS}/jobs/{name}"),
        "taskruns" => format!("/apis/orchestrator.io/v1/namespaces/{NS}/taskruns/{name}"),
        "leases" => format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}"),
        "roles" | "rolebindings" => {
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/{kind}/{name}")
        }
        _ => format!("/api/v1/namespaces/{NS}/{kind}/{name}"),
    }
}

/// The operator's context over the scripted server, and the writers of its two caches.
struct Harness {
    fake: Fake,
    ctx: Arc<Context>,
    jobs: Index<JobFacts>,
    config_maps: Index<ConfigMapFacts>,
    leases: Index<LeaseFacts>,
    decisions: Index<DecisionFacts>,
    shared_config_maps: Index<SharedFacts>,
}

impl Harness {
    fn new() -> Self {
        Self::with(catalog(), None, ProxyMode::Sidecar)
    }

    /// The harness with this catalog, the operator's shared proxy (`--shared-proxy-*`) and
    /// default mode.
    fn with(
        catalog: Catalog,
        shared_proxy: Option<crate::render::SharedProxy>,
        default_mode: ProxyMode,
    ) -> Self {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let fake = Fake::default();
        let server = fake.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().clone();
                let path = request.uri().path().to_string();
                let merge = request
                    .headers()
                    .get("content-type")
                    .is_some_and(|v| v.as_bytes() == b"application/merge-patch+json");
                let dry_run = request
                    .uri()
                    .query()
                    .is_some_and(|q| q.split('&').any(|p| p == "dryRun=All"));
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (status, answer) = server.answer(&method, &path, (merge, dry_run), body);
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(answer.to_string().into_bytes()))
                    .expect("a valid response");
                send.send_response(response);
            }
        });
        let client = Client::new(service, NS);
        let jobs = Index::default();
        // As after the Job watch's first (empty) list.
        jobs.apply(&watcher::Event::<CachedJob>::InitDone, children::job_facts);
        let (config_maps, leases, decisions) =
            (Index::default(), Index::default(), Index::default());
        let shared_config_maps = Index::default();
        shared_config_maps.apply(&watcher::Event::<ConfigMap>::InitDone, shared::facts);
        let ctx = Context {
            client: client.clone(),
            jobs: jobs.clone(),
            config_maps: config_maps.clone(),
            leases: leases.clone(),
            decisions: decisions.clone(),
            shared_config_maps: shared_config_maps.clone(),
            default_proxy_mode: default_mode,
            render: RenderSettings {
                sidecar_image: "orchestrator-mcp-proxy:test".into(),
                agent_image: "claude-code:test".into(),
                runtime_images: Default::default(),
                sidecar_otlp_endpoint: None,
                sidecar_log_json: false,
                sidecar_audit_otlp_endpoint: None,
                sidecar_port: DEFAULT_SIDECAR_PORT,
                sidecar_api_watch: true,
                sidecar_kubernetes_service: None,
                sidecar_metrics_port: None,
                shared_proxy,
                default_model: None,
                decision_point: None,
            },
            catalog: CatalogStore::with(catalog),
            metrics: Arc::new(Metrics::default()),
            reporter: Reporter {
                controller: MANAGER.into(),
                instance: None,
            },
            retention_seconds: None,
            notifier: None,
        };
        Self {
            fake,
            ctx: Arc::new(ctx),
            jobs,
            config_maps,
            leases,
            decisions,
            shared_config_maps,
        }
    }

    /// The task pod's proxy reports on the task's Lease that it serves `version`, and the
    /// operator's Lease watch sees it.
    fn proxy_reports(&mut self, name: &str, version: u64) {
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": NS,
                         "annotations": {lease::SERVED_ANNOTATION: version.to_string()}}});
        let meta: PartialObjectMeta<Lease> =
            serde_json::from_value(lease).expect("a Lease's metadata");
        self.leases
            .apply(&watcher::Event::Apply(meta), lease::lease_facts);
    }

    /// One reconcile; fails instead of hanging if it waits on an unanswered request.
    async fn reconcile(&self, tr: &TaskRun) -> Action {
        self.fake.put(
            &path("taskruns", &tr.name_any()),
            serde_json::to_value(tr).expect("a TaskRun serializes"),
        );
        // As the controller hands it over: from the trimmed cache.
        let mut cached = tr.clone();
        trim_taskrun(&mut cached);
        tokio::time::timeout(
            Duration::from_secs(10),
            reconcile(Arc::new(cached), self.ctx.clone()),
        )
        .await
        .expect("reconcile finished")
        .expect("reconcile succeeded")
    }

    /// What the watches would bring: the server's Job and ConfigMap, trimmed, in the caches.
    fn sync_caches(&mut self, name: &str) {
        if let Some(job) = self.fake.get(&path("jobs", name)) {
            let job: CachedJob = serde_json::from_value(job).expect("a Job");
            self.jobs
                .apply(&watcher::Event::Apply(job), children::job_facts);
        }
        let cm_path = path("configmaps", &crate::render::config_map_name(name));
        if let Some(cm) = self.fake.get(&cm_path) {
            let cm: ConfigMap = serde_json::from_value(cm).expect("a ConfigMap");
            self.config_maps
                .apply(&watcher::Event::Apply(cm), children::config_map_facts);
        }
    }

    /// The TaskRun as the next watch event shows it: with the status the operator wrote.
    fn with_written_status(&self, tr: &TaskRun) -> TaskRun {
        let mut tr = tr.clone();
        let name = tr.name_any();
        let written = self
            .fake
            .get(&path("taskruns", &name))
            .map(|object| object["status"].clone())
            .filter(|status| !status.is_null());
        if let Some(status) = written {
            tr.status = Some(serde_json::from_value(status).expect("a TaskRun status"));
        }
        tr
    }
}

fn kinds(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .map(|w| {
            // A create names the collection, a patch the object.
            let from_end = usize::from(w.method != Method::POST);
            let what = w.path.rsplit('/').nth(from_end).unwrap_or_default();
            let what = if w.path.ends_with("/status") {
                "taskruns/status"
            } else {
                what
            };
            format!("{} {what}", w.method)
        })
        .collect()
}

fn events(writes: &[Write]) -> Vec<(String, String)> {
    writes
        .iter()
        .filter(|w| w.path.ends_with("/events"))
        .map(|w| {
            (
                w.body["type"].as_str().unwrap_or_default().to_string(),
                w.body["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn written_status(writes: &[Write]) -> TaskRunStatus {
    let patch = writes
        .iter()
        .rfind(|w| w.path.ends_with("/status"))
        .expect("the status was written");
    serde_json::from_value(patch.body["status"].clone()).expect("a TaskRun status")
}

fn condition(status: &TaskRunStatus, type_: &str) -> (String, String, String) {
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("condition {type_} in {:?}", status.conditions));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn version_annotation(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .filter(|w| w.path.contains("/configmaps/"))
        .map(|w| {
            w.body["metadata"]["annotations"][CONTEXT_VERSION_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_new_task_gets_its_config_map_then_its_job_then_its_status() {
    let h = Harness::new();
    let mut tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    tr.metadata.annotations = Some(
        [(
            REQUESTED_BY_ANNOTATION.to_string(),
            r#"{"user":"alice","generation":1}"#.to_string(),
        )]
        .into(),
    );

    let action = h.reconcile(&tr).await;
    let writes = h.fake.take_writes();

    // The pod mounts the ConfigMap and runs as the task's identity, so both exist before the
    // Job that creates the pod. The first version is recorded in the history (no event).
    assert_eq!(
        kinds(&writes),
        [
            "PATCH configmaps",
            "PATCH taskruns/status",
            "PATCH serviceaccounts",
            "PATCH roles",
            "PATCH rolebindings",
            "PATCH leases",
            "POST secrets",
            "PATCH jobs",
            "POST events",
            "PATCH taskruns/status"
        ]
    );
    assert_eq!(version_annotation(&writes), ["1"]);
    assert_eq!(events(&writes), [("Normal".into(), "JobCreated".into())]);
    // The namespace's auditors' token, before the Job whose proxy mounts it: random, unowned.
    let auditor = h
        .fake
        .get(&path("secrets", "orchestrator-task-auditor"))
        .expect("the auditors' Secret");
    let token = auditor["stringData"]["token"].as_str().unwrap_or_default();
    assert_eq!(token.len(), 64, "{auditor}");
    assert!(
        auditor["metadata"]["ownerReferences"].is_null(),
        "{auditor}"
    );
    let history = &writes[1].body["status"];
    assert_eq!(history.as_object().map(|o| o.len()), Some(1), "{history}");
    let first = &history["contextHistory"][0];
    assert_eq!(
        (
            &first["contextVersion"],
            &first["requestedBy"],
            &first["source"]
        ),
        (&json!(1), &json!("alice"), &json!("Annotation"))
    );
    let added = first["added"].as_array().cloned().unwrap_or_default();
    assert!(added.contains(&json!("memory/read_graph")), "{first}");
    assert_eq!(
        writes[3].body["rules"][0]["resourceNames"],
        json!([crate::render::config_map_name("task-1001")])
    );
    let job = &writes[7].body;
    assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "TaskRun");
    assert_eq!(job["metadata"]["ownerReferences"][0]["controller"], true);
    let status = written_status(&writes);
    assert_eq!(status.context_version, Some(1));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        status.config_map_name.as_deref(),
        Some(crate::render::config_map_name("task-1001").as_str())
    );
    assert_eq!(condition(&status, ct::READY).0, "True");
    assert_eq!(condition(&status, ct::JOB_CREATED).0, "True");
    // An unfinished task is looked at again without any event (the safety net).
    assert_eq!(action, Action::requeue(RESYNC));
}

#[tokio::test]
async fn a_tool_config_change_rewrites_only_the_config_map_and_bumps_the_version() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.fake.take_writes();
    h.sync_caches("task-1001");
    let tr = h.with_written_status(&tr);

    // The Job's pod runs (and an earlier, finished one is still listed).
    for (pod, phase) in [
        ("task-1001-x7k2p", "Running"),
        ("task-1001-old00", "Failed"),
    ] {
        h.fake.put(
            &path("pods", pod),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod, "namespace": NS,
                                "labels": {"batch.kubernetes.io/job-name": "task-1001"}},
                   "status": {"phase": phase}}),
        );
    }

    // Nothing changed: nothing is written.
    h.reconcile(&tr).await;
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());

    // add-context: memory loses read_graph, a new generation; written by `kubectl edit` (no
    // annotation of this generation says who).
    let mut changed = tr.clone();
    changed.metadata.generation = Some(2);
    changed.metadata.managed_fields = Some(
        serde_json::from_value(json!([{"manager": "kubectl-edit", "operation": "Update",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:toolConfig": {}}}}]))
        .expect("managedFields"),
    );
    let memory = changed
        .spec
        .tool_config
        .mcp_servers
        .iter_mut()
        .find(|s| s.name == "memory")
        .expect("the sample enables memory");
    memory.tools.allow.retain(|p| p != "read_graph");
    h.reconcile(&changed).await;
    let writes = h.fake.take_writes();

    // The Job (its pod template is immutable) is never written again; the running pod is told
    // of the new version right after the ConfigMap (the kubelet then syncs it at once); the
    // history entry and its event come before the status that shows the version.
    assert_eq!(
        kinds(&writes),
        [
            "PATCH configmaps",
            "PATCH pods",
            "PATCH taskruns/status",
            "POST events",
            "PATCH taskruns/status"
        ]
    );
    assert_eq!(version_annotation(&writes), ["2"]);
    assert!(
        writes[1].path.ends_with("/pods/task-1001-x7k2p"),
        "{}",
        writes[1].path
    );
    assert_eq!(
        writes[1].body,
        json!({"metadata": {"annotations": {CONTEXT_VERSION_ANNOTATION: "2"}}})
    );
    let pod = h
        .fake
        .get(&path("pods", "task-1001-x7k2p"))
        .expect("the pod");
    assert_eq!(
        pod["status"]["phase"], "Running",
        "the patch changed only the annotation"
    );
    assert_eq!(events(&writes), [("Normal".into(), "ToolsUpdated".into())]);
    let note = writes[3].body["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with(
            "contextVersion 2 by kubectl-edit (field manager): -memory/read_graph; in force: "
        ),
        "{note}"
    );
    let entries = &writes[2].body["status"]["contextHistory"];
    assert_eq!(entries.as_array().map(Vec::len), Some(2), "{entries}");
    assert_eq!(entries[1]["removed"], json!(["memory/read_graph"]));
    assert_eq!(entries[1]["generation"], 2);
    let status = written_status(&writes);
    assert_eq!(status.context_version, Some(2));
    assert_eq!(status.observed_generation, Some(2));
    let proxy = writes[0].body["data"]["proxy.yaml"]
        .as_str()
        .unwrap_or_default();
    let proxy: orchestrator_crds::proxy::ProxyConfig =
        serde_saphyr::from_str(proxy).expect("the proxy config parses");
    let memory = proxy
        .servers
        .iter()
        .find(|s| s.name == "memory")
        .expect("memory");
    assert!(
        !memory.tools.allow.iter().any(|t| t == "read_graph"),
        "{:?}",
        memory.tools
    );
    assert!(
        memory.tools.allow.iter().any(|t| t == "search_nodes"),
        "{:?}",
        memory.tools
    );

    // The change reverted: a new version again (never an old number for a different config).
    h.sync_caches("task-1001");
    let mut reverted = h.with_written_status(&tr);
    reverted.metadata.generation = Some(3);
    h.reconcile(&reverted).await;
    let writes = h.fake.take_writes();
    assert_eq!(version_annotation(&writes), ["3"]);
    let entries = &writes[2].body["status"]["contextHistory"];
    assert_eq!(
        entries[2]["added"],
        json!(["memory/read_graph"]),
        "{entries}"
    );
    let pod = h
        .fake
        .get(&path("pods", "task-1001-x7k2p"))
        .expect("the pod");
    assert_eq!(
        pod["metadata"]["annotations"][CONTEXT_VERSION_ANNOTATION],
        "3"
    );
    assert_eq!(written_status(&writes).context_version, Some(3));
}

#[tokio::test]
async fn a_missing_secret_blocks_the_job_and_says_how_to_create_it() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun-github.yaml"));

    let action = h.reconcile(&tr).await;
    let writes = h.fake.take_writes();

    // Nothing is created: a pod without its Secret would hang in CreateContainerConfigError.
    assert_eq!(kinds(&writes), ["POST events", "PATCH taskruns/status"]);
    assert_eq!(
        events(&writes),
        [("Warning".into(), "SecretNotFound".into())]
    );
    let status = written_status(&writes);
    let (ready, reason, message) = condition(&status, ct::READY);
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "SecretNotFound")
    );
    assert!(
        message.contains("env GITHUB_PERSONAL_ACCESS_TOKEN of server github")
            && message.contains(
                "kubectl -n team-a create secret generic github --from-literal=token=..."
            ),
        "{message}"
    );
    assert_eq!(condition(&status, ct::JOB_CREATED).0, "False");
    // The operator does not watch Secrets: it looks again soon.
    assert_eq!(action, Action::requeue(SECRET_RETRY));

    // Still missing: the same problem is not announced again.
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());

    // The Secret appears (the value never reaches a write).
    h.fake.put(
        &path("secrets", "github"),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "github", "namespace": NS},
               "data": {"token": "c2VjcmV0LXZhbHVlLTQyNDI="}}),
    );
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    assert_eq!(
        kinds(&writes),
        [
            "PATCH configmaps",
            "PATCH taskruns/status",
            "PATCH serviceaccounts",
            "PATCH roles",
            "PATCH rolebindings",
            "PATCH leases",
            "POST secrets",
            "PATCH jobs",
            "POST events",
            "PATCH taskruns/status"
        ]
    );
    let all = serde_json::to_string(&writes.iter().map(|w| &w.body).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(!all.contains("c2VjcmV0LXZhbHVlLTQyNDI=") && !all.contains("secret-value-4242"));
    assert_eq!(condition(&written_status(&writes), ct::READY).0, "True");
    h.sync_caches("task-1002");
}

#[test]
fn a_lagging_cache_or_status_never_reuses_a_version_for_another_config() {
    let cm = |version: &str, hash: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "c", "annotations": {
            CONTEXT_VERSION_ANNOTATION: version, CONFIG_HASH_ANNOTATION: hash}}}))
        .expect("a ConfigMap")
    };
    let status = |version: i64, hash: &str| TaskRunStatus {
        context_version: Some(version),
        config_hash: Some(hash.into()),
        ..Default::default()
    };
    let v = |existing: Option<&ConfigMap>, previous: &TaskRunStatus, hash: &str| {
        let facts = existing.map(ConfigMapFacts::of);
        let v = version::context_version(facts.as_ref(), previous, hash);
        (v.current, v.is_new())
    };
    // First render.
    assert_eq!(v(None, &TaskRunStatus::default(), "a"), (1, true));
    // The applied config again: its version, nothing new.
    assert_eq!(v(Some(&cm("3", "a")), &status(3, "a"), "a"), (3, false));
    // The status lags behind the ConfigMap (version 3 written, status still says 2).
    assert_eq!(v(Some(&cm("3", "b")), &status(2, "a"), "c"), (4, true));
    // The ConfigMap lags behind the status (a stale cache).
    assert_eq!(v(Some(&cm("2", "a")), &status(5, "e"), "f"), (6, true));
    // The status already records this config (its ConfigMap write was lost): same version.
    assert_eq!(v(Some(&cm("4", "d")), &status(5, "e"), "e"), (5, false));
}

#[test]
fn a_finished_job_is_deleted_only_after_its_outcome_is_recorded_and_its_ttl_passed() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use orchestrator_crds::taskrun::Phase;

    let now = Timestamp::now();
    let finished = |phase: Phase, ago_s: i64| JobState {
        phase,
        reason: "Completed".into(),
        message: String::new(),
        start_time: None,
        completion_time: Some(Time(now - SignedDuration::from_secs(ago_s))),
    };
    let succeeded = finished(Phase::Succeeded, 30);
    let decide = |ttl, state: &JobState, recorded| ttl::decide(ttl, Some(state), recorded, now);

    assert_eq!(
        decide(None, &succeeded, Some(Phase::Succeeded)),
        Ttl::NotDue
    );
    // The outcome is not in the status yet: first record it, then delete.
    assert_eq!(
        decide(Some(10), &succeeded, Some(Phase::Running)),
        Ttl::NotDue
    );
    assert_eq!(
        decide(Some(10), &succeeded, Some(Phase::Succeeded)),
        Ttl::Delete
    );
    assert_eq!(
        decide(Some(100), &succeeded, Some(Phase::Succeeded)),
        Ttl::Wait(Duration::from_secs(70))
    );
    let running = finished(Phase::Running, 500);
    assert_eq!(
        decide(Some(10), &running, Some(Phase::Running)),
        Ttl::NotDue
    );
    assert_eq!(
        ttl::decide(Some(10), None, Some(Phase::Succeeded), now),
        Ttl::NotDue
    );
}

#[tokio::test]
async fn tools_synced_follows_what_the_proxy_reports_on_the_tasks_lease() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    let status = written_status(&h.fake.take_writes());
    // The Lease exists (created with the identity), nothing reported yet.
    assert!(h.fake.get(&path("leases", "task-1001")).is_some());
    assert_eq!(status.served_context_version, None);
    assert_eq!(
        condition(&status, ct::TOOLS_SYNCED),
        (
            "Unknown".into(),
            "NotReported".into(),
            "the task pod's proxy has not reported what it serves yet".into()
        )
    );

    // The proxy serves version 1: a Lease event reconciles the TaskRun (.owns()).
    h.sync_caches("task-1001");
    h.proxy_reports("task-1001", 1);
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    let status = written_status(&h.fake.take_writes());
    assert_eq!(status.served_context_version, Some(1));
    assert_eq!(condition(&status, ct::TOOLS_SYNCED).0, "True");

    // add-context: version 2 is rendered; the proxy still serves 1.
    let mut changed = h.with_written_status(&tr);
    changed.metadata.generation = Some(2);
    changed.spec.tool_config.mcp_servers[0]
        .tools
        .allow
        .push("get-env".into());
    h.reconcile(&changed).await;
    let status = written_status(&h.fake.take_writes());
    assert_eq!(status.context_version, Some(2));
    assert_eq!(status.served_context_version, Some(1));
    let (synced, reason, _) = condition(&status, ct::TOOLS_SYNCED);
    assert_eq!((synced.as_str(), reason.as_str()), ("False", "Syncing"));

    // The proxy reloads and reports 2.
    h.sync_caches("task-1001");
    h.proxy_reports("task-1001", 2);
    let changed = h.with_written_status(&changed);
    h.reconcile(&changed).await;
    let status = written_status(&h.fake.take_writes());
    assert_eq!(status.served_context_version, Some(2));
    assert_eq!(condition(&status, ct::TOOLS_SYNCED).0, "True");
}

/// The Job as the Job controller leaves it when the agent exited 0 `ago` seconds before.
fn complete_job(h: &Harness, name: &str, ago: i64) {
    let done =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ago);
    let mut job = h
        .fake
        .get(&path("jobs", name))
        .expect("the Job was applied");
    job["status"] = json!({
        "succeeded": 1,
        "startTime": done.to_string(),
        "completionTime": done.to_string(),
        "conditions": [{"type": "Complete", "status": "True"}]
    });
    h.fake.put(&path("jobs", name), job);
}

#[tokio::test]
async fn a_finished_taskrun_is_deleted_after_its_retention_once_its_outcome_is_recorded() {
    let mut h = Harness::new();
    let mut tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    tr.spec.retention_seconds_after_finished = Some(60);
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    let running = h.with_written_status(&tr);
    h.fake.take_writes();

    // The task finished 90 s ago, past its 60 s: first its outcome goes into the status...
    complete_job(&h, "task-1001", 90);
    h.sync_caches("task-1001");
    h.reconcile(&running).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["POST events", "PATCH taskruns/status"]);
    assert_eq!(written_status(&writes).phase, Some(Phase::Succeeded));
    assert_eq!(events(&writes), [("Normal".into(), "TaskSucceeded".into())]);

    // ...then the TaskRun is deleted (its ConfigMap and Job follow by owner reference), only if it
    // is still the same TaskRun (uid), and nothing else is written.
    let finished = h.with_written_status(&tr);
    let action = h.reconcile(&finished).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["DELETE taskruns"]);
    assert_eq!(
        writes[0].body["preconditions"]["uid"],
        tr.metadata.uid.clone().expect("a uid")
    );
    assert_eq!(writes[0].body["propagationPolicy"], "Background");
    assert_eq!(action, Action::await_change());
    assert!(h.fake.get(&path("taskruns", "task-1001")).is_none());
    let children_owner =
        h.fake.get(&path("jobs", "task-1001")).expect("the Job")["metadata"]["ownerReferences"][0]
            ["uid"]
            .clone();
    assert_eq!(
        children_owner,
        json!(tr.metadata.uid),
        "the garbage collector's cue"
    );
}

#[tokio::test]
async fn a_finished_taskrun_within_its_retention_is_kept_and_looked_at_when_it_is_due() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    complete_job(&h, "task-1001", 90);
    h.sync_caches("task-1001");
    h.reconcile(&h.with_written_status(&tr)).await;
    let finished = h.with_written_status(&tr);
    h.fake.take_writes();

    // No retention anywhere: kept, never looked at again without an event.
    assert_eq!(h.reconcile(&finished).await, Action::await_change());
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());

    // The operator's default (1 h), 90 s after the task finished: kept, due in 58.5 min.
    let ctx = Arc::get_mut(&mut h.ctx).expect("no reconcile holds the context");
    ctx.retention_seconds = Some(3600);
    let action = h.reconcile(&finished).await;
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());
    // Due 3,510 s after the Job's completion time, less the seconds this test took so far
    // (a loaded machine takes a few).
    let due = format!("{action:?}");
    let secs: f64 = due
        .split("requeue_after: Some(")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a requeue: {due}"));
    assert!((3480.0..=3510.0).contains(&secs), "{due}");

    // Its own retentionSecondsAfterFinished wins over the default (a spec change: one fresh read,
    // then the full reconcile, which only records the new generation).
    let mut shorter = finished.clone();
    shorter.spec.retention_seconds_after_finished = Some(30);
    shorter.metadata.generation = Some(2);
    h.reconcile(&shorter).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["PATCH taskruns/status"]);
    assert_eq!(written_status(&writes).observed_generation, Some(2));
    let recorded = h.with_written_status(&shorter);
    h.reconcile(&recorded).await;
    assert_eq!(kinds(&h.fake.take_writes()), ["DELETE taskruns"]);
}

#[tokio::test]
async fn a_blocked_task_keeps_the_tools_in_force_in_its_status() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    let before = written_status(&h.fake.take_writes());
    assert!(!before.tools.is_empty());
    h.sync_caches("task-1001");

    // A server the catalog does not have: nothing is rendered, the last good config stays, and
    // so do its tools in the status (the cache keeps them only as a digest: read afresh).
    let mut broken = h.with_written_status(&tr);
    let mut unknown = broken.spec.tool_config.mcp_servers[0].clone();
    unknown.name = "no-such-server".into();
    broken.spec.tool_config.mcp_servers.push(unknown);
    broken.metadata.generation = Some(2);
    h.reconcile(&broken).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["POST events", "PATCH taskruns/status"]);
    let status = written_status(&writes);
    assert_eq!(condition(&status, ct::READY).0, "False");
    assert_eq!(status.tools, before.tools);
    assert_eq!(status.observed_generation, Some(2));

    // Looked at again unchanged: nothing to write.
    let broken = h.with_written_status(&broken);
    h.reconcile(&broken).await;
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());
}

#[tokio::test]
async fn a_version_already_in_the_history_is_not_recorded_again() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    let tr = h.with_written_status(&tr);
    let mut changed = tr.clone();
    changed.metadata.generation = Some(2);
    changed
        .spec
        .tool_config
        .mcp_servers
        .retain(|s| s.name != "memory");
    h.reconcile(&changed).await;
    h.sync_caches("task-1001");
    let recorded = h.with_written_status(&changed);
    let history = recorded
        .status
        .as_ref()
        .map(|s| s.context_history.clone())
        .unwrap_or_default();
    assert_eq!(history.len(), 2, "{history:?}");
    h.fake.take_writes();

    // As if the operator stopped after recording version 2 but before the status showed it:
    // the next reconcile writes the status, and neither a second entry nor a second event.
    let mut crashed = changed.clone();
    crashed.status = tr.status.clone();
    if let Some(status) = crashed.status.as_mut() {
        status.context_history = history.clone();
    }
    h.reconcile(&crashed).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["PATCH taskruns/status"]);
    assert_eq!(written_status(&writes).context_version, Some(2));
    let stored = h
        .fake
        .get(&path("taskruns", "task-1001"))
        .expect("the TaskRun");
    assert_eq!(
        stored["status"]["contextHistory"],
        serde_json::to_value(&history).expect("serializes")
    );
}

/// The proxy of `name` lists `requests` as held on its Lease (besides serving version 1).
fn proxy_holds(h: &mut Harness, name: &str, requests: Value) {
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": NS,
                     "annotations": {lease::SERVED_ANNOTATION: "1",
                                     REQUESTS_ANNOTATION: requests.to_string()}}});
    let meta: PartialObjectMeta<Lease> = serde_json::from_value(lease).expect("a Lease's metadata");
    h.leases
        .apply(&watcher::Event::Apply(meta), lease::lease_facts);
}

/// A person's ToolApproval of the call [`held`] shows, as the operator's watch sees it.
fn person_decides(h: &mut Harness, task: &str, id: &str, decision: &str, who: &str) {
    let digest = held(id)["digest"].as_str().unwrap_or_default().to_string();
    person_decides_on(h, task, id, &digest, decision, who);
}

/// A person's ToolApproval naming `digest`.
fn person_decides_on(
    h: &mut Harness,
    task: &str,
    id: &str,
    digest: &str,
    decision: &str,
    who: &str,
) {
    let approval = json!({"apiVersion": "orchestrator.io/v1", "kind": "ToolApproval",
        "metadata": {"name": object_name(task, id), "namespace": NS,
                     "creationTimestamp": k8s_openapi::jiff::Timestamp::now().to_string()},
        "spec": {"taskRun": task, "id": id, "digest": digest, "decision": decision,
                 "decidedBy": who, "reason": "looks right"}});
    let approval: ToolApproval = serde_json::from_value(approval).expect("a ToolApproval");
    h.decisions
        .apply(&watcher::Event::Apply(approval), decision::decision_facts);
}

fn approvals_written(writes: &[Write]) -> Option<Vec<Approval>> {
    writes
        .iter()
        .rfind(|w| w.path.ends_with("/status") && w.body["status"].get("approvals").is_some())
        .map(|w| serde_json::from_value(w.body["status"]["approvals"].clone()).expect("approvals"))
}

#[tokio::test]
async fn a_held_call_is_listed_pending_then_its_verdict_reaches_the_proxys_config_map() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.fake.take_writes();
    h.sync_caches("task-1001");
    proxy_holds(&mut h, "task-1001", json!([held("a1b2c3d4")]));

    // Pending: in the status, with an Event; nothing for the proxy yet.
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    let listed = approvals_written(&writes).expect("status.approvals written");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].state),
        ("a1b2c3d4", ApprovalState::Pending)
    );
    assert_eq!(
        listed[0].params.as_deref(),
        held("a1b2c3d4")["params"].as_str()
    );
    assert_eq!(listed[0].digest, held("a1b2c3d4")["digest"]);
    assert!(events(&writes).contains(&("Normal".into(), "ApprovalRequested".into())));
    let cm = path("configmaps", &crate::render::config_map_name("task-1001"));
    assert!(!writes.iter().any(|w| w.path == cm), "no verdict yet");

    // Unchanged: nothing written again.
    h.sync_caches("task-1001");
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    assert_eq!(approvals_written(&writes), None);

    // alice approves: the status says so, the verdict is applied to the ConfigMap under the
    // approvals field manager (only that key), and the rendered config is not re-applied.
    person_decides(&mut h, "task-1001", "a1b2c3d4", "approve", "alice");
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    let listed = approvals_written(&writes).expect("status.approvals written");
    assert_eq!(listed[0].state, ApprovalState::Approved);
    assert_eq!(listed[0].decided_by.as_deref(), Some("alice"));
    let verdict = writes
        .iter()
        .find(|w| w.path == cm)
        .expect("the verdicts were written");
    let data = verdict.body["data"].as_object().expect("data");
    assert_eq!(data.keys().collect::<Vec<_>>(), [VERDICTS_KEY]);
    let verdicts: Vec<Verdict> =
        serde_json::from_str(data[VERDICTS_KEY].as_str().unwrap_or_default()).expect("verdicts");
    assert_eq!(verdicts.len(), 1);
    assert_eq!(
        (verdicts[0].decision, verdicts[0].decided_by.as_str()),
        (Decision::Approve, "alice")
    );
    assert_eq!(verdicts[0].digest, held("a1b2c3d4")["digest"]);
    assert_eq!(
        listed[0].params, None,
        "a decided entry keeps only the digest"
    );
    assert!(events(&writes).contains(&("Normal".into(), "ApprovalGranted".into())));

    // The ConfigMap now carries the verdict: the next reconcile neither re-renders the config
    // nor bumps the version.
    h.sync_caches("task-1001");
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    assert!(!writes.iter().any(|w| w.path == cm), "{:?}", kinds(&writes));
    assert_eq!(
        h.with_written_status(&tr)
            .status
            .and_then(|s| s.context_version),
        Some(1)
    );
}

/// An object someone else made, named like a child of `task-1001`: not the TaskRun's.
fn theirs(kind: &str, name: &str, owners: Value) -> Value {
    let api_version = match kind {
        "Job" => "batch/v1",
        "Lease" => "coordination.k8s.io/v1",
        "Role" | "RoleBinding" => "rbac.authorization.k8s.io/v1",
        _ => "v1",
    };
    let mut object = json!({"apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": NS, "uid": "5e1f0000-0000-0000-0000-00000000beef",
                     "resourceVersion": "42", "ownerReferences": owners}});
    if kind == "Job" {
        // Someone else's Job that succeeded: its outcome is not the task's.
        object["status"] = json!({"succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True"}]});
    }
    object
}

#[tokio::test]
async fn a_child_whose_name_is_taken_blocks_the_taskrun_and_nothing_is_changed() {
    for (kind, resource, name) in [
        ("ServiceAccount", "serviceaccounts", "task-1001"),
        ("Role", "roles", "task-1001"),
        ("RoleBinding", "rolebindings", "task-1001"),
        ("Lease", "leases", "task-1001"),
        ("ConfigMap", "configmaps", "task-1001-tools"),
        ("Job", "jobs", "task-1001"),
    ] {
        let mut h = Harness::new();
        let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
        let object = theirs(kind, name, json!(null));
        h.fake.put(&path(resource, name), object.clone());

        let action = h.reconcile(&tr).await;
        let writes = h.fake.take_writes();

        // Blocked before any child is applied: theirs is left exactly as it was.
        assert_eq!(
            kinds(&writes),
            ["POST events", "PATCH taskruns/status"],
            "{kind}"
        );
        assert_eq!(h.fake.get(&path(resource, name)), Some(object), "{kind}");
        assert_eq!(events(&writes), [("Warning".into(), "NameTaken".into())]);
        let status = written_status(&writes);
        let (ready, reason, message) = condition(&status, ct::READY);
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "NameTaken"));
        let lower = kind.to_lowercase();
        assert!(
            message.contains(&format!(
                "{kind} team-a/{name} exists and is not this TaskRun's"
            )) && message.contains("rename the TaskRun")
                && message.contains(&format!("kubectl -n team-a delete {lower} {name}")),
            "{message}"
        );
        assert_eq!(condition(&status, ct::JOB_CREATED).0, "False", "{kind}");
        assert_eq!(
            status.phase,
            Some(Phase::Pending),
            "not the other Job's outcome"
        );
        // It is not watched: looked at again soon.
        assert_eq!(action, Action::requeue(SECRET_RETRY), "{kind}");

        // Still there: nothing written again.
        let blocked = h.with_written_status(&tr);
        h.reconcile(&blocked).await;
        assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());

        // Deleted (as the message says): the task starts.
        h.fake.lock().objects.remove(&path(resource, name));
        if kind == "Job" {
            let job: CachedJob =
                serde_json::from_value(theirs(kind, name, json!(null))).expect("a Job");
            h.jobs
                .apply(&watcher::Event::Delete(job), children::job_facts);
        }
        h.reconcile(&blocked).await;
        let writes = h.fake.take_writes();
        assert!(kinds(&writes).contains(&"PATCH jobs".to_string()), "{kind}");
        assert_eq!(condition(&written_status(&writes), ct::READY).0, "True");
        h.sync_caches("task-1001");
    }
}

#[tokio::test]
async fn the_children_of_an_earlier_taskrun_of_the_same_name_are_not_taken_over() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    complete_job(&h, "task-1001", 5);
    h.sync_caches("task-1001");
    h.fake.take_writes();

    // Deleted and created again under the same name before the garbage collector removed the
    // first one's children: they are not the new TaskRun's (nor is their outcome).
    let mut again = sample(include_str!("../../../config/samples/taskrun.yaml"));
    again.metadata.uid = Some("0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c2002".into());
    let action = h.reconcile(&again).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["POST events", "PATCH taskruns/status"]);
    let status = written_status(&writes);
    let (_, reason, message) = condition(&status, ct::READY);
    assert_eq!(reason, "NameTaken");
    assert!(
        message.contains("Job team-a/task-1001 exists and is not this TaskRun's")
            && message.contains("ConfigMap team-a/task-1001-tools exists")
            && message.contains(
                "an earlier TaskRun task-1001 (uid 0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c1001)"
            ),
        "{message}"
    );
    assert_eq!(status.phase, Some(Phase::Pending));
    assert_eq!(action, Action::requeue(SECRET_RETRY));
    let owner = &h.fake.get(&path("jobs", "task-1001")).expect("the Job")["metadata"]["ownerReferences"]
        [0]["uid"];
    assert_eq!(*owner, json!(tr.metadata.uid), "still the first TaskRun's");
}

#[tokio::test]
async fn the_taskruns_own_children_are_not_taken_and_a_settled_task_reads_nothing() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    let tr = h.with_written_status(&tr);
    h.fake.take_writes();
    h.fake.take_reads();

    // Nothing changed: no write, and no read either (the caches say the children are its own).
    h.reconcile(&tr).await;
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());
    assert_eq!(h.fake.take_reads(), Vec::<String>::new());

    // The Job of the unfinished task is deleted: it comes back with its identity (its own
    // ServiceAccount, Role, RoleBinding and Lease are not "taken").
    let job = h.fake.lock().objects.remove(&path("jobs", "task-1001"));
    let job: CachedJob = serde_json::from_value(job.expect("the Job")).expect("a Job");
    h.jobs
        .apply(&watcher::Event::Delete(job), children::job_facts);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    assert_eq!(
        kinds(&writes),
        [
            "PATCH serviceaccounts",
            "PATCH roles",
            "PATCH rolebindings",
            "PATCH leases",
            "POST secrets",
            "PATCH jobs",
            "POST events"
        ]
    );
}

#[tokio::test]
async fn a_config_over_the_api_limit_is_a_condition_not_a_retry_loop() {
    let h = Harness::new();
    let mut tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    tr.spec.task.prompt = Some("x".repeat(1024 * 1024));

    let action = h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    assert_eq!(kinds(&writes), ["POST events", "PATCH taskruns/status"]);
    let status = written_status(&writes);
    let (ready, reason, message) = condition(&status, ct::READY);
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "ConfigTooLarge")
    );
    assert!(
        message.contains("ConfigMap team-a/task-1001-tools would hold")
            && message.contains("over the API server's limit of 1048576 bytes")
            && message.contains("task.md: 1048576 bytes (spec.task.prompt)")
            && message.contains("spec.task.configMapKeyRef"),
        "{message}"
    );
    // Only a change of the TaskRun (or the catalog) can make it fit: no retry.
    assert_eq!(action, Action::await_change());
    let tr = h.with_written_status(&tr);
    assert_eq!(h.reconcile(&tr).await, Action::await_change());
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());
}

/// One call the proxy of `task-1001` holds, expiring in five minutes, as the proxy lists it
/// (its digest over what it shows: nothing is masked).
fn held(id: &str) -> Value {
    let expires = (k8s_openapi::jiff::Timestamp::now()
        + k8s_openapi::jiff::SignedDuration::from_secs(300))
    .to_string();
    let params = json!({"name": "echo", "arguments": {"message": "hi"}});
    let definition = format!("sha256:{}", "1".repeat(64));
    let digest = orchestrator_crds::approval::CallDigest {
        v: orchestrator_crds::approval::CALL_DIGEST_VERSION,
        namespace: NS,
        task_run: "task-1001",
        id,
        server: "everything",
        definition: &definition,
        context_version: 1,
        params: &params,
    }
    .digest();
    json!({"id": id, "server": "everything", "tool": "echo", "digest": digest,
           "definition": definition, "contextVersion": 1, "params": params.to_string(),
           "paramsBytes": params.to_string().len(), "maskNonce": "a1b2c3",
           "requestedAt": "2026-01-01T00:00:00Z", "expiresAt": expires})
}

fn approval_state(tr: &TaskRun, id: &str) -> Option<ApprovalState> {
    tr.status
        .as_ref()
        .and_then(|s| s.approvals.iter().find(|a| a.id == id))
        .map(|a| a.state)
}

#[tokio::test]
async fn approvals_are_merged_while_blocked_and_withdrawn_when_the_task_finishes() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");

    // add-context names a server the catalog does not have: blocked, the last config in force.
    let mut blocked = h.with_written_status(&tr);
    let mut unknown = blocked.spec.tool_config.mcp_servers[0].clone();
    unknown.name = "no-such-server".into();
    blocked.spec.tool_config.mcp_servers.push(unknown);
    blocked.metadata.generation = Some(2);
    h.reconcile(&blocked).await;
    h.fake.take_writes();

    // Its proxy still runs and holds a call: listed pending...
    proxy_holds(&mut h, "task-1001", json!([held("a1b2c3d4")]));
    let blocked = h.with_written_status(&blocked);
    h.reconcile(&blocked).await;
    let blocked = h.with_written_status(&blocked);
    assert_eq!(
        approval_state(&blocked, "a1b2c3d4"),
        Some(ApprovalState::Pending)
    );
    assert_eq!(
        condition(blocked.status.as_ref().expect("status"), ct::READY).1,
        "UnknownServer"
    );

    // ...decided, and the verdict reaches the proxy.
    person_decides(&mut h, "task-1001", "a1b2c3d4", "approve", "alice");
    h.reconcile(&blocked).await;
    let writes = h.fake.take_writes();
    let cm = path("configmaps", &crate::render::config_map_name("task-1001"));
    let verdict = writes.iter().find(|w| w.path == cm).expect("the verdicts");
    assert!(
        verdict.body["data"][VERDICTS_KEY]
            .as_str()
            .is_some_and(|v| v.contains("a1b2c3d4")),
        "{}",
        verdict.body
    );
    let blocked = h.with_written_status(&blocked);
    assert_eq!(
        approval_state(&blocked, "a1b2c3d4"),
        Some(ApprovalState::Approved)
    );
    // Looked at again unchanged: nothing to write (the approvals listed are no reason to).
    h.sync_caches("task-1001");
    h.reconcile(&blocked).await;
    assert_eq!(kinds(&h.fake.take_writes()), Vec::<String>::new());

    // A second call is held, then the task finishes (still blocked): nobody can decide it any
    // more, so it is withdrawn.
    proxy_holds(&mut h, "task-1001", json!([held("e5f6a7b8")]));
    h.sync_caches("task-1001");
    h.reconcile(&blocked).await;
    let blocked = h.with_written_status(&blocked);
    assert_eq!(
        approval_state(&blocked, "e5f6a7b8"),
        Some(ApprovalState::Pending)
    );
    complete_job(&h, "task-1001", 1);
    h.sync_caches("task-1001");
    h.reconcile(&blocked).await;
    let writes = h.fake.take_writes();
    assert!(events(&writes).contains(&("Normal".into(), "ApprovalWithdrawn".into())));
    let finished = h.with_written_status(&blocked);
    assert_eq!(
        finished.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Succeeded)
    );
    assert_eq!(
        approval_state(&finished, "e5f6a7b8"),
        Some(ApprovalState::Withdrawn)
    );
    assert_eq!(
        approval_state(&finished, "a1b2c3d4"),
        Some(ApprovalState::Approved)
    );
}

#[tokio::test]
async fn a_finished_taskrun_with_a_pending_approval_withdraws_it() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    complete_job(&h, "task-1001", 1);
    h.sync_caches("task-1001");
    h.reconcile(&h.with_written_status(&tr)).await;
    h.fake.take_writes();

    // Its outcome is recorded, but a call is still listed pending (an operator that stopped
    // between the two writes, or an older one): nobody can decide it any more.
    let mut finished = h.with_written_status(&tr);
    proxy_holds(&mut h, "task-1001", json!([held("a1b2c3d4")]));
    let pending: Approval = serde_json::from_value(json!({"id": "a1b2c3d4",
        "server": "everything", "tool": "echo", "requestedAt": "2026-01-01T00:00:00Z",
        "expiresAt": held("a1b2c3d4")["expiresAt"], "state": "Pending"}))
    .expect("an approval");
    if let Some(status) = finished.status.as_mut() {
        status.approvals = vec![pending];
    }
    h.reconcile(&finished).await;
    let writes = h.fake.take_writes();
    let listed = approvals_written(&writes).expect("status.approvals written");
    assert_eq!(listed[0].state, ApprovalState::Withdrawn);
    assert_eq!(
        events(&writes),
        [("Normal".into(), "ApprovalWithdrawn".into())]
    );
    // Its ConfigMap is not written (the pod is done).
    assert!(!writes.iter().any(|w| w.path.contains("/configmaps/")));
}

/// The Job's pod `name` (uid `uid`), running, controlled by the Job with `job_uid`.
fn job_pod(h: &Harness, name: &str, uid: &str, job_uid: &str) {
    h.fake.put(
        &path("pods", name),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": uid,
                "labels": {"batch.kubernetes.io/controller-uid": job_uid},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "task-1001",
                                     "uid": job_uid, "controller": true}]},
            "status": {"phase": "Running"}}),
    );
}

/// The Lease as the operator's watch would show it after the writes so far.
fn sync_lease(h: &mut Harness, name: &str) {
    let lease = h.fake.get(&path("leases", name)).expect("the Lease");
    let meta: PartialObjectMeta<Lease> = serde_json::from_value(lease).expect("a Lease");
    h.leases
        .apply(&watcher::Event::Apply(meta), lease::lease_facts);
}

#[tokio::test]
async fn the_lease_is_bound_to_the_one_pod_of_the_job_and_to_none_when_there_are_two() {
    const JOB_UID: &str = "9d1c7a00-0000-4000-8000-000000001001";
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    // The Lease carries the admission policy's label from the start.
    let lease = h.fake.get(&path("leases", "task-1001")).expect("the Lease");
    assert_eq!(
        lease["metadata"]["labels"][orchestrator_crds::approval::LEASE_LABEL],
        "true"
    );
    // The Job as the API server has it (with a uid), and no pod yet: nothing to bind.
    let mut job = h.fake.get(&path("jobs", "task-1001")).expect("the Job");
    job["metadata"]["uid"] = json!(JOB_UID);
    h.fake.put(&path("jobs", "task-1001"), job);
    h.sync_caches("task-1001");
    let tr = h.with_written_status(&tr);
    h.fake.take_writes();
    h.reconcile(&tr).await;
    assert!(!kinds(&h.fake.take_writes()).contains(&"PATCH leases".to_string()));

    // Its pod: the Lease names it, under the binding's own field manager.
    job_pod(&h, "task-1001-abcde", "pod-uid-1", JOB_UID);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    let bind = writes
        .iter()
        .find(|w| w.path == path("leases", "task-1001"))
        .expect("the Lease was bound");
    assert_eq!(
        bind.body["metadata"]["annotations"],
        json!({orchestrator_crds::approval::BINDING_UID_ANNOTATION: "pod-uid-1",
               orchestrator_crds::approval::BINDING_POD_ANNOTATION: "task-1001-abcde"})
    );
    sync_lease(&mut h, "task-1001");
    assert_eq!(
        h.leases
            .get(NS, "task-1001")
            .and_then(|f| f.bound_uid.clone())
            .as_deref(),
        Some("pod-uid-1")
    );
    // Bound: the pods are not read again, and the binding never changes.
    job_pod(&h, "forger", "pod-uid-2", JOB_UID);
    h.fake.take_reads();
    h.reconcile(&tr).await;
    assert!(!h.fake.take_reads().iter().any(|r| r.ends_with("/pods")));
    assert!(!kinds(&h.fake.take_writes()).contains(&"PATCH leases".to_string()));

    // Another task whose Job has two candidate pods (one forged): none is bound, and a
    // Warning says why.
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    let mut job = h.fake.get(&path("jobs", "task-1001")).expect("the Job");
    job["metadata"]["uid"] = json!(JOB_UID);
    h.fake.put(&path("jobs", "task-1001"), job);
    h.sync_caches("task-1001");
    job_pod(&h, "task-1001-abcde", "pod-uid-1", JOB_UID);
    job_pod(&h, "forger", "pod-uid-2", JOB_UID);
    let tr = h.with_written_status(&tr);
    h.fake.take_writes();
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    assert!(!kinds(&writes).contains(&"PATCH leases".to_string()));
    assert!(events(&writes).contains(&("Warning".into(), "ProxyIdentityAmbiguous".into())));
}

#[tokio::test]
async fn a_decision_naming_another_call_rejects_the_held_one() {
    let mut h = Harness::new();
    let tr = sample(include_str!("../../../config/samples/taskrun.yaml"));
    h.reconcile(&tr).await;
    h.sync_caches("task-1001");
    proxy_holds(&mut h, "task-1001", json!([held("a1b2c3d4")]));
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    h.fake.take_writes();
    let other = format!("sha256:{}", "2".repeat(64));
    person_decides_on(&mut h, "task-1001", "a1b2c3d4", &other, "approve", "alice");
    let tr = h.with_written_status(&tr);
    h.reconcile(&tr).await;
    let writes = h.fake.take_writes();
    let listed = approvals_written(&writes).expect("status.approvals written");
    assert_eq!(listed[0].state, ApprovalState::Rejected);
    assert!(events(&writes).contains(&("Warning".into(), "ApprovalDigestMismatch".into())));
    let cm = path("configmaps", &crate::render::config_map_name("task-1001"));
    let verdict = writes.iter().find(|w| w.path == cm).expect("the verdicts");
    let verdicts: Vec<Verdict> = serde_json::from_str(
        verdict.body["data"][VERDICTS_KEY]
            .as_str()
            .unwrap_or_default(),
    )
    .expect("verdicts");
    assert_eq!(
        (verdicts[0].decision, verdicts[0].digest.as_str()),
        (
            Decision::Reject,
            held("a1b2c3d4")["digest"].as_str().unwrap_or_default()
        )
    );
}

mod lifecycle;
mod shared_mode;
