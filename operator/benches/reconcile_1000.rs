//! Benchmark: 1,000 TaskRuns applied at once against the e2e control plane -> time until every
//! one has its Job and its ConfigMap, and the operator's RSS (targets: <= 30 s, <= 64 MiB).
//!
//!     e2e/cluster up
//!     cargo bench -p orchestrator-operator --bench reconcile_1000
//!
//! It runs the real operator binary (the bench profile's build) as its own process, scoped to a
//! fresh namespace, creates the TaskRuns with 64 requests in flight, counts the Jobs and
//! ConfigMaps through metadata watches, samples the operator's VmRSS every 100 ms and reads its VmHWM
//! (peak RSS) at the end. It also reports when all TaskRuns reached Succeeded (kwok completes the
//! pods; the Job controller's and scheduler's own client rate limits bound that figure, not the
//! operator; it waits at most 180 s for it), and the CPU seconds the operator and the API server
//! used until all children existed. `BENCH_N` changes the count, `BENCH_OPERATOR_ARGS` adds
//! operator flags (e.g. `--concurrency 64`), `BENCH_OPERATOR_BIN` runs another operator binary
//! (e.g. an older build, for a before-and-after in one sitting), `BENCH_SUCCEEDED_WAIT` changes
//! the 180 s (0 skips that wait). Then it restarts the operator with everything in place and
//! reports its peak RSS until it has done N reconciles (each TaskRun's first after the relist;
//! `BENCH_RESTART=0` skips this). The namespace is deleted at the end (`BENCH_KEEP=1` keeps it).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, ResourceExt};
use orchestrator_crds::taskrun::{Phase, TaskRun};
use serde_json::json;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubeconfig() -> PathBuf {
    std::env::var_os("ORCH_E2E_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("e2e/.cluster"))
        .join("kubeconfig")
}

/// (current VmRSS, peak VmHWM) of `pid`, in KiB.
fn rss(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU seconds (user + system) `pid` has used.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The pid `e2e/cluster` recorded for a control-plane component.
fn component_pid(name: &str) -> Option<String> {
    let state = kubeconfig().parent()?.to_path_buf();
    Some(
        std::fs::read_to_string(state.join("pids").join(name))
            .ok()?
            .trim()
            .to_string(),
    )
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        // SIGTERM first (it releases its lease), then make sure.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        std::thread::sleep(Duration::from_millis(500));
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let path = kubeconfig();
    let kc = Kubeconfig::read_from(&path)
        .map_err(|e| format!("{}: {e} (run e2e/cluster up)", path.display()))?;
    let client =
        Client::try_from(Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)?;

    // CRD, namespace, catalog.
    for file in ["taskrun.yaml", "toolapproval.yaml"] {
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(
            repo().join("crds/generated").join(file),
        )?)?;
        Api::<CustomResourceDefinition>::all(client.clone())
            .patch(
                &crd.name_any(),
                &PatchParams::apply("orchestrator-bench").force(),
                &Patch::Apply(&crd),
            )
            .await?;
    }
    let ns = format!("bench-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let catalog = std::fs::read_to_string(repo().join("config/catalog.yaml"))?;
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "orchestrator-catalog"}, "data": {"catalog.yaml": catalog}}))?,
    )
    .await?;
    let result = run(&client, &ns, n).await;
    if std::env::var("BENCH_KEEP").as_deref() == Ok("1") {
        println!("namespace {ns} kept (BENCH_KEEP=1)");
    } else {
        namespaces.delete(&ns, &DeleteParams::background()).await?;
    }
    result
}

async fn run(client: &Client, ns: &str, n: usize) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let bin = std::env::var_os("BENCH_OPERATOR_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_orchestrator-operator").into());
    let succeeded_wait = Duration::from_secs(
        std::env::var("BENCH_SUCCEEDED_WAIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(180),
    );
    // Creating alone takes about 7 s per 1,000 here; the API server bounds the rest.
    let children_timeout = Duration::from_secs(300.max(n as u64 / 10));
    let operator = start_operator(&bin, ns, port, "bench").await?;
    let pid = operator.0.id();
    let idle = rss(pid).map_or(0, |r| r.0);

    let sample: TaskRun = serde_saphyr::from_str(&std::fs::read_to_string(
        repo().join("config/samples/taskrun.yaml"),
    )?)?;
    let trs: Api<TaskRun> = Api::namespaced(client.clone(), ns);
    let apiserver = component_pid("kube-apiserver");
    let cpu0 = (
        cpu_seconds(&pid.to_string()),
        apiserver.as_deref().and_then(cpu_seconds),
    );

    // Count children through metadata watches (started before the first create), which loads
    // the API server far less than listing 2,000 objects again and again.
    let jobs: Api<PartialObjectMeta<Job>> = Api::namespaced(client.clone(), ns);
    let cms: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), ns);
    let managed =
        watcher::Config::default().labels("app.kubernetes.io/managed-by=orchestrator-operator");
    let job_names = watcher::watcher(jobs, managed.clone())
        .touched_objects()
        .map_ok(|m| ("job", m.name_any()));
    let cm_names = watcher::watcher(cms, managed)
        .touched_objects()
        .map_ok(|m| ("cm", m.name_any()));
    let mut children = std::pin::pin!(futures::stream::select(job_names, cm_names));
    let mut seen_jobs = std::collections::HashSet::new();
    let mut seen_cms = std::collections::HashSet::new();
    let mut peak_sampled = 0;
    let t0 = Instant::now();
    let create = futures::stream::iter(0..n)
        .map(|i| {
            let mut tr = sample.clone();
            tr.metadata.name = Some(format!("task-{i:04}"));
            tr.spec.task_id = i as i64;
            let trs = trs.clone();
            async move { trs.create(&PostParams::default(), &tr).await }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>();
    let mut create = std::pin::pin!(create);
    let mut applied = None;
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let children_done = loop {
        tokio::select! {
            created = &mut create, if applied.is_none() => {
                created?;
                applied = Some(t0.elapsed());
            }
            item = children.next() => {
                let (kind, name) = item.ok_or("child watch ended")??;
                if kind == "job" { seen_jobs.insert(name); } else { seen_cms.insert(name); }
                if seen_jobs.len() >= n && seen_cms.len() >= n {
                    break t0.elapsed();
                }
            }
            _ = ticker.tick() => {
                if let Some((now, _)) = rss(pid) {
                    peak_sampled = peak_sampled.max(now);
                }
                if t0.elapsed() > children_timeout {
                    return Err(format!("after {} s only {} Jobs and {} ConfigMaps of {n}", children_timeout.as_secs(), seen_jobs.len(), seen_cms.len()).into());
                }
            }
        }
    };
    let applied = applied.unwrap_or(children_done);
    let (_, hwm_children) = rss(pid).ok_or("operator gone")?;
    let cpu1 = (
        cpu_seconds(&pid.to_string()),
        apiserver.as_deref().and_then(cpu_seconds),
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    // Informational: until every TaskRun shows Succeeded (bounded by the Job controller), through
    // a watch (a LIST of 10,000 TaskRuns every few seconds would load the API server).
    let mut succeeded_at = None;
    let mut done = std::collections::HashSet::new();
    let mut statuses =
        std::pin::pin!(watcher::watcher(trs.clone(), watcher::Config::default()).touched_objects());
    let deadline = tokio::time::sleep(succeeded_wait.saturating_sub(t0.elapsed()));
    let mut deadline = std::pin::pin!(deadline);
    while done.len() < n {
        tokio::select! {
            item = statuses.next() => {
                let tr = item.ok_or("TaskRun watch ended")??;
                if tr.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded) {
                    done.insert(tr.name_any());
                }
            }
            _ = ticker.tick() => {
                if let Some((now, _)) = rss(pid) {
                    peak_sampled = peak_sampled.max(now);
                }
            }
            () = &mut deadline => break,
        }
    }
    if done.len() >= n {
        succeeded_at = Some(t0.elapsed());
    }
    let succeeded = done.len();
    let (rss_end, hwm_end) = rss(pid).ok_or("operator gone")?;
    println!("TaskRuns:                          {n}");
    println!(
        "created (64 in flight) in:         {:.2} s",
        applied.as_secs_f64()
    );
    println!(
        "all Jobs + ConfigMaps exist after: {:.2} s  (target <= 30 s)",
        children_done.as_secs_f64()
    );
    match succeeded_at {
        Some(t) => println!(
            "all TaskRuns Succeeded after:      {:.2} s",
            t.as_secs_f64()
        ),
        None => println!(
            "TaskRuns Succeeded within {} s:     {succeeded} of {n}",
            succeeded_wait.as_secs()
        ),
    }
    let delta = |a: Option<f64>, b: Option<f64>| {
        a.zip(b)
            .map_or("?".to_string(), |(a, b)| format!("{:.1}", b - a))
    };
    println!(
        "CPU seconds until then: operator {}, kube-apiserver {}; load average {}",
        delta(cpu0.0, cpu1.0),
        delta(cpu0.1, cpu1.1),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("operator RSS idle (leader, 0 TRs): {:.1} MiB", mib(idle));
    println!(
        "operator RSS per TaskRun ((peak when all children existed - idle) / N): {:.1} KiB",
        hwm_children.saturating_sub(idle) as f64 / n as f64
    );
    println!(
        "operator peak RSS (VmHWM) when all children existed: {:.1} MiB  (target <= 64 MiB)",
        mib(hwm_children)
    );
    println!(
        "operator peak RSS (VmHWM) at the end: {:.1} MiB; RSS at the end: {:.1} MiB",
        mib(hwm_end),
        mib(rss_end)
    );
    println!(
        "reconciles ok: {}; reconcile errors: {}",
        metric(
            port,
            "orchestrator_operator_reconciles_total{outcome=\"ok\"}"
        ),
        metric(port, "orchestrator_operator_reconcile_errors_total")
    );

    // The operator restarted with every TaskRun and child in place: it lists them all and
    // reconciles each once (what a crash or an upgrade costs, and where an operator over its
    // memory limit would be killed again).
    if std::env::var("BENCH_RESTART").as_deref() != Ok("0") {
        drop(operator);
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let t0 = Instant::now();
        let operator = start_operator(&bin, ns, port, "bench-restart").await?;
        let pid = operator.0.id();
        let leading = t0.elapsed();
        let mut ticker = tokio::time::interval(Duration::from_millis(500));
        let all = loop {
            ticker.tick().await;
            let ok: usize = metric(
                port,
                "orchestrator_operator_reconciles_total{outcome=\"ok\"}",
            )
            .parse()
            .unwrap_or(0);
            if ok >= n {
                break t0.elapsed();
            }
            if t0.elapsed() > children_timeout {
                return Err(format!(
                    "after a restart only {ok} of {n} reconciled within {} s",
                    children_timeout.as_secs()
                )
                .into());
            }
        };
        let (_, hwm) = rss(pid).ok_or("operator gone")?;
        println!(
            "after a restart: leader in {:.2} s, every TaskRun reconciled after {:.2} s; peak RSS (VmHWM) {:.1} MiB ({:.1} KiB per TaskRun over idle); reconcile errors: {}",
            leading.as_secs_f64(),
            all.as_secs_f64(),
            mib(hwm),
            hwm.saturating_sub(idle) as f64 / n as f64,
            metric(port, "orchestrator_operator_reconcile_errors_total"),
        );
    }
    Ok(())
}

/// Starts the operator scoped to `ns`, serving metrics on `port`, and waits until it leads (and
/// so runs its controller).
async fn start_operator(bin: &std::ffi::OsStr, ns: &str, port: u16, log: &str) -> Result<Operator> {
    let log = std::fs::File::create(
        std::env::temp_dir().join(format!("orchestrator-operator-{log}.log")),
    )?;
    let child = Command::new(bin)
        .env("KUBECONFIG", kubeconfig())
        .env("RUST_LOG", "warn")
        .args([
            "--namespace",
            ns,
            "--catalog-namespace",
            ns,
            "--lease-namespace",
            ns,
        ])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .args(
            std::env::var("BENCH_OPERATOR_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let operator = Operator(child);
    let started = Instant::now();
    loop {
        let out = Command::new("curl")
            .args(["-fsS", &format!("http://127.0.0.1:{port}/readyz")])
            .output();
        if out.is_ok_and(|o| o.stdout == b"leader\n") {
            return Ok(operator);
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the operator did not become leader within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A metric's value from the operator's `/metrics` ("0" when absent).
fn metric(port: u16, name: &str) -> String {
    let out = Command::new("curl")
        .args(["-fsS", &format!("http://127.0.0.1:{port}/metrics")])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or("0")
        .to_string()
}
