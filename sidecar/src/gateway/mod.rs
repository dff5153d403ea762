//! The model gateway: the task's proxy serves the model API to the agent at `/model` on its
//! listener, behind the agent's credential (the same token as `/mcp`, presented as the API key),
//! and forwards each request to the configured endpoint with the key only the proxy reads
//! (`gateway.keyFile`). Transparent: the body byte for byte, the API's own headers, the answer's
//! status, headers and body as the endpoint sent them, a stream event by event as it arrives.
//! Only the API's requests are forwarded; the agent's credential is never passed on.
//!
//! The task's `gateway.provider` chooses the API ([`api::Api`], one small part each:
//! [`anthropic`] the Messages API, [`openai`] the Responses API, [`gemini`] the Gemini API);
//! [`forward`] itself knows none of them.
//!
//! On the way it holds the task to its budget ([`ledger`]: a request is admitted only when its
//! worst case fits) and measures every response from a copy of its bytes ([`sse`] for a
//! stream): tokens, cost, latency and stop reason into the ledger, the metrics and a
//! `model_request` audit line, and each tool use of the agent's own tools into an
//! `agent_tool_use` line.
//!
//! Modules, in the order they may import each other: [`ledger`] (usage, reservations, cost),
//! [`sse`] (events from a passing stream), [`api`] (what a provider's part answers),
//! [`anthropic`], [`openai`], [`gemini`] (each API: paths, headers, usage and tool uses), `meter`
//! (the response passed on and measured).

pub mod anthropic;
pub mod api;
pub mod gemini;
pub mod ledger;
mod meter;
pub mod openai;
pub mod sse;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::{StreamExt, future::BoxFuture};
use orchestrator_crds::gateway::{ObjectKey, PATH_PREFIX, Provider};

use crate::{
    config::{CaSource, GatewayConfig, KeySource},
    proxy::Proxy,
    sync::lock,
};
use api::{Api, Ask, Call, Kind};
use ledger::{Ledger, Reservation};

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

/// The part of the gateway that speaks `provider`'s API.
pub fn api(provider: Provider) -> &'static dyn Api {
    match provider {
        Provider::Anthropic => &anthropic::Anthropic,
        Provider::OpenAi => &openai::OpenAi,
        Provider::Gemini => &gemini::Gemini,
    }
}

/// The API a request's path (under `/model`) belongs to, for a refusal made before the task's
/// provider is known: its client then shows it as that API's error.
pub fn api_of_path(path: &str) -> &'static dyn Api {
    let path = path.strip_prefix(PATH_PREFIX).unwrap_or(path);
    if path.starts_with("/v1beta/") || path.starts_with("/v1/models/") && path.contains(':') {
        &gemini::Gemini
    } else if path.starts_with("/v1/responses") || path == "/v1/models" {
        &openai::OpenAi
    } else {
        &anthropic::Anthropic
    }
}

/// A refusal made before the task's API is known (no config yet, the credential, the body's
/// size), answered in the Messages API's shape until [`reshape`] knows the request's API.
#[derive(Clone, Debug)]
struct Unshaped {
    kind: Kind,
    message: String,
}

/// An answer in the Messages API's error shape (`{"type":"error","error":{...}}`, `kind` one of
/// its error types), which [`reshape`] turns into the shape of the API the request was for.
pub fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    let kind = Kind::from_anthropic(kind);
    let message = format!("orchestrator gateway: {message}");
    let mut response = refusal(&anthropic::Anthropic, status, kind, &message);
    response.extensions_mut().insert(Unshaped { kind, message });
    response
}

/// An answer in `api`'s error shape, which the agent's runtime shows as it would the API's.
fn refusal(api: &dyn Api, status: StatusCode, kind: Kind, message: &str) -> Response {
    let mut response = (status, axum::Json(api.error_body(status, kind, message))).into_response();
    response.headers_mut().insert(
        "x-orchestrator-gateway",
        HeaderValue::from_static("refused"),
    );
    response
}

/// `response` in the error shape of the API `path` (under `/model`) belongs to, when it is a
/// refusal of [`refuse`]; any other answer as it is.
pub fn reshape(path: &str, response: Response) -> Response {
    let Some(unshaped) = response.extensions().get::<Unshaped>().cloned() else {
        return response;
    };
    let api = api_of_path(path);
    if api.provider() == Provider::Anthropic {
        return response;
    }
    let status = response.status();
    let mut reshaped = refusal(api, status, unshaped.kind, &unshaped.message);
    for (name, value) in response.headers() {
        if !reshaped.headers().contains_key(name) && name != header::CONTENT_LENGTH {
            reshaped.headers_mut().append(name.clone(), value.clone());
        }
    }
    reshaped
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
    let api = api(config.provider);
    let no = |status, kind, message: &str| {
        refusal(
            api,
            status,
            kind,
            &format!("orchestrator gateway: {message}"),
        )
    };
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path()
        .strip_prefix(PATH_PREFIX)
        .unwrap_or_default();
    let Some(route) = api.route(&parts.method, path) else {
        return no(
            StatusCode::NOT_FOUND,
            Kind::NotFound,
            &format!(
                "{} {} is not forwarded: this task's model API is {}, and only {} are",
                parts.method,
                crate::names::clip(parts.uri.path()),
                api.provider().as_str(),
                api.forwarded(),
            ),
        );
    };
    let query = parts.uri.query().unwrap_or_default();
    if let Err(why) = api.query(&route, query) {
        return no(StatusCode::BAD_REQUEST, Kind::InvalidRequest, why);
    }
    // `server::limits::read_body` has read and bounded the body before this.
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return no(
            StatusCode::BAD_REQUEST,
            Kind::InvalidRequest,
            "the body could not be read",
        );
    };
    let ask = if route.call == Call::Catalog {
        None
    } else {
        match api.ask(&route, &body) {
            Ok(ask) => Some(ask),
            Err(why) => return no(StatusCode::BAD_REQUEST, Kind::InvalidRequest, &why),
        }
    };
    if let Some(ask) = &ask
        && !config.allows_model(&ask.model)
    {
        return no(
            StatusCode::FORBIDDEN,
            Kind::Permission,
            &format!(
                "model {:?} is not allowed for this task (its model credential's models)",
                crate::names::clip(&ask.model)
            ),
        );
    }
    let price = ask.as_ref().and_then(|ask| config.price(&ask.model));
    let (reservation, body) = match &ask {
        Some(ask) if route.call == Call::Generate => {
            match admit(&gateway, &config, api, ask, body) {
                Ok((reservation, body)) => (Some(reservation), body),
                Err(refused) => return *refused,
            }
        }
        _ => (None, body),
    };
    let key = match gateway.key(&config.key).await {
        Ok(key) => key,
        Err(why) => {
            tracing::error!(error = %why, "the model gateway has no API key");
            return no(StatusCode::SERVICE_UNAVAILABLE, Kind::Api, &why);
        }
    };
    let key = match api.key_header(&key) {
        Ok(key) => key,
        Err(why) => return no(StatusCode::SERVICE_UNAVAILABLE, Kind::Api, &why),
    };
    let client = match gateway.client(config.ca.as_ref()).await {
        Ok(client) => client,
        Err(why) => {
            tracing::error!(error = %why, "the model gateway cannot reach its endpoint");
            return no(StatusCode::SERVICE_UNAVAILABLE, Kind::Api, &why);
        }
    };
    let mut url = format!("{}{}", config.endpoint, route.path);
    if !query.is_empty() {
        url.push('?');
        url.push_str(query);
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if api.forwards_header(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(key.0, key.1);
    let mut outgoing = client.request(route.method.clone(), &url).headers(headers);
    if route.method == http::Method::POST {
        outgoing = outgoing.body(body);
    }
    let sent = outgoing.send().await;
    let measure = meter::Measure {
        gateway: gateway.clone(),
        config: snap.config.clone(),
        gateway_config: config.clone(),
        api,
        asked_model: ask.as_ref().map_or("-", |a| a.model.as_str()).to_string(),
        streamed: ask.as_ref().is_some_and(|a| a.stream),
        route,
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
            return no(StatusCode::BAD_GATEWAY, Kind::Api, &why);
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
            no(
                StatusCode::BAD_GATEWAY,
                Kind::Api,
                "the endpoint's answer could not be passed on",
            )
        })
}

/// Admits a model request under the task's budget, reserving its worst case: its body's bytes
/// as input tokens and the output it asks for (the API's largest when it asks for no cap). When
/// less is left than that, the body asks for what is left instead (the one change the gateway
/// makes to a body). Refused: the answer in the API's shape.
fn admit(
    gateway: &Gateway,
    config: &GatewayConfig,
    api: &'static dyn Api,
    ask: &Ask,
    body: Bytes,
) -> Result<(Reservation, Bytes), Box<Response>> {
    let no = |status, kind, message: &str| {
        Box::new(refusal(
            api,
            status,
            kind,
            &format!("orchestrator gateway: {message}"),
        ))
    };
    let price = config.price(&ask.model);
    if price.is_none() && config.limits.cost_nanos.is_some() {
        return Err(no(
            StatusCode::BAD_REQUEST,
            Kind::InvalidRequest,
            &format!(
                "model {:?} has no price, and this task has a cost budget: add the model to the \
                 gateway's prices",
                crate::names::clip(&ask.model)
            ),
        ));
    }
    let input = body.len() as u64;
    let asked = ask.max_output.unwrap_or(api.output_ceiling());
    let ask_most = ledger::Ask {
        input,
        output: asked,
        // Every byte an input token written to the cache (the dearer kind).
        input_cost: price.map_or(0, |p| {
            let per_mtok = u128::from(p.cache_write.max(p.input));
            u64::try_from((u128::from(input) * per_mtok).div_ceil(1_000_000)).unwrap_or(u64::MAX)
        }),
        output_price: price.map_or(0, |p| p.output),
    };
    let reservation = match gateway.ledger.admit(&config.limits, ask_most) {
        Ok(reservation) => reservation,
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
                    "budget exceeded: {} s of wall time have passed since the task started, of \
                     {} allowed; a person can raise the TaskRun's spec.budget.wallTimeSeconds",
                    over.used, over.allowed
                )
            } else {
                format!(
                    "budget exceeded: {} would be {} of {} ({} used, {} reserved by requests in \
                     flight); a person can raise the TaskRun's spec.budget.{}",
                    over.limit,
                    over.used + over.reserved + over.wanted,
                    over.allowed,
                    over.used,
                    over.reserved,
                    over.limit
                )
            };
            return Err(no(StatusCode::TOO_MANY_REQUESTS, Kind::Budget, &why));
        }
    };
    if reservation.output() >= asked {
        return Ok((reservation, body));
    }
    match api.clamp(&body, reservation.output()) {
        Some(clamped) => Ok((reservation, clamped.into())),
        // Never sent asking for more than was reserved.
        None => Err(no(
            StatusCode::BAD_REQUEST,
            Kind::InvalidRequest,
            "the request's output cap cannot be lowered to what is left of the budget",
        )),
    }
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
