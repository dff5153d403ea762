//! The one label-selected watch of this replica: every ConfigMap labelled
//! [`CONFIG_LABEL`]`=true` in the proxy's namespace is a task served here ([`Tenants::upsert`]);
//! one deleted is a task no longer served ([`Tenants::remove`]). After a re-list (a reconnect
//! whose resource version was gone), a tenant whose ConfigMap is not in the list is removed too.
//! kube's watcher resumes by itself, paced by [`crate::api::backoff`] (no wait after a 410 Gone,
//! delays up to 5 s: tasks are served again within seconds of an API server restart); the state
//! changes are logged, not every retry.

use std::{collections::HashSet, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    runtime::watcher::{self, Event},
};
use orchestrator_crds::shared::CONFIG_LABEL;
use tokio::sync::watch;

use super::registry::Tenants;

/// Runs until aborted. `listed` turns true once the first list is in (`/readyz`).
pub async fn follow(api: Api<ConfigMap>, tenants: Arc<Tenants>, listed: watch::Sender<bool>) {
    let config = watcher::Config::default().labels(&format!("{CONFIG_LABEL}=true"));
    let stream = crate::api::backoff::watch(watcher::watcher(api, config).boxed());
    futures::pin_mut!(stream);
    let mut seen: HashSet<String> = HashSet::new();
    let mut failing = false;
    tracing::info!(label = %format!("{CONFIG_LABEL}=true"), "watching the tasks' ConfigMaps");
    while let Some(event) = stream.next().await {
        if event.is_ok() && failing {
            tracing::info!("the ConfigMap watch resumed");
            failing = false;
        }
        match event {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(cm)) => {
                if let Some(name) = &cm.metadata.name {
                    seen.insert(name.clone());
                }
                tenants.upsert(cm).await;
            }
            Ok(Event::InitDone) => {
                for gone in tenants.names().into_iter().filter(|n| !seen.contains(n)) {
                    tenants.remove(&gone).await;
                }
                if !*listed.borrow() {
                    tracing::info!(tasks = seen.len(), "the tasks' ConfigMaps are listed");
                }
                listed.send_replace(true);
            }
            Ok(Event::Apply(cm)) => tenants.upsert(cm).await,
            Ok(Event::Delete(cm)) => {
                if let Some(name) = &cm.metadata.name {
                    tenants.remove(name).await;
                }
            }
            Err(e) => {
                if failing {
                    tracing::debug!(error = %e, "the ConfigMap watch failed again");
                } else {
                    tracing::warn!(error = %e, "the ConfigMap watch failed; retrying with backoff (the tasks served so far keep their config)");
                }
                failing = true;
            }
        }
    }
}
