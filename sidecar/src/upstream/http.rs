//! Streamable-HTTP upstreams: the rmcp client transport with headers taken from the proxy's
//! environment (how tokens arrive without being written into the config), over a client that
//! watches each call's answer stream ([`Watched`]).

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use rmcp::{
    model::{ClientJsonRpcMessage, RequestId},
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpClientTransportConfig,
            StreamableHttpError, StreamableHttpPostResponse,
        },
    },
};
use sse_stream::Sse;

use super::routes::CallRoutes;
use crate::{
    config::HttpTransport,
    error::{Error, Result},
    names::ServerName,
    sync::lock,
};

/// Builds the transport; fails when a header's variable (or Secret key) is not set or not a
/// valid header value.
pub fn transport(
    server: &ServerName,
    spec: &HttpTransport,
    secrets: &super::shared::SecretValues,
    routes: Arc<CallRoutes>,
) -> Result<StreamableHttpClientTransport<Watched>> {
    let mut headers = HashMap::new();
    let fail = |reason: String| Error::StartFailed {
        server: server.clone(),
        reason,
    };
    let from_env = spec.headers_from_env.iter().map(|(name, var)| {
        let value = std::env::var(var)
            .map_err(|_| format!("header {name}: environment variable {var} is not set"));
        (name, format!("the value of {var}"), value)
    });
    let from_secret = spec.headers_from_secret.iter().map(|(name, at)| {
        // A value written from a file often ends with a newline, which no header carries.
        let value = secrets.get(&at.name, &at.key).map(|v| v.trim_end_matches(['\r', '\n']).to_string()).ok_or_else(|| {
            format!(
                "header {name}: key {} of the task's Secret {} could not be read (does it exist, and may the task's Role get it?)",
                at.key, at.name
            )
        });
        (name, format!("key {} of Secret {}", at.key, at.name), value)
    });
    for (name, source, value) in from_env.chain(from_secret) {
        let value = value.map_err(fail)?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| fail(format!("{name:?} is not a valid header name")))?;
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            fail(format!(
                "header {name}: {source} is not a valid header value"
            ))
        })?;
        // Keeps the value out of debug output.
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(spec.url.clone());
    config.custom_headers = headers;
    // One message on a call's stream (rmcp bounds a plain JSON answer at 16 MiB itself).
    config.max_sse_event_size = crate::memory::bounds().result;
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| Error::StartFailed {
            server: server.clone(),
            reason: format!("http client: {e}"),
        })?;
    Ok(StreamableHttpClientTransport::with_client(
        Watched {
            inner: client,
            routes,
        },
        config,
    ))
}

/// The HTTP client of one upstream connection. An upstream may end the SSE stream of a call
/// before it answers (SEP-1699 polling: it asks the client to come back with `Last-Event-ID`,
/// which rmcp does); the client of the proxy then sees the same: its stream of that call is
/// ended too ([`CallRoutes::stream_cut`]), and it resumes from the proxy.
#[derive(Clone)]
pub struct Watched {
    inner: reqwest::Client,
    routes: Arc<CallRoutes>,
}

type Events = BoxStream<'static, std::result::Result<Sse, SseError>>;

impl Watched {
    fn watch_response(
        &self,
        response: StreamableHttpPostResponse,
        id: Option<RequestId>,
    ) -> StreamableHttpPostResponse {
        match (response, id) {
            (StreamableHttpPostResponse::Sse(events, session), Some(id)) => {
                StreamableHttpPostResponse::Sse(self.watch(events, id), session)
            }
            (other, _) => other,
        }
    }

    /// `events`, reporting a clean end before the answer to `id` of a stream the upstream had
    /// made resumable (an event id or a `retry` sent: SEP-1699 polling). A stream that broke
    /// (an error) is the upstream failing, not asking to be polled: nothing is reported.
    fn watch(&self, events: Events, id: RequestId) -> Events {
        let routes = self.routes.clone();
        let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
        let marks = seen.clone();
        let at_end = futures::stream::once(async move {
            if lock(&seen).asks_to_resume() {
                routes.stream_cut(&id);
            }
            None
        })
        .filter_map(std::future::ready);
        events
            .inspect(move |event| lock(&marks).note(event))
            .chain(at_end)
            .boxed()
    }
}

/// What went by on a call's stream.
#[derive(Default)]
struct Seen {
    /// An event id or a `retry` came: the stream can be resumed.
    resumable: bool,
    /// A JSON-RPC response or error came (the call's answer: a request's stream carries no
    /// other response).
    answered: bool,
    /// The stream failed.
    broken: bool,
}

impl Seen {
    fn note(&mut self, event: &std::result::Result<Sse, SseError>) {
        match event {
            Ok(sse) => {
                self.resumable |= sse.id.is_some() || sse.retry.is_some();
                self.answered |= sse.data.as_deref().is_some_and(is_answer);
            }
            Err(_) => self.broken = true,
        }
    }

    fn asks_to_resume(&self) -> bool {
        self.resumable && !self.answered && !self.broken
    }
}

fn is_answer(data: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Head {
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_str::<Head>(data).is_ok_and(|h| h.result.is_some() || h.error.is_some())
}

impl StreamableHttpClient for Watched {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> std::result::Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        let id = request_id(&message);
        let response = self
            .inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await?;
        Ok(self.watch_response(response, id))
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> std::result::Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        let id = request_id(&message);
        let response = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(self.watch_response(response, id))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> std::result::Result<(), StreamableHttpError<reqwest::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> std::result::Result<Events, StreamableHttpError<reqwest::Error>> {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> std::result::Result<Events, StreamableHttpError<reqwest::Error>> {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
        _ => None,
    }
}

/// Longest quote of an upstream's bytes in an error message.
const MAX_SUMMARY: usize = 512;

/// When a request to an HTTP upstream failed because its reply was not an MCP message (a body
/// that is not JSON-RPC, an unexpected content type): what it said, bounded. `None` for other
/// failures (connection refused, reset, ...), which mean the upstream is gone.
pub fn protocol_failure(error: &rmcp::ServiceError) -> Option<String> {
    let rmcp::ServiceError::TransportSend(e) = error else {
        return None;
    };
    let what = match e
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()?
    {
        // rmcp's text quotes the start of the body (at most 256 bytes).
        StreamableHttpError::UnexpectedServerResponse(text) => text.to_string(),
        StreamableHttpError::UnexpectedContentType(ct) => format!(
            "a reply of content type {:?} (expected application/json or text/event-stream)",
            ct.as_deref().unwrap_or("(none)")
        ),
        StreamableHttpError::Deserialize(e) => format!("an unreadable JSON-RPC message: {e}"),
        _ => return None,
    };
    Some(bounded(&what))
}

fn bounded(text: &str) -> String {
    if text.len() <= MAX_SUMMARY {
        return text.to_string();
    }
    let mut end = MAX_SUMMARY;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…(+{} bytes)", &text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn send_error(e: StreamableHttpError<reqwest::Error>) -> rmcp::ServiceError {
        rmcp::ServiceError::TransportSend(rmcp::transport::DynamicTransportError::from_parts(
            "http",
            std::any::TypeId::of::<()>(),
            Box::new(e),
        ))
    }

    #[test]
    fn unreadable_replies_are_protocol_failures_with_their_bytes_bounded() {
        let body = format!("HTTP 200: <html>{}</html>", "x".repeat(2000));
        let what = protocol_failure(&send_error(StreamableHttpError::UnexpectedServerResponse(
            Cow::Owned(body),
        )))
        .expect("a protocol failure");
        assert!(what.starts_with("HTTP 200: <html>xxx"), "{what}");
        assert!(what.len() < MAX_SUMMARY + 32, "{}", what.len());
        let ct = protocol_failure(&send_error(StreamableHttpError::UnexpectedContentType(
            Some("text/html".into()),
        )))
        .expect("a protocol failure");
        assert!(ct.contains("text/html"), "{ct}");
        assert_eq!(
            protocol_failure(&send_error(StreamableHttpError::TransportChannelClosed)),
            None
        );
        assert_eq!(protocol_failure(&rmcp::ServiceError::TransportClosed), None);
    }
}
