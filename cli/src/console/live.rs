//! `GET /api/events`: the page's live view. One watch on TaskRuns per open page, with the
//! caller's credentials, turned into Server-Sent Events ([`TaskView`]s): `snapshot` after each
//! (re)list, `task` per change, `deleted`, and `problem` when the watch fails (it retries with
//! kube's backoff). The watch ends when the page goes away.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::TaskRun;
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Console;
use super::view::TaskView;
use crate::catalog;

/// Events a slow page may fall behind by before the watch waits for it.
const BUFFER: usize = 64;
/// How often an idle stream says it is alive (proxies and browsers drop silent streams).
const KEEPALIVE: Duration = Duration::from_secs(15);

/// `GET /api/events`.
pub async fn events(
    State(console): State<Arc<Console>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel(BUFFER);
    tokio::spawn(watch(console, tx));
    Sse::new(ReceiverStream::new(rx).map(Ok))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
}

fn event(name: &str, data: &impl Serialize) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|e| {
            Event::default()
                .event("problem")
                .data(format!("{{\"error\":\"{e}\"}}"))
        })
}

async fn watch(console: Arc<Console>, tx: mpsc::Sender<Event>) {
    let stream = watcher(console.taskruns(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut catalog: Option<Catalog> = None;
    let mut listed: Vec<TaskRun> = Vec::new();
    let mut last_problem = String::new();
    loop {
        let next = tokio::select! {
            _ = tx.closed() => return,
            next = stream.next() => next,
        };
        let Some(next) = next else { return };
        let out = match next {
            Ok(watcher::Event::Init) => {
                listed.clear();
                // A re-list is a good moment to see a changed catalog; without one (it cannot be
                // read, e.g. RBAC) the views show the operator's report or the spec.
                catalog = catalog::load(&console.global, Some(&console.cluster(None)))
                    .await
                    .inspect_err(|e| tracing::info!("console: catalog unavailable: {e}"))
                    .ok();
                continue;
            }
            Ok(watcher::Event::InitApply(tr)) => {
                listed.push(tr);
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                last_problem.clear();
                let tasks: Vec<TaskView> = std::mem::take(&mut listed)
                    .iter()
                    .map(|tr| TaskView::new(tr, catalog.as_ref()))
                    .collect();
                event("snapshot", &json!({ "tasks": tasks }))
            }
            Ok(watcher::Event::Apply(tr)) => event("task", &TaskView::new(&tr, catalog.as_ref())),
            Ok(watcher::Event::Delete(tr)) => event(
                "deleted",
                &json!({"namespace": tr.namespace().unwrap_or_default(), "name": tr.name_any()}),
            ),
            Err(e) => {
                let text = format!("watching TaskRuns in {}: {e}", console.scope_text());
                if text == last_problem {
                    continue;
                }
                last_problem = text.clone();
                event("problem", &json!({ "error": text }))
            }
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}
