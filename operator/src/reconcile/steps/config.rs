//! The task's ConfigMap: the rendered config at its context version (see `version.rs`), checked
//! ([`prepare`]: its name is not taken by another object, see `taken.rs`; it is within the API
//! server's size limit; and what the task's placement adds), then server-side applied when it
//! is not already the one in the cluster (the placement then does what follows, see
//! `placement/mod.rs`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::VERDICTS_KEY;
use orchestrator_crds::taskrun::TaskRun;

use crate::error::Result;
use crate::reconcile::context::{Context, apply};
use crate::reconcile::facts::{ConfigMapFacts, Observed};
use crate::reconcile::placement::Placement;
use crate::reconcile::{taken, version};
use crate::render::{Plan, Problem, files};

/// The ConfigMap as reconcile is to leave it.
pub struct Config {
    /// The context version of the rendered config.
    pub version: u64,
    /// This TaskRun's ConfigMap as found before the apply (the cache, or a read): it holds the
    /// verdicts last written for the proxy (see `approvals.rs`).
    pub existing: Option<Arc<ConfigMapFacts>>,
    /// The rendered ConfigMap at `version`.
    desired: ConfigMap,
    /// The cluster has it already.
    up_to_date: bool,
    /// Why it cannot be applied: its name is taken, or it is over the API server's limit.
    pub problems: Vec<Problem>,
}

/// The ConfigMap to apply, and what stops it. Its context version is kept while the rendered
/// config is the one already applied, else one more than any version seen. When the cache does
/// not show this TaskRun's ConfigMap with the rendered config (or any, before the first
/// version), the ConfigMap is read afresh: so a lagging cache or status never yields the same
/// version for two different configs, and an object of that name that is not this TaskRun's
/// (the cache has only those with the operator's label) is found before it is written.
pub async fn prepare(
    tr: &TaskRun,
    ctx: &Context,
    seen: &Observed,
    plan: &Plan,
    placement: Placement,
) -> Result<Config> {
    let (ns, previous) = (&seen.ns, &seen.previous);
    let cm_name = plan.config_map_name();
    let uid = tr.uid().unwrap_or_default();
    let mut problems = Vec::new();
    let cached = ctx
        .config_maps
        .get(ns, &cm_name)
        .filter(|c| c.controlled_by(&uid))
        .filter(|c| {
            // Never rendered before (no version in the status): the ConfigMap can only be
            // missing, or left by a reconcile that crashed before writing the status.
            c.config_hash.as_deref() == Some(plan.config_hash())
                || previous.context_version.is_none()
        });
    let existing = match cached {
        Some(c) => Some(c),
        None => match Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .get_opt(&cm_name)
            .await?
        {
            Some(cm) => match taken::judge("ConfigMap", &cm.metadata, tr) {
                Some(problem) => {
                    problems.push(problem);
                    None
                }
                None => Some(Arc::new(ConfigMapFacts::of(&cm))),
            },
            None => None,
        },
    };
    let versions = version::context_version(existing.as_deref(), previous, plan.config_hash());
    let version = versions.current;
    let desired = plan.config_map(version);
    let up_to_date = existing.as_ref().is_some_and(|c| c.is(&desired));
    if !up_to_date {
        // What the API server counts: every value, the verdicts written beside the config too.
        let verdicts = existing.as_ref().and_then(|c| c.verdicts.as_deref());
        let data = desired.data.iter().flatten();
        let values = data
            .map(|(k, v)| (k.as_str(), v.len()))
            .chain(verdicts.map(|v| (VERDICTS_KEY, v.len())));
        problems.extend(files::too_large(ns, &cm_name, values));
    }
    problems.extend(placement.config_problems(ctx, seen, plan, version));
    Ok(Config {
        version,
        existing,
        desired,
        up_to_date,
        problems,
    })
}

impl Config {
    /// The verdicts this TaskRun's ConfigMap holds, as found before the apply.
    pub fn written_verdicts(&self) -> Option<&str> {
        self.existing.as_ref().and_then(|c| c.verdicts.as_deref())
    }
}

/// Applies the prepared config (nothing when the cluster has it already). Returns whether it
/// was applied.
pub async fn apply_config(ctx: &Context, seen: &Observed, config: &Config) -> Result<bool> {
    if config.up_to_date {
        return Ok(false);
    }
    apply(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), &seen.ns),
        &config.desired,
    )
    .await?;
    Ok(true)
}
