//! SSE priming events only for clients that know them. rmcp opens an initialize-era SSE stream
//! with a priming event (SEP-1699, protocol 2025-11-25: an event id, a `retry` time and empty
//! `data`). A client of an older revision parses every event's data as a JSON-RPC message: the
//! TypeScript SDK bundled in Gemini CLI 0.61.0 fails on the empty data ("Unexpected end of JSON
//! input"), calls that a transport error and drops the server, so the agent is offered none of
//! its tools. As the TypeScript SDK's own server does, a stream to a client of a revision before
//! 2025-11-25 starts without it.
//!
//! The revision is the request's `MCP-Protocol-Version` header; an initialize request (which has
//! none yet) names the one it asks for in its params; without either, 2025-03-26 (the spec's
//! default). Only the first event of an SSE answer is looked at, and dropped when it carries no
//! data: the rest streams through untouched.

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::header,
    middleware::Next,
    response::Response,
};
use futures::StreamExt;

/// The first revision whose clients know priming events.
pub const PRIMING_SINCE: &str = "2025-11-25";
/// The spec's revision for a request that names none.
const DEFAULT_REVISION: &str = "2025-03-26";
/// How much of a stream's start is held to find its first event; a first event longer than this
/// is not a priming event (those are a few dozen bytes) and is passed on as it is.
const FIRST_EVENT_MAX: usize = 1024;

/// The middleware: leaves the priming event out of SSE answers to clients of older revisions.
pub async fn old_clients_unprimed(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let header = parts
        .headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // Bodies are whole here (read by `limits::read_body`, the outer layer).
    let (revision, body) = match header {
        Some(revision) => (revision, body),
        None => {
            let bytes = axum::body::to_bytes(body, usize::MAX)
                .await
                .unwrap_or_default();
            (asked_revision(&bytes), Body::from(bytes))
        }
    };
    let response = next.run(Request::from_parts(parts, body)).await;
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !sse || revision.as_str() >= PRIMING_SINCE {
        return response;
    }
    response.map(|body| Body::from_stream(without_priming(body.into_data_stream())))
}

/// The revision an initialize request asks for, or the spec's default.
fn asked_revision(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .filter(|v| v["method"] == "initialize")
        .and_then(|v| v["params"]["protocolVersion"].as_str().map(str::to_string))
        .unwrap_or_else(|| DEFAULT_REVISION.to_string())
}

/// `stream` without its first event when that carries no data (a priming event).
fn without_priming<S, E>(stream: S) -> impl futures::Stream<Item = Result<Bytes, E>>
where
    S: futures::Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    enum State {
        /// Holding the start until the first event is complete.
        Head(Vec<u8>),
        Through,
    }
    let mut state = State::Head(Vec::new());
    stream.flat_map(move |chunk| {
        let out: Vec<Result<Bytes, E>> = match (&mut state, chunk) {
            (State::Through, chunk) => vec![chunk],
            (State::Head(held), Err(e)) => {
                let held = std::mem::take(held);
                state = State::Through;
                vec![Ok(Bytes::from(held)), Err(e)]
            }
            (State::Head(held), Ok(bytes)) => {
                held.extend_from_slice(&bytes);
                match first_event_end(held) {
                    Some(end) => {
                        let held = std::mem::take(held);
                        state = State::Through;
                        let rest = match is_priming(&held[..end]) {
                            true => held[end..].to_vec(),
                            false => held,
                        };
                        vec![Ok(Bytes::from(rest))]
                    }
                    None if held.len() > FIRST_EVENT_MAX => {
                        let held = std::mem::take(held);
                        state = State::Through;
                        vec![Ok(Bytes::from(held))]
                    }
                    None => Vec::new(),
                }
            }
        };
        futures::stream::iter(
            out.into_iter()
                .filter(|c| c.as_ref().map_or(true, |b| !b.is_empty())),
        )
    })
}

/// Where the first event ends (after its blank line), if it has.
fn first_event_end(held: &[u8]) -> Option<usize> {
    let find = |sep: &[u8]| {
        held.windows(sep.len())
            .position(|w| w == sep)
            .map(|i| i + sep.len())
    };
    [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"]
        .into_iter()
        .filter_map(find)
        .min()
}

/// Whether an event carries no data: only `id`, `retry`, comments and empty `data` lines.
fn is_priming(event: &[u8]) -> bool {
    let text = String::from_utf8_lossy(event);
    let mut fields = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(':'));
    fields.all(|line| {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        match name {
            "id" | "retry" => true,
            "data" => value.trim().is_empty(),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn filtered(chunks: &[&str]) -> String {
        let stream = futures::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c.to_string())))
                .collect::<Vec<_>>(),
        );
        let out: Vec<_> = without_priming(stream).collect().await;
        out.into_iter()
            .map(|c| String::from_utf8(c.expect("chunk").to_vec()).expect("utf-8"))
            .collect()
    }

    #[tokio::test]
    async fn the_priming_event_is_left_out_and_the_rest_streams_through() {
        let message = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\nid: 0/1\n\n";
        assert_eq!(
            filtered(&["id: 0\nretry: 3000\ndata:\n\n", message]).await,
            message
        );
        // Split anywhere, in one chunk with the message, with CRLF.
        assert_eq!(
            filtered(&["id: 0\nre", "try: 3000\nda", "ta:\n\n", message]).await,
            message
        );
        assert_eq!(
            filtered(&[&format!("data:\nid: 0\nretry: 3000\n\n{message}")]).await,
            message
        );
        assert_eq!(
            filtered(&["id: 0\r\nretry: 3000\r\ndata:\r\n\r\n", message]).await,
            message
        );
    }

    #[tokio::test]
    async fn a_stream_that_opens_with_a_message_is_untouched() {
        let message = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\nid: 0/1\n\n";
        assert_eq!(
            filtered(&[message, message]).await,
            format!("{message}{message}")
        );
        let named = "event: endpoint\ndata:\n\n";
        assert_eq!(filtered(&[named]).await, named);
        // A long first event is passed on as it is, without waiting for its end.
        let long = format!("data: {}", "x".repeat(FIRST_EVENT_MAX + 1));
        assert_eq!(filtered(&[&long]).await, long);
    }

    #[test]
    fn the_revision_is_the_header_the_initialize_params_or_the_default() {
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#;
        assert_eq!(asked_revision(init), "2025-06-18");
        assert_eq!(
            asked_revision(b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":2}"),
            DEFAULT_REVISION
        );
        assert_eq!(asked_revision(b"not json"), DEFAULT_REVISION);
        assert!("2025-06-18" < PRIMING_SINCE && "2026-07-28" >= PRIMING_SINCE);
    }
}
