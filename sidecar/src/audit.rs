//! Audit log: one JSON line per `tools/call` (and per model request and built-in tool use the
//! gateway saw: [`model`]). Lines are formatted on the call path and written by a dedicated
//! thread, so a slow disk never holds up a call. Argument values are recorded only when
//! `audit.includeArguments` is set; otherwise only their serialized size is. The recent records
//! are kept in memory too for `GET /audit` ([`ring`], queried with [`query`]): the same line,
//! shared, plus the few fields the query filters on. In shared mode a call forwarded upstream
//! first gets a `tool_call_started` line, written at once ([`started`]).

pub mod model;
pub mod otlp;
pub mod query;
pub mod redact;
pub mod ring;
pub mod started;

use crate::{names::clip, sync::lock};
use std::{
    io::Write,
    path::PathBuf,
    sync::{Arc, Condvar, Mutex},
};

use serde::Serialize;

/// What happened to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    ToolError,
    ProtocolError,
    Denied,
    /// Not a call: a tool's definition changed (see the record's `decision` and `rule`).
    DefinitionChanged,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::ProtocolError => "protocol_error",
            Outcome::Denied => "denied",
            Outcome::DefinitionChanged => "definition_changed",
        }
    }
}

/// What an audit line is about: the `recordType` of every line, so a reader of the stream can
/// tell a call's record from a tool definition that changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordType {
    /// A `tools/call`'s record.
    ToolCall,
    /// A tool's definition changed (see the record's `decision` and `rule`).
    DefinitionChange,
    /// Shared mode: a call about to be forwarded upstream ([`started`]).
    ToolCallStarted,
    /// The model gateway's: a request, a built-in `tool_use` in its answer ([`model`]).
    ModelRequest,
    AgentToolUse,
}

impl RecordType {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordType::ToolCall => "tool_call",
            RecordType::DefinitionChange => "definition_change",
            RecordType::ToolCallStarted => "tool_call_started",
            RecordType::ModelRequest => "model_request",
            RecordType::AgentToolUse => "agent_tool_use",
        }
    }
}

/// One audit line.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record<'a> {
    pub record_type: RecordType,
    pub ts: String,
    pub task: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub namespace: &'a str,
    /// Who created the TaskRun, as its proxy config says (the operator's `task.createdBy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<&'a str>,
    pub context_version: u64,
    /// The proxy's id of the session the call came on (`s<n>`): stable for an initialize-era
    /// session, new for every 2026-07-28 request. Empty (left out) in a record that is not a call.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub session: String,
    /// Who made the call, stable across sessions: see [`client_identity`].
    #[serde(skip_serializing_if = "String::is_empty")]
    pub client: String,
    /// The MCP revision the call was made in (as answered, not as offered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<&'a str>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// The name the client called (in intent mode, the tool a `call_tool_*` named).
    #[serde(skip_serializing_if = "str::is_empty")]
    pub tool: &'a str,
    /// The upstream server and its name for the tool (when known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_tool: Option<&'a str>,
    /// The tool's risk class (`read`, `write`, `destructive`), when its server's list is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk: Option<&'static str>,
    /// `allowed`, `denied` (a rule hides the tool), `rate_limited`, `invalid_arguments`,
    /// `intent_required`, `intent_mismatch`; for a call held for approval, `approved`,
    /// `rejected`, `expired`, `withdrawn` (cancelled by its client or shutdown),
    /// `approval_mismatch` (decided under another digest), and `approval_busy`,
    /// `approval_unavailable` or `approval_too_large` when it could not be held; in a
    /// definition-change record, `quarantined` or `alerted`.
    pub decision: &'static str,
    /// The approval request that held the call (`policy.requireApproval`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<&'a str>,
    /// The digest of the call it held (`sha256:…`): what a decision had to name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_digest: Option<&'a str>,
    /// Who approved or rejected it, as the API server authenticated them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<&'a str>,
    /// The rule that decided, as a config path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: f64,
    pub argument_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// What the agent declared, for a call made through a `call_tool_*` (intent mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent: Option<Intent<'a>>,
    #[serde(flatten)]
    pub model: Option<model::ModelFields>,
}

/// The intent declared with a call in intent mode (`policy.toolMode: intent`), as the agent gave
/// it (each field clipped), whether or not the call was allowed.
#[derive(Debug, Serialize)]
pub struct Intent<'a> {
    /// The tool called: `call_tool_read`, `call_tool_write` or `call_tool_destructive`.
    pub variant: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_type: Option<std::borrow::Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_sensitivity: Option<std::borrow::Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<std::borrow::Cow<'a, str>>,
}

/// Lines are batched: the writer thread wakes on the first line of a batch, collects for
/// [`BATCH_WINDOW`], then writes each file once. No syscall or thread wake-up per call; a crash
/// can lose the last window of lines (a normal shutdown flushes).
pub const BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(50);

/// Where audit lines go when `audit.path` is unset: stdout when the proxy serves HTTP (then the
/// audit stream is the container's stdout and logs are on stderr), stderr with `--stdio`
/// (stdout is the MCP transport there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// The stream for the audit lines: stdout unless stdout carries MCP (`--stdio`).
    pub fn for_front(stdio: bool) -> Self {
        if stdio {
            Stream::Stderr
        } else {
            Stream::Stdout
        }
    }
}

/// Where audit lines go; cheap to clone.
#[derive(Clone)]
pub struct Audit {
    shared: Arc<Shared>,
    ring: Arc<ring::Ring>,
    /// Where a line goes when the config names no file.
    stream: Stream,
    /// Each record also as an OTLP log record (`--audit-otlp`).
    otlp: Option<Arc<otlp::AuditExport>>,
    /// Added to every line (shared mode: which task, served how).
    stamp: Option<Arc<Stamp>>,
}

/// Fields a shared proxy adds to every line of one task's records: the lines of many tasks go
/// to one stream, and `task`/`namespace` (from the config) are joined by the TaskRun's uid.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Stamp {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_uid: Option<String>,
    /// `shared` (a sidecar's lines have no stamp).
    pub proxy_mode: &'static str,
    /// This replica's pod name (`--pod-name`): with `requestId` and `session`, what pairs a
    /// `tool_call_started` record with its `tool_call`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// A record with its stamp, as one JSON object.
#[derive(Serialize)]
struct Stamped<'a, R: Serialize> {
    #[serde(flatten)]
    record: &'a R,
    #[serde(flatten)]
    stamp: &'a Stamp,
}

/// Where one queued line goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sink {
    Stream(Stream),
    File(PathBuf),
}

/// A line queued for its sink.
type Pending = (Sink, Arc<[u8]>);

#[derive(Default)]
struct Shared {
    pending: Mutex<Vec<Pending>>,
    wake: Condvar,
    /// Held while a batch is taken and written, so batches reach the files in order even when
    /// `flush` (at shutdown) runs while the writer thread is writing.
    writing: Mutex<()>,
}

impl Audit {
    /// Starts the writer thread (lines without a file go to stderr); the ring keeps the default
    /// bounds.
    pub fn start() -> Self {
        Self::with_ring(ring::Ring::default())
    }

    /// Starts the writer thread; lines without a file go to `stream`.
    pub fn to_stream(stream: Stream) -> Self {
        Self {
            stream,
            ..Self::start()
        }
    }

    /// Also exports each record as an OTLP log record.
    pub fn with_otlp(self, export: Option<otlp::AuditExport>) -> Self {
        Self {
            otlp: export.map(Arc::new),
            ..self
        }
    }

    /// The OTLP export, when on (to flush it at shutdown).
    pub fn otlp(&self) -> Option<&otlp::AuditExport> {
        self.otlp.as_deref()
    }

    /// Starts the writer thread, keeping recent records in `ring`.
    pub fn with_ring(ring: ring::Ring) -> Self {
        let shared = Arc::new(Shared::default());
        let writer = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer.run());
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the audit writer; lines are written at shutdown only");
        }
        Self {
            shared,
            ring: Arc::new(ring),
            stream: Stream::Stderr,
            otlp: None,
            stamp: None,
        }
    }

    /// The same writer and ring, with `stamp` added to every line written through the copy.
    pub fn stamped(&self, stamp: Stamp) -> Self {
        Self {
            stamp: Some(Arc::new(stamp)),
            ..self.clone()
        }
    }

    /// Whether calls get a `tool_call_started` line first ([`started`]): in shared mode (a
    /// stamped copy) only.
    pub fn writes_started(&self) -> bool {
        self.stamp
            .as_ref()
            .is_some_and(|s| s.proxy_mode == "shared")
    }

    /// The recent records.
    pub fn ring(&self) -> &ring::Ring {
        &self.ring
    }

    /// Queues one line for `path` (the audit stream when `None`), and hands the record to the
    /// OTLP export when it is on.
    pub fn record(&self, path: Option<&PathBuf>, record: &Record<'_>) {
        if let Some(otlp) = &self.otlp {
            otlp.export(record);
        }
        let line = match &self.stamp {
            Some(stamp) => serde_json::to_vec(&Stamped { record, stamp }),
            None => serde_json::to_vec(record),
        };
        let mut line = match line {
            Ok(line) => line,
            Err(e) => {
                tracing::error!(error = %e, "cannot serialize an audit record");
                return;
            }
        };
        line.push(b'\n');
        let line: Arc<[u8]> = line.into();
        self.ring.push(ring::Entry::new(record, line.clone()));
        let first = {
            let mut pending = self.shared.lock();
            let sink = path.map_or(Sink::Stream(self.stream), |p| Sink::File(p.clone()));
            pending.push((sink, line));
            pending.len() == 1
        };
        if first {
            self.shared.wake.notify_one();
        }
    }

    /// Writes every queued line now (at shutdown).
    pub fn flush(&self) {
        let _writing = self.shared.writing();
        let batch = std::mem::take(&mut *self.shared.lock());
        write_batch(batch, &mut None);
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pending>> {
        lock(&self.pending)
    }

    fn writing(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.writing)
    }

    fn run(&self) {
        let mut open = None;
        loop {
            {
                let mut pending = self.lock();
                while pending.is_empty() {
                    pending = self.wake.wait(pending).unwrap_or_else(|p| p.into_inner());
                }
            }
            std::thread::sleep(BATCH_WINDOW);
            let _writing = self.writing();
            let batch = std::mem::take(&mut *self.lock());
            write_batch(batch, &mut open);
        }
    }
}

/// Writes lines in order, one write per run of lines to the same destination.
fn write_batch(batch: Vec<Pending>, open: &mut Option<(PathBuf, std::fs::File)>) {
    let mut runs: Vec<(Sink, Vec<u8>)> = Vec::new();
    for (path, line) in batch {
        match runs.last_mut() {
            Some((p, buf)) if *p == path => buf.extend_from_slice(&line),
            _ => runs.push((path, line.to_vec())),
        }
    }
    for (path, bytes) in runs {
        let result = match path {
            // One write per run, so a line is never split by a log line written meanwhile.
            Sink::Stream(Stream::Stderr) => std::io::stderr().lock().write_all(&bytes),
            Sink::Stream(Stream::Stdout) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&bytes).and_then(|()| out.flush())
            }
            Sink::File(path) => {
                if open.as_ref().is_none_or(|(p, _)| *p != path) {
                    match std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                    {
                        Ok(file) => *open = Some((path.clone(), file)),
                        Err(e) => {
                            tracing::error!(file = %path.display(), error = %e, "cannot open the audit log");
                            *open = None;
                        }
                    }
                }
                match open.as_mut() {
                    Some((_, file)) => file.write_all(&bytes),
                    None => Ok(()),
                }
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "cannot write audit lines");
        }
    }
}

/// A stable identity for the client program behind a call, `<name>/<version>#<hash>`: the
/// `clientInfo` it declared (at `initialize`, or in each 2026-07-28 request's `_meta`; clipped)
/// and 8 hex digits of a SHA-256 over the task and the unclipped name and version. It groups one
/// agent's calls although a 2026-07-28 client opens a session per request, and stays distinct
/// across tasks when audit logs are merged. The protocol carries nothing that tells two
/// instances of one program apart; a per-connection key would split one client's calls, since
/// HTTP clients open several connections.
pub fn client_identity(
    namespace: &str,
    task: &str,
    info: Option<&rmcp::model::Implementation>,
) -> String {
    use sha2::{Digest, Sha256};
    let (name, version) = info.map_or(("unknown", ""), |i| (i.name.as_str(), i.version.as_str()));
    let mut hasher = Sha256::new();
    for part in [namespace, task, name, version] {
        // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}/{}#{hash}", clip(name), clip(version))
}

/// Now, as RFC 3339 UTC with microseconds.
pub fn timestamp() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Microsecond)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_one_json_line_per_record_without_argument_values_by_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::start();
        let args =
            serde_json::Map::from_iter([("secret".to_string(), serde_json::json!("hunter2"))]);
        for (i, include) in [false, true].into_iter().enumerate() {
            let record = Record {
                record_type: RecordType::ToolCall,
                ts: timestamp(),
                task: "task-1",
                namespace: "",
                created_by: Some("alice"),
                context_version: 3,
                session: "s1".into(),
                client: "claude-code/2.1.0#0123abcd".into(),
                protocol: Some("2025-11-25"),
                request_id: i.to_string(),
                tool: "gh__create_issue",
                server: Some("gh"),
                upstream_tool: Some("create_issue"),
                risk: Some("write"),
                decision: "allowed",
                approval_id: None,
                approval_digest: None,
                decided_by: None,
                rule: Some("servers[gh].tools.allow[0] \"create_issue\"".into()),
                outcome: Outcome::Ok,
                error: None,
                duration_ms: 1.5,
                argument_bytes: 20,
                arguments: include.then_some(&args),
                intent: None,
                model: None,
            };
            audit.record(Some(&path), &record);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let lines = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() == 2 || std::time::Instant::now() > deadline {
                break text.lines().map(str::to_string).collect::<Vec<_>>();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(lines.len(), 2);
        let first: serde_json::Value = serde_json::from_str(&lines[0]).expect("json");
        assert_eq!(first["outcome"], "ok");
        assert_eq!(first["decision"], "allowed");
        assert_eq!(first["argumentBytes"], 20);
        assert!(first.get("arguments").is_none());
        assert!(!lines[0].contains("hunter2"));
        let second: serde_json::Value = serde_json::from_str(&lines[1]).expect("json");
        assert_eq!(second["arguments"]["secret"], "hunter2");
        assert_eq!(first["client"], "claude-code/2.1.0#0123abcd");
        assert_eq!(first["createdBy"], "alice");
    }

    #[test]
    fn a_stamped_copy_adds_the_task_uid_and_mode_to_its_lines_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let sidecar = Audit::start();
        let shared = sidecar.stamped(Stamp {
            task_uid: Some("0b6a3c9e".into()),
            proxy_mode: "shared",
            replica: Some("shared-proxy-0".into()),
        });
        let record = Record {
            record_type: RecordType::DefinitionChange,
            ts: timestamp(),
            task: "task-1",
            namespace: "team-a",
            created_by: None,
            context_version: 1,
            session: String::new(),
            client: String::new(),
            protocol: None,
            request_id: String::new(),
            tool: "gh__create_issue",
            server: None,
            upstream_tool: None,
            risk: None,
            decision: "alerted",
            approval_id: None,
            approval_digest: None,
            decided_by: None,
            rule: None,
            outcome: Outcome::DefinitionChanged,
            error: None,
            duration_ms: 0.0,
            argument_bytes: 0,
            arguments: None,
            intent: None,
            model: None,
        };
        shared.record(Some(&path), &record);
        sidecar.record(Some(&path), &record);
        shared.flush();
        let text = std::fs::read_to_string(&path).expect("the audit file");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            (
                &lines[0]["taskUid"],
                &lines[0]["proxyMode"],
                &lines[0]["namespace"]
            ),
            (
                &serde_json::json!("0b6a3c9e"),
                &serde_json::json!("shared"),
                &serde_json::json!("team-a")
            )
        );
        assert_eq!(lines[0]["replica"], "shared-proxy-0");
        assert!(
            lines[1].get("taskUid").is_none()
                && lines[1].get("proxyMode").is_none()
                && lines[1].get("replica").is_none()
        );
    }

    #[test]
    fn client_identity_is_stable_per_program_and_task_and_clipped() {
        let info = |name: &str, version: &str| rmcp::model::Implementation::new(name, version);
        let claude = info("claude-code", "2.1.0");
        let id = client_identity("ns", "task-1", Some(&claude));
        assert!(id.starts_with("claude-code/2.1.0#"), "{id}");
        assert_eq!(id.len(), "claude-code/2.1.0#".len() + 8);
        assert_eq!(id, client_identity("ns", "task-1", Some(&claude)));
        assert_ne!(id, client_identity("ns", "task-2", Some(&claude)));
        assert_ne!(
            id,
            client_identity("ns", "task-1", Some(&info("claude-code", "2.1.1")))
        );
        assert!(client_identity("ns", "t", None).starts_with("unknown/#"));
        let long = client_identity("ns", "t", Some(&info(&"c".repeat(50_000), "1")));
        assert!(long.len() < 200, "{long}");
        // Clipped alike, hashed apart.
        let other = client_identity("ns", "t", Some(&info(&"c".repeat(50_001), "1")));
        assert_ne!(long, other);
    }
}
