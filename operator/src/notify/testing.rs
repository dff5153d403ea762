//! A real webhook receiver on 127.0.0.1 for the tests: records each request and answers as
//! scripted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::Value;
use tokio::sync::mpsc;

use super::Notice;
use crate::metrics::Metrics;

/// How the receiver answers one request.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    Status(u16),
    /// Never answers.
    Hang,
}

/// One request received.
#[derive(Debug)]
pub struct Got {
    pub path: String,
    pub content_type: String,
    pub body: Value,
}

pub struct Receiver {
    /// `http://127.0.0.1:PORT/hook/SECRET`.
    pub url: String,
    got: mpsc::UnboundedReceiver<Got>,
}

#[derive(Clone)]
struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    got: mpsc::UnboundedSender<Got>,
}

/// Starts a receiver answering `replies` in order, then 200 to every request.
pub async fn receiver(replies: &[Reply]) -> Receiver {
    let (tx, got) = mpsc::unbounded_channel();
    let script = Script {
        replies: Arc::new(Mutex::new(replies.iter().copied().collect())),
        got: tx,
    };
    let app = Router::new()
        .route("/{*path}", post(answer))
        .with_state(script);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a local port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver {
        url: format!("http://{addr}/hook/T000-SECRET-PATH"),
        got,
    }
}

async fn answer(
    State(s): State<Script>,
    axum::extract::OriginalUri(uri): axum::extract::OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let _ = s.got.send(Got {
        path: uri.path().to_string(),
        content_type,
        body,
    });
    let reply = s
        .replies
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front();
    match reply {
        Some(Reply::Hang) => std::future::pending().await,
        Some(Reply::Status(code)) => StatusCode::from_u16(code).unwrap_or(StatusCode::OK),
        None => StatusCode::OK,
    }
}

impl Receiver {
    /// The next request, within 10 s.
    pub async fn next(&mut self) -> Got {
        tokio::time::timeout(Duration::from_secs(10), self.got.recv())
            .await
            .expect("a request within 10 s")
            .expect("the receiver runs")
    }
}

/// Waits (10 s at most) until the metrics text has `line`.
pub async fn until_metric(metrics: &Metrics, line: &str) {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while !metrics.encode().lines().any(|l| l == line) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "no line {line:?} in:\n{}", metrics.encode());
}

/// A call waiting for approval.
pub fn notice(id: &str) -> Notice {
    Notice {
        namespace: "team-a".into(),
        task_run: "task-1001".into(),
        task_id: 1001,
        approval_id: id.into(),
        server: "fs".into(),
        tool: "write_file".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        requested_at: "2026-01-01T00:00:00Z".into(),
        expires_at: "2026-01-01T00:05:00Z".into(),
    }
}
