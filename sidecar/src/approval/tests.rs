use std::collections::HashSet;

use orchestrator_crds::approval::{Decision, MASK_NONCE_LEN, MaskedSecret};
use serde_json::json;

use super::mask::tests::{PASSPHRASE, mask_dir};
use super::*;

const DEFINITION: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn approvals() -> Approvals {
    let approvals = Approvals::new(Arc::new(Metrics::new()));
    // As `api::start` does when a Lease is named.
    drop(approvals.reporter("team-a", "held"));
    approvals
}

fn published(approvals: &Approvals) -> Vec<ApprovalRequest> {
    let text = approvals.published.borrow().clone();
    serde_json::from_str(&text).expect("the annotation is a JSON array of requests")
}

/// The params of a call of everything's echo.
fn echo(message: &str) -> Value {
    json!({"name": "echo", "arguments": {"message": message}})
}

fn call(params: &Value) -> HoldCall<'_> {
    HoldCall {
        server: "everything",
        tool: "echo",
        definition: DEFINITION,
        context_version: 3,
        params,
    }
}

fn hold<'a>(approvals: &'a Approvals, params: &Value) -> Held<'a> {
    approvals.hold(call(params), WAIT).expect("held")
}

/// A verdict on the request, naming its digest.
fn verdict(request: &ApprovalRequest, decision: &str, by: &str) -> Value {
    verdict_naming(&request.id, &request.digest, decision, by)
}

fn verdict_naming(id: &str, digest: &str, decision: &str, by: &str) -> Value {
    json!({"id": id, "decision": decision, "decidedBy": by, "reason": "because", "digest": digest})
}

fn approved(outcome: Outcome) -> Verdict {
    match outcome {
        Outcome::Verdict(verdict) => verdict,
        other => panic!("not a verdict: {other:?}"),
    }
}

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_held_call_is_published_with_its_params_and_digest_and_withdrawn_when_dropped() {
    let approvals = approvals();
    let params = json!({"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234i64}, "_meta": {"vendor/key": 1}});
    let held = hold(&approvals, &params);
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
        ("everything", "echo")
    );
    assert_eq!(
        (request.definition.as_str(), request.context_version),
        (DEFINITION, 3)
    );
    // Every byte, as compact JSON.
    let text = serde_json::to_string(&params).expect("JSON");
    assert_eq!(request.params, text);
    assert_eq!(request.params_bytes as usize, text.len());
    assert!(request.masked.is_empty());
    assert_eq!(request.mask_nonce.len(), MASK_NONCE_LEN);
    assert!(
        request
            .mask_nonce
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    let digest = CallDigest {
        v: CALL_DIGEST_VERSION,
        namespace: "team-a",
        task_run: "held",
        id: &request.id,
        server: "everything",
        definition: DEFINITION,
        context_version: 3,
        params: &params,
    }
    .digest();
    assert_eq!(request.digest, digest);
    assert_eq!(
        approvals.digest_of(&request.id, &call(&params)),
        Some(digest.clone())
    );
    assert_ne!(
        approvals.digest_of(&request.id, &call(&echo("A: hello"))),
        Some(digest)
    );
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
fn the_digest_is_the_fixed_vector_for_its_call() {
    let place = Place {
        namespace: "team-a".into(),
        task: "held".into(),
    };
    let params =
        json!({"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234i64}});
    assert_eq!(
        digest(&place, "0a1b2c3d", &call(&params), None),
        "sha256:e1afe37203b00ff1c6bc666d39c20ba74fdf32752e80297c55f90aad034133a3"
    );
    // Salted (as when something is masked): the salt is one more member.
    let salt = Salt("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff".into());
    assert_eq!(
        digest(&place, "0a1b2c3d", &call(&params), Some(&salt)),
        "sha256:3d6929cb14acadf7dc8b78dd0ee58b95ca26245dcf324984855efb0af01b72d4"
    );
    assert_eq!(format!("{salt:?}"), "Salt(..)", "never printed");
}

#[test]
fn without_a_reporter_nothing_is_held() {
    let approvals = Approvals::new(Arc::new(Metrics::new()));
    assert!(!approvals.is_visible());
    assert_eq!(
        approvals.hold(call(&echo("hi")), WAIT).err(),
        Some(NotHeld::Unavailable)
    );
    assert_eq!(approvals.digest_of("0a1b2c3d", &call(&echo("hi"))), None);
    assert_eq!(approvals.pending(), 0);
}

#[test]
fn at_most_max_pending_calls_wait_at_once() {
    let approvals = approvals();
    let params = echo("rm");
    let mut held: Vec<_> = (0..MAX_PENDING)
        .map(|_| hold(&approvals, &params))
        .collect();
    assert_eq!(
        approvals.hold(call(&params), WAIT).err(),
        Some(NotHeld::Busy)
    );
    let ids: HashSet<_> = held.iter().map(|h| h.id().to_string()).collect();
    assert_eq!(ids.len(), MAX_PENDING, "ids are unique");
    let digests: HashSet<_> = held.iter().map(|h| h.request.digest.clone()).collect();
    assert_eq!(
        digests.len(),
        MAX_PENDING,
        "the same call held twice has two digests"
    );
    held.pop();
    assert!(approvals.hold(call(&params), WAIT).is_ok());
}

#[tokio::test]
async fn a_verdict_decides_its_pending_call_once_and_others_are_ignored() {
    let approvals = approvals();
    let params = echo("rm");
    let mut first = hold(&approvals, &params);
    let mut second = hold(&approvals, &params);
    let doc = json!([
        verdict_naming("00000000", &first.request.digest, "approve", "nobody"),
        {"id": first.id(), "decision": "maybe", "decidedBy": "x", "digest": first.request.digest},
        "not a verdict",
        verdict(&first.request, "approve", "alice"),
        verdict(&first.request, "reject", "mallory"),
    ]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    let decided = approved(first.decided().await);
    assert_eq!(
        (decided.decision, decided.decided_by.as_str()),
        (Decision::Approve, "alice")
    );
    assert_eq!(published(&approvals), std::slice::from_ref(&second.request));

    // The same document again (a re-list), then one that also decides the second call.
    approvals.verdicts("cm", doc.to_string().as_bytes());
    assert_eq!(approvals.pending(), 1);
    let mut doc = doc.as_array().cloned().unwrap_or_default();
    doc.push(verdict(&second.request, "reject", "bob"));
    approvals.verdicts("file", json!(doc).to_string().as_bytes());
    let decided = approved(second.decided().await);
    assert_eq!(decided.decision, Decision::Reject);
    assert_eq!(decided.reason.as_deref(), Some("because"));
    assert_eq!(&*approvals.published.borrow().clone(), "[]");

    // Not JSON, or not an array: nothing happens.
    let third = hold(&approvals, &params);
    approvals.verdicts("cm", b"{\"id\": 1}");
    approvals.verdicts("cm", b"[not json");
    assert_eq!(published(&approvals), std::slice::from_ref(&third.request));
}

#[tokio::test]
async fn a_verdict_naming_another_digest_does_not_decide_the_call_with_that_id() {
    let approvals = approvals();
    // B is held as X; A is the call a person was shown under the same id (a forged request).
    let b = echo("B: rm -rf /");
    let mut held = hold(&approvals, &b);
    let x = held.id().to_string();
    let a = echo("A: hello");
    let a_digest = approvals.digest_of(&x, &call(&a)).expect("a digest");
    assert_ne!(a_digest, held.request.digest);
    let doc = json!([verdict_naming(&x, &a_digest, "approve", "alice")]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    assert_eq!(
        held.decided().await,
        Outcome::Mismatch {
            named: a_digest.clone()
        }
    );
    // Taken out: not pending, nothing on the Lease.
    assert_eq!(approvals.pending(), 0);
    assert_eq!(&*approvals.published.borrow().clone(), "[]");
    // Once: a later verdict naming B's own digest finds nothing, and the id is not issued again.
    let doc = json!([
        verdict_naming(&x, &a_digest, "approve", "alice"),
        verdict(&held.request, "approve", "alice")
    ]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    assert_eq!(approvals.pending(), 0);
    drop(held);
    let again: Vec<_> = (0..MAX_PENDING).map(|_| hold(&approvals, &b)).collect();
    assert!(again.iter().all(|h| h.id() != x));
    // A verdict without a digest (an operator older than digests) decides nothing either.
    drop(again);
    let mut other = hold(&approvals, &b);
    let doc = json!([{"id": other.id(), "decision": "approve", "decidedBy": "alice"}]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    assert_eq!(
        other.decided().await,
        Outcome::Mismatch {
            named: String::new()
        }
    );
}

#[test]
fn a_secret_value_is_masked_everywhere_and_the_rest_shown_whole() {
    let dir = mask_dir(&[("deploy", "passphrase", PASSPHRASE)]);
    let approvals = approvals();
    approvals.mask_secrets_from(dir.path().to_path_buf());
    let message = format!("{PASSPHRASE}{}", " and more".repeat(340));
    assert!(message.len() >= 3000);
    // Not a Secret of the task, though shaped like a credential: shown as is.
    let token = "ghp_0123456789abcdefghijklmnopqrstuvwxyz";
    let params = json!({
        "name": "echo",
        "arguments": {
            "message": message,
            "nested": [1, ["x", {"deep": format!("say {PASSPHRASE}!")}]],
            "config": format!("{{\"pass\":\"{PASSPHRASE}\"}}"),
            PASSPHRASE: "as a key",
            "token": token
        }
    });
    let held = hold(&approvals, &params);
    let request = &published(&approvals)[0];
    let placeholder = format!("<secret:deploy/passphrase:{}>", request.mask_nonce);
    let text = serde_json::to_string(&params).expect("JSON");
    // Byte for byte what is forwarded, except exactly the masked spans.
    assert_eq!(request.params, text.replace(PASSPHRASE, &placeholder));
    assert!(request.params.contains(token) && request.params.len() > 3000);
    assert!(!approvals.published.borrow().contains(PASSPHRASE));
    assert_eq!(
        request.masked,
        vec![MaskedSecret {
            secret: "deploy".into(),
            key: "passphrase".into(),
            count: 4
        }]
    );
    // The length is that of what is shown; the digest covers the call as forwarded, unmasked,
    // and a salt only this process knows: nobody can test a guess of the value against it.
    assert_eq!(request.params_bytes as usize, request.params.len());
    let place = approvals.place.get().expect("a place");
    assert_ne!(
        digest(place, &request.id, &call(&params), None),
        request.digest
    );
    assert_eq!(
        approvals.digest_of(&request.id, &call(&params)).as_deref(),
        Some(request.digest.as_str())
    );
    drop(held);
    // Read at each hold: a rotated value is masked as it is now.
    std::fs::write(
        dir.path().join("deploy").join("passphrase"),
        "new sesame 0815",
    )
    .expect("rotated");
    let held = hold(&approvals, &echo("say new sesame 0815"));
    assert!(
        !held.request.params.contains("new sesame"),
        "{}",
        held.request.params
    );
}

#[test]
fn a_mask_directory_that_cannot_be_read_holds_nothing() {
    let approvals = approvals();
    approvals.mask_secrets_from("/nonexistent/mask".into());
    let refused = approvals.hold(call(&echo("hi")), WAIT).err();
    assert!(
        matches!(&refused, Some(NotHeld::MasksUnreadable(why)) if why.contains("/nonexistent/mask")),
        "{refused:?}"
    );
    assert_eq!(&*approvals.published.borrow().clone(), "[]");
}

#[test]
fn arguments_too_large_to_show_are_not_held() {
    let approvals = approvals();
    let refused = approvals
        .hold(call(&echo(&"x".repeat(13 * 1024))), WAIT)
        .err();
    let Some(NotHeld::TooLarge { bytes, limit }) = refused else {
        panic!("held: {refused:?}");
    };
    assert!(
        bytes > 13 * 1024 && limit == MAX_REQUEST_BYTES,
        "{bytes} {limit}"
    );
    assert_eq!(&*approvals.published.borrow().clone(), "[]");
    assert_eq!(approvals.pending(), 0);
    // Escaping counts: 3000 quotes take 6000 bytes in params and 12000 in the request.
    assert!(matches!(
        approvals.hold(call(&echo(&"\"".repeat(3000))), WAIT),
        Err(NotHeld::TooLarge { .. })
    ));
}

#[test]
fn a_full_set_of_requests_as_large_as_allowed_keeps_the_annotation_within_its_bound() {
    let approvals = approvals();
    // Tool names and values that grow the most when escaped.
    let tool = "\u{1}".repeat(100);
    let nasty = |n: usize| "\u{1}\"\\".repeat(n);
    let fits = |n: usize| {
        let params = json!({"name": tool, "arguments": {"message": nasty(n)}});
        let held = approvals.hold(
            HoldCall {
                tool: &tool,
                ..call(&params)
            },
            WAIT,
        );
        held.is_ok()
    };
    // The largest message that still fits (fits(lo), not fits(hi)).
    let (mut lo, mut hi) = (0, 2000);
    assert!(fits(lo) && !fits(hi));
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let largest = lo;
    let params = json!({"name": tool, "arguments": {"message": nasty(largest)}});
    let held: Vec<_> = (0..MAX_PENDING)
        .map(|_| {
            approvals
                .hold(
                    HoldCall {
                        tool: &tool,
                        ..call(&params)
                    },
                    WAIT,
                )
                .expect("held")
        })
        .collect();
    let text = approvals.published.borrow().clone();
    assert!(text.len() <= MAX_ANNOTATION_BYTES, "{} bytes", text.len());
    assert!(
        text.len() > MAX_ANNOTATION_BYTES - MAX_PENDING * 64,
        "{} bytes",
        text.len()
    );
    let requests = published(&approvals);
    assert_eq!(requests.len(), MAX_PENDING);
    assert!(
        requests
            .iter()
            .all(|r| r.tool == tool
                && r.params == serde_json::to_string(&params).unwrap_or_default())
    );
    drop(held);
}

#[test]
fn a_verdict_is_clipped_to_its_bounds() {
    let approvals = approvals();
    let mut held = hold(&approvals, &echo("rm"));
    let long = "r".repeat(5000);
    let doc = json!([{"id": held.id(), "decision": "reject", "decidedBy": long, "reason": long, "digest": held.request.digest}]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    let decided = approved(
        held.expire()
            .expect("the verdict came before the wait ran out"),
    );
    assert_eq!(decided.decided_by.chars().count(), MAX_DECIDED_BY_CHARS);
    assert_eq!(
        decided.reason.map(|r| r.chars().count()),
        Some(MAX_REASON_CHARS)
    );
}

#[test]
fn an_expired_or_cancelled_request_is_withdrawn_and_a_late_verdict_ignored() {
    let approvals = approvals();
    let params = echo("rm");
    let mut expired = hold(&approvals, &params);
    let cancelled = hold(&approvals, &params);
    let kept = hold(&approvals, &params);
    assert_eq!(expired.expire(), None);
    let (expired_request, cancelled_request) = (expired.request.clone(), cancelled.request.clone());
    // A client's cancellation and shutdown drop the held call.
    drop(cancelled);
    assert_eq!(published(&approvals), std::slice::from_ref(&kept.request));
    let doc = json!([
        verdict(&expired_request, "approve", "alice"),
        verdict(&cancelled_request, "approve", "alice")
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
        .hold(call(&echo("rm")), Duration::from_millis(200))
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
fn ids_are_not_issued_twice() {
    let approvals = approvals();
    let params = echo("rm");
    let mut seen = HashSet::new();
    for _ in 0..REMEMBERED_IDS {
        let held = hold(&approvals, &params);
        assert!(
            seen.insert(held.id().to_string()),
            "{} issued twice",
            held.id()
        );
    }
}

/// The message of a call padded to `bytes` of params: `guess` repeated `times`, then spaces.
fn padded(guess: &str, times: usize, bytes: usize) -> Value {
    let head = guess.repeat(times);
    let plain = serde_json::to_string(&echo(&head))
        .unwrap_or_default()
        .len();
    echo(&format!(
        "{head}{}",
        " ".repeat(bytes.saturating_sub(plain))
    ))
}

#[test]
fn whether_a_padded_call_is_held_and_what_its_refusal_says_do_not_depend_on_a_guess_matching_a_secret()
 {
    // A 4-byte Secret value, whose placeholder takes 34 bytes: each match grows the view by 30.
    let dir = mask_dir(&[("deploy", "pin", "4711")]);
    let approvals = approvals();
    approvals.mask_secrets_from(dir.path().to_path_buf());
    let size = |guess: &str, bytes: usize| {
        let held = approvals.hold(call(&padded(guess, 200, bytes)), WAIT);
        held.map(|h| (h.request.withheld, h.request.params_bytes))
    };
    // Find the largest padded call that is held with a wrong guess.
    let (mut lo, mut hi) = (1000, 4 * MAX_REQUEST_BYTES);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if size("0000", mid).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    for bytes in [lo - 500, lo, hi, hi + 500] {
        let wrong = size("0000", bytes);
        let right = size("4711", bytes);
        // Held both, or refused both with the very same words and numbers.
        match (&wrong, &right) {
            (Ok((None, _)), Ok(_)) => {}
            (Err(w), Err(r)) => assert_eq!(w, r, "at {bytes} bytes"),
            _ => panic!(
                "at {bytes} bytes: {wrong:?} with a wrong guess, {right:?} with the right one"
            ),
        }
    }
    // Right at the edge the right guess's view (200 placeholders) no longer fits: it is held,
    // its params withheld, never refused.
    let held = hold(&approvals, &padded("4711", 200, lo));
    assert_eq!(held.request.withheld, Some(ViewWithheld::TooLarge));
    assert!(held.request.params_bytes as usize > MAX_REQUEST_BYTES);
    let [withheld] = published(&approvals).try_into().expect("one request");
    assert!(withheld.params.is_empty());
    assert_eq!(withheld.masked[0].count, 200);
    assert!(!approvals.published.borrow().contains("4711"));
}

#[tokio::test]
async fn a_call_whose_view_is_withheld_is_held_and_can_only_be_rejected() {
    let dir = mask_dir(&[("s", "k", "x\"yz")]);
    let approvals = approvals();
    approvals.mask_secrets_from(dir.path().to_path_buf());
    // Two keys that read the same once the value is masked: the view would be ambiguous.
    let params = json!({"name": "echo", "arguments": {"a x\"yz": 1, "a x\\\"yz": 2}});
    let mut held = hold(&approvals, &params);
    assert_eq!(held.request.withheld, Some(ViewWithheld::Ambiguous));
    assert!(held.request.params.is_empty());
    let place = approvals.place.get().expect("a place");
    let unsalted = digest(place, held.id(), &call(&params), None);
    assert_ne!(unsalted, held.request.digest, "salted");
    let doc = json!([verdict(&held.request, "approve", "alice")]);
    approvals.verdicts("cm", doc.to_string().as_bytes());
    let decided = approved(held.decided().await);
    assert_eq!(
        (
            decided.decision,
            decided.decided_by.as_str(),
            decided.reason.as_deref()
        ),
        (Decision::Reject, "alice", Some("because"))
    );
}
