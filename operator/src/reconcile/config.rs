//! The task's ConfigMap: the rendered config at its context version (see `version.rs`),
//! server-side applied when it is not already the one in the cluster; a running pod is then told
//! at once (see `nudge.rs`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::children::ConfigMapFacts;
use super::observe::Observed;
use super::{Context, apply, nudge, version};
use crate::error::Result;
use crate::render::Plan;

/// The ConfigMap as reconcile left it.
pub struct Config {
    /// The context version of the rendered config.
    pub version: u64,
    /// The ConfigMap as found before the apply (the cache, or a read): it holds the verdicts
    /// last written for the proxy (see `approvals.rs`).
    pub existing: Option<Arc<ConfigMapFacts>>,
}

/// Applies the rendered config. Its context version is kept while the rendered config is the
/// one already applied, else one more than any version seen. When the cached ConfigMap is not
/// already the rendered one, the ConfigMap is read afresh so a lagging cache or status never
/// yields the same version for two different configs.
pub async fn apply_config(ctx: &Context, seen: &Observed, plan: &Plan) -> Result<Config> {
    let (ns, previous) = (&seen.ns, &seen.previous);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let cm_name = plan.config_map_name();
    let cached = ctx
        .config_maps
        .get(ns, &cm_name)
        .filter(|c| c.config_hash.as_deref() == Some(plan.config_hash()));
    let existing = match cached {
        Some(c) => Some(c),
        // Never rendered before (no version in the status): the ConfigMap can only be missing,
        // or left by a reconcile that crashed before writing the status, at version 1.
        None if previous.context_version.is_none() => ctx.config_maps.get(ns, &cm_name),
        None => cms
            .get_opt(&cm_name)
            .await?
            .map(|c| Arc::new(ConfigMapFacts::of(&c))),
    };
    let versions = version::context_version(existing.as_deref(), previous, plan.config_hash());
    let version = versions.current;
    let desired = plan.config_map(version);
    let up_to_date = existing.as_ref().is_some_and(|c| c.is(&desired));
    if !up_to_date {
        apply(&cms, &desired).await?;
        // Tell the kubelet now rather than at its next periodic sync (see nudge.rs).
        if seen.job.is_some() && !seen.finished {
            let annotated = nudge::pods(&ctx.client, ns, &seen.name, version).await;
            tracing::debug!(annotated, version, "running pods told of the new config");
        }
    }
    Ok(Config { version, existing })
}
