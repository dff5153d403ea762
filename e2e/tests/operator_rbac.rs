//! The verbs in `orchestrator_operator::rbac::RULES` (and so `docs/operator.md`) are enough: the
//! operator runs with a ServiceAccount token that has exactly those rules (a Role in the test's
//! namespace, which also holds the catalog and the Lease) and takes TaskRuns through every write
//! it makes: leader Lease, ConfigMap and Job by server-side apply, a Secret check, status, events,
//! a contextVersion bump and the Job's deletion after `ttlSecondsAfterFinished`; and each task
//! pod's identity (ServiceAccount, Role, RoleBinding), which the API server lets it grant only
//! because it holds those permissions itself. That identity reads its own ConfigMap and nothing
//! else.

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
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

/// A token for `account` in `ns`.
async fn token_for(admin: &Client, ns: &str, account: &str) -> Result<String> {
    let token: TokenRequest = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(
            account,
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?,
        )
        .await?;
    Ok(token.status.context("token")?.token)
}

/// The operator, in this process, with a ServiceAccount token that has exactly the documented
/// rules; and the CRD, the catalog and the github Secret in a namespace of its own.
struct Restricted {
    admin: Client,
    ns: TestNamespace,
    stop: tokio::sync::oneshot::Sender<()>,
    operator: tokio::task::JoinHandle<orchestrator_operator::Result<()>>,
}

impl Restricted {
    async fn start(prefix: &str) -> Result<Self> {
        let admin = client().await?;
        for file in ["taskrun.yaml", "toolapproval.yaml"] {
            let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(
                repo_root().join("crds/generated").join(file),
            )?)?;
            Api::<CustomResourceDefinition>::all(admin.clone())
                .patch(
                    &crd.name_any(),
                    &PatchParams::apply("orchestrator-e2e").force(),
                    &Patch::Apply(&crd),
                )
                .await?;
        }
        let ns = TestNamespace::create(&admin, prefix).await?;
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
        let restricted = client_with_token(&token_for(&admin, n, "operator").await?).await?;

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
        Ok(Self {
            admin,
            ns,
            stop,
            operator,
        })
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.operator.await??;
        self.ns.delete().await
    }
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn the_documented_verbs_are_enough_to_run_a_task_end_to_end() -> Result<()> {
    let r = Restricted::start("op-rbac").await?;
    let (admin, n, pp) = (r.admin.clone(), r.ns.name.clone(), PostParams::default());
    let n = n.as_str();
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

    r.stop().await
}

/// Whether `result` is the API server's 403.
fn forbidden<T>(result: kube::Result<T>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn each_task_pod_runs_as_an_identity_that_reads_only_its_own_config_map() -> Result<()> {
    let r = Restricted::start("op-identity").await?;
    let (admin, n) = (r.admin.clone(), r.ns.name.clone());
    let n = n.as_str();
    let trs: Api<TaskRun> = Api::namespaced(admin.clone(), n);
    let sample = std::fs::read_to_string(repo_root().join("config/samples/taskrun.yaml"))?;
    for name in ["task-a", "task-b"] {
        let mut tr: TaskRun = serde_saphyr::from_str(&sample)?;
        tr.metadata.name = Some(name.into());
        tr.metadata.namespace = None;
        trs.create(&PostParams::default(), &tr).await?;
    }
    let jobs: Api<Job> = Api::namespaced(admin.clone(), n);
    let job = wait_for("task-a's Job", MINUTE, || async {
        Ok(jobs.get_opt("task-a").await?)
    })
    .await?;
    wait_for("task-b's Job", MINUTE, || async {
        Ok(jobs.get_opt("task-b").await?)
    })
    .await?;

    // The pod runs as the task's own ServiceAccount, with no token mounted.
    let pod = job.spec.and_then(|s| s.template.spec).context("pod spec")?;
    assert_eq!(pod.service_account_name.as_deref(), Some("task-a"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), n);
    let sa = sas.get("task-a").await?;
    assert_eq!(sa.owner_references()[0].kind, "TaskRun");

    // What a token of that identity can do.
    let task_a = client_with_token(&token_for(&admin, n, "task-a").await?).await?;
    let cms: Api<ConfigMap> = Api::namespaced(task_a.clone(), n);
    let own = cms.get("task-a-tools").await?;
    assert!(own.data.is_some_and(|d| d.contains_key("proxy.yaml")));
    // A list or watch narrowed to its ConfigMap by name is allowed (what an API watch uses).
    let by_name = kube::api::ListParams::default().fields("metadata.name=task-a-tools");
    assert_eq!(cms.list(&by_name).await?.items.len(), 1);
    // Another task's ConfigMap, every other ConfigMap and any Secret: 403.
    assert!(
        forbidden(cms.get("task-b-tools").await),
        "another task's ConfigMap"
    );
    assert!(
        forbidden(cms.get("orchestrator-catalog").await),
        "the catalog"
    );
    assert!(
        forbidden(cms.list(&Default::default()).await),
        "all ConfigMaps"
    );
    let secrets: Api<Secret> = Api::namespaced(task_a.clone(), n);
    assert!(forbidden(secrets.get("github").await), "a Secret");
    assert!(
        forbidden(secrets.list(&Default::default()).await),
        "all Secrets"
    );
    assert!(
        forbidden(
            cms.patch(
                "task-a-tools",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"x": "y"}}))
            )
            .await
        ),
        "writing its own ConfigMap"
    );

    // Its own Lease: read and patch (where the proxy reports what it serves); nothing more.
    let leases: Api<Lease> = Api::namespaced(task_a.clone(), n);
    leases.get("task-a").await?;
    let report =
        json!({"metadata": {"annotations": {"orchestrator.io/served-context-version": "1"}}});
    leases
        .patch("task-a", &PatchParams::default(), &Patch::Merge(&report))
        .await?;
    assert!(
        forbidden(
            leases
                .patch("task-b", &PatchParams::default(), &Patch::Merge(&report))
                .await
        ),
        "another task's Lease"
    );
    assert!(
        forbidden(
            leases
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "mine"}}))?
                )
                .await
        ),
        "creating a Lease"
    );
    // The operator sees the report.
    wait_for(
        "status.servedContextVersion 1 and ToolsSynced",
        MINUTE,
        || async {
            let s = trs.get("task-a").await?.status.unwrap_or_default();
            let synced = s
                .conditions
                .iter()
                .any(|c| c.type_ == "ToolsSynced" && c.status == "True");
            Ok((s.served_context_version == Some(1) && synced).then_some(()))
        },
    )
    .await?;

    // The identity goes with the TaskRun (owner references).
    trs.delete("task-a", &Default::default()).await?;
    let roles: Api<Role> = Api::namespaced(admin.clone(), n);
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), n);
    let admin_leases: Api<Lease> = Api::namespaced(admin.clone(), n);
    wait_for(
        "the garbage collector to remove task-a's ServiceAccount, Role and RoleBinding",
        MINUTE,
        || async {
            let gone = sas.get_opt("task-a").await?.is_none()
                && admin_leases.get_opt("task-a").await?.is_none()
                && roles.get_opt("task-a").await?.is_none()
                && bindings.get_opt("task-a").await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    assert!(sas.get_opt("task-b").await?.is_some());
    r.stop().await
}
