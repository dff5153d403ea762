//! A running pod learns of a new config at once: the kubelet copies a changed ConfigMap into a
//! pod's volume only when it syncs the pod, which it does every `syncFrequency` (1 min by
//! default) or when the pod object changes. So after writing a new config the operator writes
//! its version as an annotation on the task's running pods: a change the kubelet acts on at once
//! (`podsDifferSemantically` in the kubelet's pod config compares annotations), updating the
//! volume within about a second instead of up to a minute. Nothing else about the pod changes
//! (annotations are the pod's mutable metadata; no container restarts).
//!
//! Best effort: a failed list or patch is logged, and the periodic sync still delivers the
//! config within `syncFrequency`.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::render::CONTEXT_VERSION_ANNOTATION;

/// Annotates the Job's pods that are still running with `version`; returns how many it
/// annotated.
pub async fn pods(client: &Client, ns: &str, job: &str, version: u64) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    let list = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(job, error = %e, "could not list the task's pods to tell the kubelet of the new config; it arrives with the kubelet's next periodic sync");
            return 0;
        }
    };
    let value = version.to_string();
    let patch = json!({"metadata": {"annotations": {CONTEXT_VERSION_ANNOTATION: value}}});
    let mut annotated = 0;
    for pod in list.items.iter().filter(|p| needs(p, &value)) {
        let name = pod.name_any();
        match pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => annotated += 1,
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "could not annotate the pod with the new config's version; it arrives with the kubelet's next periodic sync");
            }
        }
    }
    annotated
}

/// A pod that is neither finished nor being deleted, and not yet told of `version`.
fn needs(pod: &Pod, version: &str) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
        && pod.metadata.deletion_timestamp.is_none()
        && pod
            .annotations()
            .get(CONTEXT_VERSION_ANNOTATION)
            .map(String::as_str)
            != Some(version)
}
