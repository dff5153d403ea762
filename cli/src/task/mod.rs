//! The `task` commands, and finding the TaskRun a command is about (by name, or by
//! `spec.taskId`, which the CRD declares a selectable field).

pub mod add_context;
pub mod approve;
pub mod audit;
pub mod inbox;
pub mod lifecycle;
pub mod list_watch;
pub mod logs;
pub mod result_view;
pub mod show;
pub mod submit;
pub mod validate;

#[cfg(test)]
mod add_context_tests;
#[cfg(test)]
mod approve_tests;
#[cfg(test)]
mod inbox_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod list_watch_tests;
#[cfg(test)]
mod race_tests;
#[cfg(test)]
mod show_tests;
#[cfg(test)]
mod validate_tests;

use kube::Api;
use kube::api::ListParams;
use orchestrator_crds::taskrun::{Phase, TaskRun};

use crate::args::TaskRef;
use crate::connect::Cluster;
use crate::error::{Error, Result, is_not_found};

/// The TaskRun API in the command's namespace.
pub fn api(cluster: &Cluster) -> Api<TaskRun> {
    Api::namespaced(cluster.client.clone(), &cluster.namespace)
}

/// Gets a TaskRun by name; a missing one is a clear "not found" (exit 3).
pub async fn get_named(cluster: &Cluster, name: &str) -> Result<TaskRun> {
    api(cluster).get(name).await.map_err(|e| {
        if is_not_found(&e) && !is_missing_api(&e) {
            Error::NotFound(format!(
                "TaskRun {name} not found in namespace {} (see `orchestrator-cli task list`)",
                cluster.namespace
            ))
        } else {
            Error::kube(format!("getting TaskRun {name}"), e)
        }
    })
}

/// A 404 because the resource type itself is not served (CRD not installed).
fn is_missing_api(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404
        && s.message.contains("the server could not find the requested resource"))
}

/// Every TaskRun of the namespace with `spec.taskId == id`.
pub async fn find_by_id(cluster: &Cluster, id: i64) -> Result<Vec<TaskRun>> {
    let api = api(cluster);
    let selector = format!("spec.taskId={id}");
    match api.list(&ListParams::default().fields(&selector)).await {
        Ok(list) => Ok(list.items),
        // A CRD without selectableFields refuses the selector: filter here instead.
        Err(kube::Error::Api(s)) if s.code == 400 => {
            let all = api.list(&ListParams::default()).await.map_err(|e| {
                Error::kube(
                    format!("listing TaskRuns in namespace {}", cluster.namespace),
                    e,
                )
            })?;
            Ok(all
                .items
                .into_iter()
                .filter(|t| t.spec.task_id == id)
                .collect())
        }
        Err(e) => Err(Error::kube(
            format!(
                "listing TaskRuns with task id {id} in namespace {}",
                cluster.namespace
            ),
            e,
        )),
    }
}

/// Exactly one TaskRun, by name or task id. Several TaskRuns for one task id is an error that
/// lists them, so the user can name one.
pub async fn resolve(cluster: &Cluster, task: &TaskRef) -> Result<TaskRun> {
    match (&task.name, task.task_id) {
        (Some(name), _) => get_named(cluster, name).await,
        (None, Some(id)) => {
            let mut found = find_by_id(cluster, id).await?;
            match found.len() {
                0 => Err(Error::NotFound(format!(
                    "no TaskRun with task id {id} in namespace {} (see `orchestrator-cli task list`)",
                    cluster.namespace
                ))),
                1 => Ok(found.remove(0)),
                _ => {
                    let names: Vec<String> = found
                        .iter()
                        .map(|t| {
                            format!(
                                "{} ({})",
                                t.metadata.name.as_deref().unwrap_or("?"),
                                Phase::label(t.status.as_ref().and_then(|s| s.phase))
                            )
                        })
                        .collect();
                    Err(Error::Usage(format!(
                        "task id {id} matches {} TaskRuns in namespace {}: {}; name one instead of --task-id",
                        found.len(),
                        cluster.namespace,
                        names.join(", ")
                    )))
                }
            }
        }
        (None, None) => Err(Error::Usage("name a TaskRun, or pass --task-id".into())),
    }
}
