//! Against a real API server (the e2e control plane, `e2e/cluster up`: its kubeconfig, as the
//! other cluster tests find it, or `KUBECONFIG` when set): the
//! TaskRun CRD's rule for shared mode (no `spec.proxy.resources` with `mode: shared`), and the
//! one cluster-scoped read the operator makes, `get` of a TaskRun's Namespace (its proxy-mode
//! label), granted by a Role in that namespace only, with a token of an account holding it.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, Config};
use serde_json::json;

const MANAGER: &str = "orchestrator-operator-tests";

/// The e2e control plane's kubeconfig: `$KUBECONFIG`, else the one `e2e/cluster up` writes
/// (`$ORCH_E2E_STATE/kubeconfig`, default `<repo>/e2e/.cluster/kubeconfig`), as `./test` runs it.
async fn config() -> Config {
    let path = std::env::var_os("KUBECONFIG")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("ORCH_E2E_STATE")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/.cluster")
                })
                .join("kubeconfig")
        });
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("the e2e control plane's kubeconfig {}: {e}", path.display()));
    Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("a client config from the e2e kubeconfig")
}

async fn client() -> Client {
    Client::try_from(config().await).expect("a client for the e2e control plane")
}

/// A namespace for one test, deleted at the end.
async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{:x}", std::process::id());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    name
}

async fn delete_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await;
}

/// Polls `f` every 200 ms until it returns `Some`, for at most `within`.
async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/cluster up; KUBECONFIG)"]
async fn the_api_server_refuses_proxy_resources_in_shared_mode() {
    let client = client().await;
    // The CRD as crdgen writes it (what the chart installs).
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/generated/taskrun.yaml"
    ))
    .expect("crds/generated/taskrun.yaml");
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).expect("a CRD");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.patch(
        "taskruns.orchestrator.io",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("CRD applied");
    let ns = namespace(&client, "m2-cel").await;
    let gvk = GroupVersionKind::gvk("orchestrator.io", "v1", "TaskRun");
    let taskruns: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gvk));
    let taskrun = |name: &str, proxy: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": name},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"}, "proxy": proxy}
        }))
        .expect("a TaskRun")
    };
    let resources = json!({"requests": {"cpu": "50m"}});
    // Served with the new schema (the CRD may have just been updated).
    wait_for(
        "a shared TaskRun to be accepted",
        Duration::from_secs(30),
        || async {
            taskruns
                .create(
                    &PostParams::default(),
                    &taskrun("shared", json!({"mode": "shared"})),
                )
                .await
                .ok()
        },
    )
    .await;
    // The attack: a shared TaskRun sizing a sidecar it does not have.
    let err = taskruns
        .create(
            &PostParams::default(),
            &taskrun("sized", json!({"mode": "shared", "resources": resources})),
        )
        .await
        .expect_err("resources with shared is refused");
    let kube::Error::Api(status) = err else {
        panic!("an API refusal, got {err:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains(
            "spec.proxy.resources sizes the sidecar; in shared mode the proxy is the chart's Deployment (sharedProxy.resources)"
        ),
        "{}",
        status.message
    );
    assert!(taskruns.get_opt("sized").await.expect("read").is_none());
    // Sidecar (or no mode) with resources is fine; the mode cannot change afterwards.
    for (name, proxy) in [
        (
            "sidecar-sized",
            json!({"mode": "sidecar", "resources": resources}),
        ),
        ("unset-sized", json!({"resources": resources})),
    ] {
        taskruns
            .create(&PostParams::default(), &taskrun(name, proxy))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let flip = taskruns
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"proxy": {"mode": "sidecar"}}})),
        )
        .await
        .expect_err("spec.proxy is immutable");
    assert!(
        matches!(flip, kube::Error::Api(ref s) if s.code == 422),
        "{flip:?}"
    );
    delete_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/cluster up; KUBECONFIG)"]
async fn a_role_granting_get_namespaces_reads_its_own_namespace_and_no_other() {
    let admin = client().await;
    let ns = namespace(&admin, "m2-nsget").await;
    let other = namespace(&admin, "m2-nsother").await;
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "operator"}})).expect("sa");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "operator"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]
    }))
    .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]
    }))
    .expect("binding");
    let pp = PostParams::default();
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &ns);
    accounts.create(&pp, &sa).await.expect("sa");
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&pp, &role)
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&pp, &binding)
        .await
        .expect("binding");
    let as_operator = client_as(&admin, &ns, "operator").await;
    let namespaces = Api::<Namespace>::all(as_operator);
    // RBAC is eventually consistent after a create: wait for the grant, then the refusal stands.
    let own = wait_for("the Role to apply", Duration::from_secs(30), || async {
        namespaces.get(&ns).await.ok()
    })
    .await;
    assert_eq!(own.metadata.name.as_deref(), Some(ns.as_str()));
    let refused = namespaces.get(&other).await.expect_err("another namespace");
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 403),
        "{refused:?}"
    );
    let listed = namespaces
        .list(&Default::default())
        .await
        .expect_err("no list");
    assert!(
        matches!(listed, kube::Error::Api(ref s) if s.code == 403),
        "{listed:?}"
    );
    delete_namespace(&admin, &ns).await;
    delete_namespace(&admin, &other).await;
}

/// A client authenticated with a fresh token of `ns/account`.
async fn client_as(admin: &Client, ns: &str, account: &str) -> Client {
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("issued")
        .token;
    let mut config = config().await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).expect("client")
}

/// The chart's Lease policy with sharedProxy.enabled, as rendered, installed for the test's own
/// namespace only (a namespaceSelector added: the cluster is shared with other tests).
#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/cluster up; KUBECONFIG) and helm from its build"]
async fn only_the_shared_proxy_writes_a_shared_tasks_lease() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::coordination::v1::Lease;
    let admin = client().await;
    let sys = namespace(&admin, "m2-vap-sys").await;
    let task_ns = namespace(&admin, "m2-vap-task").await;
    let tag = format!("{:x}", std::process::id());
    // Render the chart for release m2vap in `sys`.
    let helm = {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new(root.join("e2e/controlplane/build"))
            .output()
            .expect("build");
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        let out = std::process::Command::new(std::path::Path::new(&dir).join("helm"))
            .current_dir(&root)
            .args([
                "template",
                "m2vap",
                "charts/orchestrator",
                "-n",
                &sys,
                "--kube-version",
                "1.35.4",
            ])
            .args([
                "--set",
                "sharedProxy.enabled=true",
                "--set",
                "crds.install=false",
            ])
            .output()
            .expect("helm");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let docs: Vec<serde_json::Value> = helm
        .split("\n---")
        .filter(|d| d.contains("kind:"))
        .map(|d| serde_saphyr::from_str(d).expect("yaml"))
        .collect();
    let name = "m2vap-orchestrator-proxy-lease-writer";
    let mut policy = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
        .expect("the Lease policy")
        .clone();
    let mut binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding" && d["metadata"]["name"] == name)
        .expect("its binding")
        .clone();
    let test_name = format!("{name}-{tag}");
    policy["metadata"]["name"] = json!(test_name);
    policy["spec"]["matchConstraints"]["namespaceSelector"] =
        json!({"matchLabels": {"kubernetes.io/metadata.name": task_ns}});
    binding["metadata"]["name"] = json!(test_name);
    binding["spec"]["policyName"] = json!(test_name);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(policy).expect("a policy");
    let binding: ValidatingAdmissionPolicyBinding =
        serde_json::from_value(binding).expect("a binding");
    let pp = PostParams::default();
    let policies = Api::<ValidatingAdmissionPolicy>::all(admin.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone());
    policies.create(&pp, &policy).await.expect("policy");
    bindings.create(&pp, &binding).await.expect("binding");

    // The shared proxy's account in `sys`, the task namespace's default account (any pod of
    // it), both allowed by RBAC to patch the Lease.
    let proxy_sa = "m2vap-orchestrator-mcp-proxy";
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": proxy_sa}})).expect("sa");
    Api::<ServiceAccount>::namespaced(admin.clone(), &sys)
        .create(&pp, &sa)
        .await
        .expect("sa");
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "lease"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "patch"]}]}))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), &task_ns)
        .create(&pp, &role)
        .await
        .expect("role");
    let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "lease"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"},
        "subjects": [{"kind": "ServiceAccount", "name": proxy_sa, "namespace": sys},
                     {"kind": "ServiceAccount", "name": "default", "namespace": task_ns}]}))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), &task_ns)
        .create(&pp, &rb)
        .await
        .expect("rb");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "task-1",
        "labels": {"orchestrator.io/proxy-lease": "true"},
        "annotations": {"orchestrator.io/proxy-mode": "shared"}}}))
    .expect("lease");
    Api::<Lease>::namespaced(admin.clone(), &task_ns)
        .create(&pp, &lease)
        .await
        .expect("lease");

    let served = |v: &str| {
        Patch::Merge(
            json!({"metadata": {"annotations": {"orchestrator.io/served-context-version": v}}}),
        )
    };
    let attacker = Api::<Lease>::namespaced(client_as(&admin, &task_ns, "default").await, &task_ns);
    // The attack: a pod of the task's namespace writes the shared task's Lease. Refused once the
    // policy is in force (it is loaded asynchronously).
    let refused = wait_for(
        "the policy to refuse the namespace's account",
        Duration::from_secs(60),
        || async {
            match attacker
                .patch("task-1", &PatchParams::default(), &served("9"))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 403 => Some(s.message),
                _ => None,
            }
        },
    )
    .await;
    assert!(
        refused.contains("belongs to a task served by the shared proxy")
            && refused.contains(&format!("system:serviceaccount:{sys}:{proxy_sa}")),
        "{refused}"
    );
    let proxy = Api::<Lease>::namespaced(client_as(&admin, &sys, proxy_sa).await, &task_ns);
    proxy
        .patch("task-1", &PatchParams::default(), &served("1"))
        .await
        .expect("the shared proxy writes it");
    let flip = proxy
        .patch(
            "task-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"orchestrator.io/proxy-mode": "sidecar"}}}),
            ),
        )
        .await
        .expect_err("the mode annotation is the operator's");
    assert!(
        matches!(flip, kube::Error::Api(ref s) if s.code == 403 && s.message.contains("mode annotation")),
        "{flip:?}"
    );

    let _ = bindings.delete(&test_name, &DeleteParams::default()).await;
    let _ = policies.delete(&test_name, &DeleteParams::default()).await;
    delete_namespace(&admin, &task_ns).await;
    delete_namespace(&admin, &sys).await;
}
