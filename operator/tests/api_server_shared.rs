//! Against a real API server (`KUBECONFIG`: the e2e control plane, `e2e/cluster up`): the
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

async fn client() -> Client {
    Client::try_default()
        .await
        .expect("KUBECONFIG names the e2e control plane")
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
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request("operator", &pp, &request)
        .await
        .expect("a token")
        .status
        .expect("issued")
        .token;
    let mut config = Config::infer().await.expect("kubeconfig");
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let as_operator = Client::try_from(config).expect("client");
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
