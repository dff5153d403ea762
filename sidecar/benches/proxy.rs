//! The proxy's cost, measured against talking to the upstream directly, in one run.
//!
//! Upstream: `@modelcontextprotocol/server-everything` (stdio), tool `echo`. Client: rmcp.
//! - direct: rmcp client -> stdio -> server-everything
//! - proxied: rmcp client -> streamable HTTP -> proxy (release build) -> stdio -> server-everything
//!
//! Clients through the proxy: rmcp on the initialize lifecycle, rmcp on 2026-07-28, and a bare
//! HTTP client (JSON-RPC written by hand) of each revision; beside them the HTTP floor (the bare
//! client against a bare axum server answering a canned result). Rounds interleave the clients.
//! Reports per client sequential p50/p99 and the difference to direct (added latency), 16-way
//! concurrent throughput and its ratio to direct, and the proxy's CPU per call; then proxy RSS
//! idle and after load, start-to-ready time, and the time from a kubelet-style config swap to the
//! client receiving `notifications/tools/list_changed`.
//!
//! Run: `cargo bench -p orchestrator-mcp-proxy --bench proxy` (needs `e2e/setup`'s tools).
//! Sizes: `BENCH_SEQ` (sequential calls per round, default 2000), `BENCH_CONC` (calls per
//! worker, default 300), `BENCH_ROUNDS` (default 3). `BENCH_PROXY_BIN` runs another build of the
//! proxy (e.g. one with symbols, for profiling); `BENCH_PROXY_ARGS` adds flags (e.g. `--threads 2`);
//! `BENCH_CLIENTS` picks the proxied clients (`rmcp`, `rmcp-2026`, `bare`, `bare-2026`; default
//! all).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use rmcp::{
    ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt,
    model::{CallToolRequestParams, ClientConfig, JsonObject, ProtocolVersion},
    service::{NotificationContext, Peer, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::sync::mpsc;

const PROXY: &str = env!("CARGO_BIN_EXE_orchestrator-mcp-proxy");
const WORKERS: usize = 16;
/// The `message` argument of every echo call.
const PAYLOAD: &str = "benchmark payload of a typical small size";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Tools {
    node: PathBuf,
    everything: PathBuf,
}

fn tools() -> Result<Tools> {
    let root = std::env::var_os("ORCH_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/orchestrator/tools")
        });
    let t = Tools {
        node: root.join("node/node_modules/.bin/node"),
        everything: root
            .join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
    };
    for p in [&t.node, &t.everything] {
        if !p.exists() {
            bail!(
                "{} is missing: run e2e/setup to install the MCP test tools",
                p.display()
            );
        }
    }
    Ok(t)
}

/// Sends each `tools/list_changed` arrival time to the bench.
#[derive(Clone)]
struct Listener(mpsc::UnboundedSender<Instant>);

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(Instant::now());
    }
    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

type Client = RunningService<RoleClient, Listener>;

async fn direct_client(t: &Tools, listener: Listener) -> Result<Client> {
    let mut cmd = tokio::process::Command::new(&t.node);
    cmd.arg(&t.everything).arg("stdio").stderr(Stdio::null());
    Ok(listener.serve(TokioChildProcess::new(cmd)?).await?)
}

async fn http_client(url: &str, listener: Listener) -> Result<Client> {
    // A client that keeps its connection (rmcp's default client opens one per request).
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    Ok(listener.serve(transport).await?)
}

/// A 2026-07-28 client (server/discover, stateless requests).
async fn http_client_modern(url: &str, listener: Listener) -> Result<Client> {
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    Ok(listener.serve_with_lifecycle(transport, lifecycle).await?)
}

fn echo(name: &str) -> CallToolRequestParams {
    let mut args = JsonObject::new();
    args.insert("message".into(), serde_json::json!(PAYLOAD));
    CallToolRequestParams::new(name.to_string()).with_arguments(args)
}

/// One `tools/call` of `tool` (the echo payload) by some client; `id` is unique within a run.
trait Caller: Clone + Send + Sync + 'static {
    fn call(&self, id: usize, tool: &str) -> impl Future<Output = Result<()>> + Send;
}

impl Caller for Peer<RoleClient> {
    async fn call(&self, _id: usize, tool: &str) -> Result<()> {
        let r = self.call_tool(echo(tool)).await?;
        if r.is_error == Some(true) {
            bail!("{tool} failed: {r:?}");
        }
        Ok(())
    }
}

/// `n` calls one after the other; the duration of each.
async fn sequential(client: &impl Caller, tool: &str, n: usize) -> Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for id in 1..=n {
        let start = Instant::now();
        client.call(id, tool).await?;
        out.push(start.elapsed());
    }
    Ok(out)
}

/// `WORKERS` tasks sharing one client, `per_worker` calls each; returns calls per second.
async fn concurrent(client: &impl Caller, tool: &str, per_worker: usize) -> Result<f64> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let client = client.clone();
        let tool = tool.to_string();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_worker {
                client.call(w * per_worker + i + 1, &tool).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((WORKERS * per_worker) as f64 / start.elapsed().as_secs_f64())
}

/// A bare HTTP client: the JSON-RPC messages written by hand, one POST per call on a kept
/// connection, the response read as bytes. What an agent with a lean HTTP stack pays, with
/// rmcp's client-side machinery taken out of the measurement. On the initialize lifecycle it
/// holds a session; on 2026-07-28 every request carries its protocol version, capabilities and
/// the standard headers instead.
#[derive(Clone)]
struct RawClient {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
    modern: bool,
}

impl RawClient {
    fn new(url: &str, modern: bool) -> Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder().tcp_nodelay(true).build()?,
            url: url.to_string(),
            session: None,
            modern,
        })
    }

    /// An initialize-era session.
    async fn connect(url: &str) -> Result<Self> {
        let mut client = Self::new(url, false)?;
        let init = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "bench-raw", "version": "1"}}
        });
        let response = client
            .http
            .post(url)
            .header("Accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .context("no Mcp-Session-Id on initialize")?
            .to_string();
        response.bytes().await?;
        client.session = Some(session);
        client
            .post(
                &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                None,
            )
            .await?;
        Ok(client)
    }

    async fn post(
        &self,
        body: &serde_json::Value,
        tool: Option<&str>,
    ) -> Result<axum::body::Bytes> {
        let mut request = self
            .http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream");
        if let Some(session) = &self.session {
            request = request
                .header("Mcp-Session-Id", session)
                .header("Mcp-Protocol-Version", "2025-11-25");
        }
        if self.modern {
            request = request
                .header("Mcp-Protocol-Version", "2026-07-28")
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", tool.unwrap_or_default());
        }
        let response = request.json(body).send().await?.error_for_status()?;
        Ok(response.bytes().await?)
    }
}

impl Caller for RawClient {
    async fn call(&self, id: usize, tool: &str) -> Result<()> {
        let mut params = serde_json::json!({"name": tool, "arguments": {"message": PAYLOAD}});
        if self.modern {
            params["_meta"] = serde_json::json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "bench-raw", "version": "1"},
            });
        }
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params
        });
        let reply = self.post(&body, Some(tool)).await?;
        if !reply.windows(8).any(|w| w == b"\"result\"") {
            bail!("{tool} failed: {}", String::from_utf8_lossy(&reply));
        }
        Ok(())
    }
}

/// The floor for any HTTP front on this machine: a bare axum server, on its own thread and
/// current-thread runtime (as the proxy runs), that answers every POST with a canned tools/call
/// result carrying the request's id. No MCP, no upstream: what the HTTP hop alone costs.
fn start_http_floor() -> Result<String> {
    use axum::serve::ListenerExt;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let reply = |body: axum::body::Bytes| async move {
                let id = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .unwrap_or(serde_json::Value::Null);
                axum::Json(serde_json::json!({
                    "jsonrpc": "2.0", "id": id,
                    "result": {"content": [{"type": "text", "text": format!("Echo: {PAYLOAD}")}]}
                }))
            };
            let app = axum::Router::new().route("/mcp", axum::routing::post(reply));
            axum::serve(listener, app).await?;
            anyhow::Ok(())
        })
    });
    Ok(format!("http://{addr}/mcp"))
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// What one client measured over all rounds.
#[derive(Default)]
struct Measured {
    seq: Vec<Duration>,
    throughput: Vec<f64>,
    /// Proxy CPU time while this client's calls ran, and their number (none for direct/floor).
    cpu: Duration,
    calls: usize,
}

impl Measured {
    /// One round: `seq_n` sequential calls, then 16-way concurrent ones; `pid` is the proxy
    /// whose CPU is counted (None: not through the proxy).
    async fn round(
        &mut self,
        client: &impl Caller,
        tool: &str,
        seq_n: usize,
        per_worker: usize,
        pid: Option<u32>,
    ) -> Result<()> {
        let before = pid.map(cpu_time);
        self.seq.extend(sequential(client, tool, seq_n).await?);
        self.throughput
            .push(concurrent(client, tool, per_worker).await?);
        if let (Some(pid), Some(before)) = (pid, before) {
            self.cpu += cpu_time(pid).saturating_sub(before);
            self.calls += seq_n + WORKERS * per_worker;
        }
        Ok(())
    }

    fn p(&mut self, q: f64) -> Duration {
        self.seq.sort();
        pct(&self.seq, q)
    }

    fn cpu_per_call_us(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.cpu.as_secs_f64() * 1e6 / self.calls as f64)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CPU time (user + system) a process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // Fields after the command: state is [0], utime [11], stime [12] (clock ticks, 100/s on Linux).
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// (VmRSS, VmHWM) in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Writes proxy.yaml the way the kubelet updates a ConfigMap volume; returns when renamed.
fn write_configmap(dir: &Path, text: &str, generation: u32) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let data = format!("..gen{generation}");
    std::fs::create_dir_all(dir.join(&data))?;
    std::fs::write(dir.join(&data).join("proxy.yaml"), text)?;
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&data, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    if std::fs::symlink_metadata(dir.join("proxy.yaml")).is_err() {
        std::os::unix::fs::symlink("..data/proxy.yaml", dir.join("proxy.yaml"))?;
    }
    Ok(())
}

fn config(t: &Tools, allow: &[&str]) -> String {
    serde_json::json!({
        "task": {"name": "bench"},
        "servers": [{
            "name": "every",
            "stdio": {"command": t.node, "args": [t.everything, "stdio"]},
            "tools": {"allow": allow},
        }],
    })
    .to_string()
}

struct ProxyProcess {
    child: tokio::process::Child,
    url: String,
    port: u16,
}

async fn start_proxy(dir: &Path, cache: &Path) -> Result<(ProxyProcess, Duration)> {
    let port = free_port()?;
    let log = std::fs::File::create(dir.join("../proxy.log"))?;
    let started = Instant::now();
    // BENCH_PROXY_BIN: profile another build of the same binary (e.g. one with symbols).
    let binary = std::env::var("BENCH_PROXY_BIN").unwrap_or_else(|_| PROXY.to_string());
    let child = tokio::process::Command::new(binary)
        .arg("--config")
        .arg(dir.join("proxy.yaml"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--cache-dir")
        .arg(cache)
        // BENCH_PROXY_ARGS: extra flags, e.g. "--threads 2".
        .args(
            std::env::var("BENCH_PROXY_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .stderr(log)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the proxy")?;
    // Readiness as kubelet would see it: the first 200 from /readyz.
    let http = reqwest::Client::new();
    let ready_url = format!("http://127.0.0.1:{port}/readyz");
    loop {
        if let Ok(r) = http.get(&ready_url).send().await
            && r.status().is_success()
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(10) {
            bail!("the proxy did not become ready");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let ready = started.elapsed();
    Ok((
        ProxyProcess {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            port,
        },
        ready,
    ))
}

async fn stop(mut p: ProxyProcess) -> Result<()> {
    if let Some(pid) = p
        .child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    tokio::time::timeout(Duration::from_secs(15), p.child.wait()).await??;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let t = tools()?;
    let seq_n = env_usize("BENCH_SEQ", 2000);
    let per_worker = env_usize("BENCH_CONC", 300);
    let rounds = env_usize("BENCH_ROUNDS", 3);
    let work = tempfile::tempdir()?;
    let cm = work.path().join("configmap");
    let cache = work.path().join("cache");
    let mut generation = 0;
    write_configmap(&cm, &config(&t, &["echo", "get-sum"]), generation)?;

    // Start-to-ready, on a cold cache, several times.
    let mut readies = Vec::new();
    for _ in 0..5 {
        let (p, ready) = start_proxy(&cm, &cache).await?;
        readies.push(ready);
        stop(p).await?;
    }
    readies.sort();

    let (proxy, _) = start_proxy(&cm, &cache).await?;
    let proxy_pid = proxy.child.id().context("proxy pid")?;
    let (rss_idle, _) = rss_kib(proxy_pid);

    let (tx, mut notifications) = mpsc::unbounded_channel();
    let direct = direct_client(&t, Listener(tx.clone())).await?;
    let proxied = http_client(&proxy.url, Listener(tx)).await?;
    proxied.peer().list_all_tools().await?;
    let (modern_tx, _modern_rx) = mpsc::unbounded_channel();
    let modern = http_client_modern(&proxy.url, Listener(modern_tx)).await?;
    let raw = RawClient::connect(&proxy.url).await?;
    let raw_modern = RawClient::new(&proxy.url, true)?;
    let floor = RawClient::new(&start_http_floor()?, false)?;

    // Warm up every path (JIT in node, connections, allocator).
    sequential(direct.peer(), "echo", 300).await?;
    sequential(proxied.peer(), "every__echo", 300).await?;
    sequential(modern.peer(), "every__echo", 300).await?;
    sequential(&raw, "every__echo", 300).await?;
    sequential(&raw_modern, "every__echo", 300).await?;
    sequential(&floor, "echo", 300).await?;

    let pid = Some(proxy_pid);
    // BENCH_CLIENTS: which proxied clients run (e.g. "rmcp-2026" while profiling one path).
    let clients = std::env::var("BENCH_CLIENTS").ok();
    let wanted = |kind: &str| {
        clients
            .as_deref()
            .is_none_or(|c| c.split(',').any(|k| k.trim() == kind))
    };
    let (mut d, mut fl, mut legacy, mut modern_m, mut bare, mut bare_modern) = Default::default();
    for _ in 0..rounds {
        Measured::round(&mut d, direct.peer(), "echo", seq_n, per_worker, None).await?;
        Measured::round(&mut fl, &floor, "echo", seq_n, per_worker, None).await?;
        let tool = "every__echo";
        if wanted("rmcp") {
            Measured::round(&mut legacy, proxied.peer(), tool, seq_n, per_worker, pid).await?;
        }
        if wanted("rmcp-2026") {
            Measured::round(&mut modern_m, modern.peer(), tool, seq_n, per_worker, pid).await?;
        }
        if wanted("bare") {
            Measured::round(&mut bare, &raw, tool, seq_n, per_worker, pid).await?;
        }
        if wanted("bare-2026") {
            Measured::round(&mut bare_modern, &raw_modern, tool, seq_n, per_worker, pid).await?;
        }
    }
    let (rss_loaded, rss_peak) = rss_kib(proxy_pid);
    // Diagnostic: the HTTP front alone (tools/list is answered by the proxy, no upstream).
    let mut front = Vec::with_capacity(seq_n);
    for _ in 0..seq_n {
        let start = Instant::now();
        proxied.peer().list_tools(None).await?;
        front.push(start.elapsed());
    }
    front.sort();
    let mut modern = modern;
    let _ = modern.close().await;

    // Swap -> list_changed: alternate between two allow lists so every swap changes the tools.
    while notifications.try_recv().is_ok() {}
    let mut swaps = Vec::new();
    for i in 0..10 {
        generation += 1;
        let allow: &[&str] = if i % 2 == 0 {
            &["echo"]
        } else {
            &["echo", "get-sum"]
        };
        let text = config(&t, allow);
        let before = Instant::now();
        write_configmap(&cm, &text, generation)?;
        let at = tokio::time::timeout(Duration::from_secs(5), notifications.recv())
            .await
            .context("no list_changed within 5 s")?
            .context("client gone")?;
        swaps.push(at.duration_since(before));
        tokio::time::sleep(Duration::from_millis(150)).await;
        while notifications.try_recv().is_ok() {}
    }
    swaps.sort();

    let mut direct = direct;
    let mut proxied = proxied;
    let _ = proxied.close().await;
    let _ = direct.close().await;
    let port = proxy.port;
    stop(proxy).await?;

    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!("## orchestrator-mcp-proxy benchmark");
    println!();
    println!(
        "upstream: server-everything `echo` over stdio; client: rmcp 3.9 (HTTP keep-alive); {cpus} CPUs"
    );
    println!(
        "proxy: {}; flags: {:?}",
        std::env::var("BENCH_PROXY_BIN").unwrap_or_else(|_| PROXY.to_string()),
        std::env::var("BENCH_PROXY_ARGS").unwrap_or_default()
    );
    println!(
        "sequential: {rounds} x {seq_n} calls per client; concurrent: {rounds} x {WORKERS} workers x {per_worker} calls per client, rounds interleaved; proxy port {port}"
    );
    println!();
    let (dp50, dp99) = (d.p(0.50), d.p(0.99));
    let d_tp = mean(&d.throughput);
    println!(
        "| client | p50 | p99 | added p50 / p99 | 16-way throughput | % of direct | proxy CPU per call |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| direct (rmcp client, stdio) | {:.3} ms | {:.3} ms | | {d_tp:.0} calls/s | | |",
        ms(dp50),
        ms(dp99)
    );
    println!(
        "| HTTP floor (bare client -> bare axum, canned reply) | {:.3} ms | {:.3} ms | | {:.0} calls/s | | |",
        ms(fl.p(0.50)),
        ms(fl.p(0.99)),
        mean(&fl.throughput)
    );
    for (label, m) in [
        ("proxy, rmcp client, initialize-era session", &mut legacy),
        ("proxy, rmcp client, 2026-07-28", &mut modern_m),
        ("proxy, bare client, initialize-era session", &mut bare),
        ("proxy, bare client, 2026-07-28", &mut bare_modern),
    ] {
        if m.seq.is_empty() {
            continue;
        }
        let (p50, p99) = (m.p(0.50), m.p(0.99));
        let tp = mean(&m.throughput);
        println!(
            "| {label} | {:.3} ms | {:.3} ms | {:+.3} ms / {:+.3} ms | {tp:.0} calls/s | {:.1} % | {:.0} µs |",
            ms(p50),
            ms(p99),
            ms(p50) - ms(dp50),
            ms(p99) - ms(dp99),
            100.0 * tp / d_tp,
            m.cpu_per_call_us().unwrap_or_default()
        );
    }
    println!(
        "| diagnostic: tools/list via the proxy (front only, rmcp client) | {:.3} ms | {:.3} ms | | | | |",
        ms(pct(&front, 0.5)),
        ms(pct(&front, 0.99))
    );
    println!();
    println!(
        "target: added p50 <= 2 x the floor's p50 = {:.3} ms (both revisions); p99 added <= 0.5 ms; throughput >= 90 % of direct",
        2.0 * ms(fl.p(0.50))
    );
    println!();
    println!("| metric | value | target |");
    println!("|---|---|---|");
    println!(
        "| proxy RSS idle (no upstream yet) | {:.1} MiB | <= 10 MiB |",
        rss_idle as f64 / 1024.0
    );
    println!(
        "| proxy RSS after load (peak) | {:.1} MiB ({:.1} MiB) | |",
        rss_loaded as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "| start to ready (median / max of {}) | {:.1} ms / {:.1} ms | <= 20 ms |",
        readies.len(),
        ms(pct(&readies, 0.5)),
        ms(*readies.last().unwrap_or(&Duration::ZERO))
    );
    println!(
        "| config swap to list_changed (median / max of {}) | {:.1} ms / {:.1} ms | <= 100 ms |",
        swaps.len(),
        ms(pct(&swaps, 0.5)),
        ms(*swaps.last().unwrap_or(&Duration::ZERO))
    );
    Ok(())
}
