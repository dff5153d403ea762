//! Calls held for a person's decision (`policy.requireApproval`): the bounded set of pending
//! requests, published as the JSON text of the Lease annotation `orchestrator.io/approval-requests` (the
//! reporter is `api::approvals`), and the verdicts the operator writes into the task
//! ConfigMap's key [`VERDICTS_KEY`] (through the API watch or the mounted file), each resolving
//! its pending call once.
//!
//! An approval approves one exact call. A request shows every byte of the `tools/call` params
//! the proxy will send, with the task's Secret values masked (`mask`), and names their
//! [`CallDigest`]; a verdict decides the pending call with its id only when it names that
//! digest. One naming another takes the call out as [`Outcome::Mismatch`]: it is never
//! forwarded, and its id is never issued again.
//!
//! Masking confirms no guess, to the agent nor to a reader of the request:
//! - whether a call is held or refused, and every word and number of a refusal, follow from the
//!   call as sent (unmasked) only: [`NotHeld::TooLarge`] measures the request as it would be
//!   with nothing masked. A view that grows past [`MAX_REQUEST_BYTES`] once masked (a
//!   placeholder can be longer than the value: a short value repeated many times), or whose
//!   keys become ambiguous, is held all the same, its params withheld
//!   ([`ApprovalRequest::withheld`]); such a call can only be rejected (an approval of it is
//!   taken as a rejection: nobody saw it);
//! - when something is masked (or withheld) the digest is [`CallDigest::salted`] with a random
//!   [`Salt`] kept here and never published, and `paramsBytes` is the length of the view.
//!
//! A held call owns a [`Held`]; dropping it (decided, expired, cancelled, shut down) takes its
//! request out of the published set. Nothing here waits or talks to the API.
//!
//! Shared mode (several replicas serve one task; [`Approvals::share`]): each request on the
//! Lease is tagged with its `holder`, the replica's pod name, and each replica writes only its
//! own (`lease`, written by `api::holders`). A call needing approval first tries to adopt the
//! entry of the same call held by a replica that is gone ([`Adopter`]): it waits on that id
//! instead of a new one, or is decided at once when its verdict is known. An approved call is
//! forwarded only once its entry is off the Lease ([`Approvals::settled`]), so a replica dying
//! after forwarding leaves nothing to adopt: an approved id is forwarded once.
//!
//! Children: `mask` (the Secret values, and the params as shown), `lease` (the shared pending
//! set's entries), `shared` (shared mode's holder, adoption and settling).

pub mod lease;
pub mod mask;
mod shared;

pub use shared::{Adopted, Adopter, shown_meta};
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::{BuildHasher, RandomState},
    path::PathBuf,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use orchestrator_crds::approval::{
    ApprovalRequest, CALL_DIGEST_VERSION, CallDigest, Decision, MAX_PENDING, MAX_REASON_CHARS,
    MAX_REQUEST_BYTES, VERDICTS_KEY, Verdict, ViewWithheld, clip,
};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::{metrics::Metrics, sync::lock};

use mask::Salt;
pub use mask::{MaskSource, SecretValues};

/// The annotation's value stays within this many bytes: [`MAX_PENDING`] requests of at most
/// [`MAX_REQUEST_BYTES`], the array's brackets and the commas between them.
pub const MAX_ANNOTATION_BYTES: usize = MAX_PENDING * MAX_REQUEST_BYTES + MAX_PENDING + 1;
/// The longest server or tool name a request may carry (the operator lists no longer one).
const MAX_NAME_BYTES: usize = 128;
/// The longest `decidedBy` kept from a verdict.
const MAX_DECIDED_BY_CHARS: usize = 512;
/// The longest id a verdict may name (the ToolApproval's `spec.id` limit).
const MAX_ID_CHARS: usize = 64;
/// The longest digest kept from a verdict (`sha256:` and 64 hex digits).
const MAX_DIGEST_CHARS: usize = 71;
/// Ids issued lately, and ids a verdict document named, are never issued again; this many of
/// each are remembered.
const REMEMBERED_IDS: usize = 1024;

/// The pending calls and what decides them.
pub struct Approvals {
    inner: Mutex<Inner>,
    /// The annotation's value: the pending requests as a JSON array, oldest first.
    published: watch::Sender<Arc<str>>,
    /// Where the requests are published (set by the reporter): only then can a person see a
    /// held call. Its namespace and name (the TaskRun's) are part of every digest.
    place: OnceLock<Place>,
    /// The Secret values masked in what a request shows (`--mask-secrets-dir`; shared mode:
    /// the task's Secrets through the API).
    masks: OnceLock<MaskSource>,
    metrics: Arc<Metrics>,
    ids: RandomState,
    issued: AtomicU64,
    /// Shared mode: this replica's pod name, the `holder` of its requests.
    holder: OnceLock<String>,
    /// Shared mode: what adopts the requests of replicas that are gone.
    adopter: OnceLock<Arc<dyn Adopter>>,
    /// The generation of the pending set the reporter has written (see [`Approvals::settled`]).
    committed: watch::Sender<u64>,
}

/// The Lease the requests are published on: the task's namespace and name.
#[derive(Clone, Debug)]
struct Place {
    namespace: String,
    task: String,
}

#[derive(Default)]
struct Inner {
    pending: Vec<Pending>,
    /// Ids issued lately (oldest first).
    issued: VecDeque<String>,
    /// The salts of the masked requests among them (never published: see [`Salt`]).
    salts: HashMap<String, Salt>,
    /// Ids the last verdict document named.
    named: HashSet<String>,
    /// The verdicts of the last document (at most [`REMEMBERED_IDS`]): shared mode decides an
    /// adopted request with them.
    verdicts: HashMap<String, Verdict>,
    /// Bumped at every change of the pending set.
    generation: u64,
}

struct Pending {
    request: ApprovalRequest,
    /// `request` as published.
    json: String,
    decide: oneshot::Sender<Outcome>,
}

/// The call a person is asked about.
#[derive(Clone, Copy, Debug)]
pub struct HoldCall<'a> {
    pub server: &'a str,
    /// The upstream's name of the tool.
    pub tool: &'a str,
    /// The hash of the tool's definition the call is held against.
    pub definition: &'a str,
    /// The task's context version (its policy) now.
    pub context_version: u64,
    /// The unmasked `tools/call` params the proxy will send (`proxy::call`'s `params_of`).
    pub params: &'a Value,
}

/// What became of a pending call, as a verdict document said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A verdict naming the call's digest.
    Verdict(Verdict),
    /// A verdict on the call's id naming another digest (`named`): it decides nothing, and the
    /// call is not made.
    Mismatch { named: String },
}

/// Why a call could not be held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotHeld {
    /// Nothing publishes requests (no Lease): nobody could see the call.
    Unavailable,
    /// [`MAX_PENDING`] calls wait already.
    Busy,
    /// Its request would take `bytes`, more than [`MAX_REQUEST_BYTES`]: it cannot be shown.
    TooLarge { bytes: usize, limit: usize },
    /// The Secret values to mask cannot be read (`--mask-secrets-dir`): what it says.
    MasksUnreadable(String),
    /// The call cannot be shown (its names are too long, it cannot be written as JSON): why.
    /// Never because of what masking did to it.
    Unshowable(String),
}

/// A held call's place in the pending set; dropping it withdraws the request.
pub struct Held<'a> {
    approvals: &'a Approvals,
    /// As published.
    pub request: ApprovalRequest,
    /// When the wait is over (measured here, not by the timestamps published).
    pub deadline: tokio::time::Instant,
    decided: oneshot::Receiver<Outcome>,
}

impl Held<'_> {
    pub fn id(&self) -> &str {
        &self.request.id
    }

    /// What a verdict document said of this call, once one did (cancel-safe).
    pub async fn decided(&mut self) -> Outcome {
        match (&mut self.decided).await {
            Ok(outcome) => outcome,
            // Only `expire` withdraws a request without a verdict: nothing more will come.
            Err(_) => std::future::pending().await,
        }
    }

    /// The wait is over: withdraws the request, unless a verdict came first (returned then).
    pub fn expire(&mut self) -> Option<Outcome> {
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
            place: OnceLock::new(),
            masks: OnceLock::new(),
            metrics,
            ids: RandomState::new(),
            issued: AtomicU64::new(0),
            holder: OnceLock::new(),
            adopter: OnceLock::new(),
            committed: watch::Sender::new(0),
        }
    }

    /// A request as published: shared mode adds its holder.
    fn entry_json(&self, request: &ApprovalRequest) -> serde_json::Result<String> {
        match self.holder() {
            Some(holder) => serde_json::to_string(&lease::Entry {
                request: request.clone(),
                holder: Some(holder.to_string()),
            }),
            None => serde_json::to_string(request),
        }
    }

    /// For the one reporter that publishes the requests on the Lease `task` in `namespace`:
    /// the annotation's value, changed on every change of the pending set. From now on calls
    /// can be held.
    pub fn reporter(&self, namespace: &str, task: &str) -> watch::Receiver<Arc<str>> {
        let _ = self.place.set(Place {
            namespace: namespace.to_string(),
            task: task.to_string(),
        });
        self.published.subscribe()
    }

    /// Masks the values of the files under `dir` (`<secret>/<key>`) in what requests show
    /// (see [`mask`]); read at each hold. Set once, before calls come.
    pub fn mask_secrets_from(&self, dir: PathBuf) {
        self.mask_secrets_with(MaskSource::Dir(dir));
    }

    /// Masks the values `source` gives in what requests show; read at each hold. Set once,
    /// before calls come.
    pub fn mask_secrets_with(&self, source: MaskSource) {
        let _ = self.masks.set(source);
    }

    /// The Secret values to mask, as they are now (none without a source).
    pub async fn masker(&self) -> Result<mask::Masker, NotHeld> {
        match self.masks.get() {
            Some(source) => source.load().await.map_err(NotHeld::MasksUnreadable),
            None => Ok(mask::Masker::default()),
        }
    }

    /// Whether a held call can be seen by anyone (see [`Approvals::reporter`]).
    pub fn is_visible(&self) -> bool {
        self.place.get().is_some()
    }

    /// How many calls wait now.
    pub fn pending(&self) -> usize {
        lock(&self.inner).pending.len()
    }

    /// [`Approvals::hold_masked`] with the values of a `--mask-secrets-dir` (tests).
    #[cfg(test)]
    pub fn hold(&self, call: HoldCall<'_>, timeout: Duration) -> Result<Held<'_>, NotHeld> {
        let masker = match self.masks.get() {
            Some(MaskSource::Dir(dir)) => {
                mask::Masker::load(dir).map_err(NotHeld::MasksUnreadable)?
            }
            _ => mask::Masker::default(),
        };
        self.hold_masked(call, &masker, timeout)
    }

    /// Holds `call` for at most `timeout`: a new request showing its params with the values of
    /// `masker` masked and naming its digest, published at once. Whether it is held, and why
    /// not, depend only on the call as sent: a view that cannot be shown once masked is
    /// withheld, never refused.
    pub fn hold_masked(
        &self,
        call: HoldCall<'_>,
        masker: &mask::Masker,
        timeout: Duration,
    ) -> Result<Held<'_>, NotHeld> {
        let Some(place) = self.place.get() else {
            return Err(NotHeld::Unavailable);
        };
        if self.pending() >= MAX_PENDING {
            return Err(NotHeld::Busy);
        }
        if call.server.len() > MAX_NAME_BYTES || call.tool.len() > MAX_NAME_BYTES {
            return Err(NotHeld::Unshowable(format!(
                "its server's or tool's name is longer than {MAX_NAME_BYTES} bytes, the most a request may carry"
            )));
        }
        let plain = serde_json::to_string(call.params).map_err(|e| {
            NotHeld::Unshowable(format!("its params cannot be written as JSON ({e})"))
        })?;
        let nonce = self.nonce();
        // Made for every call, used when something is masked (so a failure depends on nothing).
        let salt = Salt::new().ok_or_else(|| {
            NotHeld::Unshowable("the proxy has no randomness to salt its digest with".into())
        })?;
        let mut inner = lock(&self.inner);
        if inner.pending.len() >= MAX_PENDING {
            return Err(NotHeld::Busy);
        }
        let id = self.new_id(&inner);
        let now = jiff::Timestamp::now();
        let expires = now.checked_add(timeout).unwrap_or(now);
        let unsalted = digest(place, &id, &call, None);
        // The request as it would be with nothing masked: what the size limit is held to.
        let mut request = ApprovalRequest {
            digest: unsalted,
            id: id.clone(),
            server: call.server.to_string(),
            tool: call.tool.to_string(),
            definition: call.definition.to_string(),
            context_version: call.context_version,
            params_bytes: u32::try_from(plain.len()).unwrap_or(u32::MAX),
            params: plain,
            masked: Vec::new(),
            mask_nonce: nonce,
            withheld: None,
            requested_at: rfc3339(now),
            expires_at: rfc3339(expires),
        };
        let unshowable = |e: serde_json::Error| {
            NotHeld::Unshowable(format!("its request cannot be written as JSON ({e})"))
        };
        let plain_json = self.entry_json(&request).map_err(unshowable)?;
        if plain_json.len() > MAX_REQUEST_BYTES {
            return Err(NotHeld::TooLarge {
                bytes: plain_json.len(),
                limit: MAX_REQUEST_BYTES,
            });
        }
        // Masked once the call is known to be held (not even a refusal's timing depends on it);
        // what masking makes of the view decides nothing the agent sees (a failure withholds it).
        let shown = masker
            .mask(call.params, &request.mask_nonce)
            .map_err(|e| tracing::warn!(server = %call.server, tool = %call.tool, error = %e, "cannot mask a held call's params; its view is withheld"))
            .ok();
        let (json, salt) = match shown {
            Some(shown) if shown.masked.is_empty() && !shown.ambiguous => (plain_json, None),
            shown => {
                request.digest = digest(place, &id, &call, Some(&salt));
                (request.params, request.withheld, request.params_bytes) = match shown {
                    None => (String::new(), Some(ViewWithheld::Failed), 0),
                    Some(shown) => {
                        let bytes = u32::try_from(shown.text.len()).unwrap_or(u32::MAX);
                        request.masked = shown.masked;
                        match shown.ambiguous {
                            true => (String::new(), Some(ViewWithheld::Ambiguous), bytes),
                            false => (shown.text, None, bytes),
                        }
                    }
                };
                let mut json = self.entry_json(&request).map_err(unshowable)?;
                if json.len() > MAX_REQUEST_BYTES {
                    // Placeholders longer than the values they stand for (a short value many
                    // times): the call is held all the same, its params not shown.
                    request.withheld = Some(ViewWithheld::TooLarge);
                    request.params = String::new();
                    json = self.entry_json(&request).map_err(unshowable)?;
                    // Even the list of what was masked may be too long (long Secret names).
                    while json.len() > MAX_REQUEST_BYTES && request.masked.pop().is_some() {
                        json = self.entry_json(&request).map_err(unshowable)?;
                    }
                }
                (json, Some(salt))
            }
        };
        let (decide, decided) = oneshot::channel();
        if let Some(salt) = salt {
            inner.salts.insert(id.clone(), salt);
        }
        inner.remember(id);
        inner.pending.push(Pending {
            request: request.clone(),
            json,
            decide,
        });
        self.publish(&mut inner);
        tracing::info!(approval = %request.id, server = %request.server, tool = %request.tool, digest = %request.digest, params_bytes = request.params_bytes, masked = request.masked.len(), withheld = ?request.withheld, expires_at = %request.expires_at, "call held for approval");
        Ok(Held {
            approvals: self,
            request,
            deadline: tokio::time::Instant::now() + timeout,
            decided,
        })
    }

    /// The digest of `call` held as `id` (`None` when nothing publishes requests): what
    /// [`Approvals::hold_masked`] computed (salted as it was, when something was masked), for
    /// checking the call again before it is forwarded.
    pub fn digest_of(&self, id: &str, call: &HoldCall<'_>) -> Option<String> {
        let place = self.place.get()?;
        let salt = lock(&self.inner).salts.get(id).cloned();
        Some(digest(place, id, call, salt.as_ref()))
    }

    /// A verdict document (`approvals.json`: a JSON array of [`Verdict`]s) from `origin`: each
    /// verdict on a pending request decides it when it names the request's digest, and takes
    /// it out as [`Outcome::Mismatch`] when it names another; the others (decided, expired,
    /// unknown) are ignored. Entries that are not verdicts are skipped and counted in one
    /// warning.
    pub fn verdicts(&self, origin: &str, bytes: &[u8]) {
        let entries: Vec<serde_json::Value> = match serde_json::from_slice(bytes) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(origin, error = %e, "{VERDICTS_KEY} is not a JSON array of verdicts; ignored");
                return;
            }
        };
        let mut named = HashSet::new();
        let mut known = HashMap::new();
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
            let verdict = Verdict {
                decided_by: clip(&verdict.decided_by, MAX_DECIDED_BY_CHARS),
                reason: verdict.reason.map(|r| clip(&r, MAX_REASON_CHARS)),
                digest: clip(&verdict.digest, MAX_DIGEST_CHARS),
                ..verdict
            };
            if named.len() < REMEMBERED_IDS {
                named.insert(verdict.id.clone());
                known.insert(verdict.id.clone(), verdict.clone());
            }
            let Some(at) = inner
                .pending
                .iter()
                .position(|p| p.request.id == verdict.id)
            else {
                tracing::debug!(origin, approval = %clip(&verdict.id, MAX_ID_CHARS), "a verdict on a request that is not pending (decided, expired or unknown); ignored");
                continue;
            };
            // Out of the pending set either way: an id decides once.
            let pending = inner.pending.remove(at);
            tracing::info!(origin, approval = %verdict.id, "a verdict on a pending request");
            let outcome = outcome_of(verdict, &pending.request);
            // The call may be ending right now (cancelled): then nobody is left to tell.
            let _ = pending.decide.send(outcome);
        }
        inner.named = named;
        inner.verdicts = known;
        if inner.pending.len() != before {
            self.publish(&mut inner);
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
            self.publish(&mut inner);
        }
    }

    /// The annotation's new value (the caller holds the lock, so values go out in order).
    fn publish(&self, inner: &mut Inner) {
        inner.generation += 1;
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

    /// A request's mask nonce: 6 lowercase hex digits the agent cannot foresee (keyed by this
    /// process's random hasher keys).
    fn nonce(&self) -> String {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        format!("{:06x}", self.ids.hash_one(("mask nonce", n)) & 0xff_ffff)
    }
}

/// What `verdict` decides of `request`: itself when it names the request's digest, else a
/// mismatch (the call is not made). An approval of a request whose view was withheld is a
/// rejection: nobody saw the call (the agent is told as of any rejection).
fn outcome_of(verdict: Verdict, request: &ApprovalRequest) -> Outcome {
    if verdict.digest == request.digest
        && verdict.decision == Decision::Approve
        && request.withheld.is_some()
    {
        tracing::warn!(approval = %verdict.id, server = %request.server, tool = %request.tool, decided_by = %verdict.decided_by, "an approval of a call whose params could not be shown counts as a rejection");
        return Outcome::Verdict(Verdict {
            decision: Decision::Reject,
            ..verdict
        });
    }
    if verdict.digest == request.digest {
        tracing::info!(approval = %verdict.id, server = %request.server, tool = %request.tool, decision = ?verdict.decision, decided_by = %verdict.decided_by, "approval decided");
        Outcome::Verdict(verdict)
    } else {
        tracing::warn!(approval = %verdict.id, server = %request.server, tool = %request.tool, named = %verdict.digest, held = %request.digest, decided_by = %verdict.decided_by, "a verdict names another call than the one held under its id; the call is not made");
        Outcome::Mismatch {
            named: verdict.digest,
        }
    }
}

impl Inner {
    /// `id` was issued (or adopted) here: it is never issued again, and its salt is kept while
    /// it is remembered.
    fn remember(&mut self, id: String) {
        self.issued.push_back(id);
        if self.issued.len() > REMEMBERED_IDS
            && let Some(old) = self.issued.pop_front()
        {
            self.salts.remove(&old);
        }
    }
}

/// The [`CallDigest`] of `call` held as `id` where `place` publishes it, salted when something
/// in its view is masked.
fn digest(place: &Place, id: &str, call: &HoldCall<'_>, salt: Option<&Salt>) -> String {
    let call = CallDigest {
        v: CALL_DIGEST_VERSION,
        namespace: &place.namespace,
        task_run: &place.task,
        id,
        server: call.server,
        definition: call.definition,
        context_version: call.context_version,
        params: call.params,
    };
    match salt {
        Some(Salt(salt)) => call.salted(salt),
        None => call.digest(),
    }
}

/// RFC 3339, UTC, to the second.
fn rfc3339(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
