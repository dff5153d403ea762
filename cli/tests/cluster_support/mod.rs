//! Shared helpers of the CLI's cluster tests: run the real binary against the e2e cluster,
//! install the TaskRun CRD, and (for the tests that need it) run the real operator binary out of
//! the cluster, scoped to the test's namespace.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use orchestrator_crds::taskrun::{McpServer, TaskRun};
use orchestrator_e2e::{TestNamespace, client, kubeconfig_path, repo_root};

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_orchestrator-cli");

/// The catalog shipped in `config/`.
pub fn catalog_file() -> PathBuf {
    repo_root().join("config/catalog.yaml")
}

/// What a run of the CLI produced.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Self {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asserts exit 0 and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code,
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        &self.stdout
    }
}

/// The CLI as a user in namespace `ns` runs it: the e2e kubeconfig passed explicitly (never
/// `$KUBECONFIG` or `~/.kube/config`), the catalog file from `config/`.
pub fn cli(ns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(["-n", ns])
        .arg("--catalog")
        .arg(catalog_file())
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("ORCH_CATALOG_FILE")
        .env_remove("ORCH_CATALOG_NAMESPACE")
        .env_remove("ORCH_CATALOG_NAME");
    cmd
}

/// Runs the CLI to completion (blocking; call from `spawn_blocking` inside async tests, or
/// accept blocking the test's own runtime thread, which these tests do).
pub fn run(ns: &str, args: &[&str]) -> Run {
    Run::from(cli(ns, args).output().expect("the CLI runs"))
}

/// Runs the CLI with the e2e kubeconfig in namespace `ns`, without a catalog file (`args` say
/// where the catalog is, e.g. the ConfigMap the operator reads).
pub fn run_without_catalog_file(ns: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(["-n", ns])
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("ORCH_CATALOG_FILE");
    Run::from(cmd.output().expect("the CLI runs"))
}

/// Runs the CLI on a tokio blocking thread.
pub async fn run_async(ns: String, args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&ns, &args)
    })
    .await
    .expect("the CLI thread")
}

/// A client, the CRD installed, and a fresh namespace `<prefix>-<random>`.
pub async fn setup(prefix: &str) -> Result<(Client, TestNamespace)> {
    let client = client().await?;
    ensure_crd(&client).await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    Ok((client, ns))
}

/// The TaskRun API in `ns`.
pub fn taskruns(client: &Client, ns: &str) -> Api<TaskRun> {
    Api::namespaced(client.clone(), ns)
}

/// The MCP servers of a TaskRun's spec.
pub fn servers(tr: &TaskRun) -> Vec<McpServer> {
    tr.spec.tool_config.mcp_servers.clone()
}

/// Installs (server-side apply, idempotent) the TaskRun CRD from the `crds` crate and waits
/// until it is served.
pub async fn ensure_crd(client: &Client) -> Result<()> {
    orchestrator_e2e::install_taskrun_crd(client).await
}

/// Creates the catalog ConfigMap (key `catalog.yaml`, from `config/catalog.yaml`) in `ns`.
pub async fn create_catalog_configmap(client: &Client, ns: &str, name: &str) -> Result<()> {
    let text = std::fs::read_to_string(catalog_file())?;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"catalog.yaml": text},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await?;
    Ok(())
}

/// The real operator binary, running out of the cluster against the e2e kubeconfig, watching
/// only one namespace and reading the catalog ConfigMap there. Killed on drop.
pub struct Operator {
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Operator {
    /// Builds `orchestrator-operator` (cargo: a no-op when up to date) and starts it.
    pub fn start(ns: &str, catalog_name: &str) -> Result<Self> {
        let bin = orchestrator_e2e::cargo_bin("orchestrator-operator", "orchestrator-operator")?;
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("operator.log");
        let file = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .args([
                "--namespace",
                ns,
                "--catalog-namespace",
                ns,
                "--catalog-name",
                catalog_name,
            ])
            .args(["--leader-election", "false", "--bind", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig_path())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            child,
            log,
            _dir: dir,
        })
    }

    /// The operator's output so far (for failure messages).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
