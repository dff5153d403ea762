//! `status.approvals` and the verdicts the proxy waits for (see `orchestrator_crds::approval`).
//!
//! The proxy lists the calls it holds on its Lease ([`REQUESTS_ANNOTATION`], kept in
//! `facts::LeaseFacts`); people decide with ToolApproval objects named `<taskRun>-<id>` (kept as
//! [`DecisionFacts`]). Each reconcile of a running task merges the two into the status: a new
//! request becomes `Pending`; a pending one with a decision made before it expired becomes
//! `Approved` or `Rejected`; one past its expiry `Expired`; one the proxy stopped holding
//! without either (its client cancelled, the proxy restarted, or the task finished) `Withdrawn`.
//!
//! An approval approves one exact call, the one its digest names: a request listed again under
//! its id with another digest is a conflict (the pending entry is withdrawn and the new view
//! never listed), and a decision naming another digest than the entry's rejects the call. The
//! verdicts carry the entry's digest, and the proxy forwards only the call with it. A pending
//! entry keeps the call's full (masked) params; a decided one keeps only its digest. A call
//! whose params could not be shown masked (`withheld`) cannot be approved: an approval of it
//! rejects it (the proxy does the same), with only the person's own reason passed on, so the
//! agent learns nothing of why. `paramsBytes` is the length of the params as shown.
//! This happens while the TaskRun is blocked too (`steps/refuse.rs`: its proxy keeps serving the last
//! good config, and holding calls), and once more when a finished task still lists a pending
//! one (`ends/finished.rs`). The decided ones go to the proxy in the ConfigMap key [`VERDICTS_KEY`].
//! Both writes are under their own field manager ([`APPROVALS_MANAGER`]), so the operator's other
//! writes leave them alone, and happen only when something changed. An Event tells each
//! transition. Each merge sets the gauges of the calls waiting, and a call first listed pending
//! is announced to the approval webhook when there is one ([`announce`], `crate::notify`).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::{
    APPROVALS_MANAGER, Approval, ApprovalRequest, ApprovalState, Decision, MAX_DECIDED,
    VERDICTS_KEY, Verdict, object_name,
};
use orchestrator_crds::policy::short_pin;
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus};
use serde_json::json;

use super::context::Context;
use super::events;
use super::facts::DecisionFacts;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::notify::{Notice, Notifier};

/// A call the proxy stopped holding this close to its expiry (clocks differ a little) expired.
const EXPIRY_SLACK_SECONDS: i64 = 2;

/// Why an approval changed state, when its state alone does not say (see [`describe`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Cause {
    /// As its state says.
    State,
    /// The proxy listed its id again with this other digest: the pending entry is withdrawn.
    Conflict { listed: String },
    /// ToolApproval `object` named digest `named`, not the entry's: the call is rejected.
    DigestMismatch { object: String, named: String },
    /// ToolApproval `object` approved a call whose params were withheld: it is rejected.
    ApprovedUnseen { object: String },
}

/// An approval whose state changed (an Event each).
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub approval: Approval,
    pub cause: Cause,
}

impl Transition {
    fn new(approval: &Approval, cause: Cause) -> Self {
        Self {
            approval: approval.clone(),
            cause,
        }
    }
}

/// The new `status.approvals` from the old, the proxy's requests (`None`: never published) and
/// the decisions found for pending ids; with each approval whose state changed (an Event each),
/// in order.
pub fn merge(
    old: &[Approval],
    requests: Option<&[ApprovalRequest]>,
    decision: impl Fn(&str) -> Option<DecisionFacts>,
    now: Timestamp,
) -> (Vec<Approval>, Vec<Transition>) {
    let mut approvals: Vec<Approval> = old.to_vec();
    let mut transitions = Vec::new();
    for request in requests.unwrap_or_default() {
        if let Some(listed) = approvals.iter_mut().find(|a| a.id == request.id) {
            // The same id naming another call: the first view is not what is held any more,
            // nor is the second what was shown. Neither can be approved.
            if listed.digest != request.digest && listed.state == ApprovalState::Pending {
                listed.state = ApprovalState::Withdrawn;
                listed.params = None;
                transitions.push(Transition::new(
                    listed,
                    Cause::Conflict {
                        listed: request.digest.clone(),
                    },
                ));
            }
            continue;
        }
        let approval = Approval {
            id: request.id.clone(),
            server: request.server.clone(),
            tool: request.tool.clone(),
            digest: request.digest.clone(),
            definition: request.definition.clone(),
            context_version: request.context_version,
            params: request.withheld.is_none().then(|| request.params.clone()),
            // What is shown, measured here: never a length the proxy says of what is not.
            params_bytes: match request.withheld {
                None => u32::try_from(request.params.len()).unwrap_or(u32::MAX),
                Some(_) => request.params_bytes,
            },
            masked: request.masked.clone(),
            mask_nonce: request.mask_nonce.clone(),
            withheld: request.withheld,
            requested_at: request.requested_at.clone(),
            expires_at: request.expires_at.clone(),
            state: ApprovalState::Pending,
            decided_by: None,
            decided_at: None,
            reason: None,
        };
        transitions.push(Transition::new(&approval, Cause::State));
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
        let mut cause = Cause::State;
        if let Some(d) = decided {
            let names_this_call = !approval.digest.is_empty() && d.digest == approval.digest;
            (approval.state, approval.reason) = match d.decision {
                _ if !names_this_call => {
                    let object = object_name(&d.task_run, &d.id);
                    let reason = format!(
                        "ToolApproval {object} names {}, not this call ({})",
                        short_pin(&d.digest),
                        short_pin(&approval.digest)
                    );
                    cause = Cause::DigestMismatch {
                        object,
                        named: d.digest.clone(),
                    };
                    (ApprovalState::Rejected, Some(reason))
                }
                Decision::Approve if approval.withheld.is_some() => {
                    cause = Cause::ApprovedUnseen {
                        object: object_name(&d.task_run, &d.id),
                    };
                    (ApprovalState::Rejected, d.reason)
                }
                Decision::Approve => (ApprovalState::Approved, d.reason),
                Decision::Reject => (ApprovalState::Rejected, d.reason),
            };
            approval.decided_by = Some(d.decided_by);
            approval.decided_at = Some(d.decided_at.unwrap_or(now).to_string());
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
        // Decided: what was shown goes (the digest stays), which bounds the status.
        approval.params = None;
        transitions.push(Transition::new(approval, cause));
    }
    // Decided entries in the order they were decided: the newly decided go last.
    let (mut kept, decided_now): (Vec<_>, Vec<_>) = approvals.into_iter().partition(|a| {
        !transitions
            .iter()
            .any(|t| t.approval.id == a.id && a.state != ApprovalState::Pending)
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
                digest: a.digest.clone(),
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

/// Where the verdicts go: the task's ConfigMap (when it is this TaskRun's; in shared mode, the
/// one in the shared proxy's namespace), with the verdicts it holds.
pub struct Target {
    pub namespace: String,
    pub config_map: String,
    pub written: Option<Box<str>>,
}

/// Merges, and writes what changed: the ConfigMap's verdicts (when there is a `target`), then
/// the status, then the Events. A task that is not `running` any more holds nothing: its pending
/// calls are withdrawn. Returns when to look again for an expiry.
pub async fn sync(
    ctx: &Context,
    tr: &TaskRun,
    previous: &TaskRunStatus,
    target: Option<Target>,
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
        namespace,
        config_map,
        written,
    }) = target
        && (!verdicts.is_empty() || written.is_some())
        && written.as_deref() != Some(text.as_str())
    {
        let patch = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": config_map, "namespace": namespace},
            "data": {VERDICTS_KEY: text},
        });
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace)
            .patch(
                &config_map,
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
    announce(
        &ctx.metrics,
        ctx.notifier.as_ref(),
        tr,
        &approvals,
        &transitions,
    );
    for t in transitions {
        let (kind, reason, note) = describe(&t, &name);
        match &t.cause {
            Cause::State => {}
            Cause::ApprovedUnseen { .. } => {
                tracing::warn!(approval = %t.approval.id, "an approval of a call whose params were not shown is a rejection")
            }
            cause => {
                tracing::warn!(approval = %t.approval.id, ?cause, "approval does not name the call held")
            }
        }
        tracing::info!(approval = %t.approval.id, state = t.approval.state.as_str(), "approval");
        events::publish(ctx, tr, kind, reason, "Approve", note).await;
    }
    Ok(next_expiry(&approvals, now))
}

/// What follows the writes of a TaskRun's approvals: the gauges of its calls waiting (none:
/// the series go), and a notification for each approval this merge first listed as pending and
/// that still is (the notifier sends each id once, however often a lagging cache makes a
/// reconcile see it new again).
pub fn announce(
    metrics: &Metrics,
    notifier: Option<&Notifier>,
    tr: &TaskRun,
    approvals: &[Approval],
    transitions: &[Transition],
) {
    let ns = tr.namespace().unwrap_or_default();
    let name = tr.name_any();
    let pending = || {
        approvals
            .iter()
            .filter(|a| a.state == ApprovalState::Pending)
    };
    let oldest = pending()
        .filter_map(|a| a.requested_at.parse::<Timestamp>().ok())
        .min()
        .unwrap_or_else(Timestamp::now);
    metrics.approvals_pending(&ns, &name, pending().count(), oldest.as_second() as f64);
    let Some(notifier) = notifier else {
        return;
    };
    for t in transitions {
        let new = t.cause == Cause::State && t.approval.state == ApprovalState::Pending;
        if new && pending().any(|a| a.id == t.approval.id) {
            notifier.notify(Notice {
                namespace: ns.clone(),
                task_run: name.clone(),
                task_id: tr.spec.task_id,
                approval_id: t.approval.id.clone(),
                server: t.approval.server.clone(),
                tool: t.approval.tool.clone(),
                digest: t.approval.digest.clone(),
                requested_at: t.approval.requested_at.clone(),
                expires_at: t.approval.expires_at.clone(),
            });
        }
    }
}

/// The most bytes of an Event's note (the API server allows 1 KiB).
const MAX_NOTE_BYTES: usize = 1024;

/// The Event of a transition: its type, reason and note (never the call's params: they are in
/// the status, `task approvals T --show ID`).
fn describe(t: &Transition, task: &str) -> (EventType, &'static str, String) {
    let a = &t.approval;
    let call = format!("{} of {}/{}", a.id, a.server, a.tool);
    let by = a.decided_by.as_deref().unwrap_or("unknown");
    let because = a
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    let (kind, reason, note) = match (&t.cause, a.state) {
        (Cause::Conflict { listed }, _) => (
            EventType::Warning,
            "ApprovalConflict",
            format!(
                "call {call} ({}) was listed again under its id as another call ({}); it is withdrawn and cannot be approved",
                short_pin(&a.digest),
                short_pin(listed)
            ),
        ),
        (Cause::DigestMismatch { object, named }, _) => (
            EventType::Warning,
            "ApprovalDigestMismatch",
            format!(
                "call {call} rejected: ToolApproval {object} by {by} names {}, not this call ({})",
                short_pin(named),
                short_pin(&a.digest)
            ),
        ),
        (Cause::ApprovedUnseen { object }, _) => (
            EventType::Warning,
            "ApprovalOfUnseenCall",
            format!(
                "call {call} rejected: ToolApproval {object} by {by} approves it, but its params could not be shown with the task's Secret values masked, so nobody saw what it sends; it can only be rejected"
            ),
        ),
        (Cause::State, ApprovalState::Pending) => (
            EventType::Normal,
            "ApprovalRequested",
            format!(
                "call {call} ({}, {} bytes{}) waits for approval until {}: see it with orchestrator-cli task approvals {task} --show {}, then task approve|reject {task} {}",
                short_pin(&a.digest),
                a.params_bytes,
                match (a.masked.len(), a.withheld) {
                    (_, Some(_)) => ", params not shown: it can only be rejected".to_string(),
                    (0, None) => String::new(),
                    (n, None) => format!(", {n} Secret value(s) masked"),
                },
                a.expires_at,
                a.id,
                a.id
            ),
        ),
        (Cause::State, ApprovalState::Approved) => (
            EventType::Normal,
            "ApprovalGranted",
            format!("call {call} approved by {by}{because}"),
        ),
        (Cause::State, ApprovalState::Rejected) => (
            EventType::Normal,
            "ApprovalRejected",
            format!("call {call} rejected by {by}{because}"),
        ),
        (Cause::State, ApprovalState::Expired) => (
            EventType::Warning,
            "ApprovalExpired",
            format!(
                "call {call} was not decided by {} and was refused",
                a.expires_at
            ),
        ),
        (Cause::State, ApprovalState::Withdrawn) => (
            EventType::Normal,
            "ApprovalWithdrawn",
            format!(
                "call {call} ended before a decision (the client cancelled it, the proxy restarted or the task finished)"
            ),
        ),
    };
    (kind, reason, clip_bytes(note, MAX_NOTE_BYTES))
}

/// `s`, cut to at most `max` bytes at a char boundary.
fn clip_bytes(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod notify_tests;
#[cfg(test)]
mod tests;
