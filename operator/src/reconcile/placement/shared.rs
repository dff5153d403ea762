//! A shared task's ConfigMap in the shared proxy's namespace (`task.<namespace>.<taskrun>`, see
//! `render/shared.rs`): applied while the task is Pending or Running, with the pod the
//! operator bound the task's Lease to (`binding.rs`) once it has one, and deleted when the task
//! ends (the same reconcile that records its outcome; a cancelled task's says `Terminating`
//! first) or its TaskRun is gone (the sweep, `retention.rs`). It has no owner reference (those
//! cannot cross namespaces), so nothing else deletes it; and its deletion is what makes the
//! shared proxy refuse the finished task's token.
//!
//! What the operator keeps of these ConfigMaps is in `facts/shared.rs`.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use orchestrator_crds::shared::{TASK_PHASE_ANNOTATION, config_map_name};
use orchestrator_crds::taskrun::Phase;
use serde_json::json;

use crate::error::Result;
use crate::reconcile::approvals::Target;
use crate::reconcile::context::{Context, apply};
use crate::render::Plan;
use crate::render::shared::TaskPod;

/// The pod the task's ConfigMap names, when it has both its uid and its IP: no need to look for
/// it again.
pub fn known_pod(ctx: &Context, plan: &Plan) -> Option<TaskPod> {
    let shared = plan.shared()?;
    let facts = ctx
        .shared_config_maps
        .get(shared.namespace(), shared.name())?;
    facts.pod.clone().filter(|p| p.ip.is_some())
}

/// Applies the task's ConfigMap at `version` for a task in `phase` (Pending or Running), bound to
/// `pod` when known, unless the cluster has it already.
pub async fn apply_config(
    ctx: &Context,
    plan: &Plan,
    version: u64,
    phase: Option<Phase>,
    pod: Option<&TaskPod>,
) -> Result<()> {
    let Some(shared) = plan.shared() else {
        return Ok(());
    };
    let phase = match phase {
        Some(Phase::Running) => "Running",
        _ => "Pending",
    };
    // A pod found before stays named (the proxy keeps serving it) when this reconcile found none.
    let cached = ctx
        .shared_config_maps
        .get(shared.namespace(), shared.name());
    let pod = pod
        .cloned()
        .or_else(|| cached.as_ref().and_then(|c| c.pod.clone()));
    let desired = shared.config_map(version, plan.config_hash(), phase, pod.as_ref());
    if cached.is_some_and(|c| c.is(&desired)) {
        return Ok(());
    }
    apply(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), shared.namespace()),
        &desired,
    )
    .await?;
    Ok(())
}

/// Deletes the shared ConfigMap of the task `ns/name` (when the operator has a shared proxy),
/// after marking it `Terminating` when `terminating` (a cancel). Gone already is not an error.
pub async fn delete(ctx: &Context, ns: &str, name: &str, terminating: bool) -> Result<()> {
    let Some(proxy) = &ctx.render.shared_proxy else {
        return Ok(());
    };
    let cm_name = config_map_name(ns, name);
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &proxy.namespace);
    if terminating {
        let patch = json!({"metadata": {"annotations": {TASK_PHASE_ANNOTATION: "Terminating"}}});
        match api
            .patch(&cm_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    match api.delete(&cm_name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(taskrun = %format!("{ns}/{name}"), config_map = %cm_name, "deleted the shared proxy's ConfigMap of a task that ended");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the shared ConfigMap of the finished task `ns/name` when the watch still shows it.
pub async fn delete_left_over(ctx: &Context, ns: &str, name: &str) -> Result<()> {
    let Some(proxy) = &ctx.render.shared_proxy else {
        return Ok(());
    };
    let cm_name = config_map_name(ns, name);
    match ctx.shared_config_maps.get(&proxy.namespace, &cm_name) {
        Some(_) => delete(ctx, ns, name, false).await,
        None => Ok(()),
    }
}

/// Deletes the shared ConfigMap `name` only if it is still at `resource_version` (the sweep: a
/// ConfigMap applied since, for a TaskRun created again under the same name, is left).
pub async fn delete_orphan(
    ctx_client: &kube::Client,
    namespace: &str,
    name: &str,
    resource_version: Option<&str>,
) -> Result<bool> {
    let api = Api::<ConfigMap>::namespaced(ctx_client.clone(), namespace);
    let params = DeleteParams {
        preconditions: resource_version.map(|v| Preconditions {
            uid: None,
            resource_version: Some(v.to_string()),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Where a shared task's verdicts go: its ConfigMap in the shared proxy's namespace, when the
/// watch shows it.
pub fn verdicts_target(ctx: &Context, ns: &str, name: &str) -> Option<Target> {
    let proxy = ctx.render.shared_proxy.as_ref()?;
    let config_map = config_map_name(ns, name);
    let facts = ctx.shared_config_maps.get(&proxy.namespace, &config_map)?;
    Some(Target {
        namespace: proxy.namespace.clone(),
        config_map,
        written: facts.verdicts.clone(),
    })
}
