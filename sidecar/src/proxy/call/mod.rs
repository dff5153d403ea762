//! The `tools/call` path as one pipeline. [`Proxy::decide`] lists its steps in the order they
//! apply; each passes the call on or refuses it with a [`Refusal`], and every refusal ends in
//! [`Proxy::refuse`], which answers, audits and counts it. A refused call reaches no upstream. A
//! call that passes every step is forwarded (`forward`) and recorded.
//!
//! Adding a check: write it as a step (a function `-> Result<_, Refusal>`, in `steps` when it
//! needs only the call and its route), give it a [`crate::policy::refusal::Reason`] when none
//! fits, and call it at its place in `decide`.
//!
//! Children: `steps` (the checks), `held` (the approval step: a call waiting for a person),
//! `forward` (the last step), `record` (the audit line, metrics and span of every call).

mod forward;
mod held;
mod record;
mod steps;

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use rmcp::model::CallToolResponse;
use tracing::Instrument;

pub(super) use record::Ledger;

use super::{CallRequest, Proxy, Snapshot, intent};
use crate::{
    config::Server,
    error::Error,
    names::clip,
    policy::refusal::{ApprovalNote, Refusal},
    router::{Lookup, Route},
    session::ListKind,
    telemetry,
};

/// A call on its way through the steps: the request, the table it is decided with (a step that
/// starts servers or waits moves it to the one in force then) and when it arrived.
struct Call {
    req: CallRequest,
    snap: Arc<Snapshot>,
    started: Instant,
}

/// What the steps decided about a call that was not refused.
enum Decided {
    /// Forward it to `route` (a person approved it first, when `approved`).
    Forward {
        route: Route,
        approved: Option<ApprovalNote>,
    },
    /// The proxy answered it itself (intent mode's `retrieve_tools`), recorded already.
    Answered(CallToolResponse),
}

impl Proxy {
    /// `tools/call`: decide, then forward to the upstream that owns the tool.
    pub async fn call_tool(self: &Arc<Self>, req: CallRequest) -> Result<CallToolResponse, Error> {
        let started = Instant::now();
        let _in_flight = InFlight::enter(self);
        let snap = self.snapshot().ok_or(Error::NotReady)?;
        let mut call = Call { req, snap, started };
        match self.decide(&mut call).await {
            Ok(Decided::Forward { route, approved }) => {
                self.forward_call(&call, &route, approved).await
            }
            Ok(Decided::Answered(answer)) => Ok(answer),
            Err(refusal) => self.refuse(&call, refusal),
        }
    }

    /// The steps of the call path, in order.
    async fn decide(self: &Arc<Self>, call: &mut Call) -> Result<Decided, Refusal> {
        // 1. A proxy that is shutting down takes no new call.
        steps::open(self.is_draining())?;
        // 2. Intent mode's first key: `retrieve_tools` is answered here; a `call_tool_*` goes
        //    on as the call of the tool it names.
        if let intent::Front::Retrieve(query) = intent::front(&call.snap, &mut call.req)? {
            return Ok(Decided::Answered(self.retrieve_tools(call, &query).await));
        }
        // 3. The tool must be on offer (patterns, maxRisk, changed definitions).
        let route = self.route(call).await?;
        // 4. Intent mode's second key: the variant against the tool's class.
        intent::second_key(&route, &call.req)?;
        // 5. The arguments against the tool's inputSchema.
        steps::arguments(&self.validators, &call.snap, &route, &call.req).await?;
        // 6. The policy's CEL conditions on the call (on arguments that fit the schema): a deny
        //    that holds refuses here, before a person is asked; one may ask for approval.
        let asked = steps::conditions(&call.snap, &route, &call.req)?;
        // 7. The policy services (decision points): only an explicit allow goes on; asked after
        //    the local checks (a call they refuse costs no round trip) and before a person.
        steps::decision(&call.snap, &route, &call.req).await?;
        // 8. A person's approval, when policy.requireApproval names the call or a condition
        //    asked for it.
        let approved = self
            .gate()
            .approval(&call.snap, &route, &mut call.req, asked)
            .await?;
        let held = |refusal: Refusal| refusal.held(approved.clone());
        // 9. After an approval (the wait may have been long): still on offer, as approved,
        //    still the very call approved (its digest), and no condition in force now denies it
        //    (the decision points were asked before; a person's approval stands for the wait).
        let route = match &approved {
            Some(note) => {
                call.snap = self.snapshot().ok_or(Error::NotReady)?;
                let route = steps::still_offered(&call.snap, &call.req, route).map_err(held)?;
                self.gate().unchanged(note, &route, &call.req)?;
                steps::conditions(&call.snap, &route, &call.req).map_err(held)?;
                route
            }
            None => route,
        };
        // 10. Rate limits (after any wait: a call that waits or is refused takes no token).
        steps::rate_limits(&self.limiters, &route).map_err(held)?;
        // 11. Forward (`forward_call`).
        Ok(Decided::Forward { route, approved })
    }

    /// Step: the route of the name called, when the tool is on offer ([`steps::offered`]).
    /// Servers whose lists would decide the name are started first (once).
    async fn route(self: &Arc<Self>, call: &mut Call) -> Result<Route, Refusal> {
        fn lookup(call: &Call) -> Lookup<'_> {
            call.snap
                .router_for(&call.req.session)
                .lookup(&call.req.name)
        }
        let servers = match lookup(call) {
            Lookup::NeedsLists(servers) => servers,
            decided => return steps::offered(decided),
        };
        let timeout = call.snap.config.call_timeout;
        let failed = self.fetch_for_call(servers, &call.req, timeout).await?;
        call.snap = self.snapshot().ok_or(Error::NotReady)?;
        steps::offered(lookup(call)).map_err(|refusal| match failed.into_iter().next() {
            // The server that could own the name did not start: say that, not "unknown".
            Some(error) if refusal.is_unknown() => error.into(),
            _ => refusal,
        })
    }

    /// Starts the servers whose tool lists decide a call's name. The starts run on their own
    /// (bounded by the start timeout); the call waits for them at most `timeout`, and not past
    /// shutdown's cut-off. Returns the servers that could not be started.
    async fn fetch_for_call(
        self: &Arc<Self>,
        servers: Vec<Arc<Server>>,
        req: &CallRequest,
        timeout: Duration,
    ) -> Result<Vec<Error>, Error> {
        let first = servers.first().map(|s| s.name.clone());
        let fetch = {
            let proxy = self.clone();
            let session = req.session.clone();
            tokio::spawn(async move {
                let errors = proxy.fetch_lists(&servers, &session).await;
                if proxy.rebuild().await {
                    proxy.notify(ListKind::Tools).await;
                }
                errors
            })
        };
        tokio::select! {
            joined = tokio::time::timeout(timeout, fetch) => match joined {
                Ok(Ok(errors)) => Ok(errors),
                Ok(Err(e)) => Err(Error::Other(format!("listing the tools failed: {e}"))),
                Err(_) => Err(match first {
                    Some(server) => Error::Timeout { server, timeout },
                    None => Error::Other("listing the tools timed out".into()),
                }),
            },
            () = self.cut_off.cancelled() => Err(Error::ShuttingDown),
        }
    }

    /// Intent mode's `retrieve_tools`: the enabled tools matching the query, from the current
    /// table. Servers whose list is not known yet are started first (in parallel), as
    /// `tools/list` does in direct mode; one that fails is named in the answer.
    async fn retrieve_tools(&self, call: &Call, query: &intent::Query) -> CallToolResponse {
        let (table, unavailable) = self.with_lists(&call.snap, &call.req.session).await;
        let table = table.as_deref().unwrap_or(&call.snap);
        let answer = intent::retrieved(table, &call.req, query, &unavailable);
        self.ledger()
            .answered(table, &call.req, call.started, &answer);
        answer
    }

    /// The last step: forward the call and record what came of it.
    async fn forward_call(
        self: &Arc<Self>,
        call: &Call,
        route: &Route,
        approved: Option<ApprovalNote>,
    ) -> Result<CallToolResponse, Error> {
        let Call { req, snap, started } = call;
        let timeout = snap.config.call_timeout;
        let span = telemetry::call_span(
            &req.name,
            req.session.id,
            req.session.protocol.as_ref().map(|p| p.as_str()),
            &req.request_id.to_string(),
            &req.meta,
        );
        // Shared mode: the record of the call is written before it goes (a replica killed
        // mid-call leaves it).
        self.ledger()
            .started(snap, req, route, approved.as_ref())
            .await;
        let result = tokio::select! {
            result = self.forward(route, req, timeout).instrument(span.clone()) => result,
            // Shutdown's grace is over: the call is answered now, not cut off silently.
            () = self.cut_off.cancelled() => Err(Error::ShuttingDown),
        };
        let ledger = self.ledger();
        ledger.forwarded(
            snap,
            req,
            route,
            *started,
            &result,
            &span,
            approved.as_ref(),
        );
        result
    }

    /// Every refusal ends here: it is answered, audited and counted as it says.
    fn refuse(&self, call: &Call, refusal: Refusal) -> Result<CallToolResponse, Error> {
        if let Some(outcome) = refusal.approval_outcome() {
            self.metrics.approval(outcome);
        }
        self.ledger()
            .refused(&call.snap, &call.req, call.started, &refusal);
        refusal.answer(&clip(&call.req.name))
    }

    /// What records calls (and changed definitions).
    pub(super) fn ledger(&self) -> Ledger<'_> {
        Ledger {
            audit: &self.audit,
            metrics: &self.metrics,
            task_events: &self.task_events,
        }
    }

    fn gate(&self) -> held::Gate<'_> {
        held::Gate {
            approvals: &self.approvals,
            metrics: &self.metrics,
            cut_off: &self.cut_off,
        }
    }
}

/// Counts a call in flight for draining.
struct InFlight<'a>(&'a Proxy);

impl<'a> InFlight<'a> {
    fn enter(proxy: &'a Proxy) -> Self {
        proxy.calls_in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(proxy)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.calls_in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
