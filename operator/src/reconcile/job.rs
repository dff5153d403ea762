//! The task's Job and its pod's identity: applied once, when the Job does not exist and the task
//! has not finished, and never written again (its pod template is immutable); deleted after
//! `ttlSecondsAfterFinished` (see `ttl.rs`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DeleteParams;
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus};

use super::cached_job::CachedJob;
use super::children::JobFacts;
use super::observe::Observed;
use super::status::JobState;
use super::ttl::{self, Ttl};
use super::{Context, apply, events};
use crate::error::Result;
use crate::render::{self, Plan};

/// Creates the Job of an unfinished task that has none (a finished task is never run again, even
/// when its Job is gone), with its pod's identity first, and records it in `seen`.
pub async fn create_if_missing(
    tr: &TaskRun,
    ctx: &Context,
    seen: &mut Observed,
    plan: &Plan,
) -> Result<()> {
    if seen.job.is_some() || seen.finished {
        return Ok(());
    }
    // The pod's identity first: a pod naming a ServiceAccount that does not exist is
    // refused by admission, and the Job controller would only retry with backoff.
    apply_identity(&ctx.client, &seen.ns, plan.identity()).await?;
    // Shared mode: each zone's key, which its container mounts (the pod waits for none).
    super::zone_keys::create_if_missing(ctx, &seen.ns, tr, plan).await?;
    // Sidecar mode: the auditors' credential the proxy accepts on its read-only endpoints.
    if plan.shared().is_none() {
        super::auditor::create_if_missing(ctx, &seen.ns).await?;
    }
    let jobs: Api<CachedJob> = Api::namespaced(ctx.client.clone(), &seen.ns);
    let created = JobFacts::of(&apply(&jobs, plan.job()).await?);
    let note = format!(
        "created Job {} (agent image {}, proxy image {})",
        plan.job_name(),
        events::agent_image(plan.job()),
        ctx.render.sidecar_image
    );
    events::publish(ctx, tr, EventType::Normal, "JobCreated", "CreateJob", note).await;
    seen.job_state = Some(created.state.clone());
    seen.job = Some(Arc::new(created));
    Ok(())
}

/// A running shared task's Role again when its config changed: the shared proxy reads the task's
/// Secrets through it, and a server enabled since may name one the Role did not (a sidecar's
/// pod gets every listed server's Secret when it is created; the shared proxy, through this).
pub async fn refresh_shared_role(ctx: &Context, seen: &Observed, plan: &Plan) -> Result<()> {
    if plan.shared().is_none() || seen.job.is_none() || seen.finished {
        return Ok(());
    }
    apply(
        &Api::<Role>::namespaced(ctx.client.clone(), &seen.ns),
        &plan.identity().role,
    )
    .await?;
    Ok(())
}

/// The task pod's ServiceAccount (unless the TaskRun names its own), Role and RoleBinding (and
/// in shared mode the shared proxy's RoleBinding), and Lease.
async fn apply_identity(
    client: &Client,
    ns: &str,
    identity: &render::identity::Identity,
) -> Result<()> {
    if let Some(sa) = &identity.service_account {
        apply(&Api::<ServiceAccount>::namespaced(client.clone(), ns), sa).await?;
    }
    apply(&Api::<Role>::namespaced(client.clone(), ns), &identity.role).await?;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), ns);
    if let Some(binding) = &identity.role_binding {
        apply(&bindings, binding).await?;
    }
    if let Some(binding) = &identity.shared_binding {
        apply(&bindings, binding).await?;
    }
    if let Some(lease) = &identity.lease {
        apply(&Api::<Lease>::namespaced(client.clone(), ns), lease).await?;
    }
    Ok(())
}

/// `ttlSecondsAfterFinished` (see ttl.rs): deletes the finished Job when it is due. Returns when
/// to look again for it, and whether it was deleted now.
pub async fn expire_job(
    tr: &TaskRun,
    ctx: &Context,
    ns: &str,
    job: Option<&JobState>,
    previous: &TaskRunStatus,
    now: &Time,
) -> Result<(Option<Duration>, bool)> {
    let ttl = tr.spec.ttl_seconds_after_finished;
    match ttl::decide(ttl, job, previous.phase, now.0) {
        Ttl::NotDue => Ok((None, false)),
        Ttl::Wait(left) => Ok((Some(left), false)),
        Ttl::Delete => {
            let name = tr.name_any();
            let jobs: Api<CachedJob> = Api::namespaced(ctx.client.clone(), ns);
            match jobs.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                // Gone already (the cache lags behind a deletion).
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok((None, true)),
                Err(e) => return Err(e.into()),
            }
            let note = format!(
                "deleted Job {name} {}s after the task finished (ttlSecondsAfterFinished)",
                ttl.unwrap_or_default()
            );
            events::publish(ctx, tr, EventType::Normal, "JobDeleted", "DeleteJob", note).await;
            Ok((None, true))
        }
    }
}
