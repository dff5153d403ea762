//! How much history is kept: a finished TaskRun is deleted `retentionSecondsAfterFinished` (else
//! `--retention-seconds-after-finished`) after its task finished (decided per TaskRun when it is
//! reconciled, see `finished.rs` and `ttl.rs`), and no namespace keeps more than
//! `--max-finished-per-namespace` finished TaskRuns: a sweep over the TaskRun cache deletes the
//! ones that finished first. Its ConfigMap and Job go with a TaskRun (owner references, the
//! garbage collector). Only TaskRuns whose outcome is recorded in their status are counted.
//!
//! With a shared proxy, [`sweep_shared`] deletes the shared tasks' ConfigMaps in its namespace
//! (`shared.rs`) that no live, unfinished TaskRun owns (they have no owner reference): at start,
//! whenever a TaskRun is deleted, and every minute.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;

use crate::error::Result;
use crate::metrics::Metrics;
use crate::namespaces::Watched;
use crate::reconcile::facts::{Index, SharedFacts};
use crate::reconcile::placement::shared;
use crate::reconcile::ttl;

/// How often the per-namespace limit is enforced.
const SWEEP: Duration = Duration::from_secs(10);

/// Metric and log reason of a deletion after the retention time.
pub const RETENTION: &str = "retention";
/// Metric and log reason of a deletion beyond the per-namespace limit.
pub const MAX_FINISHED: &str = "max_finished";

/// The finished TaskRuns beyond `max` in their namespace: the ones that finished first (ties by
/// name), in that order.
pub fn over_limit(taskruns: &[Arc<TaskRun>], max: usize) -> Vec<Arc<TaskRun>> {
    let mut by_namespace: BTreeMap<String, Vec<(Timestamp, &Arc<TaskRun>)>> = BTreeMap::new();
    for tr in taskruns {
        let finished = tr.status.as_ref().and_then(ttl::finished_at);
        if let (Some(at), Some(ns)) = (finished, tr.namespace()) {
            by_namespace.entry(ns).or_default().push((at, tr));
        }
    }
    let mut out = Vec::new();
    for (_, mut finished) in by_namespace {
        if finished.len() <= max {
            continue;
        }
        finished.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.1.name_any().cmp(&b.1.name_any()))
        });
        let excess = finished.len() - max;
        out.extend(finished.into_iter().take(excess).map(|(_, tr)| tr.clone()));
    }
    out
}

/// Deletes a TaskRun, only if it is still the one with this uid (a TaskRun created again under
/// the same name is left alone). Gone already is not an error.
pub async fn delete(client: &Client, tr: &TaskRun, reason: &str, metrics: &Metrics) -> Result<()> {
    let ns = tr.namespace().unwrap_or_default();
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: tr.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&tr.name_any(), &params).await {
        Ok(_) => {
            metrics.taskrun_deleted(reason);
            tracing::info!(taskrun = %format!("{ns}/{}", tr.name_any()), reason, "finished TaskRun deleted; its ConfigMap and Job go with it");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Enforces `max` finished TaskRuns per namespace every [`SWEEP`], from the TaskRun cache.
pub async fn sweep(store: Store<TaskRun>, client: Client, metrics: Arc<Metrics>, max: u32) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let mut every = tokio::time::interval(SWEEP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        for tr in over_limit(&store.state(), max as usize) {
            if let Err(e) = delete(&client, &tr, MAX_FINISHED, &metrics).await {
                tracing::warn!(taskrun = %tr.name_any(), error = %e, "could not delete a finished TaskRun beyond --max-finished-per-namespace; retrying at the next sweep");
            }
        }
    }
}

/// How often the shared ConfigMaps are swept without a TaskRun deleted.
const SHARED_SWEEP: Duration = Duration::from_secs(60);

/// The shared ConfigMaps (`namespace/name` with their facts) whose task is gone: no TaskRun of
/// the cache has their task uid, or that TaskRun's outcome is recorded (the reconcile that
/// recorded it deleted the ConfigMap, unless the operator stopped in between). A ConfigMap of a
/// task in a namespace this operator does not watch is another operator's: left alone.
pub fn orphaned_shared(
    config_maps: &[(Box<str>, Arc<SharedFacts>)],
    taskruns: &[Arc<TaskRun>],
    watched: &Watched,
) -> Vec<(String, Option<String>)> {
    let live = |uid: &str| {
        taskruns.iter().any(|tr| {
            tr.uid().as_deref() == Some(uid)
                && !tr
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(|p| p.is_terminal())
        })
    };
    config_maps
        .iter()
        .filter_map(|(key, facts)| {
            let name = key.split_once('/').map_or(&**key, |(_, n)| n);
            let ours = match orchestrator_crds::shared::task_of_config_map(name) {
                Some((ns, _)) => match watched {
                    Watched::All => true,
                    Watched::Only(list) => list.iter().any(|w| w == ns),
                },
                None => false,
            };
            let gone = facts.task_uid.as_deref().is_none_or(|uid| !live(uid));
            (ours && gone).then(|| {
                (
                    name.to_string(),
                    facts.resource_version.as_deref().map(str::to_string),
                )
            })
        })
        .collect()
}

/// Deletes the orphaned shared ConfigMaps (see [`orphaned_shared`]) once both caches hold their
/// first list, then whenever `kick` is notified (a TaskRun was deleted) and every
/// [`SHARED_SWEEP`].
pub async fn sweep_shared(
    store: Store<TaskRun>,
    client: Client,
    config_maps: Index<SharedFacts>,
    (namespace, watched): (String, Watched),
    kick: Arc<tokio::sync::Notify>,
) {
    if store.wait_until_ready().await.is_err() || config_maps.wait_until_ready().await.is_err() {
        return;
    }
    loop {
        for (name, version) in orphaned_shared(&config_maps.entries(), &store.state(), &watched) {
            match shared::delete_orphan(&client, &namespace, &name, version.as_deref()).await {
                Ok(true) => {
                    tracing::info!(config_map = %format!("{namespace}/{name}"), "deleted a shared proxy ConfigMap whose task is gone")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(config_map = %name, error = %e, "could not delete a shared proxy ConfigMap whose task is gone; retrying at the next sweep")
                }
            }
        }
        tokio::select! {
            () = kick.notified() => {},
            () = tokio::time::sleep(SHARED_SWEEP) => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_deletion_reason_and_error_class_has_a_series_at_zero_from_the_start() {
        assert_eq!(crate::metrics::DELETE_REASONS, [RETENTION, MAX_FINISHED]);
        let errors = [
            crate::error::Error::MissingField("x"),
            crate::error::Error::LostLease("x".into()),
        ];
        for e in &errors {
            assert!(crate::metrics::ERROR_CLASSES.contains(&e.metric_label()));
        }
        let text = Metrics::default().encode();
        for reason in crate::metrics::DELETE_REASONS {
            let series =
                format!("orchestrator_operator_taskruns_deleted_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series} missing in\n{text}");
        }
        for class in crate::metrics::ERROR_CLASSES {
            let series =
                format!("orchestrator_operator_reconcile_errors_total{{outcome=\"{class}\"}} 0");
            assert!(text.contains(&series), "{series} missing in\n{text}");
        }
    }

    fn tr(ns: &str, name: &str, phase: &str, completed: Option<&str>) -> Arc<TaskRun> {
        let mut status = json!({"phase": phase});
        if let Some(at) = completed {
            status["completionTime"] = json!(at);
        }
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
                "metadata": {"name": name, "namespace": ns, "uid": name},
                "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"}},
                "status": status
            }))
            .expect("a TaskRun"),
        )
    }

    fn names(trs: &[Arc<TaskRun>]) -> Vec<String> {
        trs.iter()
            .map(|t| format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any()))
            .collect()
    }

    #[test]
    fn the_first_to_finish_go_beyond_the_limit_per_namespace() {
        let trs = [
            tr("a", "newest", "Succeeded", Some("2026-01-03T00:00:00Z")),
            tr("a", "oldest", "Failed", Some("2026-01-01T00:00:00Z")),
            tr("a", "middle", "Succeeded", Some("2026-01-02T00:00:00Z")),
            // Unfinished ones neither count nor go.
            tr("a", "running", "Running", None),
            tr("a", "pending", "Pending", None),
            tr("b", "only", "Succeeded", Some("2026-01-01T00:00:00Z")),
        ];
        assert_eq!(names(&over_limit(&trs, 2)), ["a/oldest"]);
        assert_eq!(names(&over_limit(&trs, 1)), ["a/oldest", "a/middle"]);
        assert_eq!(names(&over_limit(&trs, 3)), Vec::<String>::new());
    }
}
