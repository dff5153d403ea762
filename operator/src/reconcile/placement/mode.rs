//! Which mode a task's proxy runs in (docs/design/shared-mode.md, §1): `spec.proxy.mode`, else
//! the label `orchestrator.io/proxy-mode` on the task's Namespace, else `--default-proxy-mode`.
//! Resolved once: the status records it (`status.proxyMode`, written with the first status that
//! follows, before or with the Job), and every later reconcile reads the record, never the label
//! again, so relabelling a namespace never leaves a running task half in each mode. Between the
//! Job's creation and that status write, the Job itself is the record (a sidecar Job has the
//! `mcp-proxy` container, a shared one has none). A task rendered before the mode existed (a
//! status with a context version but no mode) ran with a sidecar.

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, ResourceExt};
use orchestrator_crds::shared::{NAMESPACE_MODE_LABEL, ProxyMode};
use orchestrator_crds::taskrun::{TaskRun, TaskRunStatus};

use crate::error::Result;
use crate::reconcile::context::Context;
use crate::reconcile::facts::JobFacts;
use crate::render::Problem;
use crate::render::job::PROXY_CONTAINER;

/// The condition reason of a Namespace label that names no mode.
pub const INVALID_PROXY_MODE: &str = "InvalidProxyMode";

/// The mode already decided for the task, if any: the status's record, else what its Job was
/// created with, else sidecar for a task rendered before the mode existed.
pub fn recorded(previous: &TaskRunStatus, job: Option<&JobFacts>) -> Option<ProxyMode> {
    if let Some(mode) = previous.proxy_mode {
        return Some(mode);
    }
    if let Some(job) = job {
        return Some(match job.has_container(PROXY_CONTAINER) {
            true => ProxyMode::Sidecar,
            false => ProxyMode::Shared,
        });
    }
    previous.context_version.map(|_| ProxyMode::Sidecar)
}

/// The mode of a task not decided yet: the TaskRun's, else its Namespace's label (`label`:
/// `None` when the Namespace has none), else the operator's default. A label naming no mode is a
/// problem naming the Namespace and the fix.
pub fn choose(
    tr: &TaskRun,
    label: Option<&str>,
    default: ProxyMode,
) -> std::result::Result<ProxyMode, Problem> {
    if let Some(mode) = tr.spec.proxy.as_ref().and_then(|p| p.mode) {
        return Ok(mode);
    }
    match label {
        None => Ok(default),
        Some(value) => ProxyMode::parse(value).ok_or_else(|| {
            let ns = tr.namespace().unwrap_or_default();
            Problem {
                reason: INVALID_PROXY_MODE,
                message: format!(
                    "Namespace {ns} has the label {NAMESPACE_MODE_LABEL}={value:?}, which is not a \
                     proxy mode; set it to sidecar or shared (kubectl label namespace {ns} \
                     {NAMESPACE_MODE_LABEL}=sidecar --overwrite), or remove it, or set \
                     spec.proxy.mode in a new TaskRun"
                ),
            }
        }),
    }
}

/// The task's mode: as recorded, else chosen now (reading its Namespace's label only when the
/// TaskRun says nothing itself).
pub async fn resolve(
    ctx: &Context,
    tr: &TaskRun,
    previous: &TaskRunStatus,
    job: Option<&JobFacts>,
) -> Result<std::result::Result<ProxyMode, Problem>> {
    if let Some(mode) = recorded(previous, job) {
        return Ok(Ok(mode));
    }
    if tr.spec.proxy.as_ref().is_some_and(|p| p.mode.is_some()) {
        return Ok(choose(tr, None, ctx.default_proxy_mode));
    }
    let ns = tr.namespace().unwrap_or_default();
    let namespace = Api::<Namespace>::all(ctx.client.clone())
        .get_opt(&ns)
        .await?;
    let label = namespace
        .as_ref()
        .and_then(|n| n.labels().get(NAMESPACE_MODE_LABEL).cloned());
    Ok(choose(tr, label.as_deref(), ctx.default_proxy_mode))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tr(mode: Option<&str>) -> TaskRun {
        let mut spec = json!({"taskId": 1, "serviceName": "s", "task": {"prompt": "p"}});
        if let Some(mode) = mode {
            spec["proxy"] = json!({"mode": mode});
        }
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "namespace": "team-a", "uid": "u"}, "spec": spec
        }))
        .expect("a TaskRun")
    }

    #[test]
    fn the_taskrun_wins_over_the_namespace_label_which_wins_over_the_flag() {
        use ProxyMode::{Shared, Sidecar};
        // The TaskRun says: neither the label nor the flag matter.
        assert_eq!(
            choose(&tr(Some("sidecar")), Some("shared"), Shared),
            Ok(Sidecar)
        );
        assert_eq!(
            choose(&tr(Some("shared")), Some("sidecar"), Sidecar),
            Ok(Shared)
        );
        // The label, over the flag.
        assert_eq!(choose(&tr(None), Some("shared"), Sidecar), Ok(Shared));
        assert_eq!(choose(&tr(None), Some("sidecar"), Shared), Ok(Sidecar));
        // Neither: the flag.
        assert_eq!(choose(&tr(None), None, Shared), Ok(Shared));
        assert_eq!(choose(&tr(None), None, Sidecar), Ok(Sidecar));
        // A label naming no mode is refused, naming the Namespace and the fix.
        let bad = choose(&tr(None), Some("Shared"), Sidecar).expect_err("not a mode");
        assert_eq!(bad.reason, INVALID_PROXY_MODE);
        assert!(
            bad.message
                .contains("Namespace team-a has the label orchestrator.io/proxy-mode=\"Shared\"")
                && bad.message.contains("set it to sidecar or shared"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn a_recorded_mode_wins_and_a_job_or_an_older_status_decides_when_none_is_recorded() {
        let status = |mode: Option<ProxyMode>, version: Option<i64>| TaskRunStatus {
            proxy_mode: mode,
            context_version: version,
            ..Default::default()
        };
        // Recorded: the status wins over everything, even a Job that says otherwise.
        let sidecar_job: crate::reconcile::facts::CachedJob = serde_json::from_value(json!({
            "metadata": {"name": "t"},
            "spec": {"template": {"spec": {"initContainers": [{"name": "mcp-proxy"}]}}}
        }))
        .expect("a Job");
        let sidecar_job = JobFacts::of(&sidecar_job);
        assert_eq!(
            recorded(
                &status(Some(ProxyMode::Shared), Some(1)),
                Some(&sidecar_job)
            ),
            Some(ProxyMode::Shared)
        );
        // Not recorded yet, the Job created: its containers say.
        assert_eq!(
            recorded(&status(None, None), Some(&sidecar_job)),
            Some(ProxyMode::Sidecar)
        );
        let shared_job: crate::reconcile::facts::CachedJob =
            serde_json::from_value(json!({"metadata": {"name": "t"}})).expect("a Job");
        assert_eq!(
            recorded(&status(None, None), Some(&JobFacts::of(&shared_job))),
            Some(ProxyMode::Shared)
        );
        // Rendered before the mode existed: a sidecar. New: not decided.
        assert_eq!(
            recorded(&status(None, Some(3)), None),
            Some(ProxyMode::Sidecar)
        );
        assert_eq!(recorded(&status(None, None), None), None);
    }
}
