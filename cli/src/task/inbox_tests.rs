//! The approvals inbox: the pending calls of many TaskRuns, and what `--watch` prints.

use k8s_openapi::jiff::Timestamp;
use orchestrator_crds::approval::ApprovalState;
use orchestrator_crds::taskrun::TaskRun;
use serde_json::json;

use super::inbox::{Inbox, cells, decide_hint, pending, state_cell};

fn approval(id: &str, state: &str, requested: &str) -> serde_json::Value {
    json!({"id": id, "server": "github", "tool": "merge_pr", "state": state,
        "requestedAt": requested, "expiresAt": "2025-01-01T00:05:00Z", "contextVersion": 1})
}

fn taskrun(ns: &str, name: &str, approvals: serde_json::Value) -> TaskRun {
    serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"}},
        "status": {"phase": "Running", "approvals": approvals},
    }))
    .expect("valid TaskRun")
}

fn now() -> Timestamp {
    "2025-01-01T00:01:00Z".parse().expect("valid")
}

#[test]
fn pending_calls_of_every_taskrun_oldest_first() {
    let items = [
        taskrun(
            "team-a",
            "t1",
            json!([
                approval("a2", "Pending", "2025-01-01T00:00:30Z"),
                approval("a1", "Approved", "2025-01-01T00:00:00Z")
            ]),
        ),
        taskrun(
            "team-b",
            "t2",
            json!([approval("b1", "Pending", "2025-01-01T00:00:10Z")]),
        ),
    ];
    let entries = pending(&items);
    let ids: Vec<_> = entries.iter().map(|e| e.approval.id.as_str()).collect();
    assert_eq!(ids, ["b1", "a2"]);
    assert_eq!(
        cells(&entries[0], now(), None),
        ["team-b", "t2", "b1", "github/merge_pr", "50s", "in 4m"]
    );
    assert_eq!(
        decide_hint(&entries[1]),
        "orchestrator-cli -n team-a task approvals t1 --show a2"
    );
}

#[test]
fn watch_prints_a_call_once_when_it_waits_and_once_when_decided() {
    let mut inbox = Inbox::default();
    let waiting = taskrun(
        "team-a",
        "t1",
        json!([approval("a1", "Pending", "2025-01-01T00:00:00Z")]),
    );
    let first = inbox.update(&waiting, false);
    assert_eq!(first.len(), 1);
    assert_eq!(state_cell(&first[0].approval), "Pending");
    assert!(inbox.update(&waiting, false).is_empty(), "shown once");
    let mut decided = approval("a1", "Rejected", "2025-01-01T00:00:00Z");
    decided["decidedBy"] = json!("alice\u{1b}[2J");
    decided["reason"] = json!("not\u{202e} that");
    let done = taskrun("team-a", "t1", json!([decided]));
    let second = inbox.update(&done, false);
    assert_eq!(second.len(), 1);
    assert_eq!(
        state_cell(&second[0].approval),
        "Rejected by alice\\u{1b}[2J: not\\u{202e} that"
    );
    assert!(inbox.update(&done, false).is_empty());
    // A decided call first seen decided (an old one) is not news.
    let old = taskrun(
        "team-b",
        "t2",
        json!([approval("b0", "Expired", "2025-01-01T00:00:00Z")]),
    );
    assert!(inbox.update(&old, false).is_empty());
    // A TaskRun deleted with a call pending: the call is withdrawn.
    let other = taskrun(
        "team-b",
        "t3",
        json!([approval("c1", "Pending", "2025-01-01T00:00:00Z")]),
    );
    assert_eq!(inbox.update(&other, false).len(), 1);
    let gone = inbox.update(&other, true);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].approval.id, "c1");
    assert_eq!(gone[0].approval.state, ApprovalState::Withdrawn);
}
