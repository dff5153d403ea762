//! `task approvals` and `task approve|reject`: what a person is shown of a held call (all of it,
//! nothing a terminal would hide), and the decision written against a scripted API server: it
//! names the digest of the entry read, and nothing is created when the request no longer names
//! the call the person looked at.

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use orchestrator_crds::approval::{Approval, ApprovalState, Decision, MaskedSecret};
use serde_json::{Value, json};
use tower_test::mock;

use super::approve::{decide_on, show, table, visible};
use crate::args::DecideArgs;
use crate::connect::Cluster;
use crate::error::Error;

const PARAMS: &str =
    r#"{"arguments":{"content":"hello","path":"/workspace/a"},"name":"write_file"}"#;

/// The digest of [`PARAMS`] held as request `a1b2c3d4` of TaskRun `held` in `ns`.
fn digest() -> String {
    let params: Value = serde_json::from_str(PARAMS).unwrap_or_default();
    orchestrator_crds::approval::CallDigest {
        v: orchestrator_crds::approval::CALL_DIGEST_VERSION,
        namespace: "ns",
        task_run: "held",
        id: "a1b2c3d4",
        server: "filesystem",
        definition: &format!("sha256:{}", "1".repeat(64)),
        context_version: 3,
        params: &params,
    }
    .digest()
}

fn pending() -> Approval {
    Approval {
        id: "a1b2c3d4".into(),
        server: "filesystem".into(),
        tool: "write_file".into(),
        digest: digest(),
        definition: format!("sha256:{}", "1".repeat(64)),
        context_version: 3,
        params: Some(PARAMS.into()),
        params_bytes: 74,
        masked: vec![],
        mask_nonce: "a1b2c3".into(),
        withheld: None,
        requested_at: "2026-01-01T00:00:00Z".into(),
        expires_at: "2026-01-01T00:05:00Z".into(),
        state: ApprovalState::Pending,
        decided_by: None,
        decided_at: None,
        reason: None,
    }
}

fn now() -> Timestamp {
    "2026-01-01T00:01:00Z"
        .parse()
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

#[test]
fn the_table_shows_what_a_person_decides_on() {
    let pending = pending();
    let rejected = Approval {
        id: "e5f6".into(),
        state: ApprovalState::Rejected,
        decided_by: Some("alice".into()),
        reason: Some("wrong file".into()),
        params: None,
        ..pending.clone()
    };
    let text = table(&[&pending, &rejected], now());
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("ID"), "{text}");
    assert!(
        lines[1].contains("a1b2c3d4") && lines[1].contains("Pending"),
        "{text}"
    );
    assert!(
        lines[1].contains("filesystem/write_file") && lines[1].contains("in 4m"),
        "{text}"
    );
    // A preview of the arguments, and where to see the call whole.
    assert!(
        lines[1]
            .contains(r#"{"content":"hello","path":"/workspace/a"} (74 bytes; --show a1b2c3d4)"#),
        "{text}"
    );
    assert!(
        lines[2].contains("alice: wrong file") && lines[2].contains("(74 bytes)"),
        "{text}"
    );
    assert_eq!(table(&[], now()), "No calls wait or waited for approval.\n");
}

#[test]
fn show_escapes_what_a_terminal_would_hide() {
    // A right-to-left override, a C1 CSI, a carriage return (JSON escapes it, but an entry is
    // not trusted to be JSON), a zero-width space; and a Secret value masked.
    let tricky = Approval {
        params: Some(
            "{\"arguments\":{\"path\":\"/workspace/\u{202e}txt.exe\",\"x\":\"a\u{9b}31mb\rc\u{200b}d <secret:deploy/passphrase:a1b2c3> <secret:deploy/passphrase:ffffff>\"},\"name\":\"write_file\"}".into(),
        ),
        masked: vec![MaskedSecret {
            secret: "deploy".into(),
            key: "passphrase".into(),
            count: 1,
        }],
        ..pending()
    };
    let text = show(&tricky, "ns", "held", now());
    for hidden in ['\u{202e}', '\u{9b}', '\r', '\u{200b}'] {
        assert!(!text.contains(hidden), "{hidden:?} printed raw:\n{text}");
    }
    for escaped in [r"\u{202e}", r"\u{9b}", r"\u{d}", r"\u{200b}"] {
        assert!(text.contains(escaped), "{escaped} missing:\n{text}");
    }
    // Everything else is printed as is, whole: the digest, definition, context version, the
    // params byte for byte, and the legend of the masks with this request's nonce.
    assert!(text.contains(&digest()), "{text}");
    assert!(
        text.contains(&format!("sha256:{}", "1".repeat(64))),
        "{text}"
    );
    assert!(text.contains("Context version: 3"), "{text}");
    assert!(text.contains("74 bytes as shown"), "{text}");
    assert!(text.contains("salted by the proxy"), "{text}");
    assert!(
        text.contains("<secret:deploy/passphrase:a1b2c3> = the value of key passphrase of Secret deploy, forwarded as is (1 time)"),
        "{text}"
    );
    assert!(text.contains("with nonce a1b2c3"), "{text}");
    assert_eq!(
        visible(tricky.params.as_deref().unwrap_or_default()),
        tricky
            .params
            .as_deref()
            .unwrap_or_default()
            .replace('\u{202e}', r"\u{202e}")
            .replace('\u{9b}', r"\u{9b}")
            .replace('\r', r"\u{d}")
            .replace('\u{200b}', r"\u{200b}")
    );
    assert!(text.contains("/workspace/\\u{202e}txt.exe"), "{text}");
    // The table's preview escapes too.
    let row = table(&[&tricky], now());
    assert!(
        !row.contains('\u{202e}') && row.contains(r"\u{202e}"),
        "{row}"
    );
}

/// A scripted API server: TaskRun `held` with `approvals` (Approved once a ToolApproval is
/// created), SelfSubjectReview says alice; every ToolApproval created is kept.
fn cluster(approvals: Vec<Approval>) -> (Cluster, Arc<Mutex<Vec<Value>>>) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let created = Arc::new(Mutex::new(Vec::new()));
    let kept = created.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (method, path) = (request.method().clone(), request.uri().path().to_string());
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (status, answer) = if method == Method::GET && path.ends_with("/taskruns/held") {
                let decided = !kept.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
                let approvals: Vec<Approval> = approvals
                    .iter()
                    .map(|a| Approval {
                        state: if decided {
                            ApprovalState::Approved
                        } else {
                            a.state
                        },
                        ..a.clone()
                    })
                    .collect();
                (
                    StatusCode::OK,
                    json!({"apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
                        "metadata": {"name": "held", "namespace": "ns", "uid": "u-1"},
                        "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"},
                                 "toolConfig": {"mcpServers": []}},
                        "status": {"approvals": approvals}}),
                )
            } else if method == Method::POST && path.ends_with("/selfsubjectreviews") {
                (
                    StatusCode::CREATED,
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                           "status": {"userInfo": {"username": "alice"}}}),
                )
            } else if method == Method::POST && path.ends_with("/toolapprovals") {
                kept.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(body.clone());
                (StatusCode::CREATED, body)
            } else {
                (
                    StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "code": 404, "reason": "NotFound", "message": path}),
                )
            };
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(answer.to_string().into_bytes()))
                    .expect("a response"),
            );
        }
    });
    let cluster = Cluster {
        client: Client::new(service, "ns"),
        namespace: "ns".into(),
    };
    (cluster, created)
}

fn args(digest: Option<&str>) -> DecideArgs {
    DecideArgs {
        task_name: "held".into(),
        id: "a1b2c3d4".into(),
        reason: None,
        digest: digest.map(str::to_string),
    }
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), f)
        .await
        .expect("the CLI made a request the scripted server did not answer")
}

#[tokio::test]
async fn decide_writes_the_entry_digest_and_refuses_a_stale_one() {
    // Without --digest: the decision names the digest of the entry read.
    let (c, created) = cluster(vec![pending()]);
    within(decide_on(&c, &args(None), Decision::Approve))
        .await
        .expect("approved");
    let written = created.lock().map(|c| c.clone()).unwrap_or_default();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0]["spec"]["digest"], digest());
    assert_eq!(written[0]["spec"]["id"], "a1b2c3d4");
    assert_eq!(written[0]["spec"]["decidedBy"], "alice");

    // --digest as `--show` printed it, whole or its first 12 hex digits: the same.
    let whole = digest();
    for given in [whole.as_str(), &whole[..19]] {
        let (c, created) = cluster(vec![pending()]);
        within(decide_on(&c, &args(Some(given)), Decision::Reject))
            .await
            .expect("rejected");
        let written = created.lock().map(|c| c.clone()).unwrap_or_default();
        assert_eq!(written[0]["spec"]["digest"], digest());
    }

    // The request now names another call than the one looked at: nothing is created.
    let (c, created) = cluster(vec![pending()]);
    let stale = format!("sha256:{}", "0".repeat(64));
    let err = within(decide_on(&c, &args(Some(&stale)), Decision::Approve))
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, Error::Failed(m) if m.contains("no longer names the call you saw") && m.contains(&whole[..19])),
        "{err}"
    );
    assert!(created.lock().map(|c| c.is_empty()).unwrap_or(false));

    // Too short a prefix proves nothing: a usage error.
    let (c, created) = cluster(vec![pending()]);
    let err = within(decide_on(&c, &args(Some(&whole[..11])), Decision::Approve))
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::Usage(_)), "{err}");
    assert!(created.lock().map(|c| c.is_empty()).unwrap_or(false));

    // An entry without a digest (a proxy older than digests) cannot be decided.
    let (c, created) = cluster(vec![Approval {
        digest: String::new(),
        ..pending()
    }]);
    let err = within(decide_on(&c, &args(None), Decision::Approve))
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, Error::Failed(m) if m.contains("older than digests")),
        "{err}"
    );
    assert!(created.lock().map(|c| c.is_empty()).unwrap_or(false));
}

#[tokio::test]
async fn approve_recomputes_the_digest_from_the_params_shown_and_refuses_another_call() {
    // The status shows one call (nothing masked) and names the digest of another: what would
    // be let through is not what the person read. Nothing is created, --digest or not.
    let other = format!("sha256:{}", "3f".repeat(32));
    let swapped = || Approval {
        digest: other.clone(),
        ..pending()
    };
    for given in [None, Some(other.as_str())] {
        let (c, created) = cluster(vec![swapped()]);
        let err = within(decide_on(&c, &args(given), Decision::Approve))
            .await
            .expect_err("refused");
        assert!(
            matches!(&err, Error::Failed(m) if m.contains("the params it shows hash to")
                && m.contains(&digest()[..19]) && m.contains("nothing was changed")),
            "{err}"
        );
        assert!(created.lock().map(|c| c.is_empty()).unwrap_or(false));
    }
    // --show says so too.
    let text = show(&swapped(), "ns", "held", now());
    assert!(text.contains("DOES NOT NAME THE PARAMS BELOW"), "{text}");
    assert!(show(&pending(), "ns", "held", now()).contains("recomputed from the params below"));
    // Params that are no JSON object cannot be checked: refused as well.
    let (c, created) = cluster(vec![Approval {
        params: Some("not json".into()),
        ..pending()
    }]);
    let err = within(decide_on(&c, &args(None), Decision::Approve))
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, Error::Failed(m) if m.contains("not a JSON object")),
        "{err}"
    );
    assert!(created.lock().map(|c| c.is_empty()).unwrap_or(false));
    // A rejection needs no check: it lets nothing through.
    let (c, created) = cluster(vec![swapped()]);
    within(decide_on(&c, &args(None), Decision::Reject))
        .await
        .expect("rejected");
    assert_eq!(created.lock().map(|c| c.len()).unwrap_or(0), 1);
}

#[tokio::test]
async fn a_call_whose_params_are_withheld_can_be_rejected_not_approved() {
    let withheld = || Approval {
        params: None,
        params_bytes: 40_000,
        masked: vec![MaskedSecret {
            secret: "deploy".into(),
            key: "pin".into(),
            count: 3000,
        }],
        withheld: Some(orchestrator_crds::approval::ViewWithheld::TooLarge),
        ..pending()
    };
    let (c, created) = cluster(vec![withheld()]);
    let err = within(decide_on(&c, &args(None), Decision::Approve))
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, Error::Failed(m) if m.contains("cannot be approved") && m.contains("task reject held a1b2c3d4")),
        "{err}"
    );
    assert!(created.lock().map(|c| c.is_empty()).unwrap_or(false));
    let (c, created) = cluster(vec![withheld()]);
    within(decide_on(&c, &args(None), Decision::Reject))
        .await
        .expect("rejected");
    assert_eq!(created.lock().map(|c| c.len()).unwrap_or(0), 1);
    let text = show(&withheld(), "ns", "held", now());
    assert!(
        text.contains("Params: not shown:") && text.contains("cannot be approved"),
        "{text}"
    );
}

/// TaskRun `held` with `status`, as `task describe` reads it.
fn with_status(status: Value) -> orchestrator_crds::taskrun::TaskRun {
    serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "held", "namespace": "team-a", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"},
                 "toolConfig": {"mcpServers": []}},
        "status": status,
    }))
    .expect("a TaskRun")
}

#[test]
fn describe_shows_a_pending_call_whole_and_a_decided_one_in_the_table() {
    let params = r#"{"arguments":{"message":"approve me: <secret:deploy/passphrase:0a1b2c>"},"name":"echo"}"#;
    let tr = with_status(json!({"phase": "Running", "approvals": [
            {"id": "a1b2c3d4", "server": "everything", "tool": "echo",
             "digest": format!("sha256:{}", "e".repeat(64)),
             "definition": format!("sha256:{}", "1".repeat(64)), "contextVersion": 1,
             "params": params, "paramsBytes": 62, "maskNonce": "0a1b2c",
             "masked": [{"secret": "deploy", "key": "passphrase", "count": 1}],
             "requestedAt": "2025-01-01T00:04:00Z", "expiresAt": "2025-01-01T00:09:00Z",
             "state": "Pending"},
            {"id": "e5f6a7b8", "server": "everything", "tool": "echo",
             "digest": format!("sha256:{}", "f".repeat(64)), "paramsBytes": 40,
             "requestedAt": "2025-01-01T00:01:00Z", "expiresAt": "2025-01-01T00:06:00Z",
             "state": "Rejected", "decidedBy": "alice", "reason": "no"}]}));
    let now: Timestamp = "2025-01-01T00:05:00Z".parse().expect("valid");
    let text = super::show::describe_text(&tr, None, &[], now);
    assert!(text.contains("Approvals:"), "{text}");
    assert!(text.contains("Request a1b2c3d4: Pending"), "{text}");
    assert!(text.contains(params), "{text}");
    assert!(
        text.contains(&format!("sha256:{}", "e".repeat(64))),
        "{text}"
    );
    assert!(
        text.contains("<secret:deploy/passphrase:0a1b2c> = the value of key passphrase"),
        "{text}"
    );
    // The decided one is a row of the table only.
    assert!(
        text.contains("alice: no") && !text.contains("Request e5f6a7b8"),
        "{text}"
    );
}
