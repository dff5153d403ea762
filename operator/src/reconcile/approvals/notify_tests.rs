//! What follows a merge ([`announce`]): the approvals-pending gauges, and one webhook
//! notification per call first listed pending, against a real receiver on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::notify::testing::{receiver, until_metric};
use crate::notify::{Notifier, Options};
use crate::settings::WebhookFormat;

fn task_run() -> TaskRun {
    let mut tr: TaskRun = serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-1001", "namespace": "team-a"},
        "spec": {"taskId": 1001, "serviceName": "svc", "task": {"prompt": "x"}},
    }))
    .expect("a TaskRun");
    tr.metadata.namespace = Some("team-a".into());
    tr
}

fn request(id: &str, requested_at: &str) -> ApprovalRequest {
    ApprovalRequest {
        id: id.into(),
        server: "fs".into(),
        tool: "write_file".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        definition: String::new(),
        context_version: 1,
        params: r#"{"name":"write_file","arguments":{"token":"<secret:s/k:a1b2c3>"}}"#.into(),
        params_bytes: 60,
        masked: vec![],
        mask_nonce: "a1b2c3".into(),
        withheld: None,
        requested_at: requested_at.into(),
        expires_at: "2026-01-01T00:05:00Z".into(),
    }
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap_or(Timestamp::UNIX_EPOCH)
}

const PENDING: &str =
    "orchestrator_operator_approvals_pending{namespace=\"team-a\",taskrun=\"task-1001\"}";
const OLDEST: &str = "orchestrator_operator_approval_oldest_pending_timestamp_seconds{namespace=\"team-a\",taskrun=\"task-1001\"}";

#[test]
fn the_gauges_count_the_calls_waiting_and_go_when_none_wait() {
    let metrics = Metrics::default();
    let tr = task_run();
    let requests = [
        request("b", "2026-01-01T00:00:30Z"),
        request("a", "2026-01-01T00:00:10Z"),
    ];
    let now = at("2026-01-01T00:01:00Z");
    let (pending, t) = merge(&[], Some(&requests), |_| None, now);
    announce(&metrics, None, &tr, &pending, &t);
    let text = metrics.encode();
    assert!(text.contains(&format!("{PENDING} 2\n")), "{text}");
    let oldest = at("2026-01-01T00:00:10Z").as_second();
    assert!(text.contains(&format!("{OLDEST} {oldest}.0\n")), "{text}");

    // The proxy stops holding both: withdrawn, none wait, the series go.
    let (gone, t) = merge(&pending, Some(&[]), |_| None, now);
    announce(&metrics, None, &tr, &gone, &t);
    let text = metrics.encode();
    assert!(!text.contains(PENDING) && !text.contains(OLDEST), "{text}");
}

#[tokio::test]
async fn a_call_first_listed_pending_is_notified_once_without_its_params() {
    let mut r = receiver(&[]).await;
    let metrics = Arc::new(Metrics::default());
    let options = Options {
        backoff: Duration::from_millis(10),
        ..Options::default()
    };
    let notifier =
        Notifier::with_options(&r.url, WebhookFormat::Cloudevents, metrics.clone(), options)
            .expect("a notifier");
    let tr = task_run();
    let requests = [request("a1", "2026-01-01T00:00:10Z")];
    let now = at("2026-01-01T00:01:00Z");
    let (pending, t) = merge(&[], Some(&requests), |_| None, now);
    // The status written, but a lagging cache shows the old one: the merge sees it new again.
    for _ in 0..5 {
        announce(&metrics, Some(&notifier), &tr, &pending, &t);
    }
    // Listed again unchanged: no transition, no notification.
    let (same, t) = merge(&pending, Some(&requests), |_| None, now);
    announce(&metrics, Some(&notifier), &tr, &same, &t);
    // A second call: notified; the next request the receiver sees after a1's is a2's.
    let more = [requests[0].clone(), request("a2", "2026-01-01T00:00:20Z")];
    let (two, t) = merge(&same, Some(&more), |_| None, now);
    announce(&metrics, Some(&notifier), &tr, &two, &t);

    let first = r.next().await.body;
    assert_eq!(first["id"], "a1");
    assert_eq!(first["data"]["taskRun"], "task-1001");
    assert_eq!(first["data"]["taskId"], 1001);
    assert!(!first.to_string().contains("secret:"), "no params: {first}");
    assert_eq!(r.next().await.body["id"], "a2");
    until_metric(
        &metrics,
        "orchestrator_operator_approval_notifications_total{format=\"cloudevents\",outcome=\"ok\"} 2",
    )
    .await;
}

#[tokio::test]
async fn a_call_that_expired_before_it_was_listed_is_not_notified() {
    let mut r = receiver(&[]).await;
    let metrics = Arc::new(Metrics::default());
    let notifier =
        Notifier::start(&r.url, WebhookFormat::Slack, metrics.clone()).expect("a notifier");
    let tr = task_run();
    // Listed after its expiry: Expired at once.
    let late = at("2026-01-01T00:06:00Z");
    let (expired, t) = merge(
        &[],
        Some(&[request("old", "2026-01-01T00:00:00Z")]),
        |_| None,
        late,
    );
    assert_eq!(expired[0].state, ApprovalState::Expired);
    announce(&metrics, Some(&notifier), &tr, &expired, &t);
    // The next request the receiver sees is a later call's.
    let mut fresh = request("new", "2026-01-01T00:05:30Z");
    fresh.expires_at = "2026-01-01T00:10:00Z".into();
    let (pending, t) = merge(&expired, Some(&[fresh]), |_| None, late);
    announce(&metrics, Some(&notifier), &tr, &pending, &t);
    let text = r.next().await.body["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(text.contains("request `new`"), "{text}");
}
