//! Shared mode's `tool_call_started` record: written before a call is forwarded upstream, and
//! awaited until its line was handed to the kernel (`write(2)` returned, stdout flushed), so a
//! replica killed mid-call leaves a record of the call it was making. The `tool_call` record
//! follows as usual; a started record without its `tool_call` (paired by `requestId`, `session`
//! and `replica`) is a call cut by the replica's death.
//!
//! The arguments are never in it, only [`arguments_digest`]: the SHA-256 of their RFC 8785
//! canonical JSON.

use std::path::PathBuf;

use orchestrator_crds::policy::sha256_jcs;
use serde::Serialize;

use super::{Audit, RecordType, Sink, Stamped, write_batch};

/// One `tool_call_started` line.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Started<'a> {
    pub record_type: RecordType,
    pub ts: String,
    pub task: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub namespace: &'a str,
    /// Who created the TaskRun (as in a call's record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<&'a str>,
    pub context_version: u64,
    pub session: String,
    pub request_id: String,
    /// The name the client called.
    pub tool: &'a str,
    pub server: &'a str,
    pub upstream_tool: &'a str,
    /// `sha256:` and 64 hex digits over the arguments' RFC 8785 canonical JSON (keys sorted,
    /// compact); `sha256:` of `{}` when the call has none.
    pub arguments_digest: String,
    /// The approval the call was made under, when one held it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<&'a str>,
}

/// The digest of a call's arguments (see [`Started::arguments_digest`]): the project's
/// [`sha256_jcs`], as tool pins and approval digests are made.
pub fn arguments_digest(arguments: Option<&serde_json::Map<String, serde_json::Value>>) -> String {
    match arguments {
        Some(map) => sha256_jcs(map),
        None => sha256_jcs(&serde_json::Map::new()),
    }
}

impl Audit {
    /// Writes `record` to `path` (the audit stream when `None`) now, after every line queued
    /// before it, and returns once the write returned (on a blocking thread: the pipe may be
    /// full). A write that fails is logged; the call goes on. Also hands it to the OTLP export.
    pub async fn started(&self, path: Option<&PathBuf>, record: &Started<'_>) {
        let line = match &self.stamp {
            Some(stamp) => serde_json::to_value(Stamped { record, stamp }),
            None => serde_json::to_value(record),
        };
        let value = match line {
            Ok(value) => value,
            Err(e) => {
                tracing::error!(error = %e, "cannot serialize a tool_call_started record");
                return;
            }
        };
        let mut line = value.to_string().into_bytes();
        line.push(b'\n');
        if let Some(otlp) = &self.otlp {
            otlp.export_value(record.record_type, value);
        }
        let sink = path.map_or(Sink::Stream(self.stream), |p| Sink::File(p.clone()));
        let shared = self.shared.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _writing = shared.writing();
            let mut batch = std::mem::take(&mut *shared.lock());
            batch.push((sink, line.into()));
            write_batch(batch, &mut None);
        })
        .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "writing a tool_call_started record failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::audit::Stamp;

    #[test]
    fn the_digest_is_of_the_canonical_arguments_and_shows_no_value() {
        let a: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"b": {"y": 1, "x": [2, "s"]}, "a": "hunter2"}"#)
                .expect("json");
        let b: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"a": "hunter2", "b": {"x": [2, "s"], "y": 1}}"#)
                .expect("json");
        let c: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"a": "hunter3", "b": {"x": [2, "s"], "y": 1}}"#)
                .expect("json");
        let digest = arguments_digest(Some(&a));
        assert_eq!(digest, arguments_digest(Some(&b)));
        assert_ne!(digest, arguments_digest(Some(&c)));
        let text = r#"{"a":"hunter2","b":{"x":[2,"s"],"y":1}}"#;
        let expected: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest, format!("sha256:{expected}"));
        assert!(digest.len() == 71 && !digest.contains("hunter2"));
    }

    #[tokio::test]
    async fn the_started_line_is_written_when_the_call_goes_on_after_lines_queued_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::start().stamped(Stamp {
            task_uid: Some("uid-1".into()),
            proxy_mode: "shared",
            replica: Some("proxy-7f9c-abcde".into()),
        });
        let record = Started {
            record_type: RecordType::ToolCallStarted,
            ts: crate::audit::timestamp(),
            task: "task-1",
            namespace: "team-a",
            created_by: None,
            context_version: 2,
            session: "s3".into(),
            request_id: "7".into(),
            tool: "gh__create_issue",
            server: "gh",
            upstream_tool: "create_issue",
            arguments_digest: arguments_digest(None),
            approval_id: Some("0a1b2c3d"),
        };
        audit.started(Some(&path), &record).await;
        // No flush, no wait: the line is in the file when `started` returns.
        let text = std::fs::read_to_string(&path).expect("the audit file");
        let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one json line");
        assert_eq!(line["recordType"], "tool_call_started");
        assert_eq!(line["replica"], "proxy-7f9c-abcde");
        assert_eq!(line["taskUid"], "uid-1");
        assert_eq!(line["requestId"], "7");
        assert_eq!(line["session"], "s3");
        assert_eq!(line["upstreamTool"], "create_issue");
        assert_eq!(line["approvalId"], "0a1b2c3d");
        assert!(line.get("arguments").is_none());
    }
}
