//! Events on a TaskRun (through the events API) and the words they use.
//!
//! Each event is published by a fresh `Recorder`: a shared one keeps every event it published
//! for six minutes (to patch a repeat into a series) and scans them all on each publish, which
//! was about 1 KiB per TaskRun and O(n) per event when thousands of TaskRuns start at once. The
//! operator does not repeat events (a blocked TaskRun's warning is published when its problem
//! changes), so there is no series to lose.

use k8s_openapi::api::batch::v1::Job;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use orchestrator_crds::taskrun::TaskRun;

use super::context::Context;
use crate::render::Plan;

/// Emits an event on the TaskRun; a failure is logged, never fails the reconcile.
pub async fn publish(
    ctx: &Context,
    tr: &TaskRun,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    // The events API limits a note to 1 kB.
    let mut note = note;
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    if let Err(e) = recorder.publish(&event, &tr.object_ref(&())).await {
        tracing::warn!(error = %e, reason, "publishing an event");
    }
}

/// The enabled tools per server, as a ToolsUpdated event lists them.
pub fn describe_tools(plan: &Plan) -> String {
    plan.tools
        .iter()
        .map(|t| {
            let mut s = format!("{} allow [{}]", t.server, t.allow.join(", "));
            if !t.deny.is_empty() {
                s += &format!(" deny [{}]", t.deny.join(", "));
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The agent container's image, as the JobCreated event names it.
pub fn agent_image(job: &Job) -> String {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}
