//! The objects as the operator caches them: trimmed to what reconcile reads, which keeps the
//! operator small with thousands of tasks (docs/benchmarks.md, "Operator at scale"). Pure.
//!
//! What goes: `managedFields` everywhere; the TaskRun's labels and annotations (kubectl's
//! `last-applied-configuration` copies the whole spec) and, once its outcome is recorded, its task
//! text; a ConfigMap's data, kept as a digest; of a Job, its labels and annotations (its pod
//! template is never read, see `cached_job.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use orchestrator_crds::taskrun::{Phase, TaskRun};

use super::cached_job::CachedJob;
use crate::render::{self, CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION};

/// Only in the operator's cache, never on a stored ConfigMap: the digest of the ConfigMap's data,
/// which the cache keeps instead of the data.
pub const CACHED_DATA_DIGEST: &str = "orchestrator.io/cached-data-digest";

/// Keeps of a TaskRun what reconcile reads: identity, spec and status. A finished task whose
/// outcome is recorded is never rendered again from the cache (see `finished.rs`), so its task
/// text goes too; a change to its spec is rendered from a fresh read.
pub fn trim_taskrun(tr: &mut TaskRun) {
    tr.metadata.managed_fields = None;
    tr.metadata.annotations = None;
    tr.metadata.labels = None;
    let recorded = tr
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_terminal);
    if recorded {
        tr.spec.task.prompt = None;
    }
}

/// Whether the cache dropped this TaskRun's task text (the API server requires exactly one task
/// source, so a TaskRun without any was trimmed).
pub fn task_text_dropped(tr: &TaskRun) -> bool {
    let task = &tr.spec.task;
    task.prompt.is_none() && task.config_map_key_ref.is_none() && task.secret_key_ref.is_none()
}

/// Keeps of a Job what reconcile reads (see [`CachedJob`]: the rest is never deserialized).
pub fn trim_job(job: &mut CachedJob) {
    job.metadata.managed_fields = None;
    job.metadata.annotations = None;
    job.metadata.labels = None;
    if let Some(status) = job.status.as_mut() {
        status.uncounted_terminated_pods = None;
    }
}

/// Keeps of a ConfigMap what reconcile reads: the operator's two annotations, owners, and the
/// digest of its data ([`CACHED_DATA_DIGEST`]) instead of the data (see [`holds`]).
pub fn trim_config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
    cm.metadata.labels = None;
    let digest = match (cm.data.take(), cm.binary_data.take()) {
        (data, None) => render::digest(&data.unwrap_or_default()),
        // The operator never writes binaryData: a ConfigMap with any differs from every render.
        (_, Some(_)) => "binaryData".to_string(),
    };
    let mut kept: BTreeMap<String, String> = cm
        .metadata
        .annotations
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == CONTEXT_VERSION_ANNOTATION || k == CONFIG_HASH_ANNOTATION)
        .collect();
    kept.insert(CACHED_DATA_DIGEST.to_string(), digest);
    cm.metadata.annotations = Some(kept);
}

/// Whether a trimmed ConfigMap holds exactly `data`.
pub fn holds(trimmed: &ConfigMap, data: &BTreeMap<String, String>) -> bool {
    trimmed
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CACHED_DATA_DIGEST))
        .is_some_and(|d| *d == render::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_trimmed_config_map_tells_its_data_by_digest() {
        let cm = |data: serde_json::Value| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": {"name": "t-tools", "labels": {"a": "b"},
                    "annotations": {CONTEXT_VERSION_ANNOTATION: "2", CONFIG_HASH_ANNOTATION: "h",
                        "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                    "managedFields": [{"manager": "kubectl"}]},
                "data": data
            }))
            .expect("a ConfigMap")
        };
        let data = BTreeMap::from([
            ("proxy.yaml".to_string(), "servers: []\n".to_string()),
            ("task.md".to_string(), "# Task\n".to_string()),
        ]);
        let mut same = cm(json!(data));
        trim_config_map(&mut same);
        assert!(holds(&same, &data));
        assert_eq!(same.data, None, "the data itself is not kept");
        assert_eq!(same.metadata.labels, None);
        assert_eq!(same.metadata.managed_fields, None);
        let kept: Vec<&str> = same
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            kept,
            [
                CACHED_DATA_DIGEST,
                CONFIG_HASH_ANNOTATION,
                CONTEXT_VERSION_ANNOTATION
            ]
        );

        // An edited value, an added or a removed key: not the rendered data.
        let mut edited = cm(json!({"proxy.yaml": "servers: [x]\n", "task.md": "# Task\n"}));
        trim_config_map(&mut edited);
        assert!(!holds(&edited, &data));
        let mut added = cm(json!({"proxy.yaml": "servers: []\n", "task.md": "# Task\n", "x": ""}));
        trim_config_map(&mut added);
        assert!(!holds(&added, &data));
        let mut removed = cm(json!({"proxy.yaml": "servers: []\n"}));
        trim_config_map(&mut removed);
        assert!(!holds(&removed, &data));
        // Untrimmed (a fresh read that was not trimmed): never taken for the rendered data.
        assert!(!holds(&cm(json!(data)), &data));
    }

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
}
