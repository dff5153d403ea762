//! The catalog the operator renders with: loaded from a ConfigMap and kept current by a watch.
//! An invalid catalog never replaces a good one: the last good catalog stays in use, the
//! problems are logged and counted, and TaskRuns keep reconciling.

use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use orchestrator_crds::catalog::{CATALOG_KEY, Catalog};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// The current catalog, shared by all reconciles.
#[derive(Clone, Default)]
pub struct CatalogStore {
    inner: Arc<RwLock<Option<Arc<Catalog>>>>,
}

impl CatalogStore {
    /// A store that already holds `catalog` (tests, benchmarks).
    pub fn with(catalog: Catalog) -> Self {
        let store = Self::default();
        store.set(catalog);
        store
    }

    /// The current catalog, if a valid one was ever loaded.
    pub fn get(&self) -> Option<Arc<Catalog>> {
        self.inner
            .read()
            .map(|g| g.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    fn set(&self, catalog: Catalog) {
        let mut guard = self.inner.write().unwrap_or_else(|p| p.into_inner());
        *guard = Some(Arc::new(catalog));
    }
}

/// Watches the catalog ConfigMap; on every valid change stores it and sends `()` on `changed`
/// (the controller then reconciles every TaskRun).
pub async fn watch(
    client: Client,
    namespace: String,
    name: String,
    store: CatalogStore,
    metrics: Arc<Metrics>,
    changed: mpsc::Sender<()>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // With backoff: an error (the ConfigMap's namespace forbidden, the API server away) is
    // retried after a growing pause, not at once in a loop that logs and counts without end.
    let mut events = std::pin::pin!(crate::backoff::watch(watcher::watcher(api, config).boxed()));
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(cm) | Event::InitApply(cm)) => {
                if load(&cm, &namespace, &name, &store, &metrics) {
                    // A full channel already holds a pending "reconcile all".
                    let _ = changed.try_send(());
                }
            }
            Ok(Event::Delete(_)) => tracing::warn!(
                configmap = %format!("{namespace}/{name}"),
                "catalog ConfigMap deleted; keeping the last good catalog"
            ),
            Ok(Event::Init | Event::InitDone) => {}
            Err(e) => {
                metrics.catalog_load(false);
                tracing::warn!(error = %e, "watching the catalog ConfigMap");
            }
        }
    }
}

/// Parses the ConfigMap's catalog; stores it when valid. Returns whether it was stored.
fn load(
    cm: &ConfigMap,
    namespace: &str,
    name: &str,
    store: &CatalogStore,
    metrics: &Metrics,
) -> bool {
    let text = cm.data.as_ref().and_then(|d| d.get(CATALOG_KEY));
    let Some(text) = text else {
        metrics.catalog_load(false);
        tracing::error!(
            configmap = %format!("{namespace}/{name}"),
            "catalog ConfigMap has no key {CATALOG_KEY}; keeping the last good catalog"
        );
        return false;
    };
    match Catalog::parse(text) {
        Ok(catalog) => {
            metrics.catalog_load(true);
            tracing::info!(servers = ?catalog.names(), "catalog loaded");
            store.set(catalog);
            true
        }
        Err(e) => {
            metrics.catalog_load(false);
            tracing::error!(
                configmap = %format!("{namespace}/{name}"),
                "{e}\nkeeping the last good catalog"
            );
            false
        }
    }
}

/// A stream that yields once per stored catalog change (for `Controller::reconcile_all_on`).
pub fn changes(rx: mpsc::Receiver<()>) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|()| ((), rx)) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower_test::mock;

    /// An API server that refuses every list of the catalog (403): the watch retries with a
    /// growing pause. Without backoff the first 8 tries came within the same instant.
    #[tokio::test(start_paused = true)]
    async fn a_refused_watch_is_retried_with_backoff() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = tries.clone();
        let start = tokio::time::Instant::now();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut done = Some(done_tx);
            while let Some((_request, send)) = handle.next_request().await {
                if counted.fetch_add(1, Ordering::SeqCst) + 1 == 8
                    && let Some(done) = done.take()
                {
                    let _ = done.send(start.elapsed());
                }
                let body = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": "configmaps is forbidden"});
                send.send_response(
                    Response::builder()
                        .status(403)
                        .header("content-type", "application/json")
                        .body(Body::from(body.to_string().into_bytes()))
                        .expect("a valid response"),
                );
            }
        });
        let client = Client::new(service, "ns");
        let metrics = Arc::new(Metrics::default());
        let (changed, _rx) = mpsc::channel(1);
        let watch = tokio::spawn(watch(
            client,
            "ns".into(),
            "catalog".into(),
            CatalogStore::default(),
            metrics,
            changed,
        ));
        let elapsed = done_rx.await.expect("8 tries");
        watch.abort();
        assert!(
            elapsed >= std::time::Duration::from_secs(3),
            "8 refused watches within {elapsed:?}: retried without backoff"
        );
    }
}
