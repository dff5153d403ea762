//! What a CEL condition (`policy.conditions`, issue 44) adds per call: the step's own work, in
//! process, as the call path does it (the facts bound, the conditions applying to the call
//! evaluated in order, the clock read): no condition, one `startsWith` on a path, the five rules
//! of docs/proxy-config.md's example (four apply), and one macro over a 10-element list.
//! Batches of 64 calls; p50 and p99 per call.
//!
//! Run: `cargo bench -p orchestrator-mcp-proxy --bench conditions` (`BENCH_ITERS` batches,
//! default 5000).

use std::{collections::BTreeMap, time::Instant};

use orchestrator_crds::condition::CallCondition;
use orchestrator_mcp_proxy::conditions::{Conditions, Facts, TaskFacts, Verdict};
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
}
