use std::collections::HashSet;

use orchestrator_crds::approval::Decision;
use serde_json::json;

use super::*;

fn approvals() -> Approvals {
    let approvals = Approvals::new(Arc::new(Metrics::new()));
    // As `api::start` does when a Lease is named.
    drop(approvals.reporter());
    approvals
}

fn published(approvals: &Approvals) -> Vec<ApprovalRequest> {
    let text = approvals.published.borrow().clone();
    serde_json::from_str(&text).expect("the annotation is a JSON array of requests")
}

fn args(value: serde_json::Value) -> JsonObject {
    value.as_object().cloned().expect("an object")
}

fn verdict(id: &str, decision: &str, by: &str) -> serde_json::Value {
    json!({"id": id, "decision": decision, "decidedBy": by, "reason": "because"})
}

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_held_call_is_published_with_a_redacted_summary_and_withdrawn_when_dropped() {
    let approvals = approvals();
    let arguments = args(json!({"path": "/workspace/a", "api_token": "hunter2"}));
    let held = approvals
        .hold("fs", "write_file", Some(&arguments), WAIT)
        .expect("held");
    assert_eq!(held.id().len(), 8);
    assert!(
        held.id()
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    );
    let requests = published(&approvals);
    assert_eq!(requests, std::slice::from_ref(&held.request));
    let request = &requests[0];
    assert_eq!(
        (request.server.as_str(), request.tool.as_str()),
        ("fs", "write_file")
    );
    assert_eq!(request.arguments["path"], "\"/workspace/a\"");
    assert_eq!(request.arguments["api_token"], "<redacted>");
    let requested: jiff::Timestamp = request.requested_at.parse().expect("RFC 3339");
    let expires: jiff::Timestamp = request.expires_at.parse().expect("RFC 3339");
    assert_eq!(expires.duration_since(requested).as_secs(), 60);
    assert!(
        approvals
            .metrics
            .encode()
            .contains("mcp_proxy_approvals_pending 1")
    );
    drop(held);
    assert_eq!(&*approvals.published.borrow().clone(), "[]");
    assert_eq!(approvals.pending(), 0);
    assert!(
        approvals
            .metrics
            .encode()
            .contains("mcp_proxy_approvals_pending 0")
    );
}

#[test]
fn without_a_reporter_nothing_is_held() {
    let approvals = Approvals::new(Arc::new(Metrics::new()));
    assert!(!approvals.is_visible());
    assert_eq!(
        approvals.hold("fs", "rm", None, WAIT).err(),
        Some(NotHeld::Unavailable)
    );
    assert_eq!(approvals.pending(), 0);
}

#[test]
fn at_most_max_pending_calls_wait_at_once() {
    let approvals = approvals();
    let mut held: Vec<_> = (0..MAX_PENDING)
        .map(|_| approvals.hold("fs", "rm", None, WAIT).expect("held"))
        .collect();
    assert_eq!(
        approvals.hold("fs", "rm", None, WAIT).err(),
        Some(NotHeld::Busy)
    );
    let ids: HashSet<_> = held.iter().map(|h| h.id().to_string()).collect();
    assert_eq!(ids.len(), MAX_PENDING, "ids are unique");
    held.pop();
    assert!(approvals.hold("fs", "rm", None, WAIT).is_ok());
}

#[tokio::test]
async fn a_verdict_decides_its_pending_call_once_and_others_are_ignored() {
    let approvals = approvals();
    let mut first = approvals.hold("fs", "rm", None, WAIT).expect("held");
    let mut second = approvals.hold("fs", "rm", None, WAIT).expect("held");
    let doc = json!([
        verdict("00000000", "approve", "nobody"),
        {"id": first.id(), "decision": "maybe", "decidedBy": "x"},
        "not a verdict",
        verdict(first.id(), "approve", "alice"),
        verdict(first.id(), "reject", "mallory"),
    ]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    let decided = first.decided().await;
    assert_eq!(
        (decided.decision, decided.decided_by.as_str()),
        (Decision::Approve, "alice")
    );
    assert_eq!(published(&approvals), std::slice::from_ref(&second.request));

    // The same document again (a re-list), then one that also decides the second call.
    approvals.verdicts("cm", doc.to_string().as_bytes());
    assert_eq!(approvals.pending(), 1);
    let mut doc = doc.as_array().cloned().unwrap_or_default();
    doc.push(verdict(second.id(), "reject", "bob"));
    approvals.verdicts("file", json!(doc).to_string().as_bytes());
    let decided = second.decided().await;
    assert_eq!(decided.decision, Decision::Reject);
    assert_eq!(decided.reason.as_deref(), Some("because"));
    assert_eq!(&*approvals.published.borrow().clone(), "[]");

    // Not JSON, or not an array: nothing happens.
    let third = approvals.hold("fs", "rm", None, WAIT).expect("held");
    approvals.verdicts("cm", b"{\"id\": 1}");
    approvals.verdicts("cm", b"[not json");
    assert_eq!(published(&approvals), std::slice::from_ref(&third.request));
}

#[test]
fn a_verdict_is_clipped_to_its_bounds() {
    let approvals = approvals();
    let mut held = approvals.hold("fs", "rm", None, WAIT).expect("held");
    let long = "r".repeat(5000);
    let doc = json!([{"id": held.id(), "decision": "reject", "decidedBy": long, "reason": long}]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    let decided = held
        .expire()
        .expect("the verdict came before the wait ran out");
    assert_eq!(decided.decided_by.chars().count(), MAX_DECIDED_BY_CHARS);
    assert_eq!(
        decided.reason.map(|r| r.chars().count()),
        Some(MAX_REASON_CHARS)
    );
}

#[test]
fn an_expired_or_cancelled_request_is_withdrawn_and_a_late_verdict_ignored() {
    let approvals = approvals();
    let mut expired = approvals.hold("fs", "rm", None, WAIT).expect("held");
    let cancelled = approvals.hold("fs", "rm", None, WAIT).expect("held");
    let kept = approvals.hold("fs", "rm", None, WAIT).expect("held");
    assert_eq!(expired.expire(), None);
    let (expired_id, cancelled_id) = (expired.id().to_string(), cancelled.id().to_string());
    // A client's cancellation and shutdown drop the held call.
    drop(cancelled);
    assert_eq!(published(&approvals), std::slice::from_ref(&kept.request));
    let doc = json!([
        verdict(&expired_id, "approve", "alice"),
        verdict(&cancelled_id, "approve", "alice")
    ]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    assert_eq!(published(&approvals), std::slice::from_ref(&kept.request));
    drop(expired);
    assert_eq!(approvals.pending(), 1);
}

#[tokio::test]
async fn a_held_call_waits_until_its_deadline() {
    let approvals = approvals();
    let started = tokio::time::Instant::now();
    let mut held = approvals
        .hold("fs", "rm", None, Duration::from_millis(200))
        .expect("held");
    let deadline = held.deadline;
    let expired = tokio::select! {
        _ = held.decided() => false,
        () = tokio::time::sleep_until(deadline) => true,
    };
    assert!(expired && started.elapsed() >= Duration::from_millis(200));
    assert_eq!(held.expire(), None);
    assert_eq!(approvals.pending(), 0);
}

#[test]
fn hostile_arguments_keep_the_annotation_below_its_bound() {
    let approvals = approvals();
    // Keys and values that grow the most when escaped twice (Debug, then JSON).
    let nasty_key = |i: usize| format!("{i:02}{}", "\u{1}\"\\".repeat(30));
    let nasty = "\u{1}\"\\".repeat(500);
    let arguments: JsonObject = (0..40)
        .map(|i| (nasty_key(i), json!(nasty.clone())))
        .collect();
    let tool = "\u{1}".repeat(1000);
    let held: Vec<_> = (0..MAX_PENDING)
        .map(|_| {
            approvals
                .hold("server-with-a-long-name", &tool, Some(&arguments), WAIT)
                .expect("held")
        })
        .collect();
    let text = approvals.published.borrow().clone();
    assert!(text.len() < MAX_ANNOTATION_BYTES, "{} bytes", text.len());
    let requests = published(&approvals);
    assert_eq!(requests.len(), MAX_PENDING);
    assert_eq!(requests[0].tool.chars().count(), MAX_TOOL_CHARS);
    assert_eq!(requests[0].arguments["…"], "17 keys, too long to show");
    // A modest summary is kept whole; only its longest views go when it does not fit.
    drop(held);
    let long = "x ".repeat(40);
    let arguments: JsonObject = (0..16)
        .map(|i| (format!("k{i:02}"), json!(long.clone())))
        .collect();
    let held = approvals
        .hold("fs", "write", Some(&arguments), WAIT)
        .expect("held");
    assert!(
        held.request
            .arguments
            .values()
            .all(|v| v.ends_with("(80 chars)"))
    );
}

#[test]
fn ids_are_not_issued_twice() {
    let approvals = approvals();
    let mut seen = HashSet::new();
    for _ in 0..REMEMBERED_IDS {
        let held = approvals.hold("fs", "rm", None, WAIT).expect("held");
        assert!(
            seen.insert(held.id().to_string()),
            "{} issued twice",
            held.id()
        );
    }
}
