//! `GET /audit`: the recent audit records kept in memory, filtered (`decision`, `risk`,
//! `server`, `tool`, `since`, `limit`), newest last, as `{"records": [...], "matched": n,
//! "dropped": n}`. A bad parameter is a 400 naming it and what it accepts.
//!
//! What an answer holds is bounded however its client behaves: the body is streamed from the
//! kept records themselves (shared with the ring, never copied into one buffer), at most
//! [`ANSWERS_AT_ONCE`] answers are sent at a time, and an answer its client has not taken within
//! [`ANSWER_DEADLINE`] closes its connection (freeing what it held). When all are taken, a new
//! request ends the answer that has made no progress for longest, if that one has been stalled
//! for [`STALLED`], so clients that ask and never read cannot lock out one that reads; else it
//! gets 503 with `Retry-After`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Extension,
    body::{Body, Bytes},
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::listener::ConnAbort;
use crate::{
    audit::{query, ring::Entry},
    proxy::Proxy,
    sync::lock,
};

/// `/audit` answers sent at once.
pub const ANSWERS_AT_ONCE: usize = 8;
/// How long one answer may take to be read by its client.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(30);
/// An answer that sent nothing for this long may be ended for a new request.
pub const STALLED: Duration = Duration::from_secs(1);
/// Chunks queued ahead of a slow client (each a record or a separator).
const QUEUED: usize = 4;

/// What the `/audit` route needs.
#[derive(Clone)]
pub struct AuditState {
    pub proxy: Arc<Proxy>,
    answers: Arc<Answers>,
}

impl AuditState {
    pub fn new(proxy: Arc<Proxy>) -> Self {
        Self {
            proxy,
            answers: Arc::new(Answers {
                slots: Arc::new(Semaphore::new(ANSWERS_AT_ONCE)),
                active: Mutex::default(),
                next: AtomicU64::new(0),
                epoch: Instant::now(),
            }),
        }
    }
}

/// The answers being sent.
struct Answers {
    slots: Arc<Semaphore>,
    active: Mutex<HashMap<u64, Active>>,
    next: AtomicU64,
    /// What progress times count from.
    epoch: Instant,
}

struct Active {
    /// Milliseconds since `epoch` of the answer's last chunk taken by its client.
    progress: Arc<AtomicU64>,
    end: CancellationToken,
}

impl Answers {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A slot for a new answer: a free one, or the one of the answer stalled for longest (ended
    /// for it), if any has been stalled for [`STALLED`].
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        let now = self.now_ms();
        let stalled = lock(&self.active)
            .values()
            .map(|a| (a.progress.load(Ordering::Relaxed), a.end.clone()))
            .filter(|(at, _)| now.saturating_sub(*at) >= STALLED.as_millis() as u64)
            .min_by_key(|(at, _)| *at);
        let (_, end) = stalled?;
        end.cancel();
        tokio::time::timeout(STALLED, self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }
}

pub async fn audit(
    State(state): State<AuditState>,
    conn: Option<Extension<ConnAbort>>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Response {
    let query = match query::Query::parse(&pairs, jiff::Timestamp::now()) {
        Ok(query) => query,
        Err(bad) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({
                    "error": bad.to_string(),
                    "parameter": bad.parameter,
                })),
            )
                .into_response();
        }
    };
    let answers = state.answers.clone();
    let Some(permit) = answers.slot().await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            axum::Json(serde_json::json!({
                "error": format!("{ANSWERS_AT_ONCE} /audit answers are being sent already; retry in a moment"),
            })),
        )
            .into_response();
    };
    let found = state
        .proxy
        .audit
        .ring()
        .find(query.limit, |entry| query.matches(entry));
    let id = answers.next.fetch_add(1, Ordering::Relaxed);
    let progress = Arc::new(AtomicU64::new(answers.now_ms()));
    let end = CancellationToken::new();
    lock(&answers.active).insert(
        id,
        Active {
            progress: progress.clone(),
            end: end.clone(),
        },
    );
    let conn = conn.map(|Extension(ConnAbort(token))| token);
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUED);
    tokio::spawn(async move {
        let _permit = permit;
        let deadline = tokio::time::Instant::now() + ANSWER_DEADLINE;
        let tail = format!(
            "],\"matched\":{},\"dropped\":{}}}",
            found.matched, found.dropped
        );
        let chunks = std::iter::once(Bytes::from_static(b"{\"records\":["))
            .chain(
                found
                    .records
                    .into_iter()
                    .enumerate()
                    .flat_map(|(i, entry)| {
                        let comma = (i > 0).then(|| Bytes::from_static(b","));
                        comma
                            .into_iter()
                            .chain(std::iter::once(Bytes::from_owner(Line(entry))))
                    }),
            )
            .chain(std::iter::once(Bytes::from(tail)))
            // The end marker: an empty chunk after the whole document.
            .chain(std::iter::once(Bytes::new()));
        let mut complete = true;
        for chunk in chunks {
            let sent = tokio::select! {
                sent = tokio::time::timeout_at(deadline, tx.send(chunk)) => matches!(sent, Ok(Ok(()))),
                () = end.cancelled() => false,
            };
            if !sent {
                complete = false;
                break;
            }
            progress.store(answers.now_ms(), Ordering::Relaxed);
        }
        lock(&answers.active).remove(&id);
        // Not taken in time (or ended for another request): the connection is closed, so what
        // it holds (its queue, what hyper buffered) goes, and its client sees a broken answer.
        if !complete {
            tracing::info!(
                closing = conn.is_some(),
                "an /audit answer was not taken in time, or was ended for another request"
            );
            if let Some(conn) = conn {
                conn.cancel();
            }
        }
    });
    let body = futures::stream::unfold((rx, false), |(mut rx, done)| async move {
        if done {
            return None;
        }
        match rx.recv().await {
            Some(chunk) if chunk.is_empty() => None,
            Some(chunk) => Some((Ok(chunk), (rx, false))),
            // Cut off before the end: an error, so the client sees a broken answer, not a short
            // one.
            None => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the /audit answer was not read in time",
                )),
                (rx, true),
            )),
        }
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

/// A kept record's JSON as a body chunk, without copying it.
struct Line(Arc<Entry>);

impl AsRef<[u8]> for Line {
    fn as_ref(&self) -> &[u8] {
        self.0.json()
    }
}
