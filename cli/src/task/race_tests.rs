//! add-context's write against a scripted API server: a lost race is retried from a fresh read
//! (so the other writer's change is kept), and a real refusal is reported, not retried. The
//! real control plane shows the same end to end (`cli/tests/cluster_cli.rs`); here the
//! interleaving is exact instead of left to timing.

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use orchestrator_crds::catalog::Catalog;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

use super::add_context::update;
use crate::connect::Cluster;
use crate::merge::Request as Change;
use crate::toolspec::parse_specs;

fn taskrun(generation: i64, servers: Value) -> Value {
    json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-1", "namespace": "ns", "generation": generation,
                     "resourceVersion": generation.to_string()},
        "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"},
                 "toolConfig": {"mcpServers": servers}},
    })
}

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .expect("valid response")
}

/// The API server's answer to a failed JSON Patch test: a generic 422 without details.
fn test_failed() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
           "reason": "Invalid", "details": {},
           "message": "the server rejected our request due to an error in our request"})
}

/// Answers the next request, which must have `method`; returns the request's JSON body.
async fn answer(
    handle: &mut Handle<Request<Body>, Response<Body>>,
    method: Method,
    status: StatusCode,
    body: Value,
) -> Value {
    let (request, send) = handle.next_request().await.expect("a request");
    assert_eq!(request.method(), method, "{}", request.uri());
    assert!(
        request
            .uri()
            .path()
            .ends_with("/namespaces/ns/taskruns/task-1"),
        "{}",
        request.uri()
    );
    let bytes = request.into_body().collect_bytes().await.expect("body");
    send.send_response(respond(status, &body));
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// Fails instead of hanging when the CLI sends a request the script does not answer.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), f)
        .await
        .expect("add-context made a request the scripted server did not expect")
}

fn setup() -> (
    Cluster,
    Handle<Request<Body>, Response<Body>>,
    Catalog,
    Change,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let cluster = Cluster {
        client: Client::new(service, "ns"),
        namespace: "ns".into(),
    };
    let catalog = Catalog::parse(
        "servers:\n  - {name: time, stdio: {command: t}}\n  - {name: memory, stdio: {command: m}}\n",
    )
    .expect("valid");
    let change = Change {
        enable: parse_specs("--enable-tools", &["time:convert_time".into()]).expect("valid"),
        disable: vec![],
    };
    (cluster, handle, catalog, change)
}

#[tokio::test]
async fn a_lost_race_is_retried_on_a_fresh_read_keeping_the_other_writers_change() {
    let (cluster, mut handle, catalog, change) = setup();
    let ours = json!([{"name": "time", "enabled": true, "tools": {"allow": ["get_current_time"]}}]);
    // Another writer added memory between our read and our write.
    let theirs = json!([
        {"name": "time", "enabled": true, "tools": {"allow": ["get_current_time"]}},
        {"name": "memory", "enabled": true, "tools": {"allow": ["read_graph"]}},
    ]);
    let server = tokio::spawn(async move {
        answer(
            &mut handle,
            Method::GET,
            StatusCode::OK,
            taskrun(1, ours.clone()),
        )
        .await;
        let first = answer(
            &mut handle,
            Method::PATCH,
            StatusCode::UNPROCESSABLE_ENTITY,
            test_failed(),
        )
        .await;
        assert_eq!(
            first[0],
            json!({"op": "test", "path": "/spec/toolConfig/mcpServers", "value": ours})
        );
        // The CLI re-reads to tell a lost race from a refusal, then starts over.
        answer(
            &mut handle,
            Method::GET,
            StatusCode::OK,
            taskrun(2, theirs.clone()),
        )
        .await;
        answer(
            &mut handle,
            Method::GET,
            StatusCode::OK,
            taskrun(2, theirs.clone()),
        )
        .await;
        let written = json!([
            {"name": "time", "enabled": true, "tools": {"allow": ["get_current_time", "convert_time"]}},
            {"name": "memory", "enabled": true, "tools": {"allow": ["read_graph"]}},
        ]);
        let second = answer(
            &mut handle,
            Method::PATCH,
            StatusCode::OK,
            taskrun(3, written.clone()),
        )
        .await;
        assert_eq!(
            second,
            json!([
                {"op": "test", "path": "/spec/toolConfig/mcpServers", "value": theirs},
                {"op": "add", "path": "/spec/toolConfig/mcpServers", "value": written},
            ]),
            "the retry is computed from the fresh read: memory stays"
        );
    });
    let report = within(update(&cluster, "task-1", &change, &catalog, false, None))
        .await
        .expect("succeeds");
    server
        .await
        .expect("the scripted server saw the expected requests");
    assert_eq!(
        (report.changed, report.attempts, report.generation),
        (true, 2, Some(3))
    );
}

#[tokio::test]
async fn a_refusal_that_is_not_a_race_is_reported_without_retrying() {
    let (cluster, mut handle, catalog, change) = setup();
    let ours = json!([{"name": "time", "enabled": true, "tools": {"allow": ["get_current_time"]}}]);
    let server = tokio::spawn(async move {
        answer(
            &mut handle,
            Method::GET,
            StatusCode::OK,
            taskrun(1, ours.clone()),
        )
        .await;
        answer(
            &mut handle,
            Method::PATCH,
            StatusCode::UNPROCESSABLE_ENTITY,
            test_failed(),
        )
        .await;
        // The list is unchanged: not a race.
        answer(&mut handle, Method::GET, StatusCode::OK, taskrun(1, ours)).await;
        handle
    });
    // A retry would send a request nobody answers: the timeout turns that into a failure.
    let err = within(update(&cluster, "task-1", &change, &catalog, false, None))
        .await
        .expect_err("refused");
    let mut handle = server.await.expect("scripted server");
    assert_eq!(err.exit_code(), 1);
    assert!(
        err.to_string()
            .starts_with("updating the tools of TaskRun task-1: "),
        "{err}"
    );
    // No further request was made.
    drop(cluster);
    assert!(
        handle.next_request().await.is_none(),
        "no retry after a real refusal"
    );
}
