//! Who is calling: the `Authorization: Bearer <token>` of a request, checked by the API server
//! (a TokenReview with `spec.audiences: [audience]`), to an [`Identity`]: the ServiceAccount and
//! the pod the token was issued to. Only a token the API server authenticates for our audience,
//! of a ServiceAccount, bound to a pod (its `pod-uid` extra) is accepted.
//!
//! The JWT's payload is read without trusting it, only for `exp`: an expired token is refused
//! without a review, and a review's answer is cached (by the token's SHA-256) until then. Refusals
//! are cached for [`FAILURE_TTL`], so a flood of bad tokens costs one review per token per 5 s.
//! Concurrent requests with one token wait for one review (single flight). The cache holds at
//! most `max_entries`, the oldest evicted first. A review the API server could not answer is not
//! cached (the next request asks again).

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use sha2::{Digest, Sha256};
use std::time::Instant;

use tokio::sync::OnceCell;

use crate::sync::lock;

/// How long a refused token stays refused without another review.
pub const FAILURE_TTL: Duration = Duration::from_secs(5);
/// The default bound of the cache.
pub const MAX_ENTRIES: usize = 10_000;
/// A review that takes longer is abandoned (the request gets 503).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The extra the API server puts in a pod-bound token's user info.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// The pod's name, next to [`POD_UID_EXTRA`].
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The caller, as the API server vouched for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub username: String,
    pub pod_name: String,
    pub pod_uid: String,
}

/// Why a request was not authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// HTTP 401: no token, not a JWT, expired, or not accepted (for the log only: the client is
    /// told no more than `invalid_token`).
    Invalid(String),
    /// HTTP 503: the API server could not be asked.
    Unavailable(String),
}

type Verdict = Result<Arc<Identity>, Refused>;

/// The TokenReview call, behind a trait so tests can count reviews.
pub trait Reviewer: Send + Sync + 'static {
    fn review(
        &self,
        token: String,
        audience: String,
    ) -> BoxFuture<'static, anyhow::Result<TokenReviewStatus>>;
}

/// Reviews through the API server with the proxy's own identity (`create tokenreviews`).
pub struct KubeReviewer(pub kube::Client);

impl Reviewer for KubeReviewer {
    fn review(
        &self,
        token: String,
        audience: String,
    ) -> BoxFuture<'static, anyhow::Result<TokenReviewStatus>> {
        let api: kube::Api<TokenReview> = kube::Api::all(self.0.clone());
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    audiences: Some(vec![audience]),
                    token: Some(token),
                },
                ..Default::default()
            };
            let answer = api
                .create(&kube::api::PostParams::default(), &review)
                .await?;
            answer
                .status
                .ok_or_else(|| anyhow::anyhow!("the TokenReview came back without a status"))
        })
    }
}

struct Cached {
    verdict: Verdict,
    until: Instant,
    seq: u64,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<[u8; 32], Cached>,
    /// Insertion order (key, seq): the oldest is evicted first; stale pairs are skipped.
    order: VecDeque<([u8; 32], u64)>,
    seq: u64,
    inflight: HashMap<[u8; 32], Arc<OnceCell<Verdict>>>,
}

/// Checks bearer tokens, with the cache described above.
pub struct Authenticator {
    reviewer: Arc<dyn Reviewer>,
    audience: String,
    max_entries: usize,
    cache: Mutex<Cache>,
    /// The cache's clock (tests move it by hand).
    clock: Clock,
}

/// Where the cache reads the time.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

impl Authenticator {
    pub fn new(reviewer: Arc<dyn Reviewer>, audience: String, max_entries: usize) -> Arc<Self> {
        Arc::new(Self {
            reviewer,
            audience,
            max_entries: max_entries.max(1),
            cache: Default::default(),
            clock: Arc::new(Instant::now),
        })
    }

    /// The same, reading the time from `clock`.
    pub fn with_clock(
        reviewer: Arc<dyn Reviewer>,
        audience: String,
        max_entries: usize,
        clock: Clock,
    ) -> Arc<Self> {
        let mut this = Self::new(reviewer, audience, max_entries);
        if let Some(inner) = Arc::get_mut(&mut this) {
            inner.clock = clock;
        }
        this
    }

    /// The identity behind an `Authorization` header's value.
    pub async fn authenticate(self: &Arc<Self>, header: Option<&str>) -> Verdict {
        let token = bearer(header)?;
        let exp = expiry(token)?;
        let now_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if exp <= now_unix {
            return Err(Refused::Invalid("the token has expired".into()));
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cell = {
            let mut cache = lock(&self.cache);
            if let Some(hit) = cache.entries.get(&key)
                && hit.until > (self.clock)()
            {
                return hit.verdict.clone();
            }
            // A review whose every waiter went away (clients that hung up) leaves its cell;
            // forget those before they add up.
            if cache.inflight.len() >= self.max_entries {
                cache
                    .inflight
                    .retain(|_, cell| Arc::strong_count(cell) > 1 || cell.initialized());
            }
            cache.inflight.entry(key).or_default().clone()
        };
        let this = self.clone();
        let token = token.to_string();
        cell.get_or_init(|| async move {
            let verdict = this.review(token).await;
            let mut cache = lock(&this.cache);
            cache.inflight.remove(&key);
            let ttl = match &verdict {
                Ok(_) => Some(Duration::from_secs(exp - now_unix)),
                Err(Refused::Invalid(_)) => Some(FAILURE_TTL),
                Err(Refused::Unavailable(_)) => None,
            };
            if let Some(ttl) = ttl {
                let until = (this.clock)() + ttl;
                cache.insert(key, verdict.clone(), until, this.max_entries);
            }
            verdict
        })
        .await
        .clone()
    }

    async fn review(&self, token: String) -> Verdict {
        let asked = self.reviewer.review(token, self.audience.clone());
        let status = match tokio::time::timeout(REVIEW_TIMEOUT, asked).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => return Err(Refused::Unavailable(format!("the TokenReview failed: {e}"))),
            Err(_) => {
                return Err(Refused::Unavailable(format!(
                    "no TokenReview answer within {}s",
                    REVIEW_TIMEOUT.as_secs()
                )));
            }
        };
        accept(&status, &self.audience).map(Arc::new)
    }

    /// Entries held now (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.cache).entries.len()
    }
}

impl Cache {
    fn insert(&mut self, key: [u8; 32], verdict: Verdict, until: Instant, max: usize) {
        self.seq += 1;
        let seq = self.seq;
        self.entries.insert(
            key,
            Cached {
                verdict,
                until,
                seq,
            },
        );
        self.order.push_back((key, seq));
        while self.entries.len() > max {
            let Some((old, old_seq)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&old).is_some_and(|e| e.seq == old_seq) {
                self.entries.remove(&old);
            }
        }
        // Re-inserted keys leave stale pairs behind: keep the queue bounded too.
        if self.order.len() > 2 * max {
            let entries = &self.entries;
            self.order
                .retain(|(k, s)| entries.get(k).is_some_and(|e| e.seq == *s));
        }
    }
}

/// The token of `Bearer <token>`.
fn bearer(header: Option<&str>) -> Result<&str, Refused> {
    let header = header.ok_or_else(|| Refused::Invalid("no Authorization header".into()))?;
    let (scheme, token) = header.split_once(' ').ok_or_else(|| {
        Refused::Invalid("the Authorization header is not `Bearer <token>`".into())
    })?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || token.contains(char::is_whitespace)
    {
        return Err(Refused::Invalid(
            "the Authorization header is not `Bearer <token>`".into(),
        ));
    }
    Ok(token)
}

/// The JWT's `exp` (seconds since the epoch), read without checking the signature: only to
/// refuse an expired token early and to bound how long its review is cached.
fn expiry(token: &str) -> Result<u64, Refused> {
    let malformed = || Refused::Invalid("the token is not a JWT with an exp claim".into());
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let bytes = base64url(payload).ok_or_else(malformed)?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| malformed())?;
    claims
        .get("exp")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(malformed)
}

/// Decodes unpadded (or padded) base64url.
fn base64url(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

/// What a review must say for the token to be accepted.
fn accept(status: &TokenReviewStatus, audience: &str) -> Result<Identity, Refused> {
    if status.authenticated != Some(true) {
        let why = status.error.as_deref().unwrap_or("not authenticated");
        return Err(Refused::Invalid(format!(
            "the API server did not authenticate the token: {why}"
        )));
    }
    if !status.audiences.iter().flatten().any(|a| a == audience) {
        return Err(Refused::Invalid(format!(
            "the token is not for the audience {audience}"
        )));
    }
    let user = status.user.as_ref();
    let username = user.and_then(|u| u.username.clone()).unwrap_or_default();
    if !username.starts_with(SERVICE_ACCOUNT_PREFIX) {
        return Err(Refused::Invalid(format!(
            "{username:?} is not a ServiceAccount"
        )));
    }
    let extra = |key: &str| {
        user.and_then(|u| u.extra.as_ref())
            .and_then(|e| e.get(key))
            .and_then(|v| v.first())
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let (Some(pod_uid), Some(pod_name)) = (extra(POD_UID_EXTRA), extra(POD_NAME_EXTRA)) else {
        return Err(Refused::Invalid(format!(
            "the token of {username} is not bound to a pod"
        )));
    };
    Ok(Identity {
        username,
        pod_name,
        pod_uid,
    })
}

#[cfg(test)]
mod tests;
