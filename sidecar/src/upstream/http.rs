//! Streamable-HTTP upstreams: the rmcp client transport with headers taken from the proxy's
//! environment (how tokens arrive without being written into the config).

use std::collections::HashMap;

use http::{HeaderName, HeaderValue};
use rmcp::transport::{
    StreamableHttpClientTransport,
    streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError},
};

use crate::{
    config::HttpTransport,
    error::{Error, Result},
    names::ServerName,
};

/// Builds the transport; fails when a header's variable is not set or not a valid header value.
pub fn transport(
    server: &ServerName,
    spec: &HttpTransport,
) -> Result<StreamableHttpClientTransport<reqwest::Client>> {
    let mut headers = HashMap::new();
    for (name, var) in &spec.headers_from_env {
        let fail = |reason: String| Error::StartFailed {
            server: server.clone(),
            reason,
        };
        let value = std::env::var(var).map_err(|_| {
            fail(format!(
                "header {name}: environment variable {var} is not set"
            ))
        })?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| fail(format!("{name:?} is not a valid header name")))?;
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            fail(format!(
                "header {name}: the value of {var} is not a valid header value"
            ))
        })?;
        // Keeps the value out of debug output.
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(spec.url.clone());
    config.custom_headers = headers;
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| Error::StartFailed {
            server: server.clone(),
            reason: format!("http client: {e}"),
        })?;
    Ok(StreamableHttpClientTransport::with_client(client, config))
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
