//! Bounds on what a client can make the HTTP front hold: the request body ([`MAX_BODY`], the same
//! limit rmcp applies, read within [`BODY_READ_TIMEOUT`]), and all bodies at once: those whose
//! [`weight`](crate::memory::weight) is larger than [`SMALL_BODY`] share the process-wide budget
//! of large bodies ([`memory::Bounds::bodies`]) from their first byte to their answer's last (a
//! body is held several times over while it is parsed, checked, masked and forwarded), so many
//! concurrent large bodies get 503 instead of the container's memory limit, and one that could
//! never fit gets 413 (the session cap is `sessions`'). Also the JSON-RPC answer to a body rmcp
//! cannot read as a message.

use std::time::Duration;

use axum::{
    body::{Body, BodyDataStream, Bytes},
    extract::Request,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use rmcp::model::{ClientJsonRpcMessage, ProtocolVersion, RequestId};
use tokio::sync::OwnedSemaphorePermit;

use crate::{
    error::Error,
    memory::{self, BODY_UNIT as UNIT},
    names::clip,
};

/// The largest request body, in bytes; rmcp is given the same limit.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// The largest model request body (`/model`): the Messages API's own limit (32 MB), so the
/// gateway refuses nothing the API would take. It shares the budget of large bodies: one this
/// large waits for no other large body to be in flight (503 and `retry-after` otherwise).
pub const MAX_MODEL_BODY: usize = 32 * 1024 * 1024;
/// A request body must arrive within this (a client trickling one holds a connection).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Bodies up to this size and weight are not counted: with at most `listener::MAX_CONNECTIONS`
/// requests at once they hold 16 MiB at most (parsed), and an agent's ordinary calls are far
/// smaller.
pub const SMALL_BODY: usize = 64 * 1024;

/// Takes `bytes` more of the budget onto `held` (none: the first), or says it is spent.
fn reserve(held: &mut Option<OwnedSemaphorePermit>, bytes: usize) -> Result<(), Collect> {
    let units = u32::try_from(bytes.div_ceil(UNIT)).map_err(|_| Collect::Busy)?;
    if units == 0 {
        return Ok(());
    }
    let more = memory::bodies()
        .clone()
        .try_acquire_many_owned(units)
        .map_err(|_| Collect::Busy)?;
    match held {
        Some(h) => h.merge(more),
        None => *held = Some(more),
    }
    Ok(())
}

/// The budget left, in bytes (tests, metrics).
pub fn budget_left() -> usize {
    memory::bodies().available_permits() * UNIT
}

/// Takes the rest of what `bytes` weighs once parsed onto `held`: `Busy` when the budget cannot
/// hold it now, `TooLarge` when it never could.
fn reserve_weight(held: &mut Option<OwnedSemaphorePermit>, bytes: &[u8]) -> Result<(), Collect> {
    let weight = memory::weight(bytes);
    if weight <= SMALL_BODY {
        return Ok(());
    }
    if weight > memory::bounds().bodies {
        return Err(Collect::TooHeavy(weight));
    }
    let have = held.as_ref().map_or(0, |h| h.num_permits() * UNIT);
    if weight > have {
        reserve(held, weight - have)?;
    }
    Ok(())
}

/// Reads a POST body whole (bounded in size and time) before anything else looks at it, so the
/// layers inside see a complete body and rmcp's own limit never has to cut a stream. A JSON body
/// rmcp cannot read as a JSON-RPC message (it answers 415 and a text) gets a JSON-RPC error.
pub async fn read_body(request: Request, next: Next) -> Response {
    read_body_upto(MAX_BODY, plain, request, next).await
}

/// How a body that cannot be read is answered: its status and what went wrong.
pub type Refusal = fn(StatusCode, String) -> Response;

/// The answer as text (MCP's front).
fn plain(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

/// [`read_body`] up to `max` bytes, refusals answered by `answer` (the model gateway: up to
/// [`MAX_MODEL_BODY`], in the model API's error shape).
pub async fn read_body_with(
    axum::extract::State((max, answer)): axum::extract::State<(usize, Refusal)>,
    request: Request,
    next: Next,
) -> Response {
    read_body_upto(max, answer, request, next).await
}

async fn read_body_upto(max: usize, answer: Refusal, request: Request, next: Next) -> Response {
    if request.method() != http::Method::POST {
        return next.run(request).await;
    }
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split_once(';').map_or(v, |(e, _)| e);
            essence.trim().eq_ignore_ascii_case("application/json")
        });
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large(max, answer);
    }
    let (parts, body) = request.into_parts();
    let mut held = None;
    // A declared size is reserved at once: a body that cannot fit is refused without being kept.
    if let Some(n) = declared.map(|n| n as usize).filter(|n| *n > SMALL_BODY)
        && reserve(&mut held, n).is_err()
    {
        return busy(body.into_data_stream(), max, answer).await;
    }
    let mut stream = body.into_data_stream();
    let read = collect(&mut stream, max, declared.map(|n| n as usize), &mut held);
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, read).await;
    let read = match read {
        Ok(Ok(bytes)) => Ok(reserve_weight(&mut held, &bytes).map(|()| bytes)),
        other => other,
    };
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(Collect::TooLarge)) => return too_large(max, answer),
        Ok(Err(Collect::TooHeavy(weight))) => return too_heavy(weight, answer),
        Ok(Err(Collect::Busy)) => return busy(stream, max, answer).await,
        Ok(Err(Collect::Broken)) => {
            return answer(
                StatusCode::BAD_REQUEST,
                "Bad Request: the body could not be read".into(),
            );
        }
        Err(_) => {
            return answer(
                StatusCode::REQUEST_TIMEOUT,
                "Request Timeout: the body did not arrive in time".into(),
            );
        }
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    if json && response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return unreadable(&bytes);
    }
    drop(bytes);
    match held {
        // The budget is given back when the answer is sent (an SSE answer streams while its call
        // runs, holding the request's arguments).
        Some(permit) => response.map(|body| {
            Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _ = &permit;
                chunk
            }))
        }),
        None => response,
    }
}

/// The JSON-RPC error for a body that is not a message: not JSON at all (-32700), JSON but not a
/// JSON-RPC 2.0 message (-32600), or a request whose params do not fit its method (-32602).
fn unreadable(body: &[u8]) -> Response {
    let value = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => value,
        Err(e) => {
            return json_rpc_error(StatusCode::BAD_REQUEST, Error::Parse(e.to_string()), None);
        }
    };
    let id = value
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    let why = serde_json::from_value::<ClientJsonRpcMessage>(value.clone())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let method = value.get("method").and_then(|m| m.as_str());
    let error = match method {
        Some(method) if value.get("jsonrpc").and_then(|v| v.as_str()) == Some("2.0") => {
            Error::InvalidParams(format!("{}: {why}", clip(method)))
        }
        _ => Error::InvalidRequest(format!(
            "not a JSON-RPC 2.0 request, notification or response: {why}"
        )),
    };
    json_rpc_error(StatusCode::BAD_REQUEST, error, id)
}

enum Collect {
    TooLarge,
    /// Its weight once parsed, beyond the whole budget.
    TooHeavy(usize),
    Broken,
    Busy,
}

/// Reads the body whole; past [`SMALL_BODY`] (when no size was declared and reserved) it takes
/// the budget as it grows.
async fn collect(
    stream: &mut BodyDataStream,
    max: usize,
    declared: Option<usize>,
    held: &mut Option<OwnedSemaphorePermit>,
) -> Result<Bytes, Collect> {
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut reserved = if held.is_some() {
        declared.unwrap_or(0)
    } else {
        SMALL_BODY
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| Collect::Broken)?;
        // Once a second chunk came, `more` holds the first too.
        let held_so_far = if more.is_empty() {
            first.as_ref().map_or(0, Bytes::len)
        } else {
            more.len()
        };
        let len = held_so_far + chunk.len();
        if len > max {
            return Err(Collect::TooLarge);
        }
        if len > reserved {
            // Steps of 256 KiB, so a trickled body does not take the budget a KiB at a time.
            let upto = len.next_multiple_of(256 * 1024).min(max);
            let first_step = held.is_none();
            reserve(held, upto - if first_step { 0 } else { reserved })?;
            reserved = upto;
        }
        match &first {
            // Most bodies arrive in one chunk: keep it without copying.
            None => first = Some(chunk),
            Some(f) => {
                if more.is_empty() {
                    // The declared size at once: no doubling past it while the body arrives.
                    more.reserve(declared.unwrap_or(0).min(max).max(len));
                    more.extend_from_slice(f);
                }
                more.extend_from_slice(&chunk);
            }
        }
    }
    Ok(if more.is_empty() {
        first.unwrap_or_default()
    } else {
        more.into()
    })
}

/// 503 for a body the budget cannot hold: the rest of it is read and dropped first (bounded in
/// size and time, keeping nothing), so its client, still sending, reads the answer instead of a
/// reset connection.
async fn busy(mut stream: BodyDataStream, max: usize, answer: Refusal) -> Response {
    let drain = async {
        let mut seen = 0usize;
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len();
            if seen > max {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(BODY_READ_TIMEOUT, drain).await;
    let mut response = answer(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "Service Unavailable: large request bodies in flight already hold the proxy's budget \
             ({}, --max-bodies-bytes); send it again in a moment\n",
            memory::human(memory::bounds().bodies)
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// 413 for a body within [`MAX_BODY`] whose parsed size would be beyond the whole budget.
fn too_heavy(weight: usize, answer: Refusal) -> Response {
    answer(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "Payload Too Large: the request body would take about {} once parsed, more than the \
             proxy's budget for request bodies ({}, --max-bodies-bytes); send fewer or flatter \
             values",
            memory::human(weight),
            memory::human(memory::bounds().bodies)
        ),
    )
}

fn too_large(max: usize, answer: Refusal) -> Response {
    answer(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("Payload Too Large: request body exceeds {max} bytes"),
    )
}

/// A POST without a session id on the initialize lifecycle (2026-07-28 requests carry their
/// version and never open a session).
pub(super) fn may_open_session(request: &Request) -> bool {
    request.method() == http::Method::POST
        && !request.headers().contains_key("mcp-session-id")
        && !modern(request.headers())
}

pub(super) fn modern(headers: &HeaderMap) -> bool {
    headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28.as_str())
}

/// The id of an `initialize` request, if that is what `body` is.
pub(super) fn initialize_id(body: &[u8]) -> Option<RequestId> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow)]
        method: Option<&'a str>,
        id: Option<RequestId>,
    }
    let head: Head = serde_json::from_slice(body).ok()?;
    (head.method == Some("initialize"))
        .then_some(head.id)
        .flatten()
}

/// An HTTP response carrying a JSON-RPC error built from `error` (`"id": null` when the request's
/// id is not known, as JSON-RPC 2.0 asks).
pub fn json_rpc_error(status: StatusCode, error: Error, id: Option<RequestId>) -> Response {
    let message = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error.to_mcp()});
    match serde_json::to_vec(&message) {
        Ok(body) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(_) => status.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_weighed_as_parsed_and_one_heavier_than_the_budget_is_refused() {
        let mut held = None;
        let light = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#;
        assert!(reserve_weight(&mut held, light).is_ok() && held.is_none());
        // 2 MB of text, a million values: far more once parsed than the whole budget.
        let heavy = format!("[{}0]", "0,".repeat(1_000_000));
        assert!(matches!(
            reserve_weight(&mut held, heavy.as_bytes()),
            Err(Collect::TooHeavy(weight)) if weight > memory::bounds().bodies
        ));
        assert!(held.is_none(), "nothing is held for a refused body");
    }

    #[test]
    fn only_initialize_requests_are_counted_as_new_sessions() {
        let init = br#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}"#;
        assert_eq!(initialize_id(init), Some(RequestId::Number(7)));
        for other in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#[..],
            br#"{"jsonrpc":"2.0","method":"initialize"}"#,
            b"not json",
        ] {
            assert_eq!(initialize_id(other), None);
        }
    }
}
