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
//! its own requests.
//!
//! An approval approves one exact call. A request shows every byte the proxy will forward
//! (`params`, the `tools/call` params with the values of the task's own Secrets masked) and
//! names the [`CallDigest`] of the unmasked call; a decision names that digest, and the proxy
//! forwards only the call with it, once. Only the task's own proxy pod may write its Lease (the
//! chart's admission policy on [`BINDING_UID_ANNOTATION`], which the operator sets).
//!
//! Nothing a reader of the request (or of the TaskRun's status) sees confirms a guess of a
//! masked value: when something is masked (or the view is [`ViewWithheld`]), the digest also
//! covers a random salt the proxy keeps to itself ([`CallDigest::salted`]), and `paramsBytes` is
//! the length of the view as shown. When nothing is masked, anyone can recompute the digest from
//! the params shown ([`ShownCall::check`]): the operator and the CLI do.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::sha256_jcs;
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
/// The most bytes one request's JSON may take on the Lease (its `params` included): a call
/// whose arguments would take more to show is refused, never held blind. 16 of them (192 KiB)
/// fit the 256 KiB all of an object's annotations may hold.
pub const MAX_REQUEST_BYTES: usize = 12 * 1024;
/// The most distinct Secret keys one request may list as masked.
pub const MAX_MASKED: usize = 64;
/// The length of a request's `maskNonce` (lowercase hex).
pub const MASK_NONCE_LEN: usize = 6;
/// The Lease annotation naming the uid of the one pod whose proxy may write the Lease. Written
/// by the operator only (under [`BINDING_MANAGER`]); the chart's admission policy checks every
/// other write of the Lease against it.
pub const BINDING_UID_ANNOTATION: &str = "orchestrator.io/proxy-pod-uid";
/// The Lease annotation naming that pod (for messages).
pub const BINDING_POD_ANNOTATION: &str = "orchestrator.io/proxy-pod";
/// The field manager of the operator's writes of the two binding annotations.
pub const BINDING_MANAGER: &str = "orchestrator-operator-binding";
/// The label on a task's Lease that puts it under the admission policy (its objectSelector).
pub const LEASE_LABEL: &str = "orchestrator.io/proxy-lease";
/// The version of [`CallDigest`]'s layout.
pub const CALL_DIGEST_VERSION: u32 = 1;
/// The ConfigMap key (shared mode: the task's ConfigMap in the shared proxy's namespace) the
/// operator writes the task's Secret keys into, as a JSON array of [`MaskKey`]s: the keys whose
/// values the shared proxy masks in what it shows an approver (a sidecar reads the same keys as
/// files, `--mask-secrets-dir`).
pub const MASK_KEYS_KEY: &str = "mask-keys.json";
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

/// The exact call a held request stands for: what its digest covers. The digest
/// ([`CallDigest::digest`], [`sha256_jcs`]) is what a decision names; the id is part of it, so
/// each digest names one call, once.
#[derive(Serialize, Clone, Copy, Debug)]
#[serde(rename_all = "camelCase")]
pub struct CallDigest<'a> {
    /// [`CALL_DIGEST_VERSION`].
    pub v: u32,
    pub namespace: &'a str,
    pub task_run: &'a str,
    pub id: &'a str,
    pub server: &'a str,
    /// The hash of the tool's definition the call was held against (`sha256:…`).
    pub definition: &'a str,
    /// The task's context version (its policy) when the call was held.
    pub context_version: u64,
    /// The unmasked `tools/call` params the proxy will send upstream: `name` (the upstream
    /// tool's name) and, when present, `arguments`, `_meta` (without the trace context the
    /// proxy replaces), `requestState` and `inputResponses`.
    pub params: &'a Value,
}

impl CallDigest<'_> {
    /// `sha256:` and 64 hex digits over every part (RFC 8785 canonical JSON).
    pub fn digest(&self) -> String {
        sha256_jcs(self)
    }

    /// The digest of a call whose view masks something: over every part and `salt` (a member
    /// `"salt"` beside the others), a random value the proxy keeps and never publishes. Nobody
    /// who only sees the request can recompute it, so it confirms no guess of a masked value.
    pub fn salted(&self, salt: &str) -> String {
        #[derive(Serialize)]
        struct Salted<'a> {
            #[serde(flatten)]
            call: &'a CallDigest<'a>,
            salt: &'a str,
        }
        sha256_jcs(&Salted { call: self, salt })
    }
}

/// A Secret key whose value is masked (what [`MASK_KEYS_KEY`] lists).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaskKey {
    pub secret: String,
    pub key: String,
}

/// Why a request shows no params: its view, with the task's Secret values masked, cannot be
/// shown. The call is held all the same (what the agent sees never depends on whether a value
/// was masked), but it cannot be approved: a person can only reject it or let it expire.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ViewWithheld {
    /// With its values masked the request would take more than [`MAX_REQUEST_BYTES`] (each
    /// placeholder may be longer than the value it stands for).
    TooLarge,
    /// Two keys of one object would read the same once masked (they differ only in how a
    /// value is written).
    Ambiguous,
    /// The masked view could not be made.
    Failed,
}

impl ViewWithheld {
    /// Why, in words (after "its params are not shown: ").
    pub fn describe(self) -> &'static str {
        match self {
            ViewWithheld::TooLarge => {
                "with the task's Secret values masked they would take more than a request may hold (a placeholder can be longer than the value it stands for)"
            }
            ViewWithheld::Ambiguous => {
                "two of its keys would read the same once a Secret value in them is masked"
            }
            ViewWithheld::Failed => {
                "the view with the task's Secret values masked could not be made"
            }
        }
    }
}

/// What a request shows of its call, for checking its digest against it ([`ShownCall::check`]).
#[derive(Clone, Copy, Debug)]
pub struct ShownCall<'a> {
    pub namespace: &'a str,
    pub task_run: &'a str,
    pub id: &'a str,
    pub server: &'a str,
    pub definition: &'a str,
    pub context_version: u64,
    /// The params text shown (`None`: not kept, or withheld).
    pub params: Option<&'a str>,
    /// Whether anything is masked in it, or its view is withheld.
    pub masked: bool,
    pub digest: &'a str,
}

/// What a digest says of the params shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DigestCheck {
    /// Recomputed from the params shown: the digest covers exactly them.
    Covers,
    /// Something is masked (or nothing is shown): the digest is salted, it cannot be recomputed
    /// here; the proxy checks it.
    Salted,
    /// The params shown hash to another digest (`computed`): the request shows another call
    /// than the one it names.
    Mismatch { computed: String },
    /// The params shown are not a JSON object.
    Unreadable,
}

impl ShownCall<'_> {
    /// Recomputes the [`CallDigest`] from the params shown when nothing is masked.
    pub fn check(&self) -> DigestCheck {
        let Some(text) = self.params.filter(|_| !self.masked) else {
            return DigestCheck::Salted;
        };
        let params = match serde_json::from_str::<Value>(text) {
            Ok(params @ Value::Object(_)) => params,
            _ => return DigestCheck::Unreadable,
        };
        let computed = CallDigest {
            v: CALL_DIGEST_VERSION,
            namespace: self.namespace,
            task_run: self.task_run,
            id: self.id,
            server: self.server,
            definition: self.definition,
            context_version: self.context_version,
            params: &params,
        }
        .digest();
        if computed == self.digest {
            DigestCheck::Covers
        } else {
            DigestCheck::Mismatch { computed }
        }
    }
}

/// A Secret key whose value a request's `params` shows masked, as
/// `<secret:SECRET/KEY:NONCE>` (NONCE is the request's `maskNonce`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaskedSecret {
    #[schemars(length(max = 253))]
    pub secret: String,
    #[schemars(length(max = 253))]
    pub key: String,
    /// How many times its value was masked.
    pub count: u32,
}

/// A call the proxy holds, as it tells the operator (on its Lease): every byte it will forward,
/// with the task's Secret values masked, and the digest of the unmasked call. At most
/// [`MAX_REQUEST_BYTES`] of JSON.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// Unique within the task: what `task approve TASK ID` names.
    pub id: String,
    pub server: String,
    pub tool: String,
    /// The [`CallDigest`] of the unmasked call: what a decision must name.
    pub digest: String,
    /// The hash of the tool's definition the call was held against.
    pub definition: String,
    /// The task's context version when the call was held.
    pub context_version: u64,
    /// The `tools/call` params the proxy will forward, as compact JSON, byte for byte, except
    /// that each value of the task's Secrets is replaced by `<secret:SECRET/KEY:NONCE>`; empty
    /// when the view is `withheld`.
    pub params: String,
    /// The length of the params' JSON as shown (masked): never the unmasked length, which
    /// would tell a masked value's length.
    pub params_bytes: u32,
    /// The Secret keys masked in `params`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<MaskedSecret>,
    /// Random per request: only placeholders carrying it are masks (a literal the agent typed
    /// cannot pose as one).
    pub mask_nonce: String,
    /// Set when the params cannot be shown with the Secret values masked (`params` is empty):
    /// the call is held, and can only be rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld: Option<ViewWithheld>,
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
    /// The digest of the call decided: the proxy forwards only the held call with this digest
    /// (an empty one matches none).
    #[serde(default)]
    pub digest: String,
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
    /// The [`CallDigest`] of the call (empty on entries written before digests).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub definition: String,
    #[serde(default)]
    pub context_version: u64,
    /// Every byte the proxy will forward, Secret values masked ([`ApprovalRequest::params`]);
    /// kept while Pending only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<String>,
    /// The length of the params as shown (masked).
    #[serde(default)]
    pub params_bytes: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<MaskedSecret>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mask_nonce: String,
    /// Set when the params could not be shown with the Secret values masked: such a call can
    /// only be rejected ([`ApprovalRequest::withheld`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld: Option<ViewWithheld>,
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

impl ApprovalRequest {
    /// What it shows, on the Lease of `task_run` in `namespace`.
    pub fn shown<'a>(&'a self, namespace: &'a str, task_run: &'a str) -> ShownCall<'a> {
        ShownCall {
            namespace,
            task_run,
            id: &self.id,
            server: &self.server,
            definition: &self.definition,
            context_version: self.context_version,
            params: self.withheld.is_none().then_some(self.params.as_str()),
            masked: !self.masked.is_empty() || self.withheld.is_some(),
            digest: &self.digest,
        }
    }
}

impl Approval {
    /// What it shows, in the status of `task_run` in `namespace`.
    pub fn shown<'a>(&'a self, namespace: &'a str, task_run: &'a str) -> ShownCall<'a> {
        ShownCall {
            namespace,
            task_run,
            id: &self.id,
            server: &self.server,
            definition: &self.definition,
            context_version: self.context_version,
            params: self.params.as_deref().filter(|_| self.withheld.is_none()),
            masked: !self.masked.is_empty() || self.withheld.is_some(),
            digest: &self.digest,
        }
    }
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
    category = "orchestrator",
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
    /// The digest of the call decided, as the request shows it (`task approvals TASK --show
    /// ID`): the proxy forwards only the call with this digest.
    #[schemars(pattern(r"^sha256:[0-9a-f]{64}$"))]
    pub digest: String,
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

/// The first `max` characters of `s`.
pub fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests;
