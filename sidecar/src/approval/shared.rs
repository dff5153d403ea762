//! Shared mode's side of the pending set: the replica's name as the `holder` of its requests,
//! the adoption of a request held by a replica that is gone ([`Adopter`], implemented over the
//! API by `api::holders`), and [`Approvals::settled`]: an approved call goes only once its
//! request is off the Lease.

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;
use orchestrator_crds::approval::ApprovalRequest;
use serde_json::Value;
use tokio::sync::oneshot;

use super::{Approvals, Held, HoldCall, Outcome, Pending, digest, lease, outcome_of};
use crate::sync::lock;

/// The `_meta` of `request` as its first sender sent it (what a person saw: the call's `params`
/// as shown), `Some(None)` when it had none. `None`: it cannot be known from what was shown (a
/// Secret value is masked in it).
pub fn shown_meta(request: &ApprovalRequest) -> Option<Option<Value>> {
    let shown: Value = serde_json::from_str(&request.params).ok()?;
    let meta = shown.get("_meta").cloned();
    let masked = meta.as_ref().is_some_and(|m| {
        !request.mask_nonce.is_empty() && m.to_string().contains(request.mask_nonce.as_str())
    });
    (!masked).then_some(meta)
}

/// `params` (a call sent again) with the `_meta` of `request`'s first sender: a client sends
/// a call again with `_meta` of its own (Claude Code: a new `claudecode/toolUseId`), and the
/// adopted request was approved as first sent, so that is what is compared, and forwarded
/// (`proxy::call::held`). `None`: the first `_meta` cannot be known.
fn as_first_sent(params: &Value, request: &ApprovalRequest) -> Option<Value> {
    let meta = shown_meta(request)?;
    let mut params = params.clone();
    let object = params.as_object_mut()?;
    match meta {
        Some(meta) => object.insert("_meta".into(), meta),
        None => object.remove("_meta"),
    };
    Some(params)
}

/// Shared mode: finds the entry of `call` held by a replica that is gone and takes it over
/// (`api::holders`, through [`Approvals::adopted`] and [`Approvals::known_verdict`]).
pub trait Adopter: Send + Sync {
    fn adopt<'a>(
        &'a self,
        approvals: &'a Approvals,
        call: HoldCall<'a>,
    ) -> BoxFuture<'a, Option<Adopted<'a>>>;
}

/// A call that adopted another replica's request.
pub enum Adopted<'a> {
    /// It waits for the request's verdict, as if held here.
    Held(Held<'a>),
    /// The verdict was known: the request left the Lease, and this is what it decided.
    Decided {
        request: ApprovalRequest,
        outcome: Outcome,
    },
}

impl Approvals {
    /// Shared mode: requests are tagged with `holder` (this replica's pod name), and calls
    /// first try `adopter`. Set once, with the reporter, before calls come.
    pub fn share(&self, holder: String, adopter: Arc<dyn Adopter>) {
        let _ = self.holder.set(holder);
        let _ = self.adopter.set(adopter);
    }

    /// Shared mode: this replica's pod name.
    pub fn holder(&self) -> Option<&str> {
        self.holder.get().map(String::as_str)
    }

    /// The pending set as published now, and its generation.
    pub fn current(&self) -> (u64, Arc<str>) {
        let inner = lock(&self.inner);
        (inner.generation, self.published.borrow().clone())
    }

    /// The reporter wrote the pending set of `generation` (or a later one).
    pub fn committed(&self, generation: u64) {
        self.committed.send_if_modified(|c| {
            let newer = generation > *c;
            if newer {
                *c = generation;
            }
            newer
        });
    }

    /// Waits until the pending set as it is now is written on the Lease: after a verdict, the
    /// request is off it. `false`: not within `within`.
    pub async fn settled(&self, within: Duration) -> bool {
        let wanted = lock(&self.inner).generation;
        let mut committed = self.committed.subscribe();
        tokio::time::timeout(within, committed.wait_for(|c| *c >= wanted))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether this process held `id` (issued or adopted it, lately): its entry on the Lease is
    /// its own to change.
    pub fn held_here(&self, id: &str) -> bool {
        let inner = lock(&self.inner);
        inner.issued.iter().any(|i| i == id) || inner.pending.iter().any(|p| p.request.id == id)
    }

    /// Shared mode: the entries of `current` (the Lease's value) `call` may adopt (see
    /// [`lease::candidates`]): its digest recomputed with each entry's id must be the entry's.
    /// A request with something masked is never adopted: its digest is salted with a value
    /// only the replica that held it knew (the call is held anew).
    pub fn adoptable(&self, current: Option<&str>, call: &HoldCall<'_>) -> Vec<lease::Entry> {
        let (Some(place), Some(me)) = (self.place.get(), self.holder()) else {
            return Vec::new();
        };
        lease::candidates(
            current,
            me,
            |id| self.held_here(id),
            |r| {
                r.server == call.server
                    && as_first_sent(call.params, r).is_some_and(|params| {
                        let call = HoldCall {
                            params: &params,
                            ..*call
                        };
                        digest(place, &r.id, &call, None) == r.digest
                    })
            },
            jiff::Timestamp::now(),
        )
    }

    /// What the last verdict document decided of `request`, if it named its id.
    pub fn known_verdict(&self, request: &ApprovalRequest) -> Option<Outcome> {
        let inner = lock(&self.inner);
        let verdict = inner.verdicts.get(&request.id)?;
        Some(outcome_of(verdict.clone(), request))
    }

    /// Tries the adopter (shared mode) for `call`: `None` when there is none, or nothing to
    /// adopt.
    pub async fn adopt<'a>(&'a self, call: HoldCall<'a>) -> Option<Adopted<'a>> {
        self.adopter.get()?.adopt(self, call).await
    }

    /// A request adopted from a replica that is gone (its entry now names this one as holder),
    /// held here until its expiry. A verdict on it that came meanwhile decides it at once.
    pub fn adopted(&self, request: ApprovalRequest) -> Held<'_> {
        let now = jiff::Timestamp::now();
        let left = request
            .expires_at
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|e| now.until(e).ok())
            .and_then(|span| Duration::try_from(span).ok())
            .unwrap_or_default();
        let (decide, decided) = oneshot::channel();
        let mut inner = lock(&self.inner);
        inner.remember(request.id.clone());
        let known = inner
            .verdicts
            .get(&request.id)
            .map(|v| outcome_of(v.clone(), &request));
        match known {
            Some(outcome) => {
                let _ = decide.send(outcome);
                // Its entry names this replica now: the next write takes it out.
                self.publish(&mut inner);
            }
            None => {
                let json = self.entry_json(&request).unwrap_or_default();
                inner.pending.push(Pending {
                    request: request.clone(),
                    json,
                    decide,
                });
                self.publish(&mut inner);
            }
        }
        tracing::info!(approval = %request.id, server = %request.server, tool = %request.tool, digest = %request.digest, expires_at = %request.expires_at, "adopted a call held for approval by a replica that is gone");
        Held {
            approvals: self,
            request,
            deadline: tokio::time::Instant::now() + left,
            decided,
        }
    }
}
