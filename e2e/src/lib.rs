//! Helpers for the integration tests that run against the real control plane of `e2e/cluster`.
//!
//! Every test builds its client from the kubeconfig that `e2e/cluster up` writes (never from
//! `$KUBECONFIG` or `~/.kube/config`), and works in a namespace of its own that it deletes.
//! The tests are `#[ignore]`d so a plain `cargo test` never touches a cluster; `./test` runs
//! them with `--ignored` once the cluster is up.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The repository root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// Where `e2e/cluster` keeps its state (`ORCH_E2E_STATE`, default `e2e/.cluster`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("ORCH_E2E_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("e2e/.cluster"))
}

/// The kubeconfig `e2e/cluster up` wrote.
pub fn kubeconfig_path() -> PathBuf {
    state_dir().join("kubeconfig")
}

/// A client for the e2e cluster, from its own kubeconfig and nothing else.
pub async fn client() -> Result<Client> {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "reading {} (is the cluster up? run `e2e/cluster up`)",
            path.display()
        )
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The directory with kubectl, helm and the control-plane binaries (built or reused).
pub fn bin_dir() -> Result<PathBuf> {
    let out = Command::new(repo_root().join("e2e/controlplane/build"))
        .output()
        .context("running e2e/controlplane/build")?;
    if !out.status.success() {
        bail!(
            "e2e/controlplane/build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().context("build printed no bin dir")?;
    Ok(PathBuf::from(last.trim()))
}

/// A pinned version from `e2e/controlplane/versions.env`, e.g. `pinned_version("K8S_VERSION")`.
pub fn pinned_version(key: &str) -> Result<String> {
    let path = repo_root().join("e2e/controlplane/versions.env");
    let text = std::fs::read_to_string(&path)?;
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
        .with_context(|| format!("{key} not in {}", path.display()))
}

/// Runs kubectl against the e2e cluster (explicit `--kubeconfig`).
pub fn kubectl(args: &[&str]) -> Result<Output> {
    let out = Command::new(bin_dir()?.join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .output()
        .context("running kubectl")?;
    Ok(out)
}

/// Polls `check` every 100 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > timeout {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A namespace for one test. Delete it with [`TestNamespace::delete`] at the end of a passing
/// test; a failing test leaves it behind to look at (`e2e/cluster down` removes everything).
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `<prefix>-<random>` and waits until its default ServiceAccount exists (pods
    /// cannot be created before that).
    pub async fn create(client: &Client, prefix: &str) -> Result<Self> {
        let name = format!("{prefix}-{:08x}", rand_u32());
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"orchestrator.io/e2e": "true"}}
        }))?;
        api.create(&PostParams::default(), &ns).await?;
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_for(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            || async { Ok(sa.get_opt("default").await?) },
        )
        .await?;
        Ok(Self {
            name,
            client: client.clone(),
        })
    }

    /// Deletes the namespace (and so everything in it).
    pub async fn delete(self) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client);
        api.delete(&self.name, &DeleteParams::background()).await?;
        Ok(())
    }
}

fn rand_u32() -> u32 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish() as u32
}

/// Runs helm against the e2e cluster (explicit `--kubeconfig`).
pub fn helm(args: &[&str]) -> Result<Output> {
    let out = Command::new(bin_dir()?.join("helm"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .output()
        .context("running helm")?;
    Ok(out)
}

/// A workspace binary as `cargo test --workspace` builds it, with the cargo running these tests
/// (a no-op when it is up to date, same target directory), and its path. Not `cargo build -p`:
/// that resolves the features of one package, not the workspace's tests', and rebuilt some 50
/// dependencies (tokio, hyper, kube, k8s-openapi) on a cold run.
pub fn cargo_bin(package: &str, bin: &str) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["test", "--workspace", "--no-run", "--quiet"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo build for {bin}"))?;
    if !out.status.success() {
        bail!("building {bin} failed");
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == bin
            && msg["target"]["kind"] == serde_json::json!(["bin"])
            && msg["profile"]["test"] == false
            && msg["package_id"]
                .as_str()
                .is_some_and(|id| id.contains(package))
            && let Some(exe) = msg["executable"].as_str()
        {
            return Ok(PathBuf::from(exe));
        }
    }
    bail!("cargo test --no-run did not report the {bin} executable")
}

/// Writes a kubeconfig for the e2e cluster that authenticates with `token` (for example a
/// ServiceAccount's, from `kubectl create token`), so a program runs with exactly its rights.
pub fn kubeconfig_with_token(path: &Path, token: &str) -> Result<()> {
    let ca = state_dir().join("pki/ca.crt");
    let admin = std::fs::read_to_string(kubeconfig_path())?;
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .context("server in the e2e kubeconfig")?;
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: sa\n  context: {{cluster: e2e, user: sa}}\ncurrent-context: sa\n",
        ca.display()
    );
    std::fs::write(path, text)?;
    Ok(())
}

/// Waits until the CustomResourceDefinition `name` is Established and its resources are served.
pub async fn wait_established(client: &Client, name: &str) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for(
        &format!("the CRD {name} to be Established"),
        Duration::from_secs(60),
        || async {
            let crd = crds.get(name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        },
    )
    .await
}

/// Installs (or updates) the TaskRun and ToolApproval CRDs from the generated YAML, as the chart
/// would, and waits until TaskRuns are served.
pub async fn install_taskrun_crd(client: &Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    // The ToolApproval CRD too: the operator watches ToolApprovals.
    for file in ["toolapproval.yaml", "taskrun.yaml"] {
        let text = std::fs::read_to_string(repo_root().join("crds/generated").join(file))?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
        let name = crd.metadata.name.clone().context("the CRD has a name")?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.patch(
            &name,
            &PatchParams::apply("orchestrator-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying the CRD {name}"))?;
        wait_established(client, &name).await?;
    }
    // Established can precede the first successful list by a moment.
    let gvk = GroupVersionKind::gvk("orchestrator.io", "v1", "TaskRun");
    let taskruns: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ApiResource::from_gvk(&gvk));
    wait_for("TaskRuns to be served", Duration::from_secs(30), || async {
        Ok(taskruns.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await
}
