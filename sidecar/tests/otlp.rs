//! Tracing over OTLP, end to end: the real proxy binary with a real upstream (server-everything),
//! an rmcp client sending a W3C `traceparent` in `_meta`, and an OTLP/HTTP JSON receiver standing
//! in for the collector (OTLP/HTTP JSON and OTLP/gRPC). Proves a span per `tools/call`, parented to the client's trace, with the
//! decision and outcome, exported only because `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, routing::post};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
};
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

#[derive(Debug, Clone)]
struct SpanRec {
    name: String,
    trace_id: String,
    parent: String,
    attributes: HashMap<String, String>,
    /// The string attributes of the span's resource.
    resource: HashMap<String, String>,
}

/// The string attributes of an OTLP/JSON attribute list.
fn json_attributes(list: &Value) -> HashMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| {
            Some((
                a["key"].as_str()?.to_string(),
                a["value"]["stringValue"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The string attributes of an OTLP/protobuf attribute list.
fn proto_attributes(
    list: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
) -> HashMap<String, String> {
    list.into_iter()
        .filter_map(|kv| match kv.value?.value? {
            any_value::Value::StringValue(v) => Some((kv.key, v)),
            _ => None,
        })
        .collect()
}

type Collected = Arc<Mutex<Vec<SpanRec>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP JSON receiver; returns its endpoint.
async fn http_json_collector(spans: Collected) -> anyhow::Result<String> {
    let receiver = Router::new()
        .route(
            "/v1/traces",
            post(|State(spans): State<Collected>, body: Bytes| async move {
                let export: Value = serde_json::from_slice(&body).unwrap_or_default();
                let found = export["resourceSpans"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|r| {
                        let resource = json_attributes(&r["resource"]["attributes"]);
                        r["scopeSpans"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default())
                            .map(move |s| (resource.clone(), s))
                    })
                    .map(|(resource, s)| SpanRec {
                        resource,
                        name: s["name"].as_str().unwrap_or_default().into(),
                        trace_id: s["traceId"].as_str().unwrap_or_default().to_lowercase(),
                        parent: s["parentSpanId"]
                            .as_str()
                            .unwrap_or_default()
                            .to_lowercase(),
                        attributes: json_attributes(&s["attributes"]),
                    });
                spans.lock().expect("lock").extend(found);
                "{}"
            }),
        )
        .with_state(spans);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, receiver).await });
    Ok(format!("http://{addr}"))
}

struct GrpcCollector(Collected);

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let found = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| {
                let resource =
                    proto_attributes(r.resource.map(|r| r.attributes).unwrap_or_default());
                r.scope_spans
                    .into_iter()
                    .flat_map(|s| s.spans)
                    .map(move |s| (resource.clone(), s))
            })
            .map(|(resource, s)| SpanRec {
                resource,
                name: s.name,
                trace_id: hex(&s.trace_id),
                parent: hex(&s.parent_span_id),
                attributes: proto_attributes(s.attributes),
            });
        self.0.lock().expect("lock").extend(found);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver; returns its endpoint.
async fn grpc_collector(spans: Collected) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(GrpcCollector(spans)))
            .serve_with_incoming(incoming),
    );
    Ok(format!("http://{addr}"))
}

#[tokio::test]
#[ignore = "needs MCP test tools from e2e/setup"]
async fn spans_are_exported_over_otlp_http_json() -> anyhow::Result<()> {
    let spans = Collected::default();
    let endpoint = http_json_collector(spans.clone()).await?;
    check_spans(&endpoint, "http/json", spans).await
}

#[tokio::test]
#[ignore = "needs MCP test tools from e2e/setup"]
async fn spans_are_exported_over_otlp_grpc() -> anyhow::Result<()> {
    let spans = Collected::default();
    let endpoint = grpc_collector(spans.clone()).await?;
    check_spans(&endpoint, "grpc", spans).await
}

/// Runs the proxy exporting to `endpoint`, makes an allowed and a denied call under a client
/// trace, stops the proxy (which flushes), and checks what the collector got.
async fn check_spans(endpoint: &str, protocol: &str, spans: Collected) -> anyhow::Result<()> {
    let tools = tools_dir();
    let node = tools.join("node/node_modules/.bin/node");
    let everything =
        tools.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        node.exists() && everything.exists(),
        "run e2e/setup to install the MCP test tools"
    );

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
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "k8s.namespace.name=ns1,k8s.pod.name=task-a-xyz,orchestrator.task.id=t-1",
        )
        // The audit stream.
        .stdout(Stdio::null())
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

    let spans = spans.lock().expect("lock").clone();
    let find = |name: &str| spans.iter().find(|s| s.name == name).cloned();
    let attr = |s: &SpanRec, k: &str| s.attributes.get(k).cloned();
    let echo =
        find("tools/call every__echo").unwrap_or_else(|| panic!("no echo span in {spans:#?}"));
    assert_eq!(echo.trace_id, TRACE_ID);
    assert_eq!(echo.parent, PARENT_SPAN);
    // OpenTelemetry's MCP semantic conventions; the proxy's own under `orchestrator.`.
    for (key, want) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "every__echo"),
        ("gen_ai.operation.name", "execute_tool"),
        ("orchestrator.server", "every"),
        ("orchestrator.decision", "allowed"),
        ("orchestrator.outcome", "ok"),
    ] {
        assert_eq!(
            attr(&echo, key).as_deref(),
            Some(want),
            "{key} in {echo:#?}"
        );
    }
    assert!(
        attr(&echo, "mcp.session.id").is_some_and(|s| s.starts_with('s')),
        "{echo:#?}"
    );
    assert!(attr(&echo, "jsonrpc.request.id").is_some(), "{echo:#?}");
    assert!(
        attr(&echo, "mcp.protocol.version").is_some_and(|v| v.starts_with("20")),
        "{echo:#?}"
    );
    assert_eq!(attr(&echo, "error.type"), None);
    for old in ["mcp.tool", "mcp.server", "mcp.decision", "mcp.outcome"] {
        assert_eq!(attr(&echo, old), None, "{old}");
    }
    // The resource: OTEL_RESOURCE_ATTRIBUTES, and the default service name.
    for (key, want) in [
        ("k8s.namespace.name", "ns1"),
        ("k8s.pod.name", "task-a-xyz"),
        ("orchestrator.task.id", "t-1"),
        ("service.name", "orchestrator-mcp-proxy"),
    ] {
        assert_eq!(
            echo.resource.get(key).map(String::as_str),
            Some(want),
            "{key}"
        );
    }
    let denied =
        find("tools/call every__get-env").unwrap_or_else(|| panic!("no denied span in {spans:#?}"));
    assert_eq!(
        attr(&denied, "orchestrator.decision").as_deref(),
        Some("denied")
    );
    assert_eq!(
        attr(&denied, "orchestrator.outcome").as_deref(),
        Some("denied")
    );
    assert!(
        attr(&denied, "error.type").is_some_and(|t| t.starts_with("PROXY.")),
        "{denied:#?}"
    );
    assert_eq!(denied.trace_id, TRACE_ID);
    Ok(())
}
