//! The console's HTTP surface against a scripted API server: the guard turns away other hosts,
//! requests without the session and cross-site posts, before anything reaches Kubernetes; the
//! token opens a session; a decision the API server forbids comes back as its 403, with its
//! words, and nothing else is written; what the caller may do is the API server's answer to
//! SelfSubjectAccessReviews; the Logs tab reads the agent's log, bounded, or says why not.

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

/// The agent's log in the scripted pod: a line, a line with an escape sequence, a last line.
const AGENT_LOG: &str =
    "agent: starting\n\u{1b}[31mred\u{1b}[0m <b>not markup</b>\nagent: waiting\n";

/// A console for namespace `ns` whose API server answers: the TaskRun `held` with one waiting
/// call, `viewer` as the caller, and 403 to creating a ToolApproval (and, asked first, a
/// SelfSubjectAccessReview that says no to it and yes to the rest); its Job's pod `held-x1`
/// runs, its agent's log is [`AGENT_LOG`]. Returns the requests seen (with their query, and the
/// reviews' resource attributes).
fn console() -> (Arc<Console>, Arc<Mutex<Vec<String>>>) {
    console_showing(digest(), false)
}

/// [`console`], its request naming `named`; with `no_logs`, pods/log is forbidden too.
fn console_showing(named: String, no_logs: bool) -> (Arc<Console>, Arc<Mutex<Vec<String>>>) {
    let (service, mut handle) = mock::pair::<http::Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or_default().to_string();
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let attributes = &body["spec"]["resourceAttributes"];
            kept.lock().unwrap_or_else(|p| p.into_inner()).push(
                match (query.is_empty(), attributes.is_null()) {
                    (true, true) => format!("{method} {path}"),
                    (false, _) => format!("{method} {path}?{query}"),
                    (true, false) => format!("{method} {path} {attributes}"),
                },
            );
            if path.ends_with("/pods/held-x1/log") {
                let response = if no_logs {
                    Response::builder().status(StatusCode::FORBIDDEN).body(Body::from(
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "code": 403, "reason": "Forbidden",
                               "message": "pods \"held-x1\" is forbidden: User \"viewer\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"ns\""})
                        .to_string()
                        .into_bytes(),
                    ))
                } else {
                    Response::builder()
                        .status(StatusCode::OK)
                        .header("content-type", "text/plain")
                        .body(Body::from(AGENT_LOG.as_bytes().to_vec()))
                };
                send.send_response(response.expect("a response"));
                continue;
            }
            let (status, answer) = if method == Method::GET && path.ends_with("/taskruns/held") {
                (StatusCode::OK, taskrun(&named))
            } else if method == Method::GET && path == "/api/v1/namespaces/ns/pods" {
                (StatusCode::OK, pods())
            } else if path.ends_with("/selfsubjectaccessreviews") {
                let denied = attributes["resource"] == "toolapprovals"
                    || (no_logs && attributes["subresource"] == "log");
                let mut review = body.clone();
                review["status"] = json!({"allowed": !denied});
                (StatusCode::CREATED, review)
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

/// The pods of Job `held`: one, its agent running.
fn pods() -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [{
        "metadata": {"name": "held-x1", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Running", "containerStatuses": [{"name": "agent", "image": "a",
            "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}}]})
}

fn taskrun(digest: &str) -> Value {
    json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "held", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"}, "toolConfig": {}},
        "status": {"phase": "Running", "jobName": "held", "approvals": [{
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
    let (c, seen) = console_showing(other.clone(), false);
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

#[tokio::test]
async fn what_the_caller_may_do_is_the_api_servers_answer_to_their_own_reviews() {
    let (c, seen) = console();
    let (status, _, body) = send(&c, Call::get("/api/namespaces/ns/access")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let access: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(access["namespace"], "ns");
    assert_eq!(access["approve"]["allowed"], false);
    let reason = access["approve"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(
            "you (viewer) may not create toolapprovals.orchestrator.io in namespace ns"
        ),
        "{reason}"
    );
    for key in ["context", "cancel", "logs"] {
        assert_eq!(
            access[key],
            json!({"allowed": true, "reason": null}),
            "{key}: {access}"
        );
    }
    // Each permission asked once, exactly as the commands use it; no user named (the caller's
    // own credentials are the subject).
    let mut asked: Vec<Value> = seen
        .lock()
        .map(|s| s.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| {
            r.strip_prefix("POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews ")
        })
        .map(|a| serde_json::from_str(a).unwrap_or_default())
        .collect();
    asked.sort_by_key(|a: &Value| a.to_string());
    assert_eq!(
        asked,
        [
            json!({"group": "", "namespace": "ns", "resource": "pods", "subresource": "log", "verb": "get"}),
            json!({"group": "", "namespace": "ns", "resource": "pods", "verb": "list"}),
            json!({"group": "orchestrator.io", "namespace": "ns", "resource": "taskruns", "verb": "patch"}),
            json!({"group": "orchestrator.io", "namespace": "ns", "resource": "toolapprovals", "verb": "create"}),
        ]
    );
    // Another namespace than the console's: refused before the API server.
    let (status, _, _) = send(&c, Call::get("/api/namespaces/other/access")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = send(&c, Call::get("/api/namespaces/A%2Fb/access")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_logs_tab_reads_the_end_of_the_agents_log_bounded() {
    let (c, seen) = console();
    let (status, _, body) = send(
        &c,
        Call::get("/api/namespaces/ns/tasks/held/logs?tailLines=200"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let read: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(
        read["text"], AGENT_LOG,
        "the bytes as logged: the page escapes"
    );
    assert_eq!(
        (&read["pod"], &read["container"], &read["state"]),
        (&json!("held-x1"), &json!("agent"), &json!("shown"))
    );
    assert_eq!(
        read["message"],
        "the last 3 lines of container agent of pod held-x1 (at most 200)"
    );
    let asked = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let log = asked
        .iter()
        .find(|r| r.contains("/pods/held-x1/log"))
        .cloned()
        .unwrap_or_default();
    for part in ["container=agent", "tailLines=200", "limitBytes=262144"] {
        assert!(log.contains(part), "{log}");
    }
    // The proxy's log is the other container; anything else is refused before the API server.
    let (status, _, body) = send(
        &c,
        Call::get("/api/namespaces/ns/tasks/held/logs?container=etcd"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_log_the_caller_may_not_read_is_the_api_servers_403_in_its_words() {
    let (c, _) = console_showing(digest(), true);
    let (_, _, body) = send(&c, Call::get("/api/namespaces/ns/access")).await;
    let access: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(access["logs"]["allowed"], false, "{access}");
    assert!(
        access["logs"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("you (viewer) may not get pods/log in namespace ns")),
        "{access}"
    );
    let (status, _, body) = send(&c, Call::get("/api/namespaces/ns/tasks/held/logs")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_default();
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("reading the log of container agent of pod held-x1 (TaskRun held)")
            && error.contains("cannot get resource \"pods/log\""),
        "{error}"
    );
}

#[tokio::test]
async fn the_page_gets_the_arguments_laid_out_and_the_params_whole() {
    let view = super::view::TaskView::new(
        &serde_json::from_value(taskrun(&digest())).expect("a TaskRun"),
        None,
    );
    let json = serde_json::to_value(&view).unwrap_or_default();
    let approval = &json["approvals"][0];
    assert_eq!(approval["arguments"], "{\n  \"message\": \"hi\"\n}");
    assert_eq!(approval["params"], PARAMS);
    assert_eq!(approval["digestCheck"], "covers");
}
