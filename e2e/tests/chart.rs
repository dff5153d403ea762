//! The Helm chart (`charts/orchestrator`) on the real control plane: it lints and renders into
//! objects the API server accepts; install, upgrade and uninstall behave as Helm documents; bad
//! values fail with the path of the bad field; and its RBAC is enough for the operator binary to
//! reconcile a TaskRun end to end with the chart's ServiceAccount token, while verbs the operator
//! does not need are refused to that account.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::Api;
use orchestrator_crds::taskrun::{Phase, TaskRun};
use orchestrator_e2e::{
    TestNamespace, bin_dir, cargo_bin, client, helm, kubeconfig_path, kubeconfig_with_token,
    kubectl, pinned_version, repo_root, wait_for,
};

const CHART: &str = "charts/orchestrator";

fn chart() -> String {
    repo_root().join(CHART).display().to_string()
}

/// stdout of a command that must succeed; otherwise an error with its output.
fn success(what: &str, out: Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// stdout + stderr of a command that must fail.
fn failure(what: &str, out: Output) -> Result<String> {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(!out.status.success(), "{what} should have failed:\n{text}");
    Ok(text)
}

fn values_file(dir: &tempfile::TempDir, name: &str, yaml: &str) -> Result<String> {
    let path = dir.path().join(name);
    std::fs::write(&path, yaml)?;
    Ok(path.display().to_string())
}

/// Everything a release named `release` created, by the chart's instance label.
fn release_objects(ns: &str, release: &str) -> Result<Vec<String>> {
    let selector = format!("app.kubernetes.io/instance={release}");
    let out = kubectl(&[
        "get",
        "deployments,configmaps,serviceaccounts,services,roles,rolebindings",
        "-n",
        ns,
        "-l",
        &selector,
        "-o",
        "name",
    ])?;
    let mut names: Vec<String> = success("kubectl get", out)?
        .lines()
        .map(str::to_string)
        .collect();
    let out = kubectl(&[
        "get",
        "clusterroles,clusterrolebindings",
        "-l",
        &selector,
        "-o",
        "name",
    ])?;
    names.extend(success("kubectl get", out)?.lines().map(str::to_string));
    Ok(names)
}

/// A Helm release this test installs; uninstalled when dropped, so a failing test leaves no
/// cluster-scoped RBAC behind (uninstalling twice is harmless).
struct Release {
    name: String,
    namespace: String,
}

impl Release {
    fn install(name: &str, namespace: &str, extra: &[&str]) -> Result<Self> {
        let chart = chart();
        // The CRDs are cluster-wide objects of one release: in the shared test cluster another
        // test's release (kept by their resource policy) or e2e's own install_taskrun_crd may
        // hold them, and Helm refuses to adopt them without --take-ownership.
        let mut args = vec![
            "install",
            name,
            chart.as_str(),
            "-n",
            namespace,
            "--take-ownership",
        ];
        args.extend_from_slice(extra);
        success("helm install", helm(&args)?)?;
        Ok(Self {
            name: name.to_string(),
            namespace: namespace.to_string(),
        })
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = helm(&[
            "uninstall",
            &self.name,
            "-n",
            &self.namespace,
            "--ignore-not-found",
        ]);
    }
}

#[test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
fn chart_lints_and_the_api_server_accepts_what_it_renders() -> Result<()> {
    let out = success("helm lint", helm(&["lint", &chart()])?)?;
    assert!(out.contains("0 chart(s) failed"), "{out}");

    let rt = tokio::runtime::Runtime::new()?;
    let ns = rt.block_on(async { TestNamespace::create(&client().await?, "chart-dry").await })?;
    let kube_version = pinned_version("K8S_VERSION")?;
    for set in [
        "watchNamespace=",
        "watchNamespace=default",
        "watchNamespaces={default,kube-public}",
    ] {
        let rendered = success(
            "helm template",
            helm(&[
                "template",
                "dry",
                &chart(),
                "--namespace",
                &ns.name,
                "--kube-version",
                &kube_version,
                "--set",
                set,
                "--set",
                "metrics.service.enabled=true",
            ])?,
        )?;
        let mut child = Command::new(bin_dir()?.join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig_path())
            .args(["apply", "--dry-run=server", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(rendered.as_bytes())?;
        let applied = success("kubectl apply --dry-run=server", child.wait_with_output()?)?;
        for kind in [
            "deployment.apps/",
            "configmap/",
            "serviceaccount/",
            "service/",
        ] {
            assert!(applied.contains(kind), "{kind} in:\n{applied}");
        }
        assert!(applied.contains("(server dry run)"), "{applied}");
    }
    rt.block_on(ns.delete())
}

#[test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
fn bad_values_fail_with_the_path_of_the_bad_field() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bad_entry = values_file(
        &dir,
        "bad-entry.yaml",
        "catalog:\n  servers:\n    - name: Not_A_Label\n      stdio: {command: npx}\n      toolz: []\n",
    )?;
    let text = failure(
        "helm lint with a malformed catalog entry",
        helm(&["lint", &chart(), "-f", &bad_entry])?,
    )?;
    assert!(text.contains("/catalog/servers/0/name"), "{text}");
    assert!(text.contains("does not match pattern"), "{text}");
    assert!(text.contains("'toolz' not allowed"), "{text}");

    let no_transport = values_file(
        &dir,
        "no-transport.yaml",
        "catalog:\n  servers:\n    - name: lonely\n      description: starts nothing\n",
    )?;
    let text = failure(
        "helm lint with a server without transport",
        helm(&["lint", &chart(), "-f", &no_transport])?,
    )?;
    assert!(text.contains("/catalog/servers/0"), "{text}");

    let typo = values_file(&dir, "typo.yaml", "replica: 2\n")?;
    let text = failure(
        "helm lint with a misspelt value",
        helm(&["lint", &chart(), "-f", &typo])?,
    )?;
    assert!(text.contains("'replica' not allowed"), "{text}");

    let dupes = values_file(
        &dir,
        "dupes.yaml",
        "catalog:\n  servers:\n    - {name: a, stdio: {command: npx}}\n    - {name: a, http: {url: 'http://127.0.0.1:9/mcp'}}\n",
    )?;
    let text = failure(
        "helm install with duplicate server names",
        helm(&[
            "install",
            "dupes",
            &chart(),
            "--dry-run=client",
            "-f",
            &dupes,
        ])?,
    )?;
    assert!(
        text.contains("catalog.servers[1].name: \"a\" is already the name of catalog.servers[0]"),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn install_upgrade_and_uninstall_leave_only_the_crd() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "chart").await?;
    let release = format!("r{}", &ns.name[ns.name.len() - 8..]);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);

    let _release = Release::install(&release, &ns.name, &["--wait", "--timeout", "90s"])?;
    let objects = release_objects(&ns.name, &release)?;
    for want in [
        "deployment.apps/",
        "configmap/",
        "serviceaccount/",
        "role.rbac.authorization.k8s.io/",
        "rolebinding.rbac.authorization.k8s.io/",
        "clusterrole.rbac.authorization.k8s.io/",
        "clusterrolebinding.rbac.authorization.k8s.io/",
    ] {
        assert!(
            objects.iter().any(|o| o.starts_with(want)),
            "{want} in {objects:#?}"
        );
    }
    let deployment = deployments
        .get(&format!("{release}-orchestrator-operator"))
        .await?;
    let env_of = |d: &Deployment, name: &str| -> Option<String> {
        d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
            .env
            .as_ref()?
            .iter()
            .find(|e| e.name == name)?
            .value
            .clone()
    };
    assert_eq!(
        env_of(&deployment, "ORCH_SIDECAR_IMAGE").as_deref(),
        Some("orchestrator-mcp-proxy:0.2.0")
    );

    // Upgrade with changed values: the Deployment follows, a Service appears.
    success(
        "helm upgrade",
        helm(&[
            "upgrade",
            &release,
            &chart(),
            "-n",
            &ns.name,
            "--wait",
            "--timeout",
            "90s",
            "--set",
            "sidecar.image=registry.example/orchestrator-mcp-proxy:9.9.9",
            "--set",
            "metrics.service.enabled=true",
            "--set",
            "otlp.endpoint=http://otel-collector.observability:4317",
        ])?,
    )?;
    let deployment = deployments
        .get(&format!("{release}-orchestrator-operator"))
        .await?;
    assert_eq!(
        env_of(&deployment, "ORCH_SIDECAR_IMAGE").as_deref(),
        Some("registry.example/orchestrator-mcp-proxy:9.9.9")
    );
    assert_eq!(
        env_of(&deployment, "OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://otel-collector.observability:4317")
    );
    let metrics = format!("{release}-orchestrator-operator-metrics");
    assert!(
        services.get_opt(&metrics).await?.is_some(),
        "metrics Service after upgrade"
    );

    // And back: the Service goes.
    success(
        "helm upgrade",
        helm(&[
            "upgrade",
            &release,
            &chart(),
            "-n",
            &ns.name,
            "--reuse-values",
            "--set",
            "metrics.service.enabled=false",
        ])?,
    )?;
    assert!(
        services.get_opt(&metrics).await?.is_none(),
        "metrics Service removed by upgrade"
    );

    success(
        "helm uninstall",
        helm(&[
            "uninstall",
            &release,
            "-n",
            &ns.name,
            "--wait",
            "--timeout",
            "90s",
        ])?,
    )?;
    let left = release_objects(&ns.name, &release)?;
    assert!(left.is_empty(), "left after uninstall: {left:#?}");
    // The CRDs carry helm.sh/resource-policy: keep: they stay, and TaskRuns keep their data.
    for crd in ["taskruns.orchestrator.io", "toolapprovals.orchestrator.io"] {
        let out = kubectl(&["get", "crd", crd, "-o", "name"])?;
        assert_eq!(
            success("kubectl get crd", out)?.trim(),
            format!("customresourcedefinition.apiextensions.k8s.io/{crd}")
        );
    }
    ns.delete().await
}

/// The operator binary, out of the cluster, with nothing but the chart's ServiceAccount token.
struct OperatorProcess {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl OperatorProcess {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn chart_rbac_lets_the_operator_reconcile_and_refuses_what_it_does_not_need() -> Result<()> {
    let client = client().await?;
    let system = TestNamespace::create(&client, "orch-sys").await?;
    let work = TestNamespace::create(&client, "orch-work").await?;
    let release = format!("r{}", &system.name[system.name.len() - 8..]);
    let _release = Release::install(&release, &system.name, &["--timeout", "90s"])?;
    let sa = format!("{release}-orchestrator-operator");
    let token = success(
        "kubectl create token",
        kubectl(&[
            "create",
            "token",
            &sa,
            "-n",
            &system.name,
            "--duration",
            "1h",
        ])?,
    )?;
    let dir = tempfile::tempdir()?;
    let sa_kubeconfig = dir.path().join("operator.kubeconfig");
    kubeconfig_with_token(&sa_kubeconfig, token.trim())?;

    // The operator as the chart configures it (same env names, same catalog and lease), but
    // watching only our work namespace so it never meets other tests' TaskRuns.
    let bin = cargo_bin("orchestrator-operator", "orchestrator-operator")?;
    let log = dir.path().join("operator.log");
    let file = std::fs::File::create(&log)?;
    let operator = OperatorProcess {
        child: Command::new(bin)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &sa_kubeconfig)
            .env("RUST_LOG", "info")
            .env("ORCH_WATCH_NAMESPACE", &work.name)
            .env("ORCH_CATALOG_NAMESPACE", &system.name)
            .env(
                "ORCH_CATALOG_NAME",
                format!("{release}-orchestrator-catalog"),
            )
            .env("ORCH_LEASE_NAMESPACE", &system.name)
            .env("ORCH_LEASE_NAME", &sa)
            .env("ORCH_BIND", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?,
        log,
    };

    // The sample TaskRun, applied as a user would.
    let sample = repo_root().join("config/samples/taskrun.yaml");
    success(
        "kubectl apply",
        kubectl(&[
            "apply",
            "-n",
            &work.name,
            "-f",
            &sample.display().to_string(),
        ])?,
    )?;
    let taskruns: Api<TaskRun> = Api::namespaced(client.clone(), &work.name);
    let name = "task-1001";
    let done = wait_for(
        "the sample TaskRun to succeed",
        Duration::from_secs(120),
        || async {
            let tr = taskruns.get(name).await?;
            Ok(tr
                .status
                .as_ref()
                .filter(|s| s.phase == Some(Phase::Succeeded))
                .map(|_| tr.clone()))
        },
    )
    .await
    .with_context(|| format!("operator log:\n{}", operator.logs()))?;
    let uid = done.uid().context("uid")?;
    let owned = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
        refs.iter()
            .any(|o| o.uid == uid && o.controller == Some(true))
    };
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &work.name)
        .get(&format!("{name}-tools"))
        .await?;
    assert!(
        owned(cm.owner_references()),
        "ConfigMap owned by the TaskRun"
    );
    let job = Api::<Job>::namespaced(client.clone(), &work.name)
        .get(name)
        .await?;
    assert!(owned(job.owner_references()), "Job owned by the TaskRun");
    let logs = operator.logs();
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "the operator was refused something:\n{logs}"
    );

    // What the operator never does is refused to its account.
    let as_operator = |args: &[&str]| -> Result<Output> {
        let mut all = vec!["--kubeconfig", sa_kubeconfig.to_str().context("path")?];
        all.extend_from_slice(args);
        Ok(Command::new(bin_dir()?.join("kubectl"))
            .args(all)
            .output()?)
    };
    let cm_name = format!("{name}-tools");
    for (what, args) in [
        (
            "delete a ConfigMap",
            vec![
                "delete",
                "configmap",
                cm_name.as_str(),
                "-n",
                work.name.as_str(),
            ],
        ),
        (
            "list Secrets",
            vec!["get", "secrets", "-n", work.name.as_str()],
        ),
        (
            "delete a Secret",
            vec!["delete", "secret", "anything", "-n", work.name.as_str()],
        ),
        (
            "create a Pod",
            vec![
                "run",
                "intruder",
                "--image=busybox",
                "-n",
                work.name.as_str(),
            ],
        ),
        ("read Nodes", vec!["get", "nodes"]),
    ] {
        let text = failure(what, as_operator(&args)?)?;
        assert!(
            text.contains("Forbidden") || text.contains("forbidden"),
            "{what}: {text}"
        );
    }
    let patch_spec = as_operator(&[
        "patch",
        "taskrun",
        name,
        "-n",
        &work.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"toolConfig":{"mcpServers":[]}}}"#,
    ])?;
    let text = failure("patch a TaskRun's spec", patch_spec)?;
    assert!(text.contains("forbidden"), "{text}");

    drop(operator);
    success(
        "helm uninstall",
        helm(&["uninstall", &release, "-n", &system.name])?,
    )?;
    work.delete().await?;
    system.delete().await
}

/// The rules of one rendered Role/ClusterRole: (group, resource) -> verbs.
type Rules = std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>>;

fn rules_of(role: &serde_json::Value) -> Result<Rules> {
    let mut rules = Rules::new();
    for rule in role["rules"].as_array().context("rules")? {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                rules
                    .entry((group.clone(), resource))
                    .or_default()
                    .extend(strings("verbs"));
            }
        }
    }
    Ok(rules)
}

/// The chart rendered with `set` (release `r` in namespace `sys`), one JSON value per object.
fn rendered(set: &[&str]) -> Result<Vec<serde_json::Value>> {
    let mut args = vec!["template", "r", CHART, "-n", "sys", "--kube-version"];
    let version = pinned_version("K8S_VERSION")?;
    args.push(&version);
    for s in set {
        args.extend(["--set", s]);
    }
    let out = success(
        "helm template",
        Command::new(bin_dir()?.join("helm"))
            .current_dir(repo_root())
            .args(&args)
            .output()?,
    )?;
    Ok(out
        .split("\n---")
        .filter(|d| d.contains("kind:"))
        .map(serde_saphyr::from_str)
        .collect::<std::result::Result<_, _>>()?)
}

/// `RULES` of the given scopes, as rules.
fn wanted(scopes: &[orchestrator_operator::rbac::Scope]) -> Rules {
    let mut want = Rules::new();
    for rule in orchestrator_operator::rbac::RULES {
        if scopes.contains(&rule.scope) {
            want.entry((rule.group.to_string(), rule.resource.to_string()))
                .or_default()
                .extend(rule.verbs.iter().map(|v| v.to_string()));
        }
    }
    want
}

/// Objects of `kind` named `name` (in `namespace`, when given).
fn find<'a>(
    docs: &'a [serde_json::Value],
    kind: &str,
    name: &str,
    namespace: Option<&str>,
) -> Vec<&'a serde_json::Value> {
    docs.iter()
        .filter(|d| {
            d["kind"] == kind
                && d["metadata"]["name"] == name
                && namespace.is_none_or(|ns| d["metadata"]["namespace"] == ns)
        })
        .collect()
}

/// Both installs grant exactly `rbac::RULES`, each rule where the table in docs/operator.md
/// says: the task rules as a ClusterRole (default) or as a Role in each watched namespace and
/// nothing cluster-wide for the operator (`watchNamespaces`); the leader Lease and the catalog
/// ConfigMap (by name) as a Role in the release namespace in both.
#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn chart_grants_exactly_the_verbs_the_operator_lists() -> Result<()> {
    use orchestrator_operator::rbac::Scope;
    let tasks = wanted(&[Scope::Tasks]);
    let local = wanted(&[Scope::LeaseNamespace, Scope::Catalog]);
    let operator = "r-orchestrator-operator";
    let local_role = |docs: &[serde_json::Value]| -> Result<()> {
        let roles = find(docs, "Role", "r-orchestrator-operator-local", Some("sys"));
        ensure!(roles.len() == 1, "one local Role: {roles:?}");
        assert_eq!(
            rules_of(roles[0])?,
            local,
            "local Role vs operator/src/rbac.rs"
        );
        let catalog = roles[0]["rules"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["resources"][0] == "configmaps"))
            .context("the catalog rule")?;
        assert_eq!(
            catalog["resourceNames"],
            serde_json::json!(["r-orchestrator-catalog"])
        );
        Ok(())
    };

    let docs = rendered(&[])?;
    let cluster = find(&docs, "ClusterRole", operator, None);
    ensure!(cluster.len() == 1, "one ClusterRole {operator}");
    assert_eq!(
        rules_of(cluster[0])?,
        tasks,
        "ClusterRole vs operator/src/rbac.rs"
    );
    ensure!(find(&docs, "ClusterRoleBinding", operator, None).len() == 1);
    local_role(&docs)?;

    for set in [
        vec!["watchNamespaces={team-a,team-b}"],
        vec!["watchNamespace=team-a"],
    ] {
        let docs = rendered(&set)?;
        let namespaces: &[&str] = if set[0].starts_with("watchNamespaces") {
            &["team-a", "team-b"]
        } else {
            &["team-a"]
        };
        for ns in namespaces {
            let role = find(&docs, "Role", operator, Some(ns));
            ensure!(role.len() == 1, "{set:?}: a Role {operator} in {ns}");
            assert_eq!(
                rules_of(role[0])?,
                tasks,
                "{set:?}: Role in {ns} vs operator/src/rbac.rs"
            );
            let binding = find(&docs, "RoleBinding", operator, Some(ns));
            ensure!(binding.len() == 1, "{set:?}: a RoleBinding in {ns}");
            assert_eq!(binding[0]["roleRef"]["kind"], "Role");
            assert_eq!(binding[0]["subjects"][0]["name"], operator);
            assert_eq!(binding[0]["subjects"][0]["namespace"], "sys");
        }
        let roles = docs.iter().filter(|d| d["kind"] == "Role").count();
        assert_eq!(
            roles,
            namespaces.len() + 1,
            "{set:?}: a Role per namespace and the local one"
        );
        // Nothing cluster-wide for the operator's account: no ClusterRole of its own and no
        // ClusterRoleBinding at all (the chart's approver ClusterRole is for people to bind).
        assert!(
            find(&docs, "ClusterRole", operator, None).is_empty(),
            "{set:?}"
        );
        let cluster_bindings: Vec<_> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRoleBinding")
            .collect();
        assert!(cluster_bindings.is_empty(), "{set:?}: {cluster_bindings:?}");
        local_role(&docs)?;
    }
    Ok(())
}

/// The chart states the Kubernetes versions it supports (Chart.yaml kubeVersion) and Helm
/// enforces them: 1.30 is refused with a message naming the range; 1.31 (selectable fields on by
/// default) and the tested 1.35 render.
#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn chart_refuses_kubernetes_before_1_31() -> Result<()> {
    let helm_template = |version: &str| -> Result<Output> {
        Ok(Command::new(bin_dir()?.join("helm"))
            .current_dir(repo_root())
            .args(["template", "r", CHART, "--kube-version", version])
            .output()?)
    };
    let text = failure("helm template for 1.30", helm_template("1.30.0")?)?;
    assert!(
        text.contains(
            "chart requires kubeVersion: >=1.31.0-0 which is incompatible with Kubernetes v1.30.0"
        ),
        "{text}"
    );
    for version in ["1.31.0", "1.35.0", &pinned_version("K8S_VERSION")?] {
        success(
            &format!("helm template for {version}"),
            helm_template(version)?,
        )?;
    }
    Ok(())
}

/// The CRDs the chart installs are crdgen's output (crds/generated/), with only Helm's keep
/// policy and the chart's labels added; `crds.install=false` installs none.
#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn chart_installs_crdgens_crds_kept_on_uninstall() -> Result<()> {
    let docs = rendered(&[])?;
    for file in ["taskrun.yaml", "toolapproval.yaml"] {
        let text = std::fs::read_to_string(repo_root().join("crds/generated").join(file))?;
        let want: serde_json::Value = serde_saphyr::from_str(&text)?;
        let name = want["metadata"]["name"].as_str().context("CRD name")?;
        let found = find(&docs, "CustomResourceDefinition", name, None);
        ensure!(found.len() == 1, "one CRD {name} rendered");
        let mut got = found[0].clone();
        let meta = got["metadata"].as_object_mut().context("metadata")?;
        let annotations = meta.remove("annotations").unwrap_or_default();
        assert_eq!(
            annotations,
            serde_json::json!({"helm.sh/resource-policy": "keep"}),
            "{name}"
        );
        let labels = meta.remove("labels").unwrap_or_default();
        assert_eq!(
            labels["app.kubernetes.io/part-of"], "orchestrator",
            "{name}"
        );
        assert_eq!(
            got, want,
            "{name}: the chart's CRD vs crds/generated/{file}"
        );
    }
    let docs = rendered(&["crds.install=false"])?;
    let crds: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    assert!(crds.is_empty(), "crds.install=false: {crds:?}");
    Ok(())
}

/// The first container of the rendered Deployment whose name ends with `suffix` (null if none).
fn first_container(objects: &[serde_json::Value], suffix: &str) -> serde_json::Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == "Deployment"
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(suffix))
        })
        .map(|d| d["spec"]["template"]["spec"]["containers"][0].clone())
        .unwrap_or_default()
}

/// One log format for the install: `logJson` (default true) makes the operator log JSON
/// (`ORCH_LOG_JSON`, which also makes it render `--log-format=json` for the task pods' proxies
/// and zones) and gives the shared proxy `--log-format=json`; false gives both text.
#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn log_json_sets_the_operators_and_the_shared_proxys_format() -> Result<()> {
    for (set, json, format) in [
        (
            &["sharedProxy.enabled=true"][..],
            "true",
            "--log-format=json",
        ),
        (
            &["sharedProxy.enabled=true", "logJson=false"],
            "false",
            "--log-format=text",
        ),
    ] {
        let objects = rendered(set)?;
        let deployment = |suffix: &str| first_container(&objects, suffix);
        let operator = deployment("-operator");
        let env = operator["env"].as_array().cloned().unwrap_or_default();
        let log_json = env.iter().find(|e| e["name"] == "ORCH_LOG_JSON");
        assert_eq!(
            log_json.map(|e| e["value"].clone()),
            Some(json.into()),
            "{set:?}: {env:?}"
        );
        let shared = deployment("-mcp-proxy");
        assert_eq!(shared["command"][1], format, "{set:?}: {shared}");
    }
    Ok(())
}

/// `otlp.auditEndpoint`: the operator is told (and renders `--audit-otlp` for the task pods'
/// proxies), the shared proxy exports its audit there too; a value that is not an http(s) URL
/// is refused with its path.
#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn the_audit_otlp_endpoint_reaches_the_operator_and_the_shared_proxy() -> Result<()> {
    let endpoint = "http://collector.obs:4318";
    let set = format!("otlp.auditEndpoint={endpoint}");
    let objects = rendered(&["sharedProxy.enabled=true", &set])?;
    let container = |suffix: &str| first_container(&objects, suffix);
    let env_of = |c: &serde_json::Value, name: &str| {
        c["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == name).cloned())
            .map(|e| e["value"].clone())
    };
    let operator = container("-operator");
    assert_eq!(
        env_of(&operator, "ORCH_SIDECAR_AUDIT_OTLP_ENDPOINT"),
        Some(endpoint.into())
    );
    let shared = container("-mcp-proxy");
    assert_eq!(
        env_of(&shared, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
        Some(endpoint.into())
    );
    let args = shared["args"].as_array().cloned().unwrap_or_default();
    assert!(args.contains(&"--audit-otlp".into()), "{args:?}");
    // Unset: neither.
    let objects = rendered(&["sharedProxy.enabled=true"])?;
    let shared = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "r-orchestrator-mcp-proxy")
        .map(|d| d["spec"]["template"]["spec"]["containers"][0].to_string())
        .unwrap_or_default();
    assert!(
        !shared.contains("--audit-otlp") && !shared.contains("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
        "{shared}"
    );
    let text = failure(
        "helm template with a bad auditEndpoint",
        Command::new(bin_dir()?.join("helm"))
            .current_dir(repo_root())
            .args([
                "template",
                "r",
                CHART,
                "--set",
                "otlp.auditEndpoint=collector:4318",
            ])
            .output()?,
    )?;
    assert!(text.contains("/otlp/auditEndpoint"), "{text}");
    Ok(())
}
