//! The model gateway's cost, measured against calling the model API directly, in one run.
//!
//! Endpoint: a stand-in Messages API on 127.0.0.1 (axum, plain HTTP: the gateway's own cost,
//! not TLS's): a whole message for `stream: false`; for `stream: true` the `message_start` event
//! at once, the rest of a small answer 5 ms later (so the first event and the end differ).
//! Client: reqwest with a kept connection, direct to the stand-in or through the proxy's
//! `/model` (release build, the agent's credential as the API key). Rounds interleave the two.
//!
//! Reports, per path: non-streamed latency p50/p99, and for streams the time to the first event
//! and to the end, p50/p99; the differences are what the gateway adds. Then the proxy's memory
//! (VmRSS, VmHWM) idle and after `BENCH_STREAMS` concurrent streams of a large answer
//! (`BENCH_EVENTS` events of 1 KiB each).
//!
//! Run: `cargo bench -p orchestrator-mcp-proxy --bench gateway`. Sizes: `BENCH_SEQ` (requests
//! per round and kind, default 500), `BENCH_ROUNDS` (default 3), `BENCH_STREAMS` (default 32),
//! `BENCH_EVENTS` (default 2000).

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use axum::{
    Json, Router,
    body::Body,
    response::{IntoResponse, Response},
    routing::post,
};
use futures::StreamExt;
use serde_json::{Value, json};

const PROXY: &str = env!("CARGO_BIN_EXE_orchestrator-mcp-proxy");

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn message() -> Value {
    json!({"id": "msg_bench", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
           "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 12, "output_tokens": 3}})
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The stand-in endpoint: `events` text deltas of `event_bytes` each in a stream.
async fn messages(Json(body): Json<Value>) -> Response {
    if body.get("stream").and_then(Value::as_bool) != Some(true) {
        return Json(message()).into_response();
    }
    let events = body
        .get("metadata")
        .and_then(|m| m.get("events"))
        .and_then(Value::as_u64)
        .unwrap_or(3);
    let size = body
        .get("metadata")
        .and_then(|m| m.get("event_bytes"))
        .and_then(Value::as_u64)
        .unwrap_or(8) as usize;
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_bench", "model": "claude-sonnet-4-5",
               "usage": {"input_tokens": 12, "output_tokens": 1}}}),
    );
    let delta = event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": "x".repeat(size)}}),
    );
    let end = event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
               "usage": {"output_tokens": events}}),
    ) + &event("message_stop", json!({"type": "message_stop"}));
    let first = futures::stream::once(async move { Ok::<_, std::io::Error>(start) });
    let rest = futures::stream::once(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(String::new())
    })
    .chain(futures::stream::iter(
        (0..events).map(move |_| Ok(delta.clone())),
    ))
    .chain(futures::stream::once(async move { Ok(end) }));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(first.chain(rest)))
        .unwrap_or_default()
}

struct Target {
    url: String,
    key: String,
}

/// (time to the first body chunk, time to the end) of one request.
async fn request(client: &reqwest::Client, target: &Target, body: &Value) -> Result<(f64, f64)> {
    let started = Instant::now();
    let response = client
        .post(format!("{}/v1/messages", target.url))
        .header("x-api-key", &target.key)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("{}: {}", response.status(), response.text().await?);
    }
    let mut stream = response.bytes_stream();
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if first.is_none() && !chunk.is_empty() {
            first = Some(started.elapsed().as_secs_f64());
        }
    }
    let total = started.elapsed().as_secs_f64();
    Ok((first.unwrap_or(total), total))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (kb("VmRSS:") / 1024, kb("VmHWM:") / 1024)
}

#[tokio::main]
async fn main() -> Result<()> {
    let seq = env_usize("BENCH_SEQ", 500);
    let rounds = env_usize("BENCH_ROUNDS", 3);
    let streams = env_usize("BENCH_STREAMS", 32);
    let events = env_usize("BENCH_EVENTS", 2000);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let app = Router::new().route("/v1/messages", post(messages));
        // No Nagle delay on the stand-in's small writes (what the API's servers do too).
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let _ = axum::serve(listener, app).await;
    });

    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("api-key");
    std::fs::write(&key_file, "sk-ant-bench")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "task: {{name: bench}}\nlisten: 127.0.0.1:{port}\nservers: []\ngateway:\n  endpoint: {endpoint}\n  keyFile: {}\n",
            key_file.display()
        ),
    )?;
    let token_file = dir.path().join("token");
    let mut proxy = tokio::process::Command::new(PROXY)
        .arg("--config")
        .arg(&config)
        .arg("--client-token-file")
        .arg(&token_file)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start the proxy")?;
    let pid = proxy.id().context("the proxy's pid")?;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let token = loop {
        if let Ok(token) = std::fs::read_to_string(&token_file)
            && client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        {
            break token.trim().to_string();
        }
        if Instant::now() > deadline {
            bail!("the proxy did not get ready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let direct = Target {
        url: endpoint.clone(),
        key: "sk-ant-bench".into(),
    };
    let gateway = Target {
        url: format!("http://127.0.0.1:{port}/model"),
        key: token,
    };
    let idle = memory(pid);

    let whole = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]});
    let streamed = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
                          "messages": [{"role": "user", "content": "hi"}]});
    // Warm both paths (connections, the proxy's client pool).
    for _ in 0..50 {
        request(&client, &direct, &whole).await?;
        request(&client, &gateway, &whole).await?;
    }
    let mut samples: [[Vec<f64>; 3]; 2] = Default::default();
    for _ in 0..rounds {
        for (i, target) in [&direct, &gateway].into_iter().enumerate() {
            for _ in 0..seq {
                samples[i][0].push(request(&client, target, &whole).await?.1);
                let (first, total) = request(&client, target, &streamed).await?;
                samples[i][1].push(first);
                samples[i][2].push(total);
            }
        }
    }
    let ms = |v: f64| v * 1000.0;
    println!("model gateway vs direct: {rounds} rounds x {seq} requests of each kind per path");
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>10}",
        "", "direct p50", "p99", "gateway p50", "p99"
    );
    let names = [
        "whole message (ms)",
        "stream: first event (ms)",
        "stream: end (ms)",
    ];
    let mut added = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let mut d = samples[0][k].clone();
        let mut g = samples[1][k].clone();
        d.sort_by(f64::total_cmp);
        g.sort_by(f64::total_cmp);
        println!(
            "{name:<28} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            ms(percentile(&d, 0.5)),
            ms(percentile(&d, 0.99)),
            ms(percentile(&g, 0.5)),
            ms(percentile(&g, 0.99))
        );
        added.push((
            ms(percentile(&g, 0.5) - percentile(&d, 0.5)),
            ms(percentile(&g, 0.99) - percentile(&d, 0.99)),
        ));
    }
    for (name, (p50, p99)) in names.iter().zip(&added) {
        println!("added by the gateway, {name}: p50 {p50:+.3} ms, p99 {p99:+.3} ms");
    }

    // Memory with streaming traffic: many large streams at once.
    let large = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
                       "metadata": {"events": events, "event_bytes": 1024},
                       "messages": [{"role": "user", "content": "hi"}]});
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|_| {
            let client = client.clone();
            let target = Target {
                url: gateway.url.clone(),
                key: gateway.key.clone(),
            };
            let body = large.clone();
            tokio::spawn(async move { request(&client, &target, &body).await })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let after = memory(pid);
    println!(
        "proxy memory: idle VmRSS {} MiB; after {streams} concurrent streams of {events} x 1 KiB events ({:.1} s): VmRSS {} MiB, peak (VmHWM) {} MiB",
        idle.0,
        started.elapsed().as_secs_f64(),
        after.0,
        after.1
    );
    proxy.kill().await?;
    Ok(())
}
