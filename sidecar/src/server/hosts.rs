//! DNS-rebinding protection for every endpoint that serves or reveals something (`/mcp`,
//! `/tools`, `/metrics`): the `Host` (and `Origin`, when sent) must name the proxy — loopback,
//! the listen address, or an `allowedHosts` entry of the config in use (so the check follows
//! reloads). A request with more than one `Host` header is malformed (RFC 9112 §3.2): 400.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::proxy::Proxy;

/// Host names always accepted (any port).
const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// Refuses requests whose `Host` (or `Origin`, when sent) is not the proxy's.
pub async fn check_host(
    State((proxy, listen)): State<(Arc<Proxy>, SocketAddr)>,
    request: Request,
    next: Next,
) -> Response {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let (first, second) = (hosts.next(), hosts.next());
    if second.is_some() {
        return (
            StatusCode::BAD_REQUEST,
            "Bad Request: more than one Host header",
        )
            .into_response();
    }
    let authority = first
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let Some(authority) = authority else {
        return (StatusCode::BAD_REQUEST, "Bad Request: missing Host header").into_response();
    };
    let snapshot = proxy.snapshot();
    let extra: &[String] = snapshot
        .as_deref()
        .map_or(&[], |s| s.config.allowed_hosts.as_slice());
    // A browser page on another site reaching the loopback proxy carries its own Origin.
    let origin_ok = match request.headers().get(header::ORIGIN) {
        None => true,
        Some(origin) => origin
            .to_str()
            .ok()
            .and_then(|o| o.parse::<http::Uri>().ok())
            .and_then(|u| u.authority().map(|a| a.to_string()))
            .is_some_and(|a| host_allowed(&a, listen, extra)),
    };
    let allowed = host_allowed(&authority, listen, extra) && origin_ok;
    drop(snapshot);
    if allowed {
        next.run(request).await
    } else {
        tracing::warn!(host = %crate::names::clip(&authority), path = %request.uri().path(), "refused a request with a Host or Origin that is not allowed (add it to allowedHosts if it is legitimate)");
        (
            StatusCode::FORBIDDEN,
            "Forbidden: Host or Origin header is not allowed",
        )
            .into_response()
    }
}

/// The Host check of the metrics listener (`--metrics-listen`): an IP address (any: a scraper
/// names the pod by its IP, and DNS rebinding needs a name), loopback, or an `allowedHosts`
/// entry. Only `GET /metrics` is behind it.
pub async fn check_metrics_host(
    State((proxy, listen)): State<(Arc<Proxy>, SocketAddr)>,
    request: Request,
    next: Next,
) -> Response {
    let ip_literal = {
        let mut hosts = request.headers().get_all(header::HOST).iter();
        match (hosts.next(), hosts.next()) {
            (Some(host), None) => host
                .to_str()
                .ok()
                .and_then(split_authority)
                .is_some_and(|(h, _)| h.parse::<std::net::IpAddr>().is_ok()),
            _ => false,
        }
    };
    if ip_literal && !request.headers().contains_key(header::ORIGIN) {
        return next.run(request).await;
    }
    check_host(State((proxy, listen)), request, next).await
}

fn split_authority(authority: &str) -> Option<(String, Option<u16>)> {
    let parsed = http::uri::Authority::try_from(authority).ok()?;
    let host = parsed.host().trim_matches(['[', ']']).to_ascii_lowercase();
    Some((host, parsed.port_u16()))
}

pub fn host_allowed(authority: &str, listen: SocketAddr, extra: &[String]) -> bool {
    let Some((host, port)) = split_authority(authority) else {
        return false;
    };
    if LOOPBACK_HOSTS.contains(&host.as_str()) {
        return true;
    }
    if !listen.ip().is_unspecified() && host == listen.ip().to_string() {
        return true;
    }
    extra
        .iter()
        .filter_map(|e| split_authority(e))
        .any(|(h, p)| h == host && (p.is_none() || p == port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_check_accepts_loopback_listen_and_configured_hosts_only() {
        let listen: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        for ok in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LOCALHOST",
        ] {
            assert!(host_allowed(ok, listen, &[]), "{ok}");
        }
        for no in [
            "evil.example:8080",
            "10.0.0.7:8080",
            "",
            "127.0.0.1.evil.example",
        ] {
            assert!(!host_allowed(no, listen, &[]), "{no}");
        }
        let extra = vec!["10.0.0.7".to_string(), "pod.local:9000".to_string()];
        assert!(host_allowed("10.0.0.7:8080", listen, &extra));
        assert!(host_allowed("pod.local:9000", listen, &extra));
        assert!(!host_allowed("pod.local:9001", listen, &extra));
        let pod: SocketAddr = "10.1.2.3:8080".parse().expect("addr");
        assert!(host_allowed("10.1.2.3:8080", pod, &[]));
    }
}
