//! The approval step: a call that `policy.requireApproval` names waits here, after its arguments
//! are checked and before the rate limits (a held call takes no token), until a person decides,
//! its wait runs out, its client cancels it or shutdown's grace is over. While it waits, a client that sent a
//! `progressToken` hears about it every [`PROGRESS_EVERY`]. The request shows the params
//! `forward::params_of` makes, the very ones forwarded, and names their digest; after an
//! approval [`Gate::unchanged`] checks the call about to go is still the one approved. The
//! pending set and the verdicts are `crate::approval`'s. In shared mode the call first adopts the
//! same call's request held by a replica that is gone, and an approved call goes only once its
//! request is off the Lease (forwarded once, whichever replica dies when).

use std::time::Duration;

use orchestrator_crds::approval::{
    ApprovalRequest, DEFAULT_TIMEOUT_SECONDS, Decision, MAX_PENDING,
};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use tokio_util::sync::CancellationToken;

use serde_json::Value;

use super::super::{CallRequest, Snapshot, upstream_meta};
use super::forward::shown_params;
use crate::{
    approval::{Adopted, Approvals, Held, HoldCall, NotHeld, Outcome, shown_meta},
    error::Error,
    metrics::Metrics,
    policy::refusal::{ApprovalNote, Reason, Refusal},
    router::Route,
    telemetry,
};

/// An adopted request was approved as its first sender sent it: the call goes with that
/// sender's `_meta` (the bytes a person saw; adoption compared the call with it,
/// `approval::shared`), keeping this client's own keys that are never forwarded
/// (`progressToken` and the like: `upstream_meta` drops them; the trace context, when the
/// proxy sends its own).
fn first_sent_meta(req: &mut CallRequest, request: &ApprovalRequest) {
    let Some(shown) = shown_meta(request) else {
        return;
    };
    let forwarded = upstream_meta(&req.meta, true);
    let mut meta = req.meta.clone();
    meta.0.0.retain(|key, _| {
        !forwarded.0.0.contains_key(key)
            || (telemetry::tracing_on() && matches!(key.as_str(), "traceparent" | "tracestate"))
    });
    if let Some(Value::Object(shown)) = shown {
        meta.0.0.extend(shown);
    }
    req.meta = meta;
}

/// How often a held call's client is told it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Shared mode: how long an approved call waits for its request to be off the Lease.
const SETTLE_WITHIN: Duration = Duration::from_secs(15);

/// How a wait ended.
enum Wait {
    Decided(Outcome),
    Expired,
    /// Cancelled by the client or cut off by shutdown: the error says which.
    Ended(Error),
}

/// What a call waiting for approval needs: the pending set, the approval metric, and shutdown's
/// cut-off.
pub(super) struct Gate<'a> {
    pub approvals: &'a Approvals,
    pub metrics: &'a Metrics,
    pub cut_off: &'a CancellationToken,
}

impl Gate<'_> {
    /// Holds `req` when `policy.requireApproval` names it, or a condition asked for it
    /// (`by_condition`: that condition, as a config path). `Ok(None)`: it need not wait;
    /// `Ok(Some(note))`: a person approved it, forward it; `Err`: rejected, expired, withdrawn
    /// (cancelled, shutdown), decided under another digest, or it could not be held.
    pub async fn approval(
        &self,
        snap: &Snapshot,
        route: &Route,
        req: &mut CallRequest,
        by_condition: Option<String>,
    ) -> Result<Option<ApprovalNote>, Refusal> {
        let policy = snap.config.require_approval.as_ref();
        if policy.is_none() && by_condition.is_none() {
            return Ok(None);
        }
        // The retry of a call the proxy parked (see `bridge`) goes on with the call approved
        // before; its arguments are not sent again.
        if req
            .request_state
            .as_deref()
            .is_some_and(|s| s.starts_with(super::super::bridge::STATE_PREFIX))
        {
            return Ok(None);
        }
        let server = &route.server.name;
        let rule = match by_condition {
            Some(rule) => rule,
            None => {
                let by_policy = policy
                    .and_then(|p| p.rule_for(server.as_str(), route.tool.as_str(), route.risk));
                let Some(rule) = by_policy else {
                    return Ok(None);
                };
                rule
            }
        };
        // The wait `policy.requireApproval` sets, or its default for a condition's call.
        let timeout = policy.map_or(
            Duration::from_secs(u64::from(DEFAULT_TIMEOUT_SECONDS)),
            |p| p.timeout,
        );
        let refused = |reason: Reason, note: Option<ApprovalNote>| {
            Refusal::of(reason, route.target(), rule.clone()).held(note)
        };
        let params = shown_params(route, req).map_err(|e| refused(Reason::Failed(e), None))?;
        let call = HoldCall {
            server: server.as_str(),
            tool: route.tool.as_str(),
            definition: &route.definition,
            context_version: snap.config.context_version,
            params: &params,
        };
        // Shared mode: the same call's request, held by a replica that is gone, is taken over.
        let (waited, request) = match self.approvals.adopt(call).await {
            Some(Adopted::Decided { request, outcome }) => {
                first_sent_meta(req, &request);
                (Wait::Decided(outcome), request)
            }
            Some(Adopted::Held(mut held)) => {
                first_sent_meta(req, &held.request);
                (self.wait(&mut held, req).await, held.request.clone())
            }
            None => {
                let held = match self.approvals.masker().await {
                    Ok(masker) => self.approvals.hold_masked(call, &masker, timeout),
                    Err(unreadable) => Err(unreadable),
                };
                let mut held = match held {
                    Ok(held) => held,
                    Err(NotHeld::Unavailable) => {
                        return Err(refused(Reason::ApprovalUnavailable, None));
                    }
                    Err(NotHeld::Busy) => {
                        let busy = Reason::ApprovalBusy { limit: MAX_PENDING };
                        return Err(refused(busy, None));
                    }
                    Err(NotHeld::TooLarge { bytes, limit }) => {
                        return Err(refused(Reason::ApprovalTooLarge { bytes, limit }, None));
                    }
                    Err(NotHeld::MasksUnreadable(why)) => {
                        tracing::error!(%server, tool = %route.tool, error = %why, "cannot hold a call for approval: the Secret values to mask cannot be read");
                        let failed = Error::Other(format!(
                            "the call needs a person's approval, but the proxy cannot read the Secret values it masks in what it shows ({why}); the call was not made"
                        ));
                        return Err(refused(Reason::Failed(failed), None));
                    }
                    Err(NotHeld::Unshowable(why)) => {
                        let invalid = Error::InvalidParams(format!(
                            "the call needs a person's approval, but it cannot be shown to them as it would be sent: {why}; the call was not made"
                        ));
                        return Err(refused(Reason::Failed(invalid), None));
                    }
                };
                let waited = self.wait(&mut held, req).await;
                (waited, held.request.clone())
            }
        };
        // (The held call is out of the published set here, before the answer goes back.)
        let ApprovalRequest {
            id,
            digest,
            context_version,
            ..
        } = request;
        let note = |decided_by: Option<&str>| ApprovalNote {
            id: id.clone(),
            decided_by: decided_by.map(str::to_string),
            digest: digest.clone(),
            context_version,
        };
        match waited {
            Wait::Decided(Outcome::Verdict(verdict)) if verdict.decision == Decision::Approve => {
                let approved = note(Some(&verdict.decided_by));
                // Shared mode: once off the Lease, no other replica can adopt it again.
                if self.approvals.holder().is_some() && !self.approvals.settled(SETTLE_WITHIN).await
                {
                    tracing::error!(approval = %id, %server, tool = %route.tool, "an approved call whose request cannot be taken off the Lease is not made (it could be made twice)");
                    let failed = Error::Other(format!(
                        "approval {id} was granted, but its request could not be taken off the task's Lease within {}s, so another replica could make the call again; the call was not made, call the tool again",
                        SETTLE_WITHIN.as_secs()
                    ));
                    return Err(refused(Reason::Failed(failed), Some(approved)));
                }
                self.metrics.approval("approved");
                Ok(Some(approved))
            }
            Wait::Decided(Outcome::Verdict(verdict)) => {
                let decided = note(Some(&verdict.decided_by));
                let rejected = Reason::ApprovalRejected {
                    id: id.clone(),
                    decided_by: verdict.decided_by,
                    reason: verdict.reason,
                };
                Err(refused(rejected, Some(decided)))
            }
            Wait::Decided(Outcome::Mismatch { named }) => {
                let mismatch = Reason::ApprovalMismatch {
                    id: id.clone(),
                    named,
                    held: digest.clone(),
                };
                Err(refused(mismatch, Some(note(None))))
            }
            Wait::Expired => {
                tracing::info!(approval = %id, %server, tool = %route.tool, "approval expired");
                let expired = Reason::ApprovalExpired {
                    id: id.clone(),
                    timeout,
                };
                Err(refused(expired, Some(note(None))))
            }
            Wait::Ended(error) => Err(refused(Reason::Withdrawn(error), Some(note(None)))),
        }
    }

    /// After an approval, with the route in force now: the call about to be forwarded must have
    /// the digest that was approved (recomputed from the route and the request, at the context
    /// version it was held at). A defence in depth: nothing the steps do should change it.
    pub fn unchanged(
        &self,
        approved: &ApprovalNote,
        route: &Route,
        req: &CallRequest,
    ) -> Result<(), Refusal> {
        let params = shown_params(route, req).map_err(Refusal::from)?;
        let call = HoldCall {
            server: route.server.name.as_str(),
            tool: route.tool.as_str(),
            definition: &route.definition,
            context_version: approved.context_version,
            params: &params,
        };
        let now = self.approvals.digest_of(&approved.id, &call);
        if now.as_deref() == Some(approved.digest.as_str()) {
            return Ok(());
        }
        let held = now.unwrap_or_default();
        tracing::warn!(approval = %approved.id, server = %route.server.name, tool = %route.tool, named = %approved.digest, %held, "the call about to be forwarded is not the one approved; it is not made");
        let reason = Reason::ApprovalMismatch {
            id: approved.id.clone(),
            named: approved.digest.clone(),
            held,
        };
        let rule = format!("approval {} (the digest of the call approved)", approved.id);
        Err(Refusal::of(reason, route.target(), rule).held(Some(approved.clone())))
    }

    /// Waits for the held call's verdict, its deadline, its client's cancellation or shutdown's
    /// cut-off; meanwhile tells the client every [`PROGRESS_EVERY`] (at once first).
    async fn wait(&self, held: &mut Held<'_>, req: &CallRequest) -> Wait {
        let token = req.meta.get_progress_token();
        let since = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval(PROGRESS_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let deadline = held.deadline;
        loop {
            tokio::select! {
                outcome = held.decided() => return Wait::Decided(outcome),
                () = tokio::time::sleep_until(deadline) => {
                    // A verdict that arrived at the last moment still counts.
                    return match held.expire() {
                        Some(outcome) => Wait::Decided(outcome),
                        None => Wait::Expired,
                    };
                }
                () = req.ct.cancelled() => return Wait::Ended(Error::Cancelled("the client")),
                () = self.cut_off.cancelled() => return Wait::Ended(Error::ShuttingDown),
                _ = ticks.tick(), if token.is_some() => {
                    if let Some(token) = &token {
                        self.tell_waiting(held, req, token.clone(), since).await;
                    }
                }
            }
        }
    }

    /// One `notifications/progress` for a held call: the seconds waited so far, and what for.
    async fn tell_waiting(
        &self,
        held: &Held<'_>,
        req: &CallRequest,
        token: ProgressToken,
        since: tokio::time::Instant,
    ) {
        let now = tokio::time::Instant::now();
        let message = format!(
            "waiting for approval {} of {}/{} (expires in {})",
            held.id(),
            held.request.server,
            held.request.tool,
            human(held.deadline.saturating_duration_since(now)),
        );
        let waited = now.saturating_duration_since(since).as_secs();
        let params = ProgressNotificationParam::new(token, waited as f64).with_message(message);
        if let Err(e) = req.session.peer.notify_progress(params).await {
            tracing::debug!(approval = %held.id(), error = %e, "cannot tell the client its call waits");
        }
    }
}

/// `4m10s`, `59s`, `1h0m5s`.
fn human(left: Duration) -> String {
    // Round up: "expires in 0s" while the call still waits would read wrong.
    let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    match (secs / 3600, secs / 60 % 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_reads_like_a_clock() {
        assert_eq!(human(Duration::from_millis(250_100)), "4m11s");
        assert_eq!(human(Duration::from_secs(250)), "4m10s");
        assert_eq!(human(Duration::from_secs(59)), "59s");
        assert_eq!(human(Duration::from_secs(3605)), "1h0m5s");
        assert_eq!(human(Duration::ZERO), "0s");
    }
}
