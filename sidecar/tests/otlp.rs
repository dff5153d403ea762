//! Tracing over OTLP, end to end: the real proxy binary with a real upstream (server-everything),
//! an rmcp client sending a W3C `traceparent` in `_meta`, and an OTLP/HTTP JSON receiver standing
//! in for the collector. Proves a span per `tools/call`, parented to the client's trace, with the
//! decision and outcome, exported only because `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, routing::post};
use rmcp::{
    ServiceExt,
    model::{CallToolRequest, CallToolRequestParams, ClientRequest, JsonObject, RequestMetaObject},
    service::PeerRequestOptions,
    transport::StreamableHttpClientTransport,
};
use serde_json::Value;

const PROXY: &str = env!("CARGO_BIN_EXE_orchestrator-mcp-proxy");
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

fn tools_dir() -> PathBuf {
    std::env::var_os("ORCH_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/orchestrator/tools")
        })
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"]["stringValue"].as_str())
}

#[tokio::test]
#[ignore = "needs MCP test tools from e2e/setup"]
async fn each_tools_call_is_a_span_under_the_clients_trace() -> anyhow::Result<()> {
    let tools = tools_dir();
    let node = tools.join("node/node_modules/.bin/node");
    let everything =
        tools.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        node.exists() && everything.exists(),
        "run e2e/setup to install the MCP test tools"
    );

    // The collector stand-in: keeps every OTLP/HTTP JSON export request.
    let exports: Arc<Mutex<Vec<Value>>> = Arc::default();
    let receiver = Router::new()
        .route(
            "/v1/traces",
            post(
                |State(exports): State<Arc<Mutex<Vec<Value>>>>, body: Bytes| async move {
                    if let Ok(v) = serde_json::from_slice(&body) {
                        exports.lock().expect("lock").push(v);
                    }
                    "{}"
                },
            ),
        )
        .with_state(exports.clone());
    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let collector_addr = collector.local_addr()?;
    tokio::spawn(async move { axum::serve(collector, receiver).await });

    let dir = tempfile::tempdir()?;
    let config = serde_json::json!({
        "task": {"name": "otlp-test"},
        "servers": [{
            "name": "every",
            "stdio": {"command": node, "args": [everything, "stdio"]},
            "tools": {"deny": ["get-env"]},
        }],
    });
    std::fs::write(dir.path().join("proxy.yaml"), config.to_string())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut proxy = tokio::process::Command::new(PROXY)
        .arg("--config")
        .arg(dir.path().join("proxy.yaml"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let client = ()
        .serve(StreamableHttpClientTransport::from_uri(format!(
            "http://127.0.0.1:{port}/mcp"
        )))
        .await?;
    let mut meta = RequestMetaObject::new();
    meta.set_traceparent(format!("00-{TRACE_ID}-{PARENT_SPAN}-01"));
    for tool in ["every__echo", "every__get-env"] {
        let mut args = JsonObject::new();
        args.insert("message".into(), "traced".into());
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(tool).with_arguments(args),
        ));
        client
            .send_request_with_option(
                request,
                PeerRequestOptions::no_options().with_meta(meta.clone()),
            )
            .await?
            .await_response()
            .await?;
    }
    client.cancel().await?;

    // SIGTERM flushes the exporter on the way out.
    if let Some(pid) = proxy
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    }
    tokio::time::timeout(Duration::from_secs(20), proxy.wait()).await??;

    let spans: Vec<Value> = exports
        .lock()
        .expect("lock")
        .iter()
        .flat_map(|e| e["resourceSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|r| r["scopeSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default())
        .collect();
    let find = |name: &str| spans.iter().find(|s| s["name"] == name).cloned();
    let echo =
        find("tools/call every__echo").unwrap_or_else(|| panic!("no echo span in {spans:#?}"));
    assert_eq!(
        echo["traceId"].as_str().map(str::to_lowercase).as_deref(),
        Some(TRACE_ID)
    );
    assert_eq!(
        echo["parentSpanId"]
            .as_str()
            .map(str::to_lowercase)
            .as_deref(),
        Some(PARENT_SPAN)
    );
    assert_eq!(attribute(&echo, "mcp.server"), Some("every"));
    assert_eq!(attribute(&echo, "mcp.decision"), Some("allowed"));
    assert_eq!(attribute(&echo, "mcp.outcome"), Some("ok"));
    let denied =
        find("tools/call every__get-env").unwrap_or_else(|| panic!("no denied span in {spans:#?}"));
    assert_eq!(attribute(&denied, "mcp.decision"), Some("denied"));
    assert_eq!(attribute(&denied, "mcp.outcome"), Some("denied"));
    assert_eq!(
        denied["traceId"].as_str().map(str::to_lowercase).as_deref(),
        Some(TRACE_ID)
    );
    Ok(())
}
