//! The model gateway: the task's proxy serves the model API to the agent at `/model` on its
//! listener, behind the agent's credential (the same token as `/mcp`, presented as the API key),
//! and forwards each request to the configured endpoint with the key only the proxy reads
//! (`gateway.keyFile`). Transparent: the body byte for byte, the API's own headers, the answer's
//! status, headers and body as the endpoint sent them, a stream event by event as it arrives.
//! Only the API's paths are forwarded ([`anthropic::Endpoint`]); the agent's credential is never
//! passed on.
//!
//! On the way it holds the task to its budget ([`ledger`]: a request is admitted only when its
//! worst case fits) and measures every response from a copy of its bytes ([`sse`] for a
//! stream): tokens, cost, latency and stop reason into the ledger, the metrics and a
//! `model_request` audit line, and each `tool_use` of the agent's own tools into an
//! `agent_tool_use` line.
//!
//! Modules, in the order they may import each other: [`ledger`] (usage and reservations),
//! [`sse`] (events from a passing stream), [`anthropic`] (the Messages API: paths, headers,
//! usage and tool uses), `meter` (the response passed on and measured).

pub mod anthropic;
pub mod ledger;
mod meter;
pub mod sse;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::{StreamExt, future::BoxFuture};
use orchestrator_crds::gateway::ObjectKey;

use crate::{
    config::{CaSource, KeySource, PriceNanos},
    proxy::Proxy,
    sync::lock,
};
use anthropic::{Ask, Endpoint};
use ledger::{Ledger, Tokens};

/// The longest key file read.
const MAX_KEY: u64 = 8 * 1024;

/// Reads the task's Secret and ConfigMap keys through the API (shared mode's `keySecret` and
/// `caConfigMap`); the error says which key of which object could not be read, never a value.
pub trait Reader: Send + Sync {
    fn secret<'a>(&'a self, at: &'a ObjectKey) -> BoxFuture<'a, Result<Vec<u8>, String>>;
    fn config_map<'a>(&'a self, at: &'a ObjectKey) -> BoxFuture<'a, Result<Vec<u8>, String>>;
}

/// The CAs a client was built with.
#[derive(PartialEq, Eq)]
enum Trust {
    File(PathBuf),
    Pem(Vec<u8>),
}

/// A task's gateway: its usage outlives config reloads (a raised budget applies to what was
/// used).
pub struct Gateway {
    proxy: Arc<Proxy>,
    pub ledger: Arc<Ledger>,
    /// The usage after each request, for the report on the task's Lease (`crate::api`).
    usage: tokio::sync::watch::Sender<orchestrator_crds::gateway::ModelUsage>,
    /// The client for the CAs it trusts (rebuilt when they change).
    client: Mutex<Option<(Option<Trust>, reqwest::Client)>>,
    /// Shared mode: reads `keySecret` and `caConfigMap` (none: a sidecar, files only).
    reader: Option<Arc<dyn Reader>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    pub fn new(proxy: Arc<Proxy>) -> Arc<Self> {
        Self::with_reader(proxy, None)
    }

    /// A gateway that reads `keySecret` and `caConfigMap` with `reader` (shared mode).
    pub fn with_reader(proxy: Arc<Proxy>, reader: Option<Arc<dyn Reader>>) -> Arc<Self> {
        Arc::new(Self {
            proxy,
            ledger: Arc::default(),
            usage: tokio::sync::watch::Sender::new(Default::default()),
            client: Mutex::new(None),
            reader,
        })
    }

    fn reader(&self, field: &str) -> Result<&Arc<dyn Reader>, String> {
        self.reader.as_ref().ok_or_else(|| {
            format!(
                "gateway.{field} is read through the API by a shared proxy; this proxy reads \
                 files only (gateway.keyFile, gateway.caFile)"
            )
        })
    }

    /// The API key, as the config says where it is.
    async fn key(&self, source: &KeySource) -> Result<HeaderValue, String> {
        match source {
            KeySource::File(path) => read_key(path),
            KeySource::Secret(at) => {
                let bytes = self.reader("keySecret")?.secret(at).await?;
                key_value(&bytes, &format!("key {} of Secret {}", at.key, at.name))
            }
        }
    }

    /// Follows the usage (a new value after each request).
    pub fn usage_watch(
        &self,
    ) -> tokio::sync::watch::Receiver<orchestrator_crds::gateway::ModelUsage> {
        self.usage.subscribe()
    }

    /// What the ledger counts now (published or not yet).
    pub fn usage_now(&self) -> orchestrator_crds::gateway::ModelUsage {
        self.ledger.usage().to_wire()
    }

    /// Takes up an earlier proxy's count (see [`Ledger::restore`]).
    pub fn restore(&self, usage: &orchestrator_crds::gateway::ModelUsage) {
        self.ledger.restore(usage);
        self.publish();
    }

    fn publish(&self) {
        let usage = self.ledger.usage().to_wire();
        self.usage.send_if_modified(|current| {
            let changed = *current != usage;
            *current = usage;
            changed
        });
    }

    /// The client trusting the CAs the config names.
    async fn client(&self, source: Option<&CaSource>) -> Result<reqwest::Client, String> {
        let trust = match source {
            None => None,
            Some(CaSource::File(path)) => Some(Trust::File(path.clone())),
            Some(CaSource::ConfigMap(at)) => Some(Trust::Pem(
                self.reader("caConfigMap")?.config_map(at).await?,
            )),
        };
        let mut cached = lock(&self.client);
        if let Some((built, client)) = cached.as_ref()
            && *built == trust
        {
            return Ok(client.clone());
        }
        let mut builder = reqwest::Client::builder()
            // The responses are read as they are passed on: no decompression, no redirects
            // (a redirect would be another endpoint).
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(std::time::Duration::from_secs(30))
            .pool_idle_timeout(std::time::Duration::from_secs(60));
        let pem = match &trust {
            None => None,
            Some(Trust::File(ca)) => Some((
                std::fs::read(ca)
                    .map_err(|e| format!("cannot read gateway.caFile {}: {e}", ca.display()))?,
                format!("gateway.caFile {}", ca.display()),
            )),
            Some(Trust::Pem(pem)) => Some((pem.clone(), "gateway.caConfigMap".to_string())),
        };
        if let Some((pem, what)) = pem {
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("{what} is not PEM: {e}"))?;
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder
            .build()
            .map_err(|e| format!("cannot build the gateway's HTTPS client: {e}"))?;
        *cached = Some((trust, client.clone()));
        Ok(client)
    }
}

/// The gateway's routes (`/model/...`), without the credential check (the caller adds it).
pub fn routes(gateway: Arc<Gateway>) -> Router {
    let prefix = orchestrator_crds::gateway::PATH_PREFIX;
    Router::new()
        .route(&format!("{prefix}/{{*path}}"), axum::routing::any(forward))
        .route(prefix, axum::routing::any(forward))
        .with_state(gateway)
}

/// An answer in the API's own error shape (`{"type":"error","error":{...}}`), which the agent's
/// runtime shows as it would the API's.
pub fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    let mut response = (
        status,
        axum::Json(anthropic::error_body(
            kind,
            &format!("orchestrator gateway: {message}"),
        )),
    )
        .into_response();
    response.headers_mut().insert(
        "x-orchestrator-gateway",
        HeaderValue::from_static("refused"),
    );
    response
}

async fn forward(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    let started = Instant::now();
    let Some(snap) = gateway.proxy.snapshot() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "the proxy has no valid config loaded yet",
        );
    };
    let Some(config) = snap.config.gateway.clone() else {
        return refuse(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "this task has no model gateway (its TaskRun names no model credential: spec.model)",
        );
    };
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path()
        .strip_prefix(orchestrator_crds::gateway::PATH_PREFIX)
        .unwrap_or_default();
    let endpoint = Endpoint::route(path).filter(|_| parts.method == http::Method::POST);
    let Some(endpoint) = endpoint else {
        return refuse(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!(
                "{} {} is not forwarded: only POST {p}/v1/messages and POST \
                 {p}/v1/messages/count_tokens are",
                parts.method,
                crate::names::clip(parts.uri.path()),
                p = orchestrator_crds::gateway::PATH_PREFIX
            ),
        );
    };
    let query = parts.uri.query().unwrap_or_default();
    if !anthropic::query_allowed(query) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the only query forwarded is ?beta=true",
        );
    }
    // `server::limits::read_body` has read and bounded the body before this.
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        Err(_) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the body could not be read",
            );
        }
    };
    let ask: Ask = match serde_json::from_slice(&body) {
        Ok(ask) => ask,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("the body is not a Messages request: {e}"),
            );
        }
    };
    if !config.allows_model(&ask.model) {
        return refuse(
            StatusCode::FORBIDDEN,
            "permission_error",
            &format!(
                "model {:?} is not allowed for this task (its model credential's models)",
                crate::names::clip(&ask.model)
            ),
        );
    }
    let price = config.price(&ask.model);
    let reservation = if endpoint == Endpoint::Messages {
        if price.is_none() && config.limits.cost_nanos.is_some() {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!(
                    "model {:?} has no price, and this task has a cost budget: add the model to \
                     the gateway's prices",
                    crate::names::clip(&ask.model)
                ),
            );
        }
        let input = body.len() as u64;
        let ask_most = ledger::Ask {
            input,
            output: ask.max_tokens.unwrap_or(0),
            // Every byte an input token written to the cache (the dearer kind).
            input_cost: price.map_or(0, |p| {
                let per_mtok = u128::from(p.cache_write.max(p.input));
                u64::try_from((u128::from(input) * per_mtok).div_ceil(1_000_000))
                    .unwrap_or(u64::MAX)
            }),
            output_price: price.map_or(0, |p| p.output),
        };
        match gateway.ledger.admit(&config.limits, ask_most) {
            Ok(reservation) => Some(reservation),
            Err(over) => {
                gateway.publish();
                let metrics = &gateway.proxy.metrics;
                metrics.model.refused(&metrics.model_task(), over.limit);
                tracing::warn!(
                    limit = over.limit,
                    used = over.used,
                    reserved = over.reserved,
                    wanted = over.wanted,
                    allowed = over.allowed,
                    "a model request is over the task's budget: refused"
                );
                let why = if over.limit == "wallTimeSeconds" {
                    format!(
                        "budget exceeded: {} s of wall time have passed since the task started, \
                         of {} allowed; a person can raise the TaskRun's \
                         spec.budget.wallTimeSeconds",
                        over.used, over.allowed
                    )
                } else {
                    format!(
                        "budget exceeded: {} would be {} of {} ({} used, {} reserved by requests \
                         in flight); a person can raise the TaskRun's spec.budget.{}",
                        over.limit,
                        over.used + over.reserved + over.wanted,
                        over.allowed,
                        over.used,
                        over.reserved,
                        over.limit
                    )
                };
                return refuse(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", &why);
            }
        }
    } else {
        None
    };
    // What is left of the budget is less than the request asks for: it asks for that instead
    // (the one change the gateway makes to a body).
    let body = match (&reservation, ask.max_tokens) {
        (Some(r), Some(asked)) if r.output() < asked => match clamp(&body, r.output()) {
            Some(clamped) => clamped,
            None => body,
        },
        _ => body,
    };
    let key = match gateway.key(&config.key).await {
        Ok(key) => key,
        Err(why) => {
            tracing::error!(error = %why, "the model gateway has no API key");
            return refuse(StatusCode::SERVICE_UNAVAILABLE, "api_error", &why);
        }
    };
    let client = match gateway.client(config.ca.as_ref()).await {
        Ok(client) => client,
        Err(why) => {
            tracing::error!(error = %why, "the model gateway cannot reach its endpoint");
            return refuse(StatusCode::SERVICE_UNAVAILABLE, "api_error", &why);
        }
    };
    let mut url = format!("{}{}", config.endpoint, endpoint.path());
    if !query.is_empty() {
        url.push('?');
        url.push_str(query);
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if anthropic::forwards_header(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(anthropic::KEY_HEADER, key);
    let sent = client.post(&url).headers(headers).body(body).send().await;
    let measure = meter::Measure {
        gateway: gateway.clone(),
        config: snap.config.clone(),
        gateway_config: config.clone(),
        endpoint,
        asked_model: ask.model,
        streamed: ask.stream.unwrap_or(false),
        price,
        reservation,
        started,
    };
    let upstream = match sent {
        Ok(upstream) => upstream,
        Err(e) => {
            let why = format!("the model endpoint did not answer: {}", error_chain(&e));
            tracing::warn!(error = %why, "model request failed");
            measure.failed();
            return refuse(StatusCode::BAD_GATEWAY, "api_error", &why);
        }
    };
    let status = upstream.status();
    let mut response = Response::builder().status(status.as_u16());
    if let Some(headers) = response.headers_mut() {
        for (name, value) in upstream.headers() {
            if passes_back(name.as_str()) {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    let event_stream = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let metered = measure.stream(
        status.as_u16(),
        event_stream,
        upstream
            .bytes_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other)),
    );
    response
        .body(Body::from_stream(metered))
        .unwrap_or_else(|_| {
            refuse(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "the endpoint's answer could not be passed on",
            )
        })
}

/// `body` asking for at most `max_tokens`.
fn clamp(body: &axum::body::Bytes, max_tokens: u64) -> Option<axum::body::Bytes> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    *value.get_mut("max_tokens")? = max_tokens.into();
    serde_json::to_vec(&value).ok().map(Into::into)
}

/// What `tokens` cost at `price` (cache writes at `cache_write`), in nano-dollars.
fn cost(tokens: &Tokens, cache_write: u64, price: PriceNanos) -> u64 {
    let sum = u128::from(tokens.input_tokens) * u128::from(price.input)
        + u128::from(tokens.cache_creation_input_tokens) * u128::from(cache_write)
        + u128::from(tokens.cache_read_input_tokens) * u128::from(price.cache_read)
        + u128::from(tokens.output_tokens) * u128::from(price.output);
    u64::try_from(sum.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Response headers passed back: all but a hop's own and the length (the body is re-framed).
fn passes_back(name: &str) -> bool {
    !matches!(
        name,
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
            | "content-length"
            | "set-cookie"
    )
}

fn read_key(path: &Path) -> Result<HeaderValue, String> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_KEY).read_to_end(&mut text))
        .map_err(|e| format!("cannot read the API key file {}: {e}", path.display()))?;
    key_value(&text, &format!("the API key file {}", path.display()))
}

/// The key in `bytes` (surrounding whitespace dropped) as a header value never logged; `what`
/// names where it came from.
fn key_value(bytes: &[u8], what: &str) -> Result<HeaderValue, String> {
    let key = bytes.trim_ascii();
    if key.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if key.len() as u64 > MAX_KEY {
        return Err(format!("{what} is longer than {MAX_KEY} bytes"));
    }
    let mut value =
        HeaderValue::from_bytes(key).map_err(|_| format!("{what} is not one header value"))?;
    value.set_sensitive(true);
    Ok(value)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
