//! `task audit`: the recent audit records of a running task's MCP proxy (its `GET /audit`),
//! read through the API server (`pods/portforward`) with the auditors' token (the namespace's
//! Secret `orchestrator-task-auditor`, read with the caller's rights), filtered there, printed as
//! a table or as the proxy's JSON.

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kube::{Api, ResourceExt};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::args::{AuditArgs, Global};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result};
use crate::output::{self, Format, Table};
use crate::portforward;
use orchestrator_crds::shared::{AUDITOR_SECRET, AUDITOR_TOKEN_KEY};
use orchestrator_crds::taskrun::TaskRun;

/// The proxy's container in a task pod.
const PROXY_CONTAINER: &str = "mcp-proxy";
/// The proxy's port when the pod does not say (the operator's default).
const DEFAULT_PORT: u16 = 8080;
/// The most of a rule or error shown in a table cell.
const DETAIL_WIDTH: usize = 60;

/// `task audit`.
pub async fn run(global: &Global, args: &AuditArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task).await?;
    let name = tr.name_any();
    let Read {
        pod: pod_name,
        body: answer_body,
        value: body,
    } = read(&cluster, &tr, &query(args)).await?;
    let records = body["records"].as_array().cloned().unwrap_or_default();
    let matched = body["matched"].as_u64().unwrap_or(records.len() as u64);
    let dropped = body["dropped"].as_u64().unwrap_or(0);
    match &global.output {
        Format::Table | Format::Wide => {
            if records.len() as u64 > 0 {
                output::print(&table(&records).render_with(output::headers()))?;
            } else {
                output::note(&format!("no matching calls in the proxy of pod {pod_name}"));
            }
            if matched > records.len() as u64 {
                output::note(&format!(
                    "{} of {matched} matching calls shown, the newest (--limit)",
                    records.len()
                ));
            }
            if dropped > 0 {
                output::note(&format!(
                    "the proxy has let go of its {dropped} oldest records (it keeps the recent ones \
                     in memory); every call is in its audit log: kubectl logs -n {} {pod_name} -c {PROXY_CONTAINER}",
                    cluster.namespace
                ));
            }
            Ok(())
        }
        Format::Json => {
            // The records exactly as the proxy wrote them: parsed into numbers and printed again,
            // a duration such as 445.58079200000003 would come out changed.
            let raw: RawAnswer = serde_json::from_slice(&answer_body)
                .map_err(|e| Error::Cluster(format!("the proxy's answer: {e}")))?;
            let shown = Shown {
                task: &name,
                pod: &pod_name,
                records: &raw.records,
                matched,
                dropped,
            };
            output::print(&output::render(&Format::Json, &shown)?)
        }
        format => {
            let value = serde_json::json!({
                "task": name,
                "pod": pod_name,
                "records": records,
                "matched": matched,
                "dropped": dropped,
            });
            output::print(&output::render(format, &value)?)
        }
    }
}

/// The proxy's answer with each record kept as its bytes.
#[derive(serde::Deserialize)]
struct RawAnswer {
    records: Vec<Box<RawValue>>,
}

/// The auditors' token of the namespace (Secret `orchestrator-task-auditor`, key `token`), read
/// with the caller's own rights: who may not `get` it may not read the audit.
async fn auditor_token(cluster: &Cluster) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let what = format!(
        "reading the auditors' token (Secret {}/{AUDITOR_SECRET}, key {AUDITOR_TOKEN_KEY})",
        cluster.namespace
    );
    let secret = match secrets.get(AUDITOR_SECRET).await {
        Ok(secret) => secret,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Err(Error::Cluster(format!(
                "{what}: forbidden ({}); `task audit` needs get on secrets named {AUDITOR_SECRET} \
                 in {} beside pods/portforward (docs/cli.md, the task-auditor Role)",
                e.message, cluster.namespace
            )));
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Err(Error::Cluster(format!(
                "{what}: it does not exist; the operator creates it with a task's Job (sidecar mode), \
                 so a namespace that has run no task since has none"
            )));
        }
        Err(e) => return Err(Error::kube(what, e)),
    };
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get(AUDITOR_TOKEN_KEY))
        .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
        .filter(|t| !t.is_empty());
    token
        .ok_or_else(|| Error::Cluster(format!("{what}: the Secret has no key {AUDITOR_TOKEN_KEY}")))
}

/// What a task's proxy answered to `GET /audit?QUERY`: its pod, the body's bytes, parsed.
pub struct Read {
    pub pod: String,
    pub body: Vec<u8>,
    pub value: Value,
}

/// Reads the audit of the task's running pod's proxy through the API server
/// (`pods/portforward`), as the caller: the records as the proxy wrote them.
pub async fn read(cluster: &Cluster, tr: &TaskRun, query: &str) -> Result<Read> {
    let name = tr.name_any();
    if let Some(e) = super::logs::no_proxy_in_pod(tr, "the proxy's GET /audit") {
        return Err(e);
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let job = tr
        .status
        .as_ref()
        .and_then(|s| s.job_name.clone())
        .unwrap_or_else(|| name.clone());
    // No Job yet: no pod, which the error below says.
    let items = super::logs::job_pods(cluster, &pods, tr).await?;
    let pod = running_pod(&items).ok_or_else(|| no_running_pod(&name, &job, &items))?;
    let pod_name = pod.name_any();
    let port = proxy_port(pod);
    let path = format!("/audit?{query}");
    let token = auditor_token(cluster).await?;
    let answer = portforward::get(&pods, &pod_name, port, &path, Some(&token)).await?;
    if answer.status == 401 {
        return Err(Error::Cluster(format!(
            "the proxy of pod {pod_name} refused the auditors' token of Secret {}/{AUDITOR_SECRET} \
             (HTTP 401): the pod was started before the Secret existed or was rotated, or the \
             Secret was changed by hand; its proxy reads the Secret's current value at each request \
             once the kubelet has updated it (a minute at most)",
            cluster.namespace
        )));
    }
    let body: Value = serde_json::from_slice(&answer.body).map_err(|e| {
        Error::Cluster(format!(
            "the proxy of pod {pod_name} answered HTTP {} with no JSON ({e}): {}",
            answer.status,
            String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
        ))
    })?;
    match answer.status {
        200 => {}
        400 => {
            let message = body["error"].as_str().unwrap_or("bad request");
            return Err(Error::Usage(format!(
                "the proxy refused the query: {message}"
            )));
        }
        status => {
            return Err(Error::Cluster(format!(
                "the proxy of pod {pod_name} answered HTTP {status}: {body}"
            )));
        }
    }
    Ok(Read {
        pod: pod_name,
        body: answer.body,
        value: body,
    })
}

/// What `-o json` prints.
#[derive(serde::Serialize)]
struct Shown<'a> {
    task: &'a str,
    pod: &'a str,
    records: &'a [Box<RawValue>],
    matched: u64,
    dropped: u64,
}

/// The query string for the proxy's `GET /audit`.
pub fn query(args: &AuditArgs) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (key, value) in [
        ("decision", &args.decision),
        ("risk", &args.risk),
        ("server", &args.server),
        ("tool", &args.tool),
        ("since", &args.since),
    ] {
        if let Some(value) = value {
            query.append_pair(key, value);
        }
    }
    if let Some(limit) = args.limit {
        query.append_pair("limit", &limit.to_string());
    }
    query.finish()
}

/// The newest pod that runs, with its proxy container running.
pub fn running_pod(pods: &[Pod]) -> Option<&Pod> {
    pods.iter()
        .filter(|p| {
            let status = p.status.as_ref();
            let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            let proxy_up = status
                .iter()
                .flat_map(|s| {
                    s.init_container_statuses
                        .iter()
                        .flatten()
                        .chain(s.container_statuses.iter().flatten())
                })
                .any(|c| {
                    c.name == PROXY_CONTAINER
                        && c.state.as_ref().is_some_and(|s| s.running.is_some())
                });
            running && proxy_up && p.metadata.deletion_timestamp.is_none()
        })
        .max_by_key(|p| p.metadata.creation_timestamp.clone())
}

fn no_running_pod(task: &str, job: &str, pods: &[Pod]) -> Error {
    let seen: Vec<String> = pods
        .iter()
        .map(|p| {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "no phase yet".into());
            format!("{} ({phase})", p.name_any())
        })
        .collect();
    let pods = if seen.is_empty() {
        "it has no pod".to_string()
    } else {
        format!("its pods: {}", seen.join(", "))
    };
    Error::NotFound(format!(
        "task {task} has no running pod with a running proxy (Job {job}; {pods}). The proxy keeps \
         its audit records in memory while the pod runs; a finished pod's calls are in the proxy's \
         log while the pod exists: kubectl logs POD -c {PROXY_CONTAINER}"
    ))
}

/// The port the pod's proxy listens on: from its probes (`http://127.0.0.1:PORT/readyz`) or the
/// agent's `ORCHESTRATOR_MCP_URL`, else the default.
pub fn proxy_port(pod: &Pod) -> u16 {
    let Some(spec) = pod.spec.as_ref() else {
        return DEFAULT_PORT;
    };
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let from_probe = containers
        .iter()
        .filter(|c| c.name == PROXY_CONTAINER)
        .flat_map(|c| [&c.readiness_probe, &c.startup_probe])
        .flatten()
        .filter_map(|p| p.exec.as_ref()?.command.as_ref())
        .flatten()
        .find_map(|arg| url_port(arg));
    let from_env = || {
        containers
            .iter()
            .flat_map(|c| c.env.iter().flatten())
            .filter(|e| e.name == "ORCHESTRATOR_MCP_URL")
            .find_map(|e| url_port(e.value.as_deref()?))
    };
    from_probe.or_else(from_env).unwrap_or(DEFAULT_PORT)
}

fn url_port(text: &str) -> Option<u16> {
    let uri: hyper::Uri = text.parse().ok()?;
    uri.scheme()?;
    uri.port_u16()
}

/// One row per record: what a person reads first.
fn table(records: &[Value]) -> Table {
    let mut table = Table::new(&[
        "TIME",
        "DECISION",
        "RISK",
        "SERVER",
        "TOOL",
        "OUTCOME",
        "DURATION",
        "RULE/ERROR",
    ]);
    let text = |v: &Value, key: &str| v[key].as_str().unwrap_or("").to_string();
    for r in records {
        let time = r["ts"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
            .unwrap_or_else(|| text(r, "ts"));
        let duration = r["durationMs"]
            .as_f64()
            .map(|ms| format!("{ms:.1}ms"))
            .unwrap_or_default();
        // A refusal's error only repeats its rule: the rule says it shorter. Other errors say
        // what went wrong, which a rule that allowed the call does not.
        let refused = r["outcome"].as_str() == Some("denied");
        let detail = match (r["error"].as_str(), r["rule"].as_str()) {
            (Some(_), Some(rule)) if refused => rule,
            (Some(error), _) => error,
            (None, Some(rule)) => rule,
            (None, None) => "",
        };
        table.row(vec![
            time,
            text(r, "decision"),
            text(r, "risk"),
            text(r, "server"),
            text(r, "tool"),
            text(r, "outcome"),
            duration,
            clip(detail, DETAIL_WIDTH),
        ]);
    }
    table
}

/// `text` on one line, at most `width` characters (the cut marked with `…`).
fn clip(text: &str, width: usize) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= width {
        return line;
    }
    let mut out: String = line.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::TaskRef;

    fn args() -> AuditArgs {
        AuditArgs {
            task: TaskRef {
                name: Some("t".into()),
                task_id: None,
            },
            decision: None,
            risk: None,
            server: None,
            tool: None,
            since: None,
            limit: None,
        }
    }

    #[test]
    fn the_query_carries_each_filter_given_encoded() {
        assert_eq!(query(&args()), "");
        let mut a = args();
        a.decision = Some("denied".into());
        a.tool = Some("a b&c".into());
        a.since = Some("2026-01-01T00:00:00+01:00".into());
        a.limit = Some(5);
        assert_eq!(
            query(&a),
            "decision=denied&tool=a+b%26c&since=2026-01-01T00%3A00%3A00%2B01%3A00&limit=5"
        );
    }

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).expect("pod")
    }

    #[test]
    fn picks_the_newest_running_pod_whose_proxy_runs() {
        let make = |name: &str, created: &str, phase: &str, proxy_running: bool| {
            let state = if proxy_running {
                serde_json::json!({"running": {}})
            } else {
                serde_json::json!({"terminated": {"exitCode": 0}})
            };
            pod(serde_json::json!({
                "metadata": {"name": name, "creationTimestamp": created},
                "status": {"phase": phase, "initContainerStatuses": [{
                    "name": "mcp-proxy", "ready": true, "restartCount": 0, "image": "i",
                    "imageID": "", "state": state,
                }]},
            }))
        };
        let pods = vec![
            make("old", "2026-01-01T00:00:00Z", "Running", true),
            make("new", "2026-01-01T00:01:00Z", "Running", true),
            make("newest-done", "2026-01-01T00:02:00Z", "Succeeded", false),
            make(
                "newest-proxy-down",
                "2026-01-01T00:03:00Z",
                "Running",
                false,
            ),
        ];
        assert_eq!(
            running_pod(&pods).map(|p| p.name_any()).as_deref(),
            Some("new")
        );
        assert!(running_pod(&pods[2..]).is_none());
        let err = no_running_pod("t", "t", &pods[2..3]).to_string();
        assert!(err.contains("has no running pod"), "{err}");
        assert!(err.contains("newest-done (Succeeded)"), "{err}");
        assert_eq!(no_running_pod("t", "t", &[]).exit_code(), 3);
    }

    #[test]
    fn finds_the_proxy_port_in_its_probe_or_the_agent_env() {
        let probe = pod(serde_json::json!({"spec": {
            "initContainers": [{"name": "mcp-proxy", "readinessProbe": {"exec": {"command":
                ["orchestrator-mcp-proxy", "probe", "http://127.0.0.1:9123/readyz"]}}}],
            "containers": [{"name": "agent"}],
        }}));
        assert_eq!(proxy_port(&probe), 9123);
        let env = pod(
            serde_json::json!({"spec": {"containers": [{"name": "agent", "env": [
            {"name": "ORCHESTRATOR_MCP_URL", "value": "http://127.0.0.1:9200/mcp"}]}]}}),
        );
        assert_eq!(proxy_port(&env), 9200);
        let neither = pod(serde_json::json!({"spec": {"containers": [{"name": "agent"}]}}));
        assert_eq!(proxy_port(&neither), DEFAULT_PORT);
    }

    #[test]
    fn table_rows_read_like_a_log() {
        let records = vec![
            serde_json::json!({
                "ts": "2026-01-01T10:00:00.123456Z", "decision": "allowed", "risk": "write",
                "server": "fs", "tool": "fs__write_file", "outcome": "protocol_error",
                "durationMs": 0.25, "rule": "servers[fs].tools.allow[0] \"*\"",
                "error": format!("refused {}", "x".repeat(100)),
            }),
            serde_json::json!({
                "ts": "2026-01-01T10:00:01Z", "decision": "denied", "risk": "destructive",
                "server": "fs", "tool": "fs__delete", "outcome": "denied", "durationMs": 0.1,
                "rule": "policy.maxRisk \"write\"", "error": "tool \"fs__delete\" is not allowed",
            }),
        ];
        let text = table(&records).render();
        let row = text.lines().nth(1).expect("a row");
        let cells: Vec<&str> = row
            .split("   ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        let want = [
            "2026-01-01T10:00:00.123Z",
            "allowed",
            "write",
            "fs",
            "fs__write_file",
            "protocol_error",
            "0.2ms",
        ];
        assert_eq!(cells[..7], want, "{row}");
        // An error says what went wrong, clipped.
        assert!(cells[7].starts_with("refused xxx"), "{row}");
        assert!(row.ends_with('…'), "{row}");
        assert!(row.chars().count() < 170, "{row}");
        // A refusal shows its rule rather than the error that repeats it.
        let refusal = text.lines().nth(2).expect("a second row");
        assert!(refusal.ends_with("policy.maxRisk \"write\""), "{refusal}");
    }
}
