//! The HTTP app: MCP at `/mcp` (behind a `Host` check that follows config reloads, the client
//! credential of `auth`, the body and session limits of `limits`), and `/healthz`, `/readyz`,
//! `/metrics`, `GET /tools`, `GET /audit` (`super::audit`; these three for the agent or an
//! auditor), and the model gateway at `/model` (`crate::gateway`).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{
    Front,
    auth::{self, Access, ClientAuth},
    hosts, limits, priming, sessions,
};
use crate::{proxy::Proxy, router::KnownTool};

/// The HTTP front's settings (flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    /// An initialize-era session with no message either way for this long is closed; zero:
    /// never.
    pub session_idle: Duration,
    /// Initialize-era sessions open at once.
    pub max_sessions: usize,
    /// Who may call (`/mcp`) and read (`/tools`, `/audit`, `/metrics`); open when empty.
    pub auth: ClientAuth,
    /// The model gateway at `/model` (one is made for the app when `None`).
    pub gateway: Option<Arc<crate::gateway::Gateway>>,
}

/// Builds the whole HTTP app.
pub fn app(proxy: Arc<Proxy>, settings: &Settings, cancel: CancellationToken) -> Router {
    let listen = settings.listen;
    let mcp = mcp(proxy.clone(), settings, cancel);
    // What the task runs, its rules and pids, its calls and its metrics are not for other web
    // pages.
    let audit = Router::new()
        .route("/audit", get(super::audit::audit))
        .with_state(super::audit::AuditState::new(proxy.clone()));
    let reading = Router::new()
        .route("/metrics", get(metrics))
        .route("/tools", get(tools))
        .with_state(proxy.clone())
        .merge(audit)
        .layer(middleware::from_fn_with_state(
            (settings.auth.clone(), Access::Read),
            auth::require,
        ));
    // The credential is checked before the body is read or a session opened.
    let mcp = mcp.layer(middleware::from_fn_with_state(
        (settings.auth.clone(), Access::Call),
        auth::require,
    ));
    // The model gateway: the agent's credential (as its API key), the body bounded by the
    // model API's own limit, a refused body answered in the API's error shape.
    let gateway = settings
        .gateway
        .clone()
        .unwrap_or_else(|| crate::gateway::Gateway::new(proxy.clone()));
    let gateway = model(gateway).layer(middleware::from_fn_with_state(
        (settings.auth.clone(), Access::Model),
        auth::require,
    ));
    let revealing = reading
        .merge(mcp)
        .merge(gateway)
        .layer(middleware::from_fn_with_state(
            (proxy.clone(), listen),
            hosts::check_host,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(proxy)
        .merge(revealing)
}

/// The model gateway at `/model` for one proxy, the body bounded by the model API's own limit
/// and a refused body answered in the API's error shape; no credential check (the caller adds
/// it). Shared mode builds one per task.
pub fn model(gateway: Arc<crate::gateway::Gateway>) -> Router {
    let model_body: (usize, limits::Refusal) = (limits::MAX_MODEL_BODY, model_body_refusal);
    crate::gateway::routes(gateway).layer(middleware::from_fn_with_state(
        model_body,
        limits::read_body_with,
    ))
}

/// MCP at `/mcp` for one proxy: its own session manager (so a session id means nothing to
/// another proxy's), with the body and session limits; no Host check (the caller adds it). Shared
/// mode builds one per task.
pub fn mcp(proxy: Arc<Proxy>, settings: &Settings, cancel: CancellationToken) -> Router {
    let mut sessions = LocalSessionManager::default();
    // rmcp closes a session when no message went either way for this long; zero: never.
    sessions.session_config.keep_alive =
        (!settings.session_idle.is_zero()).then_some(settings.session_idle);
    let sessions = Arc::new(sessions);
    let config = StreamableHttpServerConfig::default()
        // The Host check is done by `hosts::check_host` so it follows config reloads.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(limits::MAX_BODY)
        // A 2026-07-28 request answered by its result alone (no progress, no question back)
        // gets it as one JSON body: one write instead of an SSE stream's several, measured
        // 10 µs of CPU and 0.03-0.05 ms p50 less per call (docs/benchmarks.md). Initialize-era
        // sessions keep rmcp's SSE answers.
        .with_json_response(true)
        .with_cancellation_token(cancel);
    let cap = Arc::new(sessions::SessionCap::new(
        sessions.clone(),
        settings.max_sessions,
    ));
    let mcp = StreamableHttpService::new(move || Ok(Front::new(proxy.clone())), sessions, config);
    Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn(priming::old_clients_unprimed))
        .layer(middleware::from_fn(session_delete_status))
        .layer(middleware::from_fn_with_state(cap, sessions::session_cap))
        .layer(middleware::from_fn(limits::read_body))
}

/// `GET /metrics` of every task the process serves (shared mode's `--metrics-listen`), and
/// nothing else (404).
pub fn shared_metrics_app(metrics: Arc<crate::metrics::Metrics>) -> Router {
    let not_found = || async { (StatusCode::NOT_FOUND, "Not Found\n") };
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { openmetrics(metrics.encode()) }
            }),
        )
        .method_not_allowed_fallback(not_found)
        .fallback(not_found)
}

fn openmetrics(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The metrics listener's app (`--metrics-listen`): `GET /metrics` and nothing else (404), so
/// an address other pods reach shows no MCP, no `/tools`, no `/audit`.
pub fn metrics_app(proxy: Arc<Proxy>, listen: SocketAddr) -> Router {
    let not_found = || async { (StatusCode::NOT_FOUND, "Not Found\n") };
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(proxy.clone())
        .layer(middleware::from_fn_with_state(
            (proxy, listen),
            hosts::check_metrics_host,
        ))
        .method_not_allowed_fallback(not_found)
        .fallback(not_found)
}

async fn readyz(State(proxy): State<Arc<Proxy>>) -> Response {
    match proxy.snapshot() {
        Some(_) if !proxy.is_draining() => (StatusCode::OK, "ready\n").into_response(),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no valid config loaded\n").into_response(),
    }
}

async fn metrics(State(proxy): State<Arc<Proxy>>) -> Response {
    openmetrics(proxy.metrics.encode())
}

/// Every upstream tool known so far with its verdict, per server.
async fn tools(State(proxy): State<Arc<Proxy>>) -> Response {
    let Some(snap) = proxy.snapshot() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "no valid config loaded"})),
        )
            .into_response();
    };
    let states = proxy.upstream_states();
    let pids = proxy.pool.pids();
    let servers: Vec<_> = snap
        .config
        .servers
        .iter()
        .map(|s| {
            let (state, in_flight) = states.get(&s.name).copied().unwrap_or(("stopped", 0));
            // Both revisions' tables; a tool listed in both is shown once.
            let mut tools: Vec<&KnownTool> = Vec::new();
            for known in snap.routers().iter().flat_map(|r| r.known()) {
                if known.server == s.name && !tools.iter().any(|t| t.tool == known.tool) {
                    tools.push(known);
                }
            }
            let list_known = s.is_startable()
                && snap
                    .routers()
                    .iter()
                    .any(|r| !r.missing_lists().iter().any(|m| m.name == s.name));
            json!({
                "name": s.name,
                "enabled": s.enabled,
                "startable": s.is_startable(),
                "state": state,
                "pid": pids.get(&s.name),
                "callsInFlight": in_flight,
                "toolListKnown": list_known,
                "tools": tools,
            })
        })
        .collect();
    Json(json!({
        "task": snap.config.task_name,
        "contextVersion": snap.config.context_version,
        "servers": servers,
    }))
    .into_response()
}

/// rmcp answers a session `DELETE` with 202 Accepted, though the session is gone by then;
/// clients (the Python SDK among them) expect 200 or 204 and log a failure otherwise.
async fn session_delete_status(request: Request, next: Next) -> Response {
    let delete = request.method() == http::Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

/// A model request body the proxy cannot take, as the model API says it (`request_too_large`
/// for one over the limit; `overloaded_error` with `retry-after` while other large bodies hold
/// the budget), so the agent's runtime shows and retries it as an API error.
fn model_body_refusal(status: StatusCode, message: String) -> Response {
    let kind = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        StatusCode::REQUEST_TIMEOUT => "api_error",
        _ => "invalid_request_error",
    };
    crate::gateway::refuse(status, kind, message.trim_end())
}
