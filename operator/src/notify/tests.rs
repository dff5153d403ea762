//! The webhook against a real receiver on 127.0.0.1: bodies, escaping, retries, timeouts,
//! dedupe, the queue bound, and the URL kept out of errors.

use std::sync::Arc;
use std::time::Duration;

use super::testing::{Reply, notice, receiver, until_metric};
use super::*;

fn fast() -> Options {
    Options {
        timeout: Duration::from_millis(300),
        backoff: Duration::from_millis(10),
        ..Options::default()
    }
}

fn counted(format: &str, outcome: &str, n: u64) -> String {
    format!(
        "orchestrator_operator_approval_notifications_total{{format=\"{format}\",outcome=\"{outcome}\"}} {n}"
    )
}

#[tokio::test]
async fn a_cloudevent_in_structured_mode_names_the_call_and_never_its_arguments() {
    let mut r = receiver(&[]).await;
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(&r.url, WebhookFormat::Cloudevents, metrics.clone(), fast())
        .expect("a notifier");
    assert!(n.notify(notice("a1b2c3d4")));
    let got = r.next().await;
    assert_eq!(got.path, "/hook/T000-SECRET-PATH");
    assert_eq!(got.content_type, "application/cloudevents+json");
    let e = &got.body;
    assert_eq!(e["specversion"], "1.0");
    assert_eq!(e["type"], "io.orchestrator.approval.requested");
    assert_eq!(
        e["source"],
        "/apis/orchestrator.io/v1/namespaces/team-a/taskruns/task-1001"
    );
    assert_eq!(e["id"], "a1b2c3d4");
    assert_eq!(e["time"], "2026-01-01T00:00:00Z");
    assert_eq!(e["subject"], "fs/write_file");
    assert_eq!(e["datacontenttype"], "application/json");
    assert_eq!(
        e["data"],
        serde_json::json!({"namespace": "team-a", "taskRun": "task-1001", "taskId": 1001,
            "approvalId": "a1b2c3d4", "server": "fs", "tool": "write_file",
            "digest": notice("a").digest, "expiresAt": "2026-01-01T00:05:00Z"})
    );
    until_metric(&metrics, &counted("cloudevents", "ok", 1)).await;
}

#[tokio::test]
async fn a_slack_text_names_the_task_the_call_and_the_commands() {
    let mut r = receiver(&[]).await;
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(&r.url, WebhookFormat::Slack, metrics.clone(), fast())
        .expect("a notifier");
    n.notify(notice("a1b2c3d4"));
    let got = r.next().await;
    assert_eq!(got.content_type, "application/json");
    let body = got.body.as_object().expect("an object");
    assert_eq!(body.len(), 1, "only text: {body:?}");
    let text = body["text"].as_str().expect("text");
    for part in [
        "`fs/write_file`",
        "`team-a/task-1001`",
        "task 1001",
        "2026-01-01T00:05:00Z",
        "orchestrator-cli -n team-a task approvals task-1001 --show a1b2c3d4",
    ] {
        assert!(text.contains(part), "{part:?} not in {text:?}");
    }
    until_metric(&metrics, &counted("slack", "ok", 1)).await;
}

#[test]
fn a_hostile_tool_name_cannot_mention_link_forge_a_line_or_leave_its_code_span() {
    let mut hostile = notice("a1");
    hostile.tool =
        "x` <!channel> <https://evil.example|Approve here> &amp;\nApproved by admin".to_string();
    hostile.server = "<@U012AB3CD>".into();
    hostile.expires_at = "<!here>".into();
    let text = body::slack(&hostile)["text"]
        .as_str()
        .expect("text")
        .to_string();
    for bad in [
        "<!channel>",
        "<https://",
        "<@U",
        "<!here>",
        "\nApproved",
        "x`",
    ] {
        assert!(!text.contains(bad), "{bad:?} in {text:?}");
    }
    assert!(text.contains("&lt;!channel&gt;"), "{text}");
    assert!(text.contains("&amp;amp;"), "& escaped: {text}");
    // The only `<`/`>` left are none at all.
    assert!(!text.contains('<') && !text.contains('>'), "{text}");
}

#[test]
fn long_outside_strings_are_clipped() {
    let mut long = notice("a1");
    long.tool = "t".repeat(10_000);
    let text = body::slack(&long)["text"]
        .as_str()
        .expect("text")
        .to_string();
    assert!(text.len() < 1500, "{} bytes", text.len());
    let event = body::cloudevent(&long, Timestamp::UNIX_EPOCH);
    let tool = event["data"]["tool"].as_str().expect("tool");
    assert_eq!(tool.chars().count(), body::MAX_FIELD_CHARS);
    assert!(tool.ends_with('…'));
}

#[tokio::test]
async fn a_5xx_is_tried_again_and_then_delivered() {
    let mut r = receiver(&[Reply::Status(500)]).await;
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(&r.url, WebhookFormat::Slack, metrics.clone(), fast())
        .expect("a notifier");
    n.notify(notice("a1"));
    let (first, second) = (r.next().await, r.next().await);
    assert_eq!(first.body, second.body, "the same body again");
    until_metric(&metrics, &counted("slack", "ok", 1)).await;
    until_metric(&metrics, &counted("slack", "http_500", 1)).await;
}

#[tokio::test]
async fn a_4xx_is_not_tried_again() {
    let mut r = receiver(&[Reply::Status(404)]).await;
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(&r.url, WebhookFormat::Cloudevents, metrics.clone(), fast())
        .expect("a notifier");
    n.notify(notice("a1"));
    n.notify(notice("a2"));
    // One at a time, in order: the request after a1's 404 is a2's.
    assert_eq!(r.next().await.body["id"], "a1");
    assert_eq!(r.next().await.body["id"], "a2");
    until_metric(&metrics, &counted("cloudevents", "http_404", 1)).await;
    until_metric(&metrics, &counted("cloudevents", "ok", 1)).await;
}

#[tokio::test]
async fn a_receiver_that_never_answers_times_out_three_times_without_holding_anyone_up() {
    let mut r = receiver(&[Reply::Hang, Reply::Hang, Reply::Hang]).await;
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(&r.url, WebhookFormat::Slack, metrics.clone(), fast())
        .expect("a notifier");
    let started = std::time::Instant::now();
    assert!(n.notify(notice("a1")));
    assert!(n.notify(notice("a2")));
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "notify waits"
    );
    for _ in 0..3 {
        assert_eq!(
            r.next().await.body["text"],
            body::slack(&notice("a1"))["text"]
        );
    }
    until_metric(&metrics, &counted("slack", "timeout", 3)).await;
    // Then the next one goes.
    assert_eq!(
        r.next().await.body["text"],
        body::slack(&notice("a2"))["text"]
    );
}

#[tokio::test]
async fn an_approval_is_notified_once_however_often_it_is_seen() {
    let mut r = receiver(&[]).await;
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(&r.url, WebhookFormat::Cloudevents, metrics.clone(), fast())
        .expect("a notifier");
    assert!(n.notify(notice("a1")));
    for _ in 0..10 {
        assert!(!n.notify(notice("a1")), "a storm of reconciles sends once");
    }
    let mut other_task = notice("a1");
    other_task.task_run = "task-1002".into();
    assert!(
        n.notify(other_task),
        "the same id of another TaskRun is another call"
    );
    assert!(n.clone().notify(notice("a2")));
    let mut ids = Vec::new();
    for _ in 0..3 {
        let got = r.next().await.body;
        let task = got["data"]["taskRun"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ids.push(format!("{task}#{}", got["id"].as_str().unwrap_or_default()));
    }
    assert_eq!(ids, ["task-1001#a1", "task-1002#a1", "task-1001#a2"]);
    until_metric(&metrics, &counted("cloudevents", "ok", 3)).await;
}

#[test]
fn the_set_of_ids_notified_is_bounded() {
    let mut seen = Seen::new(2);
    let key = |id: &str| ("ns".to_string(), "t".to_string(), id.to_string());
    assert!(seen.first(key("a")));
    assert!(seen.first(key("b")));
    assert!(!seen.first(key("a")));
    assert!(seen.first(key("c")), "a third forgets the oldest");
    assert_eq!(seen.set.len(), 2);
    assert!(seen.first(key("a")));
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_instead_of_waiting() {
    let mut r = receiver(&[Reply::Hang]).await;
    let metrics = Arc::new(Metrics::default());
    let options = Options {
        queue: 1,
        timeout: Duration::from_secs(30),
        ..fast()
    };
    let n = Notifier::with_options(&r.url, WebhookFormat::Slack, metrics.clone(), options)
        .expect("a notifier");
    assert!(n.notify(notice("a1")));
    // The delivery task holds a1 (its receiver never answers): the queue has room for one.
    r.next().await;
    assert!(n.notify(notice("a2")));
    assert!(!n.notify(notice("a3")), "the queue is full");
    until_metric(&metrics, &counted("slack", "dropped", 1)).await;
}

#[tokio::test]
async fn errors_and_logs_never_carry_the_url() {
    // Nothing listens on port 1 of loopback: a connect error.
    let url = "http://127.0.0.1:1/services/T000/B000/XXXXSECRET";
    let e = reqwest::Client::new()
        .post(url)
        .send()
        .await
        .expect_err("nothing listens");
    let text = describe(e);
    assert!(!text.contains("SECRET"), "{text}");
    assert!(!text.is_empty());
    for bad in [
        "ftp://h/XXXXSECRET",
        "hooks.slack.com/XXXXSECRET",
        "not a url XXXXSECRET",
        "mailto:a@XXXXSECRET",
    ] {
        let error = check_url(bad).expect_err(bad);
        assert!(!error.contains("SECRET"), "{error}");
        assert!(error.contains("--approval-webhook-url"), "{error}");
    }
    check_url("https://hooks.slack.com/services/T/B/X").expect("a webhook URL");
    let n = Notifier::start(url, WebhookFormat::Slack, Arc::new(Metrics::default()))
        .expect("a notifier");
    assert!(!format!("{n:?}").contains("SECRET"));
}

#[tokio::test]
async fn a_connect_error_is_tried_three_times_and_counted() {
    let metrics = Arc::new(Metrics::default());
    let n = Notifier::with_options(
        "http://127.0.0.1:1/hook",
        WebhookFormat::Cloudevents,
        metrics.clone(),
        fast(),
    )
    .expect("a notifier");
    n.notify(notice("a1"));
    until_metric(&metrics, &counted("cloudevents", "error", 3)).await;
}
