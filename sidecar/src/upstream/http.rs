//! Streamable-HTTP upstreams: the rmcp client transport with headers taken from the proxy's
//! environment (how tokens arrive without being written into the config).

use std::collections::HashMap;

use http::{HeaderName, HeaderValue};
use rmcp::transport::{
    StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
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
