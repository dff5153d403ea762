//! What a CEL condition (`policy.conditions`, issue 44) adds per call: the step's own work, in
//! process, as the call path does it (the facts bound, the conditions applying to the call
//! evaluated in order, the clock read): no condition, one `startsWith` on a path, the five rules
//! of docs/proxy-config.md's example (four apply), and one macro over a 10-element list.
//! Batches of 64 calls; p50 and p99 per call.
//!
//! Then an external decision point: a real Open Policy Agent (`e2e/tools/opa`, built from its Go
//! module) on loopback serving `config/policy/orchestrator.rego`, asked as the call path asks
//! (`DecisionPoints::decide`), one call at a time: without the cache, and with it (the same
//! input each time). p50 and p99 per decision.
//!
//! Run: `cargo bench -p orchestrator-mcp-proxy --bench conditions` (`BENCH_ITERS` batches,
//! default 5000; `BENCH_DECISIONS`, default 2000).

use std::{collections::BTreeMap, time::Instant};

use orchestrator_crds::{condition::CallCondition, decision::DecisionPoint};
use orchestrator_mcp_proxy::{
    conditions::{Conditions, Facts, TaskFacts, Verdict},
    decision::{self, DecisionPoints},
};
use serde_json::json;

const BATCH: usize = 64;

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn conditions(list: serde_json::Value) -> Conditions {
    let wire: Vec<CallCondition> = serde_json::from_value(list).expect("conditions");
    Conditions::compile(&wire).expect("compiles")
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let labels = BTreeMap::from([(
        "orchestrator.io/repository".to_string(),
        "acme/app".to_string(),
    )]);
    let args = json!({"path": "/workspace/src/main.rs", "content": "fn main() {}", "owner": "acme",
                      "repo": "app", "body": "ok", "paths": (0..10).map(|i| format!("/workspace/src/{i}.rs")).collect::<Vec<_>>()});
    let args = args.as_object().cloned();
    let cases = [
        ("no condition", conditions(json!([]))),
        (
            "one startsWith",
            conditions(json!([
            {"name": "under-src", "tools": ["filesystem/write_*"], "when": "!args.path.startsWith('/workspace/src/')"}])),
        ),
        (
            "the five example rules (four apply)",
            conditions(json!([
            {"name": "under-src", "tools": ["filesystem/write_*"], "when": "!args.path.startsWith('/workspace/src/')"},
            {"name": "agent-branches", "tools": ["git/git_push"], "when": "!args.branch.matches('^agent/')"},
            {"name": "short", "tools": ["filesystem/*"], "when": "has(args.body) && size(args.body) >= 2000"},
            {"name": "own-repo", "tools": ["filesystem/*"], "when": "tool.class != 'read' && args.owner + '/' + args.repo != task.labels['orchestrator.io/repository']"},
            {"name": "after-hours", "when": "tool.class != 'read' && time.getHours('Europe/Berlin') >= 23 && time.getHours('Europe/Berlin') < 0", "effect": "requireApproval"}])),
        ),
        (
            "a macro over 10 paths",
            conditions(json!([
            {"name": "paths", "when": "!args.paths.all(p, p.startsWith('/workspace/') && !p.contains('..'))"}])),
        ),
    ];
    println!("per call (batches of {BATCH}, {iters} batches)");
    for (name, compiled) in &cases {
        let mut per_call = Vec::with_capacity(iters);
        for _ in 0..iters {
            let started = Instant::now();
            for _ in 0..BATCH {
                let facts = Facts {
                    server: "filesystem",
                    tool: "write_file",
                    class: Some("write"),
                    annotations: json!({"destructiveHint": false}),
                    args: args.as_ref(),
                    task: TaskFacts {
                        name: "task-1001",
                        namespace: "team-a",
                        labels: &labels,
                        context_version: 3,
                        created_by: Some("alice"),
                    },
                    now: chrono::Utc::now(),
                };
                let verdict = compiled.decide(&facts);
                assert!(
                    matches!(verdict, Verdict::Pass { .. }),
                    "{name}: {verdict:?}"
                );
            }
            per_call.push(started.elapsed().as_nanos() as f64 / BATCH as f64);
        }
        per_call.sort_by(f64::total_cmp);
        println!(
            "{name:40} p50 {:>9.0} ns   p99 {:>9.0} ns",
            pct(&per_call, 0.5),
            pct(&per_call, 0.99)
        );
    }
    opa();
}

/// The decision point part: a real OPA on loopback.
fn opa() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = std::process::Command::new(repo.join("e2e/tools/opa")).output();
    let Some(built) = built.ok().filter(|o| o.status.success()) else {
        println!("decision point: skipped (e2e/tools/opa could not build OPA)");
        return;
    };
    let opa = String::from_utf8_lossy(&built.stdout).trim().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut server = std::process::Command::new(opa)
        .args([
            "run",
            "--server",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--log-level",
            "error",
        ])
        .arg("--disable-telemetry")
        .arg(repo.join("config/policy/orchestrator.rego"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("opa starts");
    let url = format!("http://127.0.0.1:{port}/v1/data/orchestrator/decision");
    let n: usize = std::env::var("BENCH_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let input = json!({"tool": {"name": "git_push", "server": "git", "class": "write", "annotations": {}},
                       "server": "git", "args": {"branch": "agent/x"},
                       "task": {"name": "t", "namespace": "n", "labels": {}, "contextVersion": 1},
                       "time": "2026-11-30T10:00:00.000Z"});
    runtime.block_on(async {
        // Until it answers.
        let plain = points(&url, None);
        for _ in 0..200 {
            if plain.decide(&input).await == decision::Verdict::Allow {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for (name, points) in [
            ("OPA decision, no cache", plain),
            (
                "OPA decision, cached",
                points(&url, Some(json!({"entries": 1000, "ttlSeconds": 3600}))),
            ),
        ] {
            let mut times = Vec::with_capacity(n);
            for _ in 0..n {
                let started = Instant::now();
                let verdict = points.decide(&input).await;
                times.push(started.elapsed().as_nanos() as f64);
                assert_eq!(verdict, decision::Verdict::Allow, "{name}");
            }
            times.sort_by(f64::total_cmp);
            println!(
                "{name:40} p50 {:>9.0} ns   p99 {:>9.0} ns",
                pct(&times, 0.5),
                pct(&times, 0.99)
            );
        }
    });
    let _ = server.kill();
    let _ = server.wait();
}

fn points(url: &str, cache: Option<serde_json::Value>) -> DecisionPoints {
    let mut wire = json!({"url": url, "timeoutMilliseconds": 5000});
    if let Some(cache) = cache {
        wire["cache"] = cache;
    }
    let wire: DecisionPoint = serde_json::from_value(wire).expect("a point");
    DecisionPoints::compile(&[wire]).expect("compiles")
}
