//! Answers a POSTed request with `application/json` when its SSE stream would carry nothing but
//! the response.
//!
//! rmcp's streamable-HTTP server answers every request of a session with a `text/event-stream`
//! (a priming event, the response, the end of the stream): chunked framing, several writes and an
//! SSE parse in the client for what is, for almost every `tools/call`, one JSON object. The
//! transport lets the server choose either content type for a POST whose `Accept` lists both, so
//! this layer reads the stream up to its first message: when that message is the response, the
//! client gets it as a plain JSON body; when it is anything else (progress, a log line, a
//! sampling or elicitation request sent back during the call), the client gets the stream,
//! unchanged, including the events already read. Nothing is lost or reordered either way.
//!
//! Only short request/response methods are looked at (never `subscriptions/listen`, whose stream
//! is meant to stay open), and only for [`PEEK_LIMIT`]: a call still running after that gets its
//! stream (and rmcp's keep-alive events) as before, so a slow tool never holds the response
//! headers long enough to trip a client's read timeout.

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::Response,
};
use futures::StreamExt;
use serde::de::IgnoredAny;
use tokio::time::{Duration, Instant, timeout_at};

/// How long the response's stream is read for a lone response before it is handed over as is.
pub const PEEK_LIMIT: Duration = Duration::from_secs(1);

/// Request/response methods whose answer is usually the only message on the stream.
const SHORT_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "completion/complete",
];

pub async fn json_when_single_response(request: Request, next: Next) -> Response {
    if request.method() != http::Method::POST || !accepts_json(&request) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // rmcp enforces its own body limit; this one only bounds what is held to look at.
    let Ok(bytes) = axum::body::to_bytes(body, rmcp_body_limit()).await else {
        return Response::builder()
            .status(StatusCode::PAYLOAD_TOO_LARGE)
            .body(Body::from("Payload Too Large: the request body is too large"))
            .unwrap_or_default();
    };
    let short = is_short_request(&bytes);
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if !short || response.status() != StatusCode::OK || !is_event_stream(&response) {
        return response;
    }
    let deadline = Instant::now() + PEEK_LIMIT;
    let (mut parts, body) = response.into_parts();
    let mut stream = body.into_data_stream();
    let mut seen: Vec<u8> = Vec::new();
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut scanned = 0;
    loop {
        match first_message(&seen, &mut scanned) {
            Scan::Response(json) => {
                parts.headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                parts.headers.remove(header::CACHE_CONTROL);
                return Response::from_parts(parts, Body::from(json));
            }
            Scan::Other => break,
            Scan::NeedMore => {}
        }
        match timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(chunk))) => {
                seen.extend_from_slice(&chunk);
                chunks.push(chunk);
            }
            // Still running, or the stream ended or failed before any message: hand over
            // what there was and the rest as it comes.
            Err(_) | Ok(Some(Err(_)) | None) => break,
        }
    }
    let replay = futures::stream::iter(chunks.into_iter().map(Ok::<_, axum::Error>));
    Response::from_parts(parts, Body::from_stream(replay.chain(stream)))
}

/// rmcp's default request body limit (its `max_request_body_bytes`).
fn rmcp_body_limit() -> usize {
    rmcp::transport::streamable_http_server::StreamableHttpServerConfig::default()
        .max_request_body_bytes
}

/// A single JSON-RPC request (not a batch, not a notification) for one of [`SHORT_METHODS`].
fn is_short_request(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape<'a> {
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
        id: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Shape>(body)
        .is_ok_and(|s| s.id.is_some() && SHORT_METHODS.contains(&s.method.as_ref()))
}

fn accepts_json(request: &Request) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("application/json") || t == "*/*" || t == "application/*"
        })
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

#[derive(Debug, PartialEq)]
enum Scan {
    /// The first message is a JSON-RPC response: its JSON text.
    Response(String),
    /// The first message is a request or notification: keep streaming.
    Other,
    /// No complete message event yet.
    NeedMore,
}

/// Looks at the complete SSE events in `buf` from `*scanned` on (events without data, such as
/// the priming event and keep-alive comments, are skipped) and classifies the first message.
fn first_message(buf: &[u8], scanned: &mut usize) -> Scan {
    loop {
        let rest = &buf[*scanned..];
        let Some((len, sep)) = event_end(rest) else {
            return Scan::NeedMore;
        };
        let event = &rest[..len];
        *scanned += len + sep;
        let Ok(event) = std::str::from_utf8(event) else {
            return Scan::Other;
        };
        let mut data: Option<String> = None;
        for line in event.lines() {
            if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                }
            }
        }
        let Some(data) = data.filter(|d| !d.trim().is_empty()) else {
            continue;
        };
        return if is_response(&data) {
            Scan::Response(data)
        } else {
            Scan::Other
        };
    }
}

/// The length of the first complete event and of the blank line ending it.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// A JSON-RPC response (result or error with an id), as opposed to a request or notification.
fn is_response(data: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape {
        method: Option<IgnoredAny>,
        id: Option<IgnoredAny>,
        result: Option<IgnoredAny>,
        error: Option<IgnoredAny>,
    }
    serde_json::from_str::<Shape>(data).is_ok_and(|s| {
        s.method.is_none() && s.id.is_some() && (s.result.is_some() || s.error.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Scan {
        first_message(text.as_bytes(), &mut 0)
    }

    #[test]
    fn the_response_after_a_priming_event_is_taken() {
        let text = "id: 0\nretry: 3000\ndata: \n\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n";
        assert_eq!(
            scan(text),
            Scan::Response(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#.into())
        );
        let error = "data: {\"jsonrpc\":\"2.0\",\"id\":\"a\",\"error\":{\"code\":-32601,\"message\":\"x\"}}\r\n\r\n";
        assert!(matches!(scan(error), Scan::Response(_)));
    }

    #[test]
    fn a_notification_or_request_first_keeps_the_stream() {
        let progress = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n";
        assert_eq!(scan(progress), Scan::Other);
        let sampling = "data: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"sampling/createMessage\",\"params\":{}}\n\n";
        assert_eq!(scan(sampling), Scan::Other);
        assert_eq!(scan("data: not json\n\n"), Scan::Other);
    }

    #[test]
    fn only_single_requests_for_short_methods_are_looked_at() {
        let call = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"}}"#;
        assert!(is_short_request(call));
        let listen = br#"{"jsonrpc":"2.0","id":4,"method":"subscriptions/listen","params":{}}"#;
        assert!(!is_short_request(listen));
        let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert!(!is_short_request(note));
        let batch = br#"[{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{}}]"#;
        assert!(!is_short_request(batch));
    }

    #[test]
    fn incomplete_events_ask_for_more_and_resume_where_they_stopped() {
        let mut scanned = 0;
        let first = b"id: 0\nretry: 3000\ndata: \n\n: keep-alive\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,";
        assert_eq!(first_message(first, &mut scanned), Scan::NeedMore);
        assert_eq!(scanned, first.len() - br#"data: {"jsonrpc":"2.0","id":1,"#.len());
        let mut all = first.to_vec();
        all.extend_from_slice(b"\"result\":{\"ok\":true}}\n\n");
        assert_eq!(
            first_message(&all, &mut scanned),
            Scan::Response(r#"{"jsonrpc":"2.0","id":1,"result":{"ok":true}}"#.into())
        );
    }
}
