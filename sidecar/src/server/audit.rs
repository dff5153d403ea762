//! `GET /audit`: the recent audit records kept in memory, filtered (`decision`, `risk`,
//! `server`, `tool`, `since`, `limit`), newest last, as `{"records": [...], "matched": n,
//! "dropped": n}`. A bad parameter is a 400 naming it and what it accepts.

use std::sync::Arc;

use axum::{
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::{audit::query, proxy::Proxy};

pub async fn audit(
    State(proxy): State<Arc<Proxy>>,
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
    let found = proxy
        .audit
        .ring()
        .find(query.limit, |entry| query.matches(entry));
    // The kept lines are JSON objects already: joined, not parsed and serialized again.
    let size: usize = found.records.iter().map(|r| r.json().len() + 1).sum();
    let mut body = Vec::with_capacity(size + 64);
    body.extend_from_slice(b"{\"records\":[");
    for (i, record) in found.records.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(record.json());
    }
    body.extend_from_slice(
        format!(
            "],\"matched\":{},\"dropped\":{}}}",
            found.matched, found.dropped
        )
        .as_bytes(),
    );
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
