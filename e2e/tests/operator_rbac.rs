//! The verbs in `orchestrator_operator::rbac::RULES` (and so `docs/operator.md`) are enough: the
//! operator runs with a ServiceAccount token that has exactly those rules (a Role in the test's
//! namespace, which also holds the catalog and the Lease) and takes TaskRuns through every write
//! it makes: leader Lease, ConfigMap and Job by server-side apply, a Secret check, status, events,
//! a contextVersion bump and the Job's deletion after `ttlSecondsAfterFinished`.

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskRun};
use orchestrator_e2e::{TestNamespace, client, kubeconfig_path, repo_root, wait_for};
use orchestrator_operator::rbac::RULES;
use serde_json::json;

const MINUTE: Duration = Duration::from_secs(60);

/// A client for the same cluster that authenticates with `token` only.
async fn client_with_token(token: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig_path())?;
    let mut value = serde_json::to_value(&kc)?;
    for user in value["users"].as_array_mut().context("users")? {
        user["user"] = json!({"token": token});
    }
    let kc: Kubeconfig = serde_json::from_value(value)?;
    Ok(Client::try_from(
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?,
    )?)
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn the_documented_verbs_are_enough_to_run_a_task_end_to_end() -> Result<()> {
    let admin = client().await?;
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(
        repo_root().join("crds/generated/taskrun.yaml"),
    )?)?;
    Api::<CustomResourceDefinition>::all(admin.clone())
        .patch(
            &crd.name_any(),
            &PatchParams::apply("orchestrator-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await?;
    let ns = TestNamespace::create(&admin, "op-rbac").await?;
    let n = ns.name.as_str();

    // A ServiceAccount with exactly the documented rules.
    let rules: Vec<_> = RULES
        .iter()
        .map(|r| json!({"apiGroups": [r.group], "resources": [r.resource], "verbs": r.verbs}))
        .collect();
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(admin.clone(), n)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "operator"}}))?,
        )
        .await?;
    Api::<Role>::namespaced(admin.clone(), n)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "operator"}, "rules": rules}))?,
        )
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), n)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "operator"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator"},
                "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": n}],
            }))?,
        )
        .await?;
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), n)
        .create_token_request(
            "operator",
            &pp,
            &serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?,
        )
        .await?;
    let token: TokenRequest = token;
    let restricted = client_with_token(&token.status.context("token")?.token).await?;

    // Catalog, the Secret the github server needs, and the operator with the restricted client.
    let catalog = std::fs::read_to_string(repo_root().join("config/catalog.yaml"))?;
    Api::<ConfigMap>::namespaced(admin.clone(), n)
        .create(&pp, &serde_json::from_value(json!({"metadata": {"name": "orchestrator-catalog"}, "data": {"catalog.yaml": catalog}}))?)
        .await?;
    let secret: Secret = serde_saphyr::from_str(&std::fs::read_to_string(
        repo_root().join("config/samples/github-secret.yaml"),
    )?)?;
    Api::<Secret>::namespaced(admin.clone(), n)
        .create(&pp, &secret)
        .await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let settings = orchestrator_operator::Settings::from_args([
        "orchestrator-operator",
        "--namespace",
        n,
        "--catalog-namespace",
        n,
        "--lease-namespace",
        n,
        "--bind",
        &format!("127.0.0.1:{port}"),
    ])?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(orchestrator_operator::run_with(
        restricted,
        settings,
        async {
            let _ = stopped.await;
        },
    ));

    let mut tr: TaskRun = serde_saphyr::from_str(&std::fs::read_to_string(
        repo_root().join("config/samples/taskrun-github.yaml"),
    )?)?;
    tr.spec.ttl_seconds_after_finished = Some(1);
    let trs: Api<TaskRun> = Api::namespaced(admin.clone(), n);
    trs.create(&pp, &tr).await?;
    let jobs: Api<Job> = Api::namespaced(admin.clone(), n);
    wait_for("the Job", MINUTE, || async {
        Ok(jobs.get_opt("task-1002").await?)
    })
    .await?;
    let patch = json!({"spec": {"toolConfig": {"mcpServers": [{"name": "github", "tools": {"allow": ["list_*"]}}]}}});
    trs.patch("task-1002", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    // The operator deletes the Job first and records it in the status right after.
    wait_for(
        "Succeeded, contextVersion 2, the Job deleted after its TTL and JobCreated=DeletedAfterTTL",
        MINUTE,
        || async {
            let s = trs.get("task-1002").await?.status.unwrap_or_default();
            let deleted = s
                .conditions
                .iter()
                .any(|c| c.type_ == "JobCreated" && c.reason == "DeletedAfterTTL");
            let ok = s.phase == Some(Phase::Succeeded)
                && s.context_version == Some(2)
                && deleted
                && jobs.get_opt("task-1002").await?.is_none();
            Ok(ok.then_some(()))
        },
    )
    .await?;

    let _ = stop.send(());
    operator.await??;
    ns.delete().await
}
