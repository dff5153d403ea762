//! The TaskRun as the operator caches it: trimmed to what reconcile reads, which keeps the
//! operator small with thousands of tasks (docs/benchmarks.md, "Operator at scale"). Pure. (Of
//! the children only facts are kept, see `facts/children.rs`.)
//!
//! What goes: `managedFields`, labels and annotations but the cancel request and who created
//! the TaskRun (kubectl's
//! `last-applied-configuration` copies the whole spec); `status.tools`, kept as a digest (a
//! quarter of a TaskRun's size in the cache; reconcile only compares it);
//! `status.contextHistory` (read afresh when a version is recorded, see `history.rs`); once its
//! outcome is recorded, the task text.

use kube::ResourceExt;
use orchestrator_crds::taskrun::result::{CANCEL_ANNOTATION, CREATED_BY_ANNOTATION, created_by};
use orchestrator_crds::taskrun::{CancelRequest, EffectiveTools, Phase, TaskRun, TaskRunStatus};
use sha2::{Digest, Sha256};

use crate::render::short_hex;

/// Only in the operator's cache, never on a stored TaskRun: `status.tools` becomes one entry
/// whose server is this followed by the digest of the list (a server is a DNS-1123 label, so no
/// real entry starts so).
const TOOLS_DIGEST: &str = "#cached-tools-digest:";

/// Keeps of a TaskRun what reconcile reads: identity, spec and status. A finished task whose
/// outcome is recorded is never rendered again from the cache (see `finished.rs`), so its task
/// text goes too; a change to its spec is rendered from a fresh read.
pub fn trim_taskrun(tr: &mut TaskRun) {
    tr.metadata.managed_fields = None;
    // Only the cancel request and the creator, each as its user (clipped, see
    // `CancelRequest::parse` and `created_by`).
    let cancel = tr
        .annotations()
        .get(CANCEL_ANNOTATION)
        .map(|v| CancelRequest::annotation_value(&CancelRequest::parse(v).user));
    let creator = tr
        .annotations()
        .get(CREATED_BY_ANNOTATION)
        .and_then(|v| created_by(v))
        .map(|user| CancelRequest::annotation_value(&user));
    let kept: std::collections::BTreeMap<String, String> = [
        cancel.map(|v| (CANCEL_ANNOTATION.to_string(), v)),
        creator.map(|v| (CREATED_BY_ANNOTATION.to_string(), v)),
    ]
    .into_iter()
    .flatten()
    .collect();
    tr.metadata.annotations = (!kept.is_empty()).then_some(kept);
    tr.metadata.labels = None;
    let recorded = tr
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_terminal);
    if recorded {
        tr.spec.task.prompt = None;
    }
    if let Some(status) = tr.status.as_mut() {
        status.tools = tools_digest(&status.tools);
        status.context_history = Vec::new();
    }
}

/// The one entry that stands for `tools` in the cache.
fn tools_digest(tools: &[EffectiveTools]) -> Vec<EffectiveTools> {
    let json = serde_json::to_vec(tools).unwrap_or_default();
    vec![EffectiveTools {
        server: format!("{TOOLS_DIGEST}{}", short_hex(&Sha256::digest(json))),
        allow: Vec::new(),
        deny: Vec::new(),
        exposed: None,
    }]
}

/// Whether the cache dropped this TaskRun's `status.tools` (kept as a digest).
pub fn tools_dropped(tr: &TaskRun) -> bool {
    tr.status.as_ref().is_some_and(
        |s| matches!(s.tools.as_slice(), [only] if only.server.starts_with(TOOLS_DIGEST)),
    )
}

/// Whether `tr` (as cached, or as read) has exactly `status`, tools included; the history and
/// the approvals are not compared (each is written on its own, see `history.rs`,
/// `approvals.rs`).
pub fn has_status(tr: &TaskRun, status: &TaskRunStatus) -> bool {
    let Some(old) = tr.status.as_ref() else {
        return false;
    };
    let tools = if tools_dropped(tr) {
        tools_digest(&status.tools)
    } else {
        status.tools.clone()
    };
    *old == TaskRunStatus {
        tools,
        context_history: old.context_history.clone(),
        approvals: old.approvals.clone(),
        ..status.clone()
    }
}

/// Whether the cache dropped this TaskRun's task text (the API server requires exactly one task
/// source, so a TaskRun without any was trimmed).
pub fn task_text_dropped(tr: &TaskRun) -> bool {
    let task = &tr.spec.task;
    task.prompt.is_none() && task.config_map_key_ref.is_none() && task.secret_key_ref.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_finished_taskrun_is_cached_without_its_task_text() {
        let tr = |phase: Option<&str>| -> TaskRun {
            let mut v = json!({
                "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
                "metadata": {"name": "t", "namespace": "n", "uid": "u",
                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                    "labels": {"team": "a"}, "managedFields": [{"manager": "kubectl"}]},
                "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "# Do it"}}
            });
            if let Some(p) = phase {
                v["status"] = json!({"phase": p});
            }
            serde_json::from_value(v).expect("a TaskRun")
        };
        for phase in [None, Some("Pending"), Some("Running")] {
            let mut t = tr(phase);
            trim_taskrun(&mut t);
            assert_eq!(t.spec.task.prompt.as_deref(), Some("# Do it"), "{phase:?}");
            assert!(!task_text_dropped(&t));
            assert_eq!(t.metadata.annotations, None);
            assert_eq!(tools_dropped(&t), phase.is_some(), "the tools of a status");
            assert_eq!(t.metadata.labels, None);
            assert_eq!(t.metadata.managed_fields, None);
        }
        for phase in ["Succeeded", "Failed"] {
            let mut t = tr(Some(phase));
            trim_taskrun(&mut t);
            assert_eq!(t.spec.task.prompt, None, "{phase}");
            assert!(task_text_dropped(&t));
            assert_eq!(t.metadata.uid.as_deref(), Some("u"), "identity is kept");
        }
    }

    #[test]
    fn a_cached_status_is_compared_with_its_tools_by_digest() {
        let status: TaskRunStatus = serde_json::from_value(json!({
            "phase": "Running", "contextVersion": 2,
            "tools": [{"server": "everything", "allow": ["echo"], "exposed": ["echo"]}],
            "contextHistory": [{"contextVersion": 2, "time": "2026-01-01T00:00:00Z",
                "requestedBy": "alice", "source": "Annotation", "added": ["everything/echo"]}]
        }))
        .expect("a status");
        let mut tr: TaskRun = serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "namespace": "n"},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "# Do it"}}
        }))
        .expect("a TaskRun");
        tr.status = Some(status.clone());
        assert!(has_status(&tr, &status) && !tools_dropped(&tr));

        trim_taskrun(&mut tr);
        assert!(tools_dropped(&tr));
        assert_eq!(tr.status.as_ref().map(|s| s.tools.len()), Some(1));
        assert_eq!(tr.status.as_ref().map(|s| s.context_history.len()), Some(0));
        // The history is written on its own: the rest of the status is compared without it.
        assert!(has_status(&tr, &status));
        let without = TaskRunStatus {
            context_history: Vec::new(),
            ..status.clone()
        };
        assert!(has_status(&tr, &without));
        // Other tools, none, or another field: a different status.
        let mut other = status.clone();
        other.tools[0].exposed = Some(vec!["echo".into(), "add".into()]);
        assert!(!has_status(&tr, &other));
        let none = TaskRunStatus {
            tools: Vec::new(),
            ..status.clone()
        };
        assert!(!has_status(&tr, &none));
        let later = TaskRunStatus {
            context_version: Some(3),
            ..status.clone()
        };
        assert!(!has_status(&tr, &later));
    }
}
