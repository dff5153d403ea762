//! Calls held for a person's decision (`policy.requireApproval`): the bounded set of pending
//! requests, published as the JSON text of the Lease annotation `orchestrator.io/approval-requests` (the
//! reporter is `api::approvals`), and the verdicts the operator writes into the task
//! ConfigMap's key [`VERDICTS_KEY`] (through the API watch or the mounted file), each resolving
//! its pending call once.
//!
//! A held call owns a [`Held`]; dropping it (decided, expired, cancelled, shut down) takes its
//! request out of the published set. Nothing here waits or talks to the API.

#[cfg(test)]
mod tests;

use std::{
    collections::{HashSet, VecDeque},
    hash::{BuildHasher, RandomState},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use orchestrator_crds::approval::{
    ApprovalRequest, MAX_PENDING, MAX_REASON_CHARS, VERDICTS_KEY, Verdict, clip, summarize,
};
use rmcp::model::JsonObject;
use tokio::sync::{oneshot, watch};

use crate::{metrics::Metrics, sync::lock};

/// The annotation's value stays below this many bytes.
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;
/// One request's share of it (the array's brackets and commas fit in what is left).
const MAX_REQUEST_BYTES: usize = MAX_ANNOTATION_BYTES / MAX_PENDING - 2;
/// The longest tool name a request carries (MCP clients limit names to 128).
const MAX_TOOL_CHARS: usize = 128;
/// The longest `decidedBy` kept from a verdict.
const MAX_DECIDED_BY_CHARS: usize = 512;
/// The longest id a verdict may name (the ToolApproval's `spec.id` limit).
const MAX_ID_CHARS: usize = 64;
/// Ids issued lately, and ids a verdict document named, are never issued again; this many of
/// each are remembered.
const REMEMBERED_IDS: usize = 1024;
/// What replaces an argument's view that does not fit a request's share of the annotation.
const OMITTED: &str = "<omitted: too long for the request>";

/// The pending calls and what decides them.
pub struct Approvals {
    inner: Mutex<Inner>,
    /// The annotation's value: the pending requests as a JSON array, oldest first.
    published: watch::Sender<Arc<str>>,
    /// A reporter publishes the requests (the API is used and a Lease named): only then can a
    /// person see a held call.
    visible: AtomicBool,
    metrics: Arc<Metrics>,
    ids: RandomState,
    issued: AtomicU64,
}

#[derive(Default)]
struct Inner {
    pending: Vec<Pending>,
    /// Ids issued lately (oldest first).
    issued: VecDeque<String>,
    /// Ids the last verdict document named.
    named: HashSet<String>,
}

struct Pending {
    request: ApprovalRequest,
    /// `request` as published.
    json: String,
    decide: oneshot::Sender<Verdict>,
}

/// Why a call could not be held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotHeld {
    /// Nothing publishes requests (no Lease): nobody could see the call.
    Unavailable,
    /// [`MAX_PENDING`] calls wait already.
    Busy,
}

/// A held call's place in the pending set; dropping it withdraws the request.
pub struct Held<'a> {
    approvals: &'a Approvals,
    /// As published.
    pub request: ApprovalRequest,
    /// When the wait is over (measured here, not by the timestamps published).
    pub deadline: tokio::time::Instant,
    decided: oneshot::Receiver<Verdict>,
}

impl Held<'_> {
    pub fn id(&self) -> &str {
        &self.request.id
    }

    /// The verdict on this call, once one arrives (cancel-safe).
    pub async fn decided(&mut self) -> Verdict {
        match (&mut self.decided).await {
            Ok(verdict) => verdict,
            // Only `expire` withdraws a request without a verdict: nothing more will come.
            Err(_) => std::future::pending().await,
        }
    }

    /// The wait is over: withdraws the request, unless a verdict came first (returned then).
    pub fn expire(&mut self) -> Option<Verdict> {
        self.approvals.withdraw(&self.request.id);
        self.decided.try_recv().ok()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.approvals.withdraw(&self.request.id);
    }
}

impl Approvals {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Mutex::default(),
            published: watch::Sender::new(Arc::from("[]")),
            visible: AtomicBool::new(false),
            metrics,
            ids: RandomState::new(),
            issued: AtomicU64::new(0),
        }
    }

    /// For the one reporter that publishes the requests on the Lease: the annotation's value,
    /// changed on every change of the pending set. From now on calls can be held.
    pub fn reporter(&self) -> watch::Receiver<Arc<str>> {
        self.visible.store(true, Ordering::Release);
        self.published.subscribe()
    }

    /// Whether a held call can be seen by anyone (see [`Approvals::reporter`]).
    pub fn is_visible(&self) -> bool {
        self.visible.load(Ordering::Acquire)
    }

    /// How many calls wait now.
    pub fn pending(&self) -> usize {
        lock(&self.inner).pending.len()
    }

    /// Holds a call to `tool` of `server` for at most `timeout`: a new request with a bounded,
    /// redacted summary of `arguments`, published at once.
    pub fn hold(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
        timeout: Duration,
    ) -> Result<Held<'_>, NotHeld> {
        if !self.is_visible() {
            return Err(NotHeld::Unavailable);
        }
        let mut inner = lock(&self.inner);
        if inner.pending.len() >= MAX_PENDING {
            return Err(NotHeld::Busy);
        }
        let id = self.new_id(&inner);
        let now = jiff::Timestamp::now();
        let expires = now.checked_add(timeout).unwrap_or(now);
        let (request, json) = fit(ApprovalRequest {
            id: id.clone(),
            server: server.to_string(),
            tool: clip(tool, MAX_TOOL_CHARS),
            arguments: summarize(arguments),
            requested_at: rfc3339(now),
            expires_at: rfc3339(expires),
        });
        let (decide, decided) = oneshot::channel();
        inner.issued.push_back(id);
        if inner.issued.len() > REMEMBERED_IDS {
            inner.issued.pop_front();
        }
        inner.pending.push(Pending {
            request: request.clone(),
            json,
            decide,
        });
        self.publish(&inner);
        tracing::info!(approval = %request.id, server = %request.server, tool = %request.tool, expires_at = %request.expires_at, "call held for approval");
        Ok(Held {
            approvals: self,
            request,
            deadline: tokio::time::Instant::now() + timeout,
            decided,
        })
    }

    /// A verdict document (`approvals.json`: a JSON array of [`Verdict`]s) from `origin`: each
    /// verdict on a pending request decides it; the others (decided, expired, unknown) are
    /// ignored. Entries that are not verdicts are skipped and counted in one warning.
    pub fn verdicts(&self, origin: &str, bytes: &[u8]) {
        let entries: Vec<serde_json::Value> = match serde_json::from_slice(bytes) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(origin, error = %e, "{VERDICTS_KEY} is not a JSON array of verdicts; ignored");
                return;
            }
        };
        let mut named = HashSet::new();
        let mut invalid = 0;
        let mut inner = lock(&self.inner);
        let before = inner.pending.len();
        for entry in entries {
            let verdict = match serde_json::from_value::<Verdict>(entry) {
                Ok(v) if !v.id.is_empty() && v.id.chars().count() <= MAX_ID_CHARS => v,
                _ => {
                    invalid += 1;
                    continue;
                }
            };
            if named.len() < REMEMBERED_IDS {
                named.insert(verdict.id.clone());
            }
            let Some(at) = inner
                .pending
                .iter()
                .position(|p| p.request.id == verdict.id)
            else {
                tracing::debug!(origin, approval = %clip(&verdict.id, MAX_ID_CHARS), "a verdict on a request that is not pending (decided, expired or unknown); ignored");
                continue;
            };
            let pending = inner.pending.remove(at);
            let verdict = Verdict {
                decided_by: clip(&verdict.decided_by, MAX_DECIDED_BY_CHARS),
                reason: verdict.reason.map(|r| clip(&r, MAX_REASON_CHARS)),
                ..verdict
            };
            tracing::info!(origin, approval = %verdict.id, server = %pending.request.server, tool = %pending.request.tool, decision = ?verdict.decision, decided_by = %verdict.decided_by, "approval decided");
            // The call may be ending right now (cancelled): then nobody is left to tell.
            let _ = pending.decide.send(verdict);
        }
        inner.named = named;
        if inner.pending.len() != before {
            self.publish(&inner);
        }
        if invalid > 0 {
            tracing::warn!(
                origin,
                invalid,
                "{VERDICTS_KEY} has entries that are not verdicts; they are ignored"
            );
        }
    }

    /// Takes `id` out of the pending set, if it is still there.
    fn withdraw(&self, id: &str) {
        let mut inner = lock(&self.inner);
        if let Some(at) = inner.pending.iter().position(|p| p.request.id == id) {
            inner.pending.remove(at);
            self.publish(&inner);
        }
    }

    /// The annotation's new value (the caller holds the lock, so values go out in order).
    fn publish(&self, inner: &Inner) {
        let mut text = String::with_capacity(
            2 + inner
                .pending
                .iter()
                .map(|p| p.json.len() + 1)
                .sum::<usize>(),
        );
        text.push('[');
        for (i, p) in inner.pending.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(&p.json);
        }
        text.push(']');
        self.published.send_replace(Arc::from(text));
        self.metrics.approvals_pending(inner.pending.len());
    }

    /// 8 lowercase hex digits, not pending, not issued lately, not named by a verdict.
    fn new_id(&self, inner: &Inner) -> String {
        loop {
            let n = self.issued.fetch_add(1, Ordering::Relaxed);
            let id = format!("{:08x}", self.ids.hash_one(n) as u32);
            let taken = inner.pending.iter().any(|p| p.request.id == id)
                || inner.issued.contains(&id)
                || inner.named.contains(&id);
            if !taken {
                return id;
            }
        }
    }
}

/// A request that fits its share of the annotation, and its JSON: the longest argument views
/// are omitted first, then (very long keys) the whole summary.
fn fit(mut request: ApprovalRequest) -> (ApprovalRequest, String) {
    loop {
        let json = serde_json::to_string(&request).unwrap_or_else(|_| "{}".into());
        if json.len() <= MAX_REQUEST_BYTES {
            return (request, json);
        }
        let longest = request
            .arguments
            .iter()
            .filter(|(_, v)| v.len() > OMITTED.len())
            .max_by_key(|(_, v)| v.len())
            .map(|(k, _)| k.clone());
        match longest {
            Some(key) => {
                request.arguments.insert(key, OMITTED.to_string());
            }
            None if request.arguments.keys().any(|k| k != "…") => {
                let keys = request.arguments.len();
                request.arguments.clear();
                request
                    .arguments
                    .insert("…".into(), format!("{keys} keys, too long to show"));
            }
            // Ids, names and timestamps alone are far below the share.
            None => return (request, json),
        }
    }
}

/// RFC 3339, UTC, to the second.
fn rfc3339(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
