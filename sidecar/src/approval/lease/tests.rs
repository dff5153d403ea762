use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::{
    approval::{Approvals, HoldCall},
    metrics::Metrics,
};

const DEFINITION: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

fn entry(id: &str, holder: &str, expires_at: &str) -> Value {
    json!({"id": id, "holder": holder, "server": "gh", "tool": "t", "digest": "sha256:x",
        "definition": DEFINITION, "contextVersion": 1, "params": "{}", "paramsBytes": 2,
        "maskNonce": "abcdef", "requestedAt": "2026-11-27T10:00:00Z", "expiresAt": expires_at})
}

fn ids(text: &str) -> Vec<(String, String)> {
    entries(Some(text))
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap_or_default().to_string(),
                e["holder"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn now() -> jiff::Timestamp {
    "2026-11-27T10:01:00Z".parse().expect("time")
}

const LATER: &str = "2026-11-27T10:05:00Z";

#[test]
fn a_replica_writes_only_its_own_entries() {
    let current = Value::Array(vec![
        entry("a1", "r1", LATER),
        entry("b1", "r2", LATER),
        entry("b2", "r2", LATER),
        // r2's name, an id this process never held: an earlier process of the pod; kept.
        entry("b0", "r2", LATER),
        // r1's, long expired: nobody can decide it any more.
        entry("a0", "r1", "2026-11-27T09:59:00Z"),
    ])
    .to_string();
    let own = vec![entry("b2", "r2", LATER), entry("b3", "r2", LATER)];
    let held_here = |id: &str| ["b1", "b2", "b3"].contains(&id);
    let merged = merge_own(Some(&current), "r2", &own, held_here, now());
    assert_eq!(
        ids(&merged),
        [("a1", "r1"), ("b0", "r2"), ("b2", "r2"), ("b3", "r2")]
            .map(|(i, h)| (i.to_string(), h.to_string()))
    );
    // Nothing pending: only its own go; an entry it cannot read is left as it is.
    let odd = Value::Array(vec![entry("a1", "r1", LATER), json!("not a request")]).to_string();
    let merged = merge_own(Some(&odd), "r2", &[], held_here, now());
    assert_eq!(entries(Some(&merged)).len(), 2);
    assert_eq!(merge_own(None, "r2", &[], held_here, now()), "[]");
}

#[test]
fn a_take_over_needs_the_entry_still_under_the_holder_it_was_found_with() {
    let current =
        Value::Array(vec![entry("a1", "r1", LATER), entry("b1", "r2", LATER)]).to_string();
    let taken = take_over(Some(&current), "a1", "r1", "r3", false).expect("taken");
    assert_eq!(ids(&taken)[0], ("a1".to_string(), "r3".to_string()));
    // r4 comes second: the entry is r3's now.
    assert_eq!(take_over(Some(&taken), "a1", "r1", "r4", false), None);
    // A known verdict: the entry leaves the set.
    let consumed = take_over(Some(&current), "a1", "r1", "r3", true).expect("consumed");
    assert_eq!(ids(&consumed), [("b1".to_string(), "r2".to_string())]);
    assert_eq!(take_over(Some(&consumed), "a1", "r1", "r3", true), None);
}

fn replica(name: &str) -> Approvals {
    let approvals = Approvals::new(Arc::new(Metrics::new()));
    drop(approvals.reporter("team-a", "task-1"));
    let _ = approvals.holder.set(name.to_string());
    approvals
}

fn call<'a>(tool: &'a str, context_version: u64, params: &'a Value) -> HoldCall<'a> {
    HoldCall {
        server: "gh",
        tool,
        definition: DEFINITION,
        context_version,
        params,
    }
}

#[test]
fn only_the_same_call_adopts_an_entry_held_by_another_replica() {
    let r1 = replica("r1");
    let params = json!({"name": "create_issue", "arguments": {"title": "x"}});
    let held = r1
        .hold(call("create_issue", 3, &params), WAIT)
        .expect("held");
    let lease = r1.published.borrow().clone();
    assert_eq!(
        ids(&lease),
        [(held.request.id.clone(), "r1".to_string())],
        "the entry names its holder"
    );
    let r2 = replica("r2");
    let found = r2.adoptable(Some(&lease), &call("create_issue", 3, &params));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].request, held.request);
    assert_eq!(found[0].holder.as_deref(), Some("r1"));
    // Other arguments, another tool, another context version: another call.
    let other = json!({"name": "create_issue", "arguments": {"title": "y"}});
    assert!(
        r2.adoptable(Some(&lease), &call("create_issue", 3, &other))
            .is_empty()
    );
    let renamed = json!({"name": "delete_repo", "arguments": {"title": "x"}});
    assert!(
        r2.adoptable(Some(&lease), &call("delete_repo", 3, &renamed))
            .is_empty()
    );
    assert!(
        r2.adoptable(Some(&lease), &call("create_issue", 4, &params))
            .is_empty()
    );
    // Its own holder never adopts what it holds.
    assert!(
        r1.adoptable(Some(&lease), &call("create_issue", 3, &params))
            .is_empty()
    );
    // Another task's replica (another Lease in the digest) does not either.
    let elsewhere = Approvals::new(Arc::new(Metrics::new()));
    drop(elsewhere.reporter("team-a", "task-2"));
    let _ = elsewhere.holder.set("r2".to_string());
    assert!(
        elsewhere
            .adoptable(Some(&lease), &call("create_issue", 3, &params))
            .is_empty()
    );
}

#[test]
fn an_expired_entry_is_not_adopted() {
    let r1 = replica("r1");
    let params = json!({"name": "create_issue", "arguments": {}});
    let held = r1
        .hold(call("create_issue", 3, &params), std::time::Duration::ZERO)
        .expect("held");
    let lease = r1.published.borrow().clone();
    drop(held);
    let r2 = replica("r2");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(
        r2.adoptable(Some(&lease), &call("create_issue", 3, &params))
            .is_empty()
    );
}
