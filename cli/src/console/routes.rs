//! The console's HTTP surface: the page and its assets (embedded in the binary at build time),
//! the JSON API, and the guard and security headers on every answer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use super::Console;
use super::actions::{self, ApiError};
use super::guard::{CSRF_HEADER, Seen};
use super::handoff;
use super::live;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// The most a request body may be (a reason, a few tool names).
const MAX_BODY: usize = 64 * 1024;

/// The whole console.
pub fn router(console: Arc<Console>) -> Router {
    let task = "/api/namespaces/{ns}/tasks/{name}";
    Router::new()
        .route("/", get(index))
        .route(handoff::PATH, get(open))
        .route("/assets/console.js", get(script))
        .route("/assets/console.css", get(style))
        .route("/api/session", get(actions::session))
        .route("/api/events", get(live::events))
        .route("/api/catalog", get(actions::catalog))
        .route("/api/namespaces/{ns}/access", get(actions::access))
        .route(&format!("{task}/audit"), get(actions::audit))
        .route(&format!("{task}/logs"), get(actions::logs))
        .route(&format!("{task}/approvals/{{id}}"), post(actions::decide))
        .route(&format!("{task}/context"), post(actions::context))
        .route(&format!("{task}/cancel"), post(actions::cancel))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// `GET /`: with `?token=` the console's token, opens the session (a cookie) and sends the
/// browser back to `/` so the token leaves the address bar; with the session, the page.
async fn index(
    State(console): State<Arc<Console>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Some(token) = query.get("token") {
        if !console.session.token_ok(token) {
            return refusal(super::guard::Refusal::BadToken, true);
        }
        return (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_string()),
                (header::SET_COOKIE, console.session.set_cookie()),
            ],
        )
            .into_response();
    }
    if !console.session.has_session(&cookies(&headers)) {
        return refusal(super::guard::Refusal::NoSession, true);
    }
    Html(INDEX).into_response()
}

/// `GET /open`: the link the browser was opened with (no secret in it, see [`handoff`]): once,
/// for a connection from a process of the console's own user, opens the session as `?token=`
/// does.
async fn open(State(console): State<Arc<Console>>, request: Request) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let checked = match peer {
        Some(peer) => (console.same_user)(peer, console.addr),
        None => Err("the connection's address is unknown".into()),
    };
    if let Err(why) = checked {
        tracing::warn!(peer = ?peer, reason = %why, "refused the one-time link: not the console's user");
        return refusal(super::guard::Refusal::OtherUser, true);
    }
    if !console.handoff.take() {
        return refusal(super::guard::Refusal::HandedOver, true);
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_string()),
            (header::SET_COOKIE, console.session.set_cookie()),
        ],
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

async fn not_found() -> ApiError {
    ApiError {
        status: 404,
        reason: "NotFound".into(),
        message: "no such page in the console".into(),
    }
}

fn cookies(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

fn refusal(r: super::guard::Refusal, page: bool) -> Response {
    let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::FORBIDDEN);
    if page {
        let body = format!(
            "<!doctype html><title>orchestrator console</title><p>{}</p>",
            r.message().replace('<', "&lt;")
        );
        return (status, Html(body)).into_response();
    }
    ApiError {
        status: r.status(),
        reason: status.canonical_reason().unwrap_or("Forbidden").into(),
        message: r.message().into(),
    }
    .into_response()
}

/// Every request: the Host, session and CSRF checks ([`super::guard`]), then the answer with
/// headers that keep the page out of frames, caches and other origins' reach.
async fn guard(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let headers = request.headers();
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let seen = Seen {
        post: request.method() != Method::GET && request.method() != Method::HEAD,
        host: text(header::HOST),
        origin: text(header::ORIGIN),
        csrf_header: headers.contains_key(CSRF_HEADER),
        fetch_site: headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
        cookies: cookies(headers),
        open_path: path == "/" || path == handoff::PATH || path.starts_with("/assets/"),
    };
    let mut response = match console.session.check(&seen) {
        Ok(()) => next.run(request).await,
        Err(r) => refusal(r, !path.starts_with("/api/")),
    };
    let h = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}
