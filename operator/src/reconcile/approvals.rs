//! `status.approvals` and the verdicts the proxy waits for (see `orchestrator_crds::approval`).
//!
//! The proxy lists the calls it holds on its Lease ([`REQUESTS_ANNOTATION`], kept in
//! `served::LeaseFacts`); people decide with ToolApproval objects named `<taskRun>-<id>` (kept as
//! [`DecisionFacts`]). Each reconcile of a running task merges the two into the status: a new
//! request becomes `Pending`; a pending one with a decision made before it expired becomes
//! `Approved` or `Rejected`; one past its expiry `Expired`; one the proxy stopped holding
//! without either (its client cancelled, the proxy restarted, or the task finished) `Withdrawn`.
//! This happens while the TaskRun is blocked too (`refuse.rs`: its proxy keeps serving the last
//! good config, and holding calls), and once more when a finished task still lists a pending
//! one (`finished.rs`). The decided ones go to the proxy in the ConfigMap key [`VERDICTS_KEY`].
//! Both writes are under their own field manager ([`APPROVALS_MANAGER`]), so the operator's other
//! writes leave them alone, and happen only when something changed. An Event tells each
//! transition.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::{
    APPROVALS_MANAGER, Approval, ApprovalRequest, ApprovalState, Decision, MAX_DECIDED,
    MAX_REASON_CHARS, ToolApproval, VERDICTS_KEY, Verdict, clip, object_name,
};
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus};
use serde_json::json;

use super::{Context, events};
use crate::error::Result;

/// A call the proxy stopped holding this close to its expiry (clocks differ a little) expired.
const EXPIRY_SLACK_SECONDS: i64 = 2;

/// What the operator keeps of a ToolApproval.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionFacts {
    pub task_run: String,
    pub id: String,
    pub decision: Decision,
    pub decided_by: String,
    pub reason: Option<String>,
    /// When the API server stored it (RFC 3339).
    pub decided_at: Option<Timestamp>,
}

/// The facts of a ToolApproval.
pub fn decision_facts(approval: &ToolApproval) -> Option<DecisionFacts> {
    Some(DecisionFacts {
        task_run: approval.spec.task_run.clone(),
        id: approval.spec.id.clone(),
        decision: approval.spec.decision,
        decided_by: approval.spec.decided_by.clone(),
        reason: approval
            .spec
            .reason
            .as_deref()
            .map(|r| clip(r, MAX_REASON_CHARS)),
        decided_at: approval.metadata.creation_timestamp.as_ref().map(|t| t.0),
    })
}

/// The new `status.approvals` from the old, the proxy's requests (`None`: never published) and
/// the decisions found for pending ids; with each approval whose state changed (an Event each),
/// in order.
pub fn merge(
    old: &[Approval],
    requests: Option<&[ApprovalRequest]>,
    decision: impl Fn(&str) -> Option<DecisionFacts>,
    now: Timestamp,
) -> (Vec<Approval>, Vec<Approval>) {
    let mut approvals: Vec<Approval> = old.to_vec();
    let mut transitions = Vec::new();
    for request in requests.unwrap_or_default() {
        if approvals.iter().any(|a| a.id == request.id) {
            continue;
        }
        let approval = Approval {
            id: request.id.clone(),
            server: request.server.clone(),
            tool: request.tool.clone(),
            arguments: request.arguments.clone(),
            requested_at: request.requested_at.clone(),
            expires_at: request.expires_at.clone(),
            state: ApprovalState::Pending,
            decided_by: None,
            decided_at: None,
            reason: None,
        };
        transitions.push(approval.clone());
        approvals.push(approval);
    }
    for approval in approvals
        .iter_mut()
        .filter(|a| a.state == ApprovalState::Pending)
    {
        let expires = approval.expires_at.parse::<Timestamp>().ok();
        let held = requests.is_none_or(|r| r.iter().any(|q| q.id == approval.id));
        let decided = decision(&approval.id).filter(|d| {
            // A decision after the expiry comes too late: the proxy has refused the call.
            expires.zip(d.decided_at).is_none_or(|(e, at)| at <= e)
        });
        if let Some(d) = decided {
            approval.state = match d.decision {
                Decision::Approve => ApprovalState::Approved,
                Decision::Reject => ApprovalState::Rejected,
            };
            approval.decided_by = Some(d.decided_by);
            approval.decided_at = Some(d.decided_at.unwrap_or(now).to_string());
            approval.reason = d.reason;
        } else if expires.is_some_and(|e| now >= e) {
            approval.state = ApprovalState::Expired;
        } else if !held {
            let nearly =
                expires.is_some_and(|e| now.as_second() + EXPIRY_SLACK_SECONDS >= e.as_second());
            approval.state = if nearly {
                ApprovalState::Expired
            } else {
                ApprovalState::Withdrawn
            };
        } else {
            continue;
        }
        transitions.push(approval.clone());
    }
    // Decided entries in the order they were decided: the newly decided go last.
    let (mut kept, decided_now): (Vec<_>, Vec<_>) = approvals.into_iter().partition(|a| {
        !transitions
            .iter()
            .any(|t| t.id == a.id && a.state != ApprovalState::Pending)
    });
    kept.extend(decided_now);
    let mut approvals = kept;
    bound(&mut approvals, requests);
    (approvals, transitions)
}

/// Keeps every pending approval and the last [`MAX_DECIDED`] decided ones (oldest decided go
/// first), and never one the proxy still holds: its verdict must reach it.
fn bound(approvals: &mut Vec<Approval>, requests: Option<&[ApprovalRequest]>) {
    let held = |a: &Approval| requests.is_some_and(|r| r.iter().any(|q| q.id == a.id));
    let droppable = |a: &Approval| a.state != ApprovalState::Pending && !held(a);
    let decided = approvals
        .iter()
        .filter(|a| a.state != ApprovalState::Pending)
        .count();
    let mut drop = decided.saturating_sub(MAX_DECIDED);
    approvals.retain(|a| {
        if drop > 0 && droppable(a) {
            drop -= 1;
            false
        } else {
            true
        }
    });
}

/// The verdicts for the proxy: every approved or rejected approval still listed.
pub fn verdicts(approvals: &[Approval]) -> Vec<Verdict> {
    approvals
        .iter()
        .filter_map(|a| {
            let decision = match a.state {
                ApprovalState::Approved => Decision::Approve,
                ApprovalState::Rejected => Decision::Reject,
                _ => return None,
            };
            Some(Verdict {
                id: a.id.clone(),
                decision,
                decided_by: a.decided_by.clone().unwrap_or_default(),
                reason: a.reason.clone(),
            })
        })
        .collect()
}

/// When to look again: at the earliest expiry of a pending approval.
pub fn next_expiry(approvals: &[Approval], now: Timestamp) -> Option<Duration> {
    approvals
        .iter()
        .filter(|a| a.state == ApprovalState::Pending)
        .filter_map(|a| a.expires_at.parse::<Timestamp>().ok())
        .map(|e| {
            Duration::from_secs(e.as_second().saturating_sub(now.as_second()).max(0) as u64 + 1)
        })
        .min()
}

/// Where the verdicts go: the task's ConfigMap (when it is this TaskRun's), with the verdicts
/// it holds.
pub struct Target<'a> {
    pub config_map: &'a str,
    pub written: Option<&'a str>,
}

/// Merges, and writes what changed: the ConfigMap's verdicts (when there is a `target`), then
/// the status, then the Events. A task that is not `running` any more holds nothing: its pending
/// calls are withdrawn. Returns when to look again for an expiry.
pub async fn reconcile(
    ctx: &Context,
    tr: &TaskRun,
    previous: &TaskRunStatus,
    target: Option<Target<'_>>,
    running: bool,
) -> Result<Option<Duration>> {
    let ns = tr.namespace().unwrap_or_default();
    let name = tr.name_any();
    let facts = ctx.leases.get(&ns, &name);
    // A finished task's proxy holds nothing any more.
    let requests = match running {
        true => facts.as_ref().and_then(|f| f.requests.as_deref()),
        false => Some(&[][..]),
    };
    if previous.approvals.is_empty() && requests.is_none_or(<[_]>::is_empty) {
        return Ok(None);
    }
    let now = Timestamp::now();
    let (approvals, transitions) = merge(
        &previous.approvals,
        requests,
        |id| {
            ctx.decisions
                .get(&ns, &object_name(&name, id))
                .filter(|d| d.task_run == name && d.id == id)
                .map(|d| (*d).clone())
        },
        now,
    );
    let verdicts = verdicts(&approvals);
    let text = serde_json::to_string(&verdicts).unwrap_or_else(|_| "[]".into());
    if let Some(Target {
        config_map,
        written,
    }) = target
        && (!verdicts.is_empty() || written.is_some())
        && written != Some(text.as_str())
    {
        let patch = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": config_map, "namespace": ns},
            "data": {VERDICTS_KEY: text},
        });
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .patch(
                config_map,
                &PatchParams::apply(APPROVALS_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await?;
    }
    if approvals != previous.approvals {
        let patch = json!({
            "apiVersion": "orchestrator.io/v1",
            "kind": "TaskRun",
            "status": {"approvals": approvals},
        });
        Api::<TaskRun>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::apply(APPROVALS_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await?;
    }
    for t in transitions {
        let (kind, reason, note) = describe(&t, &name);
        tracing::info!(approval = %t.id, state = t.state.as_str(), "approval");
        events::publish(ctx, tr, kind, reason, "Approve", note).await;
    }
    Ok(next_expiry(&approvals, now))
}

/// The Event of a transition: its type, reason and note.
fn describe(a: &Approval, task: &str) -> (EventType, &'static str, String) {
    let call = format!("{} of {}/{}", a.id, a.server, a.tool);
    let by = a.decided_by.as_deref().unwrap_or("unknown");
    let because = a
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    match a.state {
        ApprovalState::Pending => (
            EventType::Normal,
            "ApprovalRequested",
            format!(
                "call {call} waits for approval until {} (orchestrator-cli task approve|reject {task} {}); arguments: {}",
                a.expires_at,
                a.id,
                summary(&a.arguments)
            ),
        ),
        ApprovalState::Approved => (
            EventType::Normal,
            "ApprovalGranted",
            format!("call {call} approved by {by}{because}"),
        ),
        ApprovalState::Rejected => (
            EventType::Normal,
            "ApprovalRejected",
            format!("call {call} rejected by {by}{because}"),
        ),
        ApprovalState::Expired => (
            EventType::Warning,
            "ApprovalExpired",
            format!(
                "call {call} was not decided by {} and was refused",
                a.expires_at
            ),
        ),
        ApprovalState::Withdrawn => (
            EventType::Normal,
            "ApprovalWithdrawn",
            format!(
                "call {call} ended before a decision (the client cancelled it, the proxy restarted or the task finished)"
            ),
        ),
    }
}

fn summary(arguments: &BTreeMap<String, String>) -> String {
    if arguments.is_empty() {
        return "none".into();
    }
    arguments
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn request(id: &str) -> ApprovalRequest {
        ApprovalRequest {
            id: id.into(),
            server: "fs".into(),
            tool: "write_file".into(),
            arguments: BTreeMap::from([("path".into(), "\"/w/a\"".into())]),
            requested_at: "2026-01-01T00:00:00Z".into(),
            expires_at: "2026-01-01T00:05:00Z".into(),
        }
    }

    fn decided(id: &str, decision: Decision, when: &str) -> DecisionFacts {
        DecisionFacts {
            task_run: "t".into(),
            id: id.into(),
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
}
