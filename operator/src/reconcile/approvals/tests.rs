//! The merge of requests and decisions into `status.approvals`, the verdicts and the Events.

use super::*;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A digest standing for the call `id` shows (`call`): not a real one, the merge only
/// compares them.
fn digest(id: &str, call: &str) -> String {
    orchestrator_crds::policy::sha256_jcs(&(id, call))
}

fn request(id: &str) -> ApprovalRequest {
    let params = r#"{"name":"write_file","arguments":{"path":"/w/a"}}"#;
    ApprovalRequest {
        id: id.into(),
        server: "fs".into(),
        tool: "write_file".into(),
        digest: digest(id, "a"),
        definition: format!("sha256:{}", "1".repeat(64)),
        context_version: 1,
        params: params.into(),
        params_bytes: params.len() as u32,
        masked: vec![],
        mask_nonce: "a1b2c3".into(),
        withheld: None,
        requested_at: "2026-01-01T00:00:00Z".into(),
        expires_at: "2026-01-01T00:05:00Z".into(),
    }
}

/// A decision naming the call `request(id)` shows.
fn decided(id: &str, decision: Decision, when: &str) -> DecisionFacts {
    DecisionFacts {
        task_run: "t".into(),
        id: id.into(),
        digest: digest(id, "a"),
        decision,
        decided_by: "alice".into(),
        reason: Some("ok".into()),
        decided_at: Some(at(when)),
    }
}

#[test]
fn a_request_is_pending_then_approved_by_the_first_decision() {
    let requests = [request("a1")];
    let (pending, t) = merge(&[], Some(&requests), |_| None, at("2026-01-01T00:01:00Z"));
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].state, ApprovalState::Pending);
    assert_eq!(t.len(), 1);
    // Unchanged inputs: no transition.
    let (same, t) = merge(
        &pending,
        Some(&requests),
        |_| None,
        at("2026-01-01T00:02:00Z"),
    );
    assert_eq!((same.as_slice(), t.len()), (pending.as_slice(), 0));
    let (approved, t) = merge(
        &pending,
        Some(&requests),
        |id| Some(decided(id, Decision::Approve, "2026-01-01T00:03:00Z")),
        at("2026-01-01T00:03:01Z"),
    );
    assert_eq!(approved[0].state, ApprovalState::Approved);
    assert_eq!(approved[0].decided_by.as_deref(), Some("alice"));
    assert_eq!(t.len(), 1);
    assert_eq!(verdicts(&approved).len(), 1);
    assert_eq!(verdicts(&approved)[0].decision, Decision::Approve);
    assert_eq!(verdicts(&approved)[0].digest, requests[0].digest);
    // Pending, it shows every byte; decided, only the digest is kept.
    assert_eq!(
        pending[0].params.as_deref(),
        Some(requests[0].params.as_str())
    );
    assert_eq!(approved[0].params, None);
    assert_eq!(approved[0].digest, requests[0].digest);
}

#[test]
fn a_decision_naming_another_digest_rejects_and_passes_no_approval() {
    let requests = [request("a1")];
    let (pending, _) = merge(&[], Some(&requests), |_| None, at("2026-01-01T00:01:00Z"));
    // alice approved `a1` as she saw it elsewhere: another call under the same id.
    let other = DecisionFacts {
        digest: digest("a1", "b"),
        ..decided("a1", Decision::Approve, "2026-01-01T00:03:00Z")
    };
    let (after, t) = merge(
        &pending,
        Some(&requests),
        |_| Some(other.clone()),
        at("2026-01-01T00:03:01Z"),
    );
    assert_eq!(after[0].state, ApprovalState::Rejected);
    let reason = after[0].reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("ToolApproval t-a1 names sha256:") && reason.contains("not this call"),
        "{reason}"
    );
    assert_eq!(t.len(), 1);
    assert!(matches!(&t[0].cause, Cause::DigestMismatch { named, .. } if *named == other.digest));
    let (kind, event, _) = describe(&t[0], "t");
    assert_eq!(
        (kind, event),
        (EventType::Warning, "ApprovalDigestMismatch")
    );
    // The proxy hears a rejection of the held call, never an approval.
    let v = verdicts(&after);
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].decision, &v[0].digest),
        (Decision::Reject, &requests[0].digest)
    );
    // An entry from before digests (none) is never approved either.
    let mut undigested = pending.clone();
    undigested[0].digest = String::new();
    let (after, _) = merge(
        &undigested,
        None,
        |id| Some(decided(id, Decision::Approve, "2026-01-01T00:03:00Z")),
        at("2026-01-01T00:03:01Z"),
    );
    assert_eq!(after[0].state, ApprovalState::Rejected);
    assert!(
        verdicts(&after)
            .iter()
            .all(|v| v.decision == Decision::Reject)
    );
}

#[test]
fn a_request_republished_under_its_id_with_another_digest_withdraws_it() {
    let (pending, _) = merge(
        &[],
        Some(&[request("a1"), request("a2")]),
        |_| None,
        at("2026-01-01T00:01:00Z"),
    );
    // The Lease now shows another call under `a1`.
    let swapped = ApprovalRequest {
        digest: digest("a1", "b"),
        params: r#"{"name":"write_file","arguments":{"path":"/w/benign"}}"#.into(),
        ..request("a1")
    };
    let requests = [swapped.clone(), request("a2")];
    let (after, t) = merge(
        &pending,
        Some(&requests),
        |_| None,
        at("2026-01-01T00:02:00Z"),
    );
    let a1 = after.iter().find(|a| a.id == "a1").cloned();
    let a1 = a1.unwrap_or_else(|| panic!("a1 listed: {after:?}"));
    assert_eq!(a1.state, ApprovalState::Withdrawn);
    assert_eq!(
        a1.digest,
        request("a1").digest,
        "the first digest, not the new one"
    );
    assert_eq!(a1.params, None, "neither view is shown");
    assert_eq!(t.len(), 1);
    let (kind, event, _) = describe(&t[0], "t");
    assert_eq!((kind, event), (EventType::Warning, "ApprovalConflict"));
    // A decision on `a1` now changes nothing and passes no verdict.
    let (later, t) = merge(
        &after,
        Some(&requests),
        |id| {
            (id == "a1").then(|| DecisionFacts {
                digest: swapped.digest.clone(),
                ..decided(id, Decision::Approve, "2026-01-01T00:03:00Z")
            })
        },
        at("2026-01-01T00:03:00Z"),
    );
    assert_eq!(
        later.iter().find(|a| a.id == "a1").map(|a| a.state),
        Some(ApprovalState::Withdrawn)
    );
    assert!(!verdicts(&later).iter().any(|v| v.id == "a1"));
    assert_eq!(t.iter().filter(|t| t.approval.id == "a1").count(), 0);
    // `a2`, listed unchanged, stays pending.
    assert_eq!(
        later.iter().find(|a| a.id == "a2").map(|a| a.state),
        Some(ApprovalState::Pending)
    );
}

#[test]
fn the_pending_event_tells_the_digest_and_where_to_see_the_call_not_its_params() {
    let mut r = request("a1");
    r.params = format!(
        r#"{{"name":"write_file","arguments":{{"content":"{}"}}}}"#,
        "x".repeat(4000)
    );
    r.masked = vec![orchestrator_crds::approval::MaskedSecret {
        secret: "deploy".into(),
        key: "passphrase".into(),
        count: 2,
    }];
    let (_, t) = merge(
        &[],
        Some(&[r.clone()]),
        |_| None,
        at("2026-01-01T00:01:00Z"),
    );
    let (_, event, note) = describe(&t[0], "t");
    assert_eq!(event, "ApprovalRequested");
    assert!(
        note.contains(orchestrator_crds::policy::short_pin(&r.digest)),
        "{note}"
    );
    assert!(note.contains("task approvals t --show a1"), "{note}");
    assert!(note.contains("1 Secret value(s) masked"), "{note}");
    assert!(
        !note.contains("xxxx") && note.len() <= MAX_NOTE_BYTES,
        "{note}"
    );
}

#[test]
fn past_its_expiry_a_request_expires_and_a_late_decision_does_not_count() {
    let requests = [request("a1")];
    let (pending, _) = merge(&[], Some(&requests), |_| None, at("2026-01-01T00:01:00Z"));
    let (expired, t) = merge(
        &pending,
        Some(&requests),
        |id| Some(decided(id, Decision::Approve, "2026-01-01T00:06:00Z")),
        at("2026-01-01T00:06:00Z"),
    );
    assert_eq!(expired[0].state, ApprovalState::Expired);
    assert_eq!(t.len(), 1);
    assert!(verdicts(&expired).is_empty());
    assert_eq!(next_expiry(&expired, at("2026-01-01T00:06:00Z")), None);
    assert_eq!(
        next_expiry(&pending, at("2026-01-01T00:01:00Z")),
        Some(Duration::from_secs(241))
    );
}

#[test]
fn a_request_the_proxy_drops_is_withdrawn_or_expired_near_its_expiry() {
    let (pending, _) = merge(
        &[],
        Some(&[request("a1")]),
        |_| None,
        at("2026-01-01T00:01:00Z"),
    );
    let (gone, _) = merge(&pending, Some(&[]), |_| None, at("2026-01-01T00:02:00Z"));
    assert_eq!(gone[0].state, ApprovalState::Withdrawn);
    let (late, _) = merge(&pending, Some(&[]), |_| None, at("2026-01-01T00:04:59Z"));
    assert_eq!(late[0].state, ApprovalState::Expired);
    // A Lease that never published requests withdraws nothing.
    let (kept, t) = merge(&pending, None, |_| None, at("2026-01-01T00:02:00Z"));
    assert_eq!((kept[0].state, t.len()), (ApprovalState::Pending, 0));
}

#[test]
fn a_request_decided_after_twenty_others_keeps_its_verdict() {
    let mut requests: Vec<_> = (0..21).map(|i| request(&format!("r{i:02}"))).collect();
    let (mut approvals, _) = merge(&[], Some(&requests), |_| None, at("2026-01-01T00:01:00Z"));
    // r01..r20 are rejected and leave the proxy; r00 still waits.
    (approvals, _) = merge(
        &approvals,
        Some(&requests),
        |id| (id != "r00").then(|| decided(id, Decision::Reject, "2026-01-01T00:02:00Z")),
        at("2026-01-01T00:02:00Z"),
    );
    requests.truncate(1);
    let (approvals, _) = merge(
        &approvals,
        Some(&requests),
        |_| None,
        at("2026-01-01T00:02:30Z"),
    );
    let (approvals, t) = merge(
        &approvals,
        Some(&requests),
        |id| (id == "r00").then(|| decided(id, Decision::Approve, "2026-01-01T00:03:00Z")),
        at("2026-01-01T00:03:00Z"),
    );
    assert_eq!(t.len(), 1);
    // The oldest decided (r01) went; r00, decided last, stays with its verdict.
    assert_eq!(approvals.len(), MAX_DECIDED);
    assert!(!approvals.iter().any(|a| a.id == "r01"));
    assert_eq!(
        approvals.last().map(|a| a.id.as_str()),
        Some("r00"),
        "decided last, listed last"
    );
    assert!(
        verdicts(&approvals)
            .iter()
            .any(|v| v.id == "r00" && v.decision == Decision::Approve)
    );
    // Decided entries the proxy still holds are never dropped, even past the bound.
    let all_held: Vec<_> = (0..25).map(|i| request(&format!("h{i:02}"))).collect();
    let (held, _) = merge(&[], Some(&all_held), |_| None, at("2026-01-01T00:01:00Z"));
    let (held, _) = merge(
        &held,
        Some(&all_held),
        |id| Some(decided(id, Decision::Approve, "2026-01-01T00:02:00Z")),
        at("2026-01-01T00:02:00Z"),
    );
    assert_eq!(held.len(), 25);
    assert_eq!(verdicts(&held).len(), 25);
}

#[test]
fn decided_approvals_are_bounded_and_pending_ones_kept() {
    let requests: Vec<_> = (0..30).map(|i| request(&format!("r{i}"))).collect();
    let (pending, _) = merge(&[], Some(&requests), |_| None, at("2026-01-01T00:01:00Z"));
    let (decided, _) = merge(
        &pending,
        Some(&requests[..5]),
        |id| (id >= "r2").then(|| decided(id, Decision::Reject, "2026-01-01T00:02:00Z")),
        at("2026-01-01T00:02:00Z"),
    );
    let pending_left = decided
        .iter()
        .filter(|a| a.state == ApprovalState::Pending)
        .count();
    let done = decided.len() - pending_left;
    assert_eq!(done, MAX_DECIDED);
    assert_eq!(pending_left, 2, "r0 and r1 are still held");
}

#[test]
fn a_request_of_a_shared_replica_that_died_stays_pending_while_listed_until_it_expires() {
    // Shared mode: each entry names its holder; the operator reads the request alone (the
    // `holder` key is not part of ApprovalRequest and is ignored).
    let listed: Vec<ApprovalRequest> =
        serde_json::from_value(serde_json::json!([serde_json::to_value(request("a1"))
            .map(|mut v| {
                v["holder"] = "shared-proxy-7f9c-x2k4p".into();
                v
            })
            .unwrap_or_default()]))
        .unwrap_or_default();
    assert_eq!(listed, [request("a1")]);
    let (pending, _) = merge(&[], Some(&listed), |_| None, at("2026-01-01T00:01:00Z"));
    // Its holder is gone, the entry stays on the Lease (the other replicas write only their
    // own): still pending, a person can still decide, and another replica adopt it.
    let (still, t) = merge(
        &pending,
        Some(&listed),
        |_| None,
        at("2026-01-01T00:04:00Z"),
    );
    assert_eq!((still[0].state, t.len()), (ApprovalState::Pending, 0));
    // Adopted (the same id and digest, another holder): the same approval, no conflict.
    let (adopted, t) = merge(
        &still,
        Some(&[request("a1")]),
        |_| None,
        at("2026-01-01T00:04:30Z"),
    );
    assert_eq!((adopted[0].state, t.len()), (ApprovalState::Pending, 0));
    let (expired, _) = merge(
        &adopted,
        Some(&listed),
        |_| None,
        at("2026-01-01T00:05:00Z"),
    );
    assert_eq!(expired[0].state, ApprovalState::Expired);
}

#[test]
fn an_approval_of_a_call_whose_params_were_withheld_rejects_it_and_says_nothing_more() {
    // Its params could not be shown masked: nobody saw what it sends.
    let withheld = ApprovalRequest {
        params: String::new(),
        params_bytes: 40_000,
        masked: vec![orchestrator_crds::approval::MaskedSecret {
            secret: "deploy".into(),
            key: "pin".into(),
            count: 3000,
        }],
        withheld: Some(orchestrator_crds::approval::ViewWithheld::TooLarge),
        ..request("w1")
    };
    let requests = [withheld.clone()];
    let (pending, _) = merge(&[], Some(&requests), |_| None, at("2026-01-01T00:01:00Z"));
    assert_eq!(pending[0].params, None, "nothing to show");
    assert_eq!(pending[0].withheld, withheld.withheld);
    let (after, t) = merge(
        &pending,
        Some(&requests),
        |id| Some(decided(id, Decision::Approve, "2026-01-01T00:03:00Z")),
        at("2026-01-01T00:03:01Z"),
    );
    assert_eq!(after[0].state, ApprovalState::Rejected);
    // Only the person's own reason: the agent hears what any rejection says.
    assert_eq!(after[0].reason.as_deref(), Some("ok"));
    assert!(matches!(&t[0].cause, Cause::ApprovedUnseen { object } if object == "t-w1"));
    let (kind, event, note) = describe(&t[0], "t");
    assert_eq!((kind, event), (EventType::Warning, "ApprovalOfUnseenCall"));
    assert!(note.contains("could not be shown"), "{note}");
    let v = verdicts(&after);
    assert_eq!(
        (v[0].decision, v[0].reason.as_deref(), &v[0].digest),
        (Decision::Reject, Some("ok"), &withheld.digest)
    );
}

#[test]
fn the_params_length_listed_is_that_of_the_params_shown() {
    // A proxy that says more than it shows (an unmasked length) is not repeated.
    let said = ApprovalRequest {
        params_bytes: 9999,
        ..request("b1")
    };
    let (pending, _) = merge(
        &[],
        Some(std::slice::from_ref(&said)),
        |_| None,
        at("2026-01-01T00:01:00Z"),
    );
    assert_eq!(pending[0].params_bytes as usize, said.params.len());
}
