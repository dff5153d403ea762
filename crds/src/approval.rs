//! Human approval of risky tool calls: what a TaskRun asks for (`toolConfig.policy.
//! requireApproval`), and the three messages of the approval path.
//!
//! ```text
//! proxy --(its Lease, annotation REQUESTS_ANNOTATION: [ApprovalRequest])--> operator
//! operator --> TaskRun status.approvals[]: [Approval] (+ Events)          (what people read)
//! approver --(creates a ToolApproval; RBAC + an admission policy on decidedBy)--> API server
//! operator --(the task ConfigMap's key VERDICTS_KEY: [Verdict])--> proxy --> the held call
//! ```
//!
//! The proxy's Role cannot create ToolApprovals nor write the ConfigMap, so it cannot approve
//! its own requests. Full arguments never leave the proxy: a request carries only
//! [`summarize`]'s bounded, redacted summary.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::Risk;

/// The Lease annotation the proxy writes: a JSON array of its pending [`ApprovalRequest`]s.
pub const REQUESTS_ANNOTATION: &str = "orchestrator.io/approval-requests";
/// The task ConfigMap's key the operator writes: a JSON array of [`Verdict`]s.
pub const VERDICTS_KEY: &str = "approvals.json";
/// The field manager of the operator's writes of `status.approvals` and of [`VERDICTS_KEY`]
/// (its other writes are under another, so they leave these alone).
pub const APPROVALS_MANAGER: &str = "orchestrator-operator-approvals";
/// The most calls a proxy holds for approval at once; more are refused.
pub const MAX_PENDING: usize = 16;
/// The most decided approvals `status.approvals` keeps besides the pending ones (oldest go first).
pub const MAX_DECIDED: usize = 20;
/// Seconds a held call waits for a decision when the policy does not say.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 300;
/// The longest wait a policy may set.
pub const MAX_TIMEOUT_SECONDS: u32 = 3600;
/// The most argument keys a summary lists (then `…` with the count left out).
pub const MAX_SUMMARY_KEYS: usize = 16;
/// The most characters of a string argument a summary shows.
pub const MAX_SUMMARY_CHARS: usize = 64;
/// The longest reason a decision keeps.
pub const MAX_REASON_CHARS: usize = 512;

/// Which calls wait for a person's decision (`toolConfig.policy.requireApproval`). A call
/// matching either the class or a pattern waits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequireApproval {
    /// Calls to tools of this class and riskier wait (`write`: write and destructive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<Risk>,
    /// Calls to these tools wait: `server/glob`, e.g. `github/merge_*`, `filesystem/write_file`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tools: Vec<String>,
    /// How long a call waits for a decision before it is refused (default 300, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,
}

impl RequireApproval {
    /// The wait in force.
    pub fn timeout_seconds(&self) -> u32 {
        self.timeout_seconds
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
            .clamp(1, MAX_TIMEOUT_SECONDS)
    }

    /// Whether a call to `tool` of `server`, of class `risk`, waits for approval.
    /// A malformed pattern matches nothing (the TaskRun's admission and the operator reject it).
    pub fn requires(&self, server: &str, tool: &str, risk: Option<Risk>) -> bool {
        self.risk.zip(risk).is_some_and(|(min, risk)| risk >= min)
            || self.tools.iter().any(|pattern| {
                pattern
                    .split_once('/')
                    .is_some_and(|(s, t)| glob_matches(s, server) && glob_matches(t, tool))
            })
    }
}

fn glob_matches(pattern: &str, name: &str) -> bool {
    globset::Glob::new(pattern)
        .map(|g| g.compile_matcher().is_match(name))
        .unwrap_or(false)
}

/// A call the proxy holds, as it tells the operator (on its Lease). Bounded: ids and names
/// are short, the summary is [`summarize`]'s.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// Unique within the task: what `task approve TASK ID` names.
    pub id: String,
    pub server: String,
    pub tool: String,
    /// The arguments' top-level keys with a bounded, redacted view of each value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
    /// RFC 3339.
    pub requested_at: String,
    /// RFC 3339: past it the proxy refuses the call.
    pub expires_at: String,
}

/// A person's decision.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Hash)]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    Approve,
    Reject,
}

/// A decision the operator passes to the proxy (in the ConfigMap key [`VERDICTS_KEY`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub id: String,
    pub decision: Decision,
    /// Who decided, as the API server authenticated them.
    pub decided_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where an approval stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Hash)]
pub enum ApprovalState {
    Pending,
    Approved,
    Rejected,
    Expired,
    /// The call ended before a decision: its client cancelled it, or the proxy restarted.
    Withdrawn,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "Pending",
            ApprovalState::Approved => "Approved",
            ApprovalState::Rejected => "Rejected",
            ApprovalState::Expired => "Expired",
            ApprovalState::Withdrawn => "Withdrawn",
        }
    }
}

/// An entry of `status.approvals`: a request and what became of it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    pub id: String,
    pub server: String,
    pub tool: String,
    /// The arguments' top-level keys with a bounded, redacted view of each value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
    pub requested_at: String,
    pub expires_at: String,
    pub state: ApprovalState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A person's decision on a held call of a TaskRun in the same namespace. Created by
/// `orchestrator-cli task approve|reject`; creating one needs the `orchestrator-approver`
/// ClusterRole (or equivalent RBAC), and an admission policy shipped by the chart requires
/// `spec.decidedBy` to be the creating identity. Named `<taskRun>-<id>`, so the first decision
/// on a request is the only one; the TaskRun owns it (garbage collected with it).
// Several columns are strings: not the duplicate clippy takes them for.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "orchestrator.io",
    version = "v1",
    kind = "ToolApproval",
    namespaced,
    doc = "A person's decision (approve or reject) on a tool call a TaskRun's proxy holds for approval.",
    printcolumn(name = "TaskRun", type_ = "string", json_path = ".spec.taskRun"),
    printcolumn(name = "Request", type_ = "string", json_path = ".spec.id"),
    printcolumn(name = "Decision", type_ = "string", json_path = ".spec.decision"),
    printcolumn(name = "By", type_ = "string", json_path = ".spec.decidedBy"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "a decision cannot be changed; it is recorded as made"}]))]
pub struct ToolApprovalSpec {
    /// The TaskRun whose call this decides.
    #[schemars(length(min = 1, max = 253))]
    pub task_run: String,
    /// The request's id (`orchestrator-cli task approvals TASK`).
    #[schemars(length(min = 1, max = 64))]
    pub id: String,
    pub decision: Decision,
    /// Why; shown to the agent on a rejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub reason: Option<String>,
    /// Who decided: must be the identity creating the object (checked at admission).
    #[schemars(length(min = 1, max = 512))]
    pub decided_by: String,
}

/// The name of the ToolApproval deciding request `id` of `task_run`.
pub fn object_name(task_run: &str, id: &str) -> String {
    format!("{task_run}-{id}")
}

/// A bounded view of a call's arguments for a person deciding it: each top-level key (at most
/// [`MAX_SUMMARY_KEYS`]) with its value's shape. Strings are clipped to [`MAX_SUMMARY_CHARS`]
/// characters, and shown as `<redacted>` when the key sounds secret or the value looks like a
/// credential; objects and arrays show only their size.
pub fn summarize(
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
) -> BTreeMap<String, String> {
    use serde_json::Value;
    let mut out = BTreeMap::new();
    let Some(arguments) = arguments else {
        return out;
    };
    for (full_key, value) in arguments.iter().take(MAX_SUMMARY_KEYS) {
        let key = clip(full_key, MAX_SUMMARY_CHARS);
        let shown = match value {
            _ if secret_key(full_key) => "<redacted>".to_string(),
            Value::String(s) if looks_like_credential(s) => "<redacted>".to_string(),
            Value::String(s) if s.chars().count() > MAX_SUMMARY_CHARS => format!(
                "{:?}… ({} chars)",
                clip(s, MAX_SUMMARY_CHARS),
                s.chars().count()
            ),
            Value::String(s) => format!("{s:?}"),
            Value::Array(a) => format!("array of {}", a.len()),
            Value::Object(o) => format!("object with {} keys", o.len()),
            other => other.to_string(),
        };
        out.insert(key, shown);
    }
    if arguments.len() > MAX_SUMMARY_KEYS {
        out.insert(
            "…".to_string(),
            format!("{} more keys", arguments.len() - MAX_SUMMARY_KEYS),
        );
    }
    out
}

/// The first `max` characters of `s`.
pub fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "token",
        "secret",
        "password",
        "passwd",
        "key",
        "authorization",
        "credential",
        "cookie",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// A value holding something shaped like a credential anywhere in it: a known token prefix, a
/// long unbroken run of letters, digits and `-_+/=.` (an API key, a JWT, base64 of a secret), or
/// a secret-sounding name followed by `=` or `:` (`PGPASSWORD=...`, `"api_key": "..."`). The value
/// is cut into runs at every other character, so quotes, `@`, `:` and spaces hide nothing.
fn looks_like_credential(value: &str) -> bool {
    const PREFIXES: [&str; 8] = [
        "sk-",
        "ghp_",
        "gho_",
        "ghs_",
        "github_pat_",
        "xox",
        "AKIA",
        "eyJ",
    ];
    let credential_char = |c: char| c.is_ascii_alphanumeric() || "-_+/=.".contains(c);
    let run_is_secret = |run: &str| {
        PREFIXES.iter().any(|p| run.starts_with(p))
            || (run.len() >= 32
                && run.chars().any(|c| c.is_ascii_digit())
                && run.chars().any(|c| c.is_ascii_alphabetic()))
    };
    if value
        .split(|c: char| !credential_char(c))
        .any(run_is_secret)
    {
        return true;
    }
    // A secret-sounding name with a value after it.
    let lower = value.to_ascii_lowercase();
    lower.match_indices(['=', ':']).any(|(at, _)| {
        let name: String = lower[..at]
            .trim_end_matches(['"', '\'', ' '])
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        secret_key(&name.chars().rev().collect::<String>())
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_call_waits_by_class_or_by_pattern() {
        let policy = RequireApproval {
            risk: Some(Risk::Destructive),
            tools: vec!["github/merge_*".into()],
            timeout_seconds: None,
        };
        assert!(policy.requires("fs", "rm", Some(Risk::Destructive)));
        assert!(!policy.requires("fs", "write", Some(Risk::Write)));
        assert!(!policy.requires("fs", "write", None));
        assert!(policy.requires("github", "merge_pull_request", Some(Risk::Write)));
        assert!(!policy.requires("gitlab", "merge_pull_request", Some(Risk::Write)));
        assert_eq!(policy.timeout_seconds(), DEFAULT_TIMEOUT_SECONDS);
    }

    #[test]
    fn a_summary_shows_shapes_and_clips_and_redacts_what_looks_secret() {
        let long = "x ".repeat(100);
        let args = json!({
            "path": "/workspace/a.txt",
            "content": long,
            "api_token": "hunter2",
            "header": "ghp_abcdefabcdefabcdefabcdefabcdef123456",
            "blob": "QWxhZGRpbjpvcGVuIHNlc2FtZQ0123456789abcdefXYZ",
            "items": [1, 2, 3],
            "options": {"a": 1},
            "force": true,
        });
        let summary = summarize(args.as_object());
        assert_eq!(summary["path"], "\"/workspace/a.txt\"");
        assert!(
            summary["content"].ends_with("(200 chars)"),
            "{}",
            summary["content"]
        );
        assert_eq!(summary["api_token"], "<redacted>");
        assert_eq!(summary["header"], "<redacted>");
        assert_eq!(summary["blob"], "<redacted>");
        assert_eq!(summary["items"], "array of 3");
        assert_eq!(summary["options"], "object with 1 keys");
        assert_eq!(summary["force"], "true");
        let text = serde_json::to_string(&summary).unwrap_or_default();
        assert!(!text.contains("hunter2") && !text.contains("ghp_abc"));
    }

    #[test]
    fn credentials_inside_longer_text_are_redacted_too() {
        let args = json!({
            "command": "curl -H \"Authorization: Bearer ghp_abcdefabcdefabcdef\" https://x",
            "url": "https://x-access-token:ghs_abcdefabcdef@github.com/o/r.git",
            "body": "{\"api_key\":\"k123\"}",
            "env": "PGPASSWORD=hunter2 psql",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx_token": "t0k3n",
            "note": "keep the build green",
        });
        let summary = summarize(args.as_object());
        for key in ["command", "url", "body", "env"] {
            assert_eq!(summary[key], "<redacted>", "{key}: {}", summary[key]);
        }
        assert!(
            summary.values().filter(|v| *v == "<redacted>").count() == 5,
            "{summary:?}"
        );
        assert_eq!(summary["note"], "\"keep the build green\"");
    }

    #[test]
    fn a_summary_of_many_keys_is_bounded() {
        let args: serde_json::Map<_, _> = (0..40).map(|i| (format!("k{i:02}"), json!(i))).collect();
        let summary = summarize(Some(&args));
        assert_eq!(summary.len(), MAX_SUMMARY_KEYS + 1);
        assert_eq!(summary["…"], "24 more keys");
    }
}
