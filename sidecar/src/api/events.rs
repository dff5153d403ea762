//! Publishes events about the task on its TaskRun (events.k8s.io/v1, one new Event each: the
//! pod's Role may create Events, nothing more), e.g. a tool definition that changed. A failed
//! publish is retried a few times, then logged and dropped: the log, the metric and the audit
//! line have the same facts.

use std::time::Duration;

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, api::PostParams};
use tokio::sync::mpsc;

use crate::proxy::TaskEvent;

/// Who publishes, about which TaskRun.
pub struct Reporter {
    pub uid: String,
    pub namespace: String,
    /// The pod's name.
    pub instance: String,
}

const ATTEMPTS: u32 = 3;
const RETRY: Duration = Duration::from_secs(1);

/// Runs until the proxy is gone.
pub async fn publish(api: Api<Event>, reporter: Reporter, mut events: mpsc::Receiver<TaskEvent>) {
    while let Some(event) = events.recv().await {
        let body = event_for(&reporter, &event);
        for attempt in 1..=ATTEMPTS {
            match api.create(&PostParams::default(), &body).await {
                Ok(_) => {
                    tracing::info!(reason = event.reason, "published an event on the TaskRun");
                    break;
                }
                // Refused (forbidden, invalid): trying again changes nothing.
                Err(e)
                    if attempt == ATTEMPTS
                        || matches!(&e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429) =>
                {
                    tracing::warn!(reason = event.reason, error = %e, "cannot publish an event on the TaskRun; dropped (the log, metrics and audit have it)");
                    break;
                }
                Err(_) => tokio::time::sleep(RETRY * attempt).await,
            }
        }
    }
}

fn event_for(reporter: &Reporter, event: &TaskEvent) -> Event {
    let task = event.task.clone();
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{task}-")),
            ..Default::default()
        },
        event_time: Some(MicroTime(jiff::Timestamp::now())),
        type_: Some("Warning".into()),
        reason: Some(event.reason.into()),
        action: Some(event.action.into()),
        // The API server refuses notes over 1 kB.
        note: Some(clip(&event.note, 1000)),
        regarding: Some(ObjectReference {
            api_version: Some("orchestrator.io/v1".into()),
            kind: Some("TaskRun".into()),
            name: Some(task),
            namespace: Some(reporter.namespace.clone()),
            uid: Some(reporter.uid.clone()),
            ..Default::default()
        }),
        reporting_controller: Some("orchestrator.io/mcp-proxy".into()),
        reporting_instance: Some(clip(&reporter.instance, 128)),
        ..Default::default()
    }
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}
