//! The console's HTTP surface against a scripted API server: the guard turns away other hosts,
//! requests without the session and cross-site posts, before anything reaches Kubernetes; the
//! token opens a session; a decision the API server forbids comes back as its 403, with its
//! words, and nothing else is written.

use std::sync::{Arc, Mutex};

use axum::body::Body as AxumBody;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_test::mock;

use super::guard::Session;
use super::{Console, routes};
use crate::args::Global;

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const PARAMS: &str = r#"{"arguments":{"message":"hi"}}"#;

/// The digest of the call `held`'s request `a1b2c3d4` shows (nothing masked).
fn digest() -> String {
    let params: Value = serde_json::from_str(PARAMS).unwrap_or_default();
    orchestrator_crds::approval::CallDigest {
        v: orchestrator_crds::approval::CALL_DIGEST_VERSION,
        namespace: "ns",
        task_run: "held",
        id: "a1b2c3d4",
        server: "everything",
        definition: "",
        context_version: 1,
        params: &params,
    }
    .digest()
}

/// A console for namespace `ns` whose API server answers: the TaskRun `held` with one waiting
/// call, `viewer` as the caller, and 403 to creating a ToolApproval. Returns the requests seen.
fn console() -> (Arc<Console>, Arc<Mutex<Vec<String>>>) {
    console_showing(digest())
}

/// [`console`], its request naming `named`.
fn console_showing(named: String) -> (Arc<Console>, Arc<Mutex<Vec<String>>>) {
    let (service, mut handle) = mock::pair::<http::Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_string();
            kept.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("{method} {path}"));
            let (status, answer) = if method == Method::GET && path.ends_with("/taskruns/held") {
                (StatusCode::OK, taskrun(&named))
            } else if path.ends_with("/selfsubjectreviews") {
                (
                    StatusCode::CREATED,
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                           "status": {"userInfo": {"username": "viewer"}}}),
                )
            } else if method == Method::POST && path.ends_with("/toolapprovals") {
                (
                    StatusCode::FORBIDDEN,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                           "reason": "Forbidden",
                           "message": "toolapprovals.orchestrator.io is forbidden: User \"viewer\" cannot create resource \"toolapprovals\""}),
                )
            } else {
                (
                    StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "code": 404, "reason": "NotFound", "message": path}),
                )
            };
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(answer.to_string().into_bytes()))
                    .expect("a response"),
            );
        }
    });
    let global = Global {
        kubeconfig: None,
        context: None,
        namespace: Some("ns".into()),
        as_user: None,
        as_group: vec![],
        output: crate::output::Format::Table,
        catalog: None,
        catalog_namespace: "orchestrator-system".into(),
        catalog_name: "orchestrator-catalog".into(),
        verbose: 0,
    };
    let console = Console {
        client: Client::new(service, "ns"),
        namespace: Some("ns".into()),
        default_namespace: "ns".into(),
        global,
        session: Session::with_token(TOKEN.into(), 8123, &[]),
        user: Some("viewer".into()),
        addr: "127.0.0.1:8123".parse().expect("an address"),
        handoff: super::handoff::Handoff::default(),
        same_user: |peer, _| match peer.port() {
            // The test's own browser; any other port is another user's process.
            51000 => Ok(()),
            _ => Err("uid 1001".into()),
        },
    };
    (Arc::new(console), seen)
}

fn taskrun(digest: &str) -> Value {
    json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "held", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"}, "toolConfig": {}},
        "status": {"phase": "Running", "approvals": [{
            "id": "a1b2c3d4", "server": "everything", "tool": "echo", "digest": digest,
            "contextVersion": 1, "params": PARAMS,
            "paramsBytes": 31, "requestedAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2999-01-01T00:05:00Z", "state": "Pending"}]}
    })
}

fn cookie() -> String {
    format!("orchestrator_console_8123={TOKEN}")
}

struct Call<'a> {
    method: Method,
    path: &'a str,
    host: &'a str,
    cookie: Option<String>,
    csrf: bool,
    origin: Option<&'a str>,
    body: Option<Value>,
    /// The client's address (what the server's connect info says).
    peer: Option<&'a str>,
}

impl<'a> Call<'a> {
    fn get(path: &'a str) -> Self {
        Call {
            method: Method::GET,
            path,
            host: "127.0.0.1:8123",
            cookie: Some(cookie()),
            csrf: false,
            origin: None,
            body: None,
            peer: None,
        }
    }

    fn post(path: &'a str, body: Value) -> Self {
        Call {
            method: Method::POST,
            csrf: true,
            origin: Some("http://127.0.0.1:8123"),
            body: Some(body),
            ..Call::get(path)
        }
    }
}

async fn send(console: &Arc<Console>, call: Call<'_>) -> (StatusCode, http::HeaderMap, String) {
    let mut r = Request::builder()
        .method(call.method)
        .uri(call.path)
        .header("host", call.host);
    if let Some(c) = call.cookie {
        r = r.header("cookie", c);
    }
    if call.csrf {
        r = r.header("x-orchestrator-console", "1");
    }
    if let Some(o) = call.origin {
        r = r.header("origin", o);
    }
    if let Some(peer) = call.peer {
        let peer: std::net::SocketAddr = peer.parse().expect("an address");
        r = r.extension(axum::extract::ConnectInfo(peer));
    }
    let body = match call.body {
        Some(b) => {
            r = r.header("content-type", "application/json");
            AxumBody::from(b.to_string())
        }
        None => AxumBody::empty(),
    };
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        routes::router(console.clone()).oneshot(r.body(body).expect("a request")),
    )
    .await
    .expect("answered in time")
    .expect("infallible");
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = answer
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test]
async fn the_guard_turns_away_other_hosts_no_session_and_cross_site_posts() {
    let (c, seen) = console();
    let approve = json!({"decision": "approve", "digest": digest()});
    let path = "/api/namespaces/ns/tasks/held/approvals/a1b2c3d4";

    let (status, headers, _) = send(&c, Call::get("/api/session")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-frame-options"], "DENY");
    assert!(
        headers["content-security-policy"]
            .to_str()
            .is_ok_and(|v| v.contains("frame-ancestors 'none'"))
    );

    let rebinding = Call {
        host: "evil.example:8123",
        ..Call::get("/api/session")
    };
    assert_eq!(send(&c, rebinding).await.0, StatusCode::FORBIDDEN);
    let no_cookie = Call {
        cookie: None,
        ..Call::get("/api/session")
    };
    let (status, _, body) = send(&c, no_cookie).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("open the URL"), "{body}");

    let form_post = Call {
        csrf: false,
        ..Call::post(path, approve.clone())
    };
    assert_eq!(send(&c, form_post).await.0, StatusCode::FORBIDDEN);
    let other_origin = Call {
        origin: Some("http://evil.example"),
        ..Call::post(path, approve.clone())
    };
    assert_eq!(send(&c, other_origin).await.0, StatusCode::FORBIDDEN);
    let no_session = Call {
        cookie: None,
        ..Call::post(path, approve)
    };
    assert_eq!(send(&c, no_session).await.0, StatusCode::UNAUTHORIZED);
    let asked = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        asked.is_empty(),
        "nothing reached the API server: {asked:?}"
    );
}

#[tokio::test]
async fn the_token_opens_a_session_and_a_wrong_one_does_not() {
    let (c, _) = console();
    let open = Call {
        cookie: None,
        ..Call::get(Box::leak(format!("/?token={TOKEN}").into_boxed_str()))
    };
    let (status, headers, _) = send(&c, open).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/");
    let set = headers["set-cookie"].to_str().unwrap_or_default();
    assert!(set.starts_with(&cookie()), "{set}");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );

    let wrong = Call {
        cookie: None,
        ..Call::get("/?token=0000")
    };
    let (status, headers, _) = send(&c, wrong).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!headers.contains_key("set-cookie"));

    let (status, _, page) = send(&c, Call::get("/")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("/assets/console.js"),
        "the page loads its script"
    );
    let assets = Call {
        cookie: None,
        ..Call::get("/assets/console.js")
    };
    assert_eq!(send(&c, assets).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_decision_the_api_server_forbids_is_its_403_in_its_words() {
    let (c, seen) = console();
    let path = "/api/namespaces/ns/tasks/held/approvals/a1b2c3d4";
    let (status, _, body) = send(
        &c,
        Call::post(
            path,
            json!({"decision": "approve", "reason": "ok", "digest": digest()}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(body["status"], 403);
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("approving request a1b2c3d4 of TaskRun held as viewer")
            && error.contains("cannot create resource"),
        "{error}"
    );
    let asked = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        asked
            .iter()
            .any(|r| r.starts_with("POST") && r.ends_with("/toolapprovals")),
        "{asked:?}"
    );
}

#[tokio::test]
async fn bad_requests_are_refused_before_the_api_server() {
    let (c, seen) = console();
    for (path, body, want) in [
        (
            "/api/namespaces/other/tasks/held/cancel",
            json!({}),
            StatusCode::NOT_FOUND,
        ),
        (
            "/api/namespaces/ns/tasks/a%2Fstatus/cancel",
            json!({}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/namespaces/ns/tasks/held/approvals/a1b2c3d4",
            json!({"decision": "maybe", "digest": digest()}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/namespaces/ns/tasks/held/approvals/a1b2c3d4",
            json!({"decision": "approve"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/namespaces/ns/tasks/held/context",
            json!({"enable": [], "disable": []}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/namespaces/ns/tasks/held/context",
            json!({"enable": ["no-colon"]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/namespaces/ns/tasks/held/context",
            json!({"budget": ["outputTokens=lots"]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/namespaces/ns/tasks/held/context",
            json!({"budget": ["tokens=5"]}),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, _, answer) = send(&c, Call::post(path, body)).await;
        assert_eq!(status, want, "{path}: {answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap_or_default();
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{answer}"
        );
    }
    let asked = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(asked.is_empty(), "{asked:?}");
}

#[tokio::test]
async fn the_one_time_link_opens_a_session_once_and_only_for_the_consoles_user() {
    let (c, _) = console();
    let open = |peer: &'static str| Call {
        cookie: None,
        peer: Some(peer),
        ..Call::get("/open")
    };
    // Another local user read the link off the opener's command line and came first: refused,
    // and the link is not used up.
    let (status, headers, page) = send(&c, open("127.0.0.1:51001")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(!headers.contains_key("set-cookie"));
    assert!(
        page.contains("only for a browser of the user running"),
        "{page}"
    );
    // The console's user's browser: the session, and the page.
    let (status, headers, _) = send(&c, open("127.0.0.1:51000")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/");
    let set = headers["set-cookie"].to_str().unwrap_or_default();
    assert!(
        set.starts_with(&cookie()) && set.contains("HttpOnly"),
        "{set}"
    );
    // Once.
    let (status, headers, page) = send(&c, open("127.0.0.1:51000")).await;
    assert_eq!(status, StatusCode::GONE, "{page}");
    assert!(!headers.contains_key("set-cookie"));
    assert!(page.contains("opened a session once already"), "{page}");
    // Without the connection's address (not served with connect info): refused.
    let (c, _) = console();
    let unknown = Call {
        cookie: None,
        ..Call::get("/open")
    };
    assert_eq!(send(&c, unknown).await.0, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_request_whose_params_are_not_the_call_its_digest_names_is_not_approved() {
    // The status shows {"message":"hi"} under the digest of another call.
    let other = format!("sha256:{}", "3f".repeat(32));
    let (c, seen) = console_showing(other.clone());
    let path = "/api/namespaces/ns/tasks/held/approvals/a1b2c3d4";
    let (status, _, body) = send(
        &c,
        Call::post(path, json!({"decision": "approve", "digest": other})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_default();
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("the params it shows hash to") && error.contains("nothing was changed"),
        "{error}"
    );
    let asked = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        !asked.iter().any(|r| r.ends_with("/toolapprovals")),
        "a ToolApproval was created: {asked:?}"
    );
}
