//! `GET /audit`: the recent audit records kept in memory, filtered (`decision`, `risk`,
//! `server`, `tool`, `since`, `limit`), newest last, as `{"records": [...], "matched": n,
//! "dropped": n}`. A bad parameter is a 400 naming it and what it accepts.
//!
//! What an answer holds is bounded however its client behaves: the body is streamed from the
//! kept records themselves (shared with the ring, never copied into one buffer), at most
//! [`ANSWERS_AT_ONCE`] answers are sent at a time (more get 503 with `Retry-After`), and an answer
//! not taken within [`ANSWER_DEADLINE`] is cut off (its connection is closed), so a client that
//! asks and never reads holds no more than a few records, and only that long.

use std::{sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::sync::{Semaphore, mpsc};

use crate::{
    audit::{query, ring::Entry},
    proxy::Proxy,
};

/// `/audit` answers sent at once.
pub const ANSWERS_AT_ONCE: usize = 8;
/// How long one answer may take to be read by its client.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(30);
/// Chunks queued ahead of a slow client (each a record or a separator).
const QUEUED: usize = 4;

/// What the `/audit` route needs.
#[derive(Clone)]
pub struct AuditState {
    pub proxy: Arc<Proxy>,
    pub answers: Arc<Semaphore>,
}

impl AuditState {
    pub fn new(proxy: Arc<Proxy>) -> Self {
        Self {
            proxy,
            answers: Arc::new(Semaphore::new(ANSWERS_AT_ONCE)),
        }
    }
}

pub async fn audit(
    State(state): State<AuditState>,
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
    let Ok(permit) = state.answers.clone().try_acquire_owned() else {
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
            .chain(std::iter::once(Bytes::from(tail)));
        for chunk in chunks {
            match tokio::time::timeout_at(deadline, tx.send(chunk)).await {
                Ok(Ok(())) => {}
                // The client went away, or did not read in time: the records are let go, and
                // the body ends without its end marker (its connection is closed).
                Ok(Err(_)) | Err(_) => return,
            }
        }
        // The end marker: an empty chunk after the whole document.
        let _ = tokio::time::timeout_at(deadline, tx.send(Bytes::new())).await;
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
