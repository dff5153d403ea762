//! Which pod's proxy may write the task's Lease: the operator names the task pod on the Lease
//! ([`BINDING_UID_ANNOTATION`], [`BINDING_POD_ANNOTATION`], under [`BINDING_MANAGER`]), and the
//! chart's admission policy lets a namespace ServiceAccount write the Lease only with a token
//! bound to that pod (`templates/approval.yaml`). Without it, every pod running the task's
//! ServiceAccount (a shared one, or `default`) could publish approval requests in the task's
//! name, or withdraw them.
//!
//! The pod is the one the task's Job created: listed by the Job's uid, controlled by the Job,
//! not finished. `backoffLimit: 0` means one per task; more than one (a pod forged with the
//! Job's labels and owner) binds none, which fails closed: the proxy cannot publish, and its
//! held calls time out. A Lease is bound once; a task running when the operator is upgraded is
//! bound at its next reconcile (its Lease gets the policy's label then too).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::{
    BINDING_MANAGER, BINDING_POD_ANNOTATION, BINDING_UID_ANNOTATION, LEASE_LABEL,
};
use orchestrator_crds::taskrun::TaskRun;
use serde_json::json;

use crate::error::Result;
use crate::reconcile::context::Context;
use crate::reconcile::events;
use crate::reconcile::facts::JobFacts;
use crate::render::shared::TaskPod;

/// The pods' label naming their Job's uid (set by the Job controller).
const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";

/// The pod a Lease is to be bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// No pod yet (or only finished ones).
    None,
    One {
        name: String,
        uid: String,
        /// `status.podIP`, once it has one.
        ip: Option<String>,
    },
    /// Several: none is bound.
    Ambiguous(Vec<String>),
}

/// The pod of the Job with `job_uid` whose proxy may write the Lease: the one pod that is not
/// finished (nor going) and whose controller is that Job.
pub fn candidate(pods: &[Pod], job_uid: &str) -> Candidate {
    let mut found: Vec<(String, String, Option<String>)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            p.owner_references().iter().any(|o| {
                o.controller == Some(true)
                    && o.kind == "Job"
                    && o.api_version == "batch/v1"
                    && o.uid == job_uid
            })
        })
        .filter_map(|p| {
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            Some((p.name_any(), p.metadata.uid.clone()?, ip))
        })
        .collect();
    match found.len() {
        0 => Candidate::None,
        1 => {
            let (name, uid, ip) = found.remove(0);
            Candidate::One { name, uid, ip }
        }
        _ => Candidate::Ambiguous(found.into_iter().map(|(name, ..)| name).collect()),
    }
}

/// Binds the Lease of a running task that is not bound yet to its Job's pod (see the module).
/// In shared mode (`shared`), when the shared proxy's ConfigMap does not name the pod with its
/// IP yet (`need_pod`), returns that pod: the same one the Lease is bound to, or none (fails
/// closed: the shared proxy serves no token for the task). A failure is logged, not returned:
/// the rest of the reconcile goes on, the Lease stays unbound (its proxy cannot write it) and
/// the next reconcile tries again.
pub async fn bind_lease(
    ctx: &Context,
    tr: &TaskRun,
    job: &JobFacts,
    (shared, need_pod): (bool, bool),
) -> Option<TaskPod> {
    match bind(ctx, tr, job, shared, need_pod).await {
        Ok(pod) => pod,
        Err(error) => {
            tracing::warn!(taskrun = %tr.name_any(), %error, "could not bind the task's Lease to its pod");
            None
        }
    }
}

async fn bind(
    ctx: &Context,
    tr: &TaskRun,
    job: &JobFacts,
    shared: bool,
    need_pod: bool,
) -> Result<Option<TaskPod>> {
    let (ns, name) = (tr.namespace().unwrap_or_default(), tr.name_any());
    let bound_uid = ctx.leases.get(&ns, &name).and_then(|f| f.bound_uid.clone());
    let Some(job_uid) = job.uid.as_deref() else {
        return Ok(None);
    };
    // Only a task with a Lease has one to bind (the API watch on, or shared mode).
    let has_lease = ctx.render.sidecar_api_watch || shared;
    let bind_lease = bound_uid.is_none() && has_lease;
    if !bind_lease && !need_pod {
        return Ok(None);
    }
    let selector = format!("{CONTROLLER_UID_LABEL}={job_uid}");
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&selector))
        .await?;
    match candidate(&pods.items, job_uid) {
        Candidate::None => Ok(None),
        Candidate::One { uid, ip, .. } if !bind_lease => {
            // Bound before: only that pod, never another.
            let same = bound_uid.as_deref().is_none_or(|b| b == uid);
            if !same {
                tracing::warn!(lease = %name, %uid, "the Job's pod is not the one its Lease is bound to; the shared proxy serves none");
            }
            Ok(same.then_some(TaskPod { uid, ip }))
        }
        Candidate::One { name: pod, uid, ip } => {
            // A merge patch, not an apply: a Lease that is gone is not created again here.
            let patch = json!({"metadata": {
                "labels": {LEASE_LABEL: "true"},
                "annotations": {BINDING_UID_ANNOTATION: uid, BINDING_POD_ANNOTATION: pod},
            }});
            let leases = Api::<Lease>::namespaced(ctx.client.clone(), &ns);
            match leases
                .patch(&name, &binding_manager(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(lease = %name, %pod, %uid, "bound the task's Lease to its pod");
                    Ok(Some(TaskPod { uid, ip }))
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    tracing::warn!(lease = %name, "the task's Lease is gone; nothing to bind");
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        }
        Candidate::Ambiguous(pods) => {
            let note = format!(
                "Job {name} has {} pods that are not finished ({}); the proxy of none may publish approval requests or what it serves, so held calls are refused at their timeout. Delete the pods that are not the Job's own",
                pods.len(),
                pods.join(", ")
            );
            tracing::warn!(lease = %name, ?pods, "several candidate pods; the Lease stays unbound");
            events::publish(
                ctx,
                tr,
                EventType::Warning,
                "ProxyIdentityAmbiguous",
                "Bind",
                note,
            )
            .await;
            Ok(None)
        }
    }
}

/// Writes under [`BINDING_MANAGER`], so no other write of the operator owns the binding.
fn binding_manager() -> PatchParams {
    PatchParams {
        field_manager: Some(BINDING_MANAGER.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const JOB: &str = "6f1c1a52-0000-4000-8000-00000000j0b1";

    fn pod(name: &str, uid: &str, owner_uid: &str, phase: &str) -> Pod {
        let value: Value = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "uid": uid,
                "labels": {CONTROLLER_UID_LABEL: JOB, "job-name": "t"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "t",
                                     "uid": owner_uid, "controller": true}]},
            "status": {"phase": phase}});
        serde_json::from_value(value).unwrap_or_else(|e| panic!("a Pod: {e}"))
    }

    #[test]
    fn the_one_pod_of_the_job_is_bound_and_a_second_makes_it_ambiguous() {
        let own = pod("t-abcde", "uid-1", JOB, "Running");
        assert_eq!(
            candidate(std::slice::from_ref(&own), JOB),
            Candidate::One {
                name: "t-abcde".into(),
                uid: "uid-1".into(),
                ip: None
            }
        );
        // Finished pods, pods going away and pods of another controller do not count.
        let done = pod("t-old", "uid-0", JOB, "Failed");
        let mut going = pod("t-going", "uid-2", JOB, "Running");
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let elsewhere = pod("x", "uid-3", "another-job", "Running");
        let mut not_controller = pod("y", "uid-4", JOB, "Running");
        if let Some(o) = not_controller.metadata.owner_references.as_mut() {
            o[0].controller = None;
        }
        assert_eq!(
            candidate(
                &[done.clone(), own.clone(), going, elsewhere, not_controller],
                JOB
            ),
            Candidate::One {
                name: "t-abcde".into(),
                uid: "uid-1".into(),
                ip: None
            }
        );
        // A pod forged with the Job as its controller: neither is bound (fails closed).
        let forged = pod("forger", "uid-5", JOB, "Pending");
        assert_eq!(
            candidate(&[own, forged], JOB),
            Candidate::Ambiguous(vec!["t-abcde".into(), "forger".into()])
        );
        assert_eq!(candidate(&[done], JOB), Candidate::None);
        assert_eq!(candidate(&[], JOB), Candidate::None);
    }
}
