//! `status.contextHistory` (see `orchestrator_crds::taskrun::history`): an entry per rendered
//! `contextVersion`, written before the status that records the version, and the
//! `ToolsUpdated` event saying who changed what.
//!
//! The history is neither cached (`trim.rs` drops it) nor part of the status the operator
//! writes on every reconcile: it is written alone, under its own field manager
//! ([`HISTORY_MANAGER`]), so the other status writes leave it as it is. Recording a version
//! reads the TaskRun afresh: the cache keeps neither the annotations and `managedFields` that
//! say who asked, nor the tools in force before, nor the history to append to. That is one
//! read per version, until the status records the version.

use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::history::{self, ContextChange, HISTORY_MANAGER};
use serde_json::json;

use crate::error::Result;
use crate::reconcile::context::Context;
use crate::reconcile::{events, status};
use crate::render::Plan;

/// Records `version` (rendered from `plan`) in the history unless it is there already, and
/// publishes `ToolsUpdated` for a change after the first version.
pub async fn record(ctx: &Context, tr: &TaskRun, version: u64, plan: &Plan) -> Result<()> {
    let api: Api<TaskRun> =
        Api::namespaced(ctx.client.clone(), &tr.namespace().unwrap_or_default());
    let fresh = api.get(&tr.name_any()).await?;
    let recorded = fresh.status.unwrap_or_default();
    let version = i64::try_from(version).unwrap_or(i64::MAX);
    // The status is written after the history: one recording this version is done with it.
    if recorded.context_version.is_some_and(|v| v >= version) {
        return Ok(());
    }
    let mut entries = recorded.context_history;
    // The status's tools are still those of the version before.
    let (added, removed) = history::diff(&recorded.tools, &plan.tools);
    let previous_generation = entries.last().and_then(|e| e.generation);
    // `plan` was rendered from `tr`, which may be older than the fresh read.
    let rendered = tr.metadata.generation;
    let (requested_by, source) = history::attribute(&fresh.metadata, rendered, previous_generation);
    let entry = ContextChange {
        context_version: version,
        generation: rendered,
        time: status::now(),
        requested_by,
        source,
        added,
        removed,
    };
    if !history::append(&mut entries, entry.clone()) {
        return Ok(());
    }
    let patch = json!({
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "status": {"contextHistory": entries},
    });
    api.patch_status(
        &tr.name_any(),
        &PatchParams::apply(HISTORY_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    tracing::info!(
        version,
        requested_by = %entry.who(),
        changes = %entry.changes(),
        "context version recorded"
    );
    if version > 1 {
        let note = format!(
            "contextVersion {version} by {}: {}; in force: {}",
            entry.who(),
            entry.changes(),
            events::describe_tools(plan)
        );
        events::publish(
            ctx,
            tr,
            EventType::Normal,
            "ToolsUpdated",
            "UpdateConfig",
            note,
        )
        .await;
    }
    Ok(())
}
