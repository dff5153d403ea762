//! What the tool-call policy (argument validation, rate limits, definition pins) adds per call.
//!
//! 1. In process, the policy's own work on the call path against the real tool list of
//!    `@modelcontextprotocol/server-everything`: the route lookup alone, then lookup + argument
//!    validation (compiled schema) + both rate limit buckets; batches of 64 calls, p50/p99 per call.
//! 2. End to end, two release proxies in front of their own server-everything, one with the policy
//!    (validation on, a server and a tool rate limit that never trips, every tool pinned to its
//!    hash) and one without (`validateArguments: false`, no limits, no pins); an rmcp client per
//!    proxy, sequential `tools/call` of `echo`, rounds interleaved; p50 of each and the difference.
//!
//! Run: `cargo bench -p orchestrator-mcp-proxy --bench policy` (needs `e2e/setup`'s tools).
//! Sizes: `BENCH_ITERS` (in-process batches, default 20000), `BENCH_SEQ` (calls per proxy per
//! round, default 1000), `BENCH_ROUNDS` (default 5).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use orchestrator_mcp_proxy::{
    config::load_bytes,
    names::ServerName,
    policy::{arguments::Validators, definitions::KnownList, limits::Limiters},
    router::{Lookup, Router},
};
use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, JsonObject},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};

const PROXY: &str = env!("CARGO_BIN_EXE_orchestrator-mcp-proxy");
const PAYLOAD: &str = "benchmark payload of a typical small size";
const BATCH: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn server_everything() -> Result<(PathBuf, PathBuf)> {
    let root = std::env::var_os("ORCH_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/orchestrator/tools")
        });
    let node = root.join("node/node_modules/.bin/node");
    let everything =
        root.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    for p in [&node, &everything] {
        if !p.exists() {
            bail!(
                "{} is missing: run e2e/setup to install the MCP test tools",
                p.display()
            );
        }
    }
    Ok((node, everything))
}

fn arguments() -> JsonObject {
    let mut args = JsonObject::new();
    args.insert("message".into(), serde_json::json!(PAYLOAD));
    args
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// The config both parts use: with the policy, or without it.
fn config(node: &Path, everything: &Path, policy: bool, pins: &HashMap<String, String>) -> String {
    let mut server = serde_json::json!({
        "name": "every",
        "stdio": {"command": node, "args": [everything, "stdio"]},
        "tools": {"allow": ["echo", "get-sum"]},
    });
    let mut top = serde_json::json!({"task": {"name": "bench"}});
    if policy {
        // Limits far above what the bench sends: every call takes its tokens and passes.
        server["rateLimit"] = serde_json::json!({
            "perMinute": 4_000_000_000u32,
            "tools": {"echo": {"perMinute": 4_000_000_000u32}},
        });
        server["pins"] = serde_json::json!(pins);
    } else {
        top["policy"] = serde_json::json!({"validateArguments": false});
    }
    top["servers"] = serde_json::json!([server]);
    top.to_string()
}

/// Part 1: the policy's work per call, in process.
async fn in_process(
    node: &Path,
    everything: &Path,
    iters: usize,
) -> Result<HashMap<String, String>> {
    let mut cmd = tokio::process::Command::new(node);
    cmd.arg(everything).arg("stdio").stderr(Stdio::null());
    let client = ().serve(TokioChildProcess::new(cmd)?).await?;
    let tools = client.peer().list_all_tools().await?;
    client.cancel().await?;
    let list = KnownList::first_sight(Arc::new(tools));
    let pins: HashMap<String, String> = list
        .tools
        .iter()
        .zip(list.seen.iter())
        .map(|(t, s)| (t.name.to_string(), s.hash.to_string()))
        .collect();
    let loaded = load_bytes(config(node, everything, true, &pins).as_bytes());
    let config = loaded
        .config
        .with_context(|| format!("bench config: {}", loaded.problems))?;
    let router = Router::build(&config, &[(ServerName::new("every"), list)].into());
    let validators = Validators::default();
    let limiters = Limiters::default();
    let args = arguments();

    let mut lookup_only = Vec::with_capacity(iters);
    let mut with_policy = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        for _ in 0..BATCH {
            let Lookup::Routed(route) = router.lookup(std::hint::black_box("every__echo")) else {
                bail!("echo is not routed");
            };
            std::hint::black_box(route);
        }
        lookup_only.push(start.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        let start = Instant::now();
        for _ in 0..BATCH {
            let Lookup::Routed(route) = router.lookup(std::hint::black_box("every__echo")) else {
                bail!("echo is not routed");
            };
            if let Err(problems) = validators
                .check(&route.definition, &route.input_schema, Some(&args))
                .await
            {
                bail!("valid arguments refused: {problems:?}");
            }
            if let Err(limited) = limiters.check(&route.server, route.tool.as_str()) {
                bail!("the bench's limit tripped: {limited:?}");
            }
        }
        with_policy.push(start.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
    }
    lookup_only.sort_by(f64::total_cmp);
    with_policy.sort_by(f64::total_cmp);
    let (l50, p50) = (pct(&lookup_only, 0.5), pct(&with_policy, 0.5));
    println!("in process ({iters} batches of {BATCH} calls; us per call):");
    println!(
        "  route lookup only            p50 {:>7.3}  p99 {:>7.3}",
        l50,
        pct(&lookup_only, 0.99)
    );
    println!(
        "  lookup + validation + limits p50 {:>7.3}  p99 {:>7.3}",
        p50,
        pct(&with_policy, 0.99)
    );
    println!("  the policy's own work        p50 {:>7.3}", p50 - l50);
    audit_ring(iters);
    Ok(pins)
}

/// What keeping each audit record in the `GET /audit` ring adds to a call: the line is
/// serialized either way; the ring copies it into an `Arc`, parses the timestamp, boxes the
/// filter fields and pushes (evicting the oldest, as a full ring does).
fn audit_ring(iters: usize) {
    use orchestrator_mcp_proxy::audit::{
        Outcome, Record, RecordType,
        ring::{DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, Entry, Ring},
        timestamp,
    };
    let ts = timestamp();
    let record = Record {
        record_type: RecordType::ToolCall,
        ts: ts.clone(),
        task: "task-1001",
        namespace: "team-a",
        created_by: Some("alice"),
        context_version: 3,
        session: "s5".into(),
        client: "claude-code/2.1.0#5f0c1a9e".into(),
        protocol: Some("2025-11-25"),
        request_id: "5".into(),
        tool: "every__echo",
        server: Some("every"),
        upstream_tool: Some("echo"),
        risk: Some("write"),
        decision: "allowed",
        approval_id: None,
        approval_digest: None,
        decided_by: None,
        rule: Some("servers[every].tools.allow[0] \"echo\"".into()),
        outcome: Outcome::Ok,
        error: None,
        duration_ms: 0.61,
        argument_bytes: 53,
        arguments: None,
        intent: None,
        model: None,
    };
    let ring = Ring::new(DEFAULT_MAX_RECORDS, DEFAULT_MAX_BYTES);
    let mut serialize = Vec::with_capacity(iters);
    let mut with_ring = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        for _ in 0..BATCH {
            std::hint::black_box(serde_json::to_vec(&record).unwrap_or_default());
        }
        serialize.push(start.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        let start = Instant::now();
        for _ in 0..BATCH {
            let line: Arc<[u8]> = serde_json::to_vec(&record).unwrap_or_default().into();
            ring.push(Entry::new(&record, line));
        }
        with_ring.push(start.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
    }
    serialize.sort_by(f64::total_cmp);
    with_ring.sort_by(f64::total_cmp);
    let (s50, r50) = (pct(&serialize, 0.5), pct(&with_ring, 0.5));
    println!("  audit line serialized        p50 {s50:>7.3}");
    println!(
        "  serialized + kept in the ring p50 {r50:>6.3}  p99 {:>7.3}  (the ring adds {:.3})",
        pct(&with_ring, 0.99),
        r50 - s50
    );
}

struct ProxyProcess {
    child: tokio::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

async fn start_proxy(text: &str) -> Result<ProxyProcess> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("proxy.yaml"), text)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = tokio::process::Command::new(PROXY)
        .arg("--config")
        .arg(dir.path().join("proxy.yaml"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .stderr(std::fs::File::create(dir.path().join("proxy.log"))?)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the proxy")?;
    let http = reqwest::Client::new();
    let started = Instant::now();
    while !http
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        if started.elapsed() > Duration::from_secs(10) {
            bail!("the proxy did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(ProxyProcess {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
        _dir: dir,
    })
}

async fn client(url: &str) -> Result<rmcp::service::RunningService<rmcp::RoleClient, ()>> {
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    Ok(().serve(transport).await?)
}

async fn calls(peer: &rmcp::Peer<rmcp::RoleClient>, n: usize) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let params = CallToolRequestParams::new("every__echo").with_arguments(arguments());
        let start = Instant::now();
        let r = peer.call_tool(params).await?;
        out.push(start.elapsed().as_secs_f64() * 1e6);
        if r.is_error == Some(true) {
            bail!("echo failed: {r:?}");
        }
    }
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let (node, everything) = server_everything()?;
    let pins = in_process(&node, &everything, env_usize("BENCH_ITERS", 20_000)).await?;

    let seq = env_usize("BENCH_SEQ", 1000);
    let rounds = env_usize("BENCH_ROUNDS", 5);
    let with = start_proxy(&config(&node, &everything, true, &pins)).await?;
    let without = start_proxy(&config(&node, &everything, false, &pins)).await?;
    let (a, b) = (client(&with.url).await?, client(&without.url).await?);
    // Warm up (node's JIT, connections, the compiled schema); and check the policy is in force.
    calls(a.peer(), 200).await?;
    calls(b.peer(), 200).await?;
    let refused = a
        .peer()
        .call_tool(CallToolRequestParams::new("every__echo"))
        .await?;
    if refused.is_error != Some(true) {
        bail!("the policy proxy forwarded a call without its required argument");
    }
    let (mut on, mut off, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which proxy goes first.
        let (mut x, mut y) = if round % 2 == 0 {
            let x = calls(a.peer(), seq).await?;
            (x, calls(b.peer(), seq).await?)
        } else {
            let y = calls(b.peer(), seq).await?;
            (calls(a.peer(), seq).await?, y)
        };
        x.sort_by(f64::total_cmp);
        y.sort_by(f64::total_cmp);
        diffs.push(pct(&x, 0.5) - pct(&y, 0.5));
        on.extend(x);
        off.extend(y);
    }
    on.sort_by(f64::total_cmp);
    off.sort_by(f64::total_cmp);
    diffs.sort_by(f64::total_cmp);
    println!("end to end ({rounds} rounds x {seq} sequential calls per proxy; us per call):");
    println!(
        "  with the policy     p50 {:>8.1}  p99 {:>8.1}",
        pct(&on, 0.5),
        pct(&on, 0.99)
    );
    println!(
        "  without             p50 {:>8.1}  p99 {:>8.1}",
        pct(&off, 0.5),
        pct(&off, 0.99)
    );
    println!(
        "  added p50 (all calls) {:>6.1}; per-round p50 differences {:?} (median {:.1})",
        pct(&on, 0.5) - pct(&off, 0.5),
        diffs
            .iter()
            .map(|d| (d * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        pct(&diffs, 0.5)
    );
    drop((a, b));
    for p in [with, without] {
        let mut child = p.child;
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    Ok(())
}
