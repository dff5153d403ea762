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

use crate::error::Result;
use crate::reconcile::context::{Context, apply};
use crate::reconcile::facts::{CachedJob, JobFacts, JobState, Observed};
use crate::reconcile::placement::Placement;
use crate::reconcile::ttl::{self, Ttl};
use crate::reconcile::{events, status};
use crate::render::{self, Plan};

/// Creates the Job of an unfinished task that has none (a finished task is never run again, even
/// when its Job is gone), with its pod's identity first, and records it in `seen`.
pub async fn create_if_missing(
    tr: &TaskRun,
    ctx: &Context,
    seen: &mut Observed,
    plan: &Plan,
    placement: Placement,
) -> Result<()> {
    if seen.job.is_some() || seen.finished {
        return Ok(());
    }
    // The pod's identity first: a pod naming a ServiceAccount that does not exist is
    // refused by admission, and the Job controller would only retry with backoff.
    apply_identity(&ctx.client, &seen.ns, plan.identity()).await?;
    placement.prepare_job(ctx, &seen.ns, tr, plan).await?;
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

/// [`expire_job`] for the task as observed.
pub async fn expire(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
) -> Result<(Option<Duration>, bool)> {
    let (job, previous) = (seen.job_state.as_ref(), &seen.previous);
    expire_job(tr, ctx, &seen.ns, job, previous, &status::now()).await
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
