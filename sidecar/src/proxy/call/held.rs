//! The approval step: a call that `policy.requireApproval` names waits here, after its arguments
//! are checked and before the rate limits (a held call takes no token), until a person decides,
//! its wait runs out, its client cancels it or shutdown's grace is over. While it waits, a client that sent a
//! `progressToken` hears about it every [`PROGRESS_EVERY`]. The pending set and the verdicts are
//! `crate::approval`'s.

use std::time::Duration;

use orchestrator_crds::approval::{Decision, MAX_PENDING, Verdict};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use tokio_util::sync::CancellationToken;

use super::super::{CallRequest, Snapshot};
use crate::{
    approval::{Approvals, Held, NotHeld},
    error::Error,
    metrics::Metrics,
    policy::refusal::{ApprovalNote, Reason, Refusal},
    router::Route,
};

/// How often a held call's client is told it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How a wait ended.
enum Wait {
    Decided(Verdict),
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
    /// Holds `req` when `policy.requireApproval` names it. `Ok(None)`: it need not wait;
    /// `Ok(Some(note))`: a person approved it, forward it; `Err`: rejected, expired, withdrawn
    /// (cancelled, shutdown), or it could not be held.
    pub async fn approval(
        &self,
        snap: &Snapshot,
        route: &Route,
        req: &CallRequest,
    ) -> Result<Option<ApprovalNote>, Refusal> {
        let Some(policy) = &snap.config.require_approval else {
            return Ok(None);
        };
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
        let Some(rule) = policy.rule_for(server.as_str(), route.tool.as_str(), route.risk) else {
            return Ok(None);
        };
        let refused = |reason: Reason, decided_by: Option<String>, id: Option<String>| {
            let note = id.map(|id| ApprovalNote { id, decided_by });
            Refusal::of(reason, route.target(), rule.clone()).held(note)
        };
        let mut held = match self.approvals.hold(
            server.as_str(),
            route.tool.as_str(),
            req.arguments.as_ref(),
            policy.timeout,
        ) {
            Ok(held) => held,
            Err(NotHeld::Unavailable) => {
                return Err(refused(Reason::ApprovalUnavailable, None, None));
            }
            Err(NotHeld::Busy) => {
                let busy = Reason::ApprovalBusy { limit: MAX_PENDING };
                return Err(refused(busy, None, None));
            }
        };
        let id = held.id().to_string();
        let waited = self.wait(&mut held, req).await;
        // Out of the published set before the answer goes back.
        drop(held);
        match waited {
            Wait::Decided(verdict) if verdict.decision == Decision::Approve => {
                self.metrics.approval("approved");
                Ok(Some(ApprovalNote {
                    id,
                    decided_by: Some(verdict.decided_by),
                }))
            }
            Wait::Decided(verdict) => {
                let rejected = Reason::ApprovalRejected {
                    id: id.clone(),
                    decided_by: verdict.decided_by.clone(),
                    reason: verdict.reason,
                };
                Err(refused(rejected, Some(verdict.decided_by), Some(id)))
            }
            Wait::Expired => {
                tracing::info!(approval = %id, %server, tool = %route.tool, "approval expired");
                let expired = Reason::ApprovalExpired {
                    id: id.clone(),
                    timeout: policy.timeout,
                };
                Err(refused(expired, None, Some(id)))
            }
            Wait::Ended(error) => Err(refused(Reason::Withdrawn(error), None, Some(id))),
        }
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
                verdict = held.decided() => return Wait::Decided(verdict),
                () = tokio::time::sleep_until(deadline) => {
                    // A verdict that arrived at the last moment still counts.
                    return match held.expire() {
                        Some(verdict) => Wait::Decided(verdict),
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
