//! What the operator keeps of a ToolApproval: a person's decision on a held call
//! ([`DecisionFacts`], merged into `status.approvals` by `approvals.rs`).

use k8s_openapi::jiff::Timestamp;
use orchestrator_crds::approval::{Decision, MAX_REASON_CHARS, ToolApproval, clip};

/// What the operator keeps of a ToolApproval.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionFacts {
    pub task_run: String,
    pub id: String,
    /// The digest of the call it decides.
    pub digest: String,
    pub decision: Decision,
    pub decided_by: String,
    pub reason: Option<String>,
    /// When the API server stored it (RFC 3339).
    pub decided_at: Option<Timestamp>,
}

/// The facts of a ToolApproval.
pub fn decision_facts(approval: &ToolApproval) -> Option<DecisionFacts> {
    Some(DecisionFacts {
        task_run: approval.spec.task_run.clone(),
        id: approval.spec.id.clone(),
        digest: approval.spec.digest.clone(),
        decision: approval.spec.decision,
        decided_by: approval.spec.decided_by.clone(),
        reason: approval
            .spec
            .reason
            .as_deref()
            .map(|r| clip(r, MAX_REASON_CHARS)),
        decided_at: approval.metadata.creation_timestamp.as_ref().map(|t| t.0),
    })
}
