//! One HTTP request to a port inside a pod, through the API server: `pods/portforward` (API
//! server -> kubelet -> the container runtime, which dials the port on the pod's own loopback).
//! It needs no network path from here or from the API server to the pod, unlike
//! `pods/proxy`, which the API server dials at the pod's IP.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::error::{Error, Result};

/// The most of an answer read (the proxy's audit ring holds 8 MiB by default).
pub const MAX_BODY: usize = 64 * 1024 * 1024;

/// How long the whole exchange may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// An answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `GET path_and_query` at `127.0.0.1:port` inside `pod`, with `Host: localhost` and, when
/// given, `Authorization: Bearer <bearer>`.
pub async fn get(
    pods: &Api<Pod>,
    pod: &str,
    port: u16,
    path_and_query: &str,
    bearer: Option<&str>,
) -> Result<Answer> {
    let what =
        format!("GET {path_and_query} on port {port} of pod {pod} (through pods/portforward)");
    let exchange = exchange(pods, pod, port, path_and_query, bearer, &what);
    match tokio::time::timeout(TIMEOUT, exchange).await {
        Ok(answer) => answer,
        Err(_) => Err(Error::Timeout {
            what,
            after: TIMEOUT,
        }),
    }
}

async fn exchange(
    pods: &Api<Pod>,
    pod: &str,
    port: u16,
    path_and_query: &str,
    bearer: Option<&str>,
    what: &str,
) -> Result<Answer> {
    let mut forwarder = pods
        .portforward(pod, &[port])
        .await
        .map_err(|e| Error::kube(what.to_string(), e))?;
    let (Some(stream), Some(refused)) = (forwarder.take_stream(port), forwarder.take_error(port))
    else {
        return Err(Error::Cluster(format!("{what}: no stream for the port")));
    };
    // The kubelet reports a failure to reach the port (nothing listening, say) on the port's
    // error channel; the stream then just ends.
    let refused = async {
        match refused.await {
            Some(message) => message,
            None => std::future::pending().await,
        }
    };
    let request = async {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| Error::Cluster(format!("{what}: {e}")))?;
        tokio::spawn(connection);
        let mut request =
            hyper::Request::get(path_and_query).header(hyper::header::HOST, "localhost");
        if let Some(token) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| Error::Usage(format!("{what}: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| Error::Cluster(format!("{what}: {e}")))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| Error::Cluster(format!("{what}: reading the answer: {e}")))?
            .to_bytes()
            .to_vec();
        Ok(Answer { status, body })
    };
    let answer = tokio::select! {
        answer = request => answer,
        message = refused => Err(Error::Cluster(format!("{what}: {}", message.trim()))),
    };
    forwarder.abort();
    answer
}
