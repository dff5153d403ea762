//! The task's ConfigMap: the rendered config at its context version (see `version.rs`), checked
//! ([`prepare`]: its name is not taken by another object, see `taken.rs`; it is within the API
//! server's size limit), then server-side applied when it is not already the one in the
//! cluster; a running pod is then told at once (see `nudge.rs`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};
use orchestrator_crds::approval::VERDICTS_KEY;
use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::TaskRun;

use super::children::ConfigMapFacts;
use super::observe::Observed;
use super::{Context, apply, nudge, taken, version};
use crate::error::Result;
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
pub async fn prepare(tr: &TaskRun, ctx: &Context, seen: &Observed, plan: &Plan) -> Result<Config> {
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
    // The shared proxy's ConfigMap holds the proxy config (the verdicts beside it, counted too).
    if let Some(shared) = plan.shared() {
        let data = shared
            .config_map(version, plan.config_hash(), "Running", None)
            .data;
        let written = super::shared::verdicts_target(ctx, ns, &seen.name).and_then(|t| t.2);
        let values = data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.len()))
            .chain(written.as_deref().map(|v| (VERDICTS_KEY, v.len())));
        problems.extend(files::too_large(shared.namespace(), shared.name(), values));
    }
    Ok(Config {
        version,
        existing,
        desired,
        up_to_date,
        problems,
    })
}

impl Config {
    /// Whether the cluster has the rendered ConfigMap already.
    pub fn up_to_date(&self) -> bool {
        self.up_to_date
    }
}

/// Applies the prepared config (nothing when the cluster has it already).
pub async fn apply_config(ctx: &Context, seen: &Observed, config: &Config) -> Result<()> {
    if config.up_to_date {
        return Ok(());
    }
    let ns = &seen.ns;
    apply(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), ns),
        &config.desired,
    )
    .await?;
    // Tell the kubelet now rather than at its next periodic sync (see nudge.rs). Not in shared
    // mode: the shared proxy reads its config from the API only, and the agent's files in the
    // pod are read once, at start.
    if seen.job.is_some() && !seen.finished && seen.mode != Some(ProxyMode::Shared) {
        let annotated = nudge::pods(&ctx.client, ns, &seen.name, config.version).await;
        tracing::debug!(
            annotated,
            version = config.version,
            "running pods told of the new config"
        );
    }
    Ok(())
}
