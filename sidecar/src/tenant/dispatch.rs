//! The shared proxy's HTTP front: `/mcp` authenticates the bearer token ([`super::auth`]), maps
//! the pod it was issued to onto exactly one tenant (nothing else in the request chooses the
//! task), checks the connection comes from that pod's IP, and hands the request to that tenant's
//! own MCP service. A session id made under one tenant means nothing to another's session
//! manager: 404 there. `/model/...` is the tenant's model gateway behind the same checks (the
//! token may come as the API key, `x-api-key` or `x-goog-api-key`, there only; refusals in the
//! error shape of the API the request is for). `/healthz`
//! and `/readyz` answer without a token; nothing else is served.
//!
//! Refusals: 401 with `WWW-Authenticate: Bearer error="invalid_token"` for a missing, malformed,
//! expired or refused token; 403 `PROXY.UNKNOWN_TASK` for a pod that runs no task served here;
//! 403 `PROXY.PEER_MISMATCH` for a connection from another address; 503 `PROXY.AUTH_UNAVAILABLE`
//! when the API server cannot review the token; 503 `PROXY.TASK_NOT_READY` (`Retry-After: 1`)
//! while the operator has bound the task's pod but not yet written its IP (the peer check cannot
//! pass yet; the agent's default command waits for it).

use std::{net::IpAddr, sync::Arc};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{any, get},
};
use tokio::sync::watch;
use tower::ServiceExt;

use super::{
    auth::{Authenticator, Identity, Refused},
    registry::{Binding, Tenant, Tenants},
};
use crate::server::listener::Peer;
use orchestrator_crds::gateway::PATH_PREFIX;

/// What the front needs.
pub struct Front {
    pub auth: Arc<Authenticator>,
    pub tenants: Arc<Tenants>,
    /// `--check-peer-address`.
    pub check_peer: bool,
    /// True once the ConfigMaps are listed.
    pub listed: watch::Receiver<bool>,
}

/// Why a request reaches no tenant.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Unauthenticated(String),
    Unavailable(String),
    UnknownTask {
        pod_uid: String,
    },
    PeerMismatch {
        expected: Option<IpAddr>,
        peer: Option<IpAddr>,
    },
    /// The pod is bound, its IP not yet known: the peer check cannot decide yet.
    NotReady {
        pod_uid: String,
    },
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Unavailable(_) | Refusal::NotReady { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::UnknownTask { .. } | Refusal::PeerMismatch { .. } => StatusCode::FORBIDDEN,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "PROXY.UNAUTHENTICATED",
            Refusal::Unavailable(_) => "PROXY.AUTH_UNAVAILABLE",
            Refusal::UnknownTask { .. } => "PROXY.UNKNOWN_TASK",
            Refusal::PeerMismatch { .. } => "PROXY.PEER_MISMATCH",
            Refusal::NotReady { .. } => "PROXY.TASK_NOT_READY",
        }
    }

    /// What the client is told (no more than it needs: not why a token was refused).
    pub fn message(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => {
                "the bearer token is missing, malformed, expired or not accepted"
            }
            Refusal::Unavailable(_) => "the token cannot be checked now; retry",
            Refusal::UnknownTask { .. } => "this token's pod runs no task served here",
            Refusal::PeerMismatch { .. } => "this token is accepted only from its pod's address",
            Refusal::NotReady { .. } => {
                "this task's pod is not yet bound to its address; retry in a second"
            }
        }
    }

    fn response(&self) -> Response {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": -32001, "message": self.message(), "data": {"code": self.code()}},
        });
        let mut response = (
            self.status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body.to_string(),
        )
            .into_response();
        if matches!(self, Refusal::NotReady { .. }) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, Refusal::Unauthenticated(_)) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer error="invalid_token""#),
            );
        }
        response
    }
}

/// The tenant of an authenticated identity, `lookup` being the registry's pod-uid index.
pub fn choose<T>(
    identity: &Identity,
    lookup: impl FnOnce(&str) -> Option<(T, Binding)>,
    peer: Option<IpAddr>,
    check_peer: bool,
) -> Result<T, Refusal> {
    let Some((tenant, binding)) = lookup(&identity.pod_uid) else {
        return Err(Refusal::UnknownTask {
            pod_uid: identity.pod_uid.clone(),
        });
    };
    let canonical = |ip: IpAddr| ip.to_canonical();
    if check_peer && binding.pod_ip.is_none() {
        return Err(Refusal::NotReady {
            pod_uid: identity.pod_uid.clone(),
        });
    }
    if check_peer && binding.pod_ip.map(canonical) != peer.map(canonical) {
        return Err(Refusal::PeerMismatch {
            expected: binding.pod_ip,
            peer,
        });
    }
    Ok(tenant)
}

/// The listener's app.
pub fn app(front: Arc<Front>) -> Router {
    let not_found = || async { (StatusCode::NOT_FOUND, "Not Found\n") };
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/mcp", any(mcp))
        .route(PATH_PREFIX, any(model))
        .route(&format!("{PATH_PREFIX}/{{*path}}"), any(model))
        .with_state(front)
        .fallback(not_found)
}

async fn readyz(State(front): State<Arc<Front>>) -> Response {
    if *front.listed.borrow() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the tasks' ConfigMaps are not listed yet\n",
        )
            .into_response()
    }
}

async fn mcp(State(front): State<Arc<Front>>, request: Request) -> Response {
    let peer = request.extensions().get::<Peer>().map(|p| p.0.ip());
    // Owned: a borrow of the request (its body is not Sync) cannot be held across the review.
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    match front.resolve(authorization.as_deref(), peer).await {
        Ok(tenant) => match tenant.mcp.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        Err(refusal) => {
            log(&refusal, peer);
            refusal.response()
        }
    }
}

/// The credential a model request presents, as a bearer `Authorization`: the bearer token, or
/// the API key the agent's runtime sends (`x-api-key`; `x-goog-api-key` from Gemini CLI, which
/// has no other way). Only `/model` takes an API key header: `/mcp` reads the bearer token only.
fn model_credential(headers: &axum::http::HeaderMap) -> Option<String> {
    let text = |name: &str| headers.get(name).and_then(|h| h.to_str().ok());
    text(header::AUTHORIZATION.as_str())
        .map(str::to_string)
        .or_else(|| {
            text(crate::gateway::anthropic::KEY_HEADER)
                .or_else(|| text(crate::gateway::gemini::KEY_HEADER))
                .map(|key| format!("Bearer {}", key.trim()))
        })
}

/// The model API at `/model/...`: the same token, pod and peer checks as `/mcp` (the token as
/// the agent's runtime sends it, [`model_credential`]), then the task's own gateway. Refusals
/// come in the error shape of the API the request is for, which the agent's runtime shows.
async fn model(State(front): State<Arc<Front>>, request: Request) -> Response {
    let peer = request.extensions().get::<Peer>().map(|p| p.0.ip());
    let path = request.uri().path().to_string();
    let authorization = model_credential(request.headers());
    match front.resolve(authorization.as_deref(), peer).await {
        Ok(tenant) => match tenant.model.clone().oneshot(request).await {
            Ok(response) => crate::gateway::reshape(&path, response),
            Err(never) => match never {},
        },
        Err(refusal) => {
            log(&refusal, peer);
            let kind = match refusal.status() {
                StatusCode::UNAUTHORIZED => "authentication_error",
                StatusCode::FORBIDDEN => "permission_error",
                _ => "overloaded_error",
            };
            let mut response = crate::gateway::refuse(refusal.status(), kind, refusal.message());
            if matches!(refusal, Refusal::NotReady { .. }) {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            crate::gateway::reshape(&path, response)
        }
    }
}

/// Why a request was refused, in the proxy's log (the client is told less).
fn log(refusal: &Refusal, peer: Option<IpAddr>) {
    match refusal {
        Refusal::Unauthenticated(why) => {
            tracing::info!(peer = ?peer, why = %why, "refused a request: unauthenticated")
        }
        Refusal::Unavailable(why) => {
            tracing::warn!(peer = ?peer, why = %why, "cannot review a token")
        }
        Refusal::UnknownTask { pod_uid } => {
            tracing::info!(peer = ?peer, pod_uid = %pod_uid, "refused a request: its pod runs no task served here")
        }
        Refusal::NotReady { pod_uid } => {
            tracing::info!(peer = ?peer, pod_uid = %pod_uid, "refused a request: its pod's address is not known yet")
        }
        Refusal::PeerMismatch { expected, peer } => {
            tracing::warn!(peer = ?peer, expected = ?expected, "refused a request: not from its task's pod address")
        }
    }
}

impl Front {
    async fn resolve(
        &self,
        header: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<Arc<Tenant>, Refusal> {
        let identity = self.auth.authenticate(header).await.map_err(|r| match r {
            Refused::Invalid(why) => Refusal::Unauthenticated(why),
            Refused::Unavailable(why) => Refusal::Unavailable(why),
        })?;
        choose(
            &identity,
            |uid| {
                self.tenants.by_pod_uid(uid).map(|t| {
                    let binding = t.binding();
                    (t, binding)
                })
            },
            peer,
            self.check_peer,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(pod_uid: &str) -> Identity {
        Identity {
            username: "system:serviceaccount:team-a:default".into(),
            pod_name: "p".into(),
            pod_uid: pod_uid.into(),
        }
    }

    fn bound(ip: Option<&str>) -> Binding {
        Binding {
            pod_uid: Some("uid-a".into()),
            pod_ip: ip.map(|ip| ip.parse().expect("an IP")),
        }
    }

    /// The registry as a table: uid-a is task A at 10.244.0.7, uid-b task B with no IP yet.
    fn lookup(uid: &str) -> Option<(&'static str, Binding)> {
        match uid {
            "uid-a" => Some(("A", bound(Some("10.244.0.7")))),
            "uid-b" => Some(("B", bound(None))),
            _ => None,
        }
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().expect("an IP"))
    }

    #[test]
    fn only_the_pod_uid_chooses_the_task_and_the_peer_must_be_its_pod() {
        let a = identity("uid-a");
        assert_eq!(choose(&a, lookup, ip("10.244.0.7"), true), Ok("A"));
        // The same address as an IPv4-mapped IPv6 peer (a dual-stack listener).
        assert_eq!(choose(&a, lookup, ip("::ffff:10.244.0.7"), true), Ok("A"));
        let stolen = choose(&a, lookup, ip("10.244.0.9"), true);
        assert!(
            matches!(stolen, Err(Refusal::PeerMismatch { .. })),
            "{stolen:?}"
        );
        assert_eq!(choose(&a, lookup, ip("10.244.0.9"), false), Ok("A"));
        // No pod IP known yet: not ready (retry) while the check is on, never served.
        let b = identity("uid-b");
        assert_eq!(
            choose(&b, lookup, ip("10.244.0.7"), true),
            Err(Refusal::NotReady {
                pod_uid: "uid-b".into()
            })
        );
        let not_ready = Refusal::NotReady {
            pod_uid: "uid-b".into(),
        }
        .response();
        assert_eq!(not_ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            not_ready
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        assert_eq!(choose(&b, lookup, None, false), Ok("B"));
        let unknown = choose(&identity("uid-z"), lookup, ip("10.244.0.7"), false);
        assert_eq!(
            unknown,
            Err(Refusal::UnknownTask {
                pod_uid: "uid-z".into()
            })
        );
    }

    #[test]
    fn refusals_have_the_statuses_and_codes_the_agent_sees() {
        let unauth = Refusal::Unauthenticated("expired".into()).response();
        assert_eq!(unauth.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            unauth
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok()),
            Some(r#"Bearer error="invalid_token""#)
        );
        let unknown = Refusal::UnknownTask {
            pod_uid: "u".into(),
        };
        assert_eq!(
            (unknown.status(), unknown.code()),
            (StatusCode::FORBIDDEN, "PROXY.UNKNOWN_TASK")
        );
        let peer = Refusal::PeerMismatch {
            expected: None,
            peer: None,
        };
        assert_eq!(
            (peer.status(), peer.code()),
            (StatusCode::FORBIDDEN, "PROXY.PEER_MISMATCH")
        );
        assert!(
            peer.response()
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .is_none()
        );
    }

    #[test]
    fn a_model_request_presents_its_token_as_any_runtime_sends_its_key() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut map = axum::http::HeaderMap::new();
            for (name, value) in pairs {
                map.append(
                    axum::http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                    HeaderValue::from_str(value).expect("value"),
                );
            }
            map
        };
        for pairs in [
            &[("authorization", "Bearer jwt")][..],
            &[("x-api-key", "jwt")],
            &[("x-goog-api-key", "jwt")],
            // The bearer token wins over a key header.
            &[("authorization", "Bearer jwt"), ("x-goog-api-key", "other")],
        ] {
            assert_eq!(
                model_credential(&headers(pairs)).as_deref(),
                Some("Bearer jwt"),
                "{pairs:?}"
            );
        }
        assert_eq!(model_credential(&headers(&[("cookie", "jwt")])), None);
    }

    #[test]
    fn a_refusal_before_the_task_is_known_is_in_the_shape_of_the_api_asked() {
        let refused = |path: &str| {
            let r = crate::gateway::reshape(
                path,
                crate::gateway::refuse(StatusCode::UNAUTHORIZED, "authentication_error", "who"),
            );
            let status = r.status();
            let body = futures::executor::block_on(axum::body::to_bytes(r.into_body(), 1 << 16))
                .expect("body");
            let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
            (status, body)
        };
        let (status, gemini) = refused("/model/v1beta/models/gemini-2.5-pro:streamGenerateContent");
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(gemini["error"]["status"], "UNAUTHENTICATED");
        assert_eq!(gemini["error"]["code"], 401);
        let (_, openai) = refused("/model/v1/responses");
        assert_eq!(openai["error"]["code"], "invalid_api_key");
        assert_eq!(openai["error"]["param"], serde_json::Value::Null);
        let (_, anthropic) = refused("/model/v1/messages");
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "authentication_error");
    }
}
