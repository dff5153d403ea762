//! A shared task's ConfigMap in the shared proxy's namespace (`task.<namespace>.<taskrun>`, see
//! `render/shared.rs`): applied while the task is Pending or Running, with the pod the
//! operator bound the task's Lease to (`binding.rs`) once it has one, and deleted when the task
//! ends (the same reconcile that records its outcome; a cancelled task's says `Terminating`
//! first) or its TaskRun is gone (the sweep, `retention.rs`). It has no owner reference (those
//! cannot cross namespaces), so nothing else deletes it; and its deletion is what makes the
//! shared proxy refuse the finished task's token.
//!
//! What the operator keeps of these ConfigMaps ([`SharedFacts`]) comes from a watch of the
//! labelled ConfigMaps in the shared proxy's namespace (`lib.rs`), which also reconciles a
//! task whose ConfigMap was changed or deleted by someone else.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::VERDICTS_KEY;
use orchestrator_crds::shared::{
    TASK_ANNOTATION, TASK_PHASE_ANNOTATION, TASK_POD_IP_ANNOTATION, TASK_POD_UID_ANNOTATION,
    TASK_UID_ANNOTATION, config_map_name,
};
use orchestrator_crds::taskrun::Phase;
use serde_json::json;

use super::{Context, apply};
use crate::error::Result;
use crate::render::shared::TaskPod;
use crate::render::{self, Plan};

/// What reconcile reads of a shared task's ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedFacts {
    /// The task's TaskRun uid (what the sweep matches).
    pub task_uid: Option<Box<str>>,
    /// The pod the task is bound to, as written.
    pub pod: Option<TaskPod>,
    /// The verdicts as written (see `approvals.rs`).
    pub verdicts: Option<Box<str>>,
    /// A digest of what the operator renders into it (data without the verdicts, its labels and
    /// annotations).
    rendered: Box<str>,
    /// Its version, for a deletion that must not delete a newer one.
    pub resource_version: Option<Box<str>>,
}

impl SharedFacts {
    pub fn of(cm: &ConfigMap) -> Self {
        let annotations = cm.annotations();
        let mut rendered: BTreeMap<String, String> = cm.data.clone().unwrap_or_default();
        rendered.remove(VERDICTS_KEY);
        for (k, v) in annotations
            .iter()
            .filter(|(k, _)| k.starts_with("orchestrator.io/"))
        {
            rendered.insert(format!("@annotation {k}"), v.clone());
        }
        for (k, v) in cm.labels() {
            rendered.insert(format!("@label {k}"), v.clone());
        }
        if cm.binary_data.is_some() {
            rendered.insert("@binaryData".into(), String::new());
        }
        let pod = annotations.get(TASK_POD_UID_ANNOTATION).map(|uid| TaskPod {
            uid: uid.clone(),
            ip: annotations.get(TASK_POD_IP_ANNOTATION).cloned(),
        });
        Self {
            task_uid: annotations
                .get(TASK_UID_ANNOTATION)
                .map(|u| u.as_str().into()),
            pod,
            verdicts: cm
                .data
                .as_ref()
                .and_then(|d| d.get(VERDICTS_KEY))
                .map(|v| v.as_str().into()),
            rendered: render::digest(&rendered).into(),
            resource_version: cm.resource_version().map(Into::into),
        }
    }

    /// Whether the ConfigMap is `desired` (the verdicts aside).
    pub fn is(&self, desired: &ConfigMap) -> bool {
        self.rendered == Self::of(desired).rendered
    }
}

/// The facts of a shared task's ConfigMap.
pub fn facts(cm: &ConfigMap) -> Option<SharedFacts> {
    Some(SharedFacts::of(cm))
}

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
pub fn verdicts_target(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Option<(String, String, Option<Box<str>>)> {
    let proxy = ctx.render.shared_proxy.as_ref()?;
    let cm_name = config_map_name(ns, name);
    let facts = ctx.shared_config_maps.get(&proxy.namespace, &cm_name)?;
    Some((proxy.namespace.clone(), cm_name, facts.verdicts.clone()))
}

/// The task a shared ConfigMap names (`<namespace>/<name>`), for the controller to reconcile.
pub fn task_of(cm: &ConfigMap) -> Option<(String, String)> {
    let (ns, name) = cm.annotations().get(TASK_ANNOTATION)?.split_once('/')?;
    Some((ns.to_string(), name.to_string()))
}
