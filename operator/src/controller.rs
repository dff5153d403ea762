//! The controller and the watches that feed it: the TaskRuns (trimmed, `reconcile::trim`), the
//! facts of their children (`reconcile::facts`), people's decisions, the shared tasks'
//! ConfigMaps, and the sweeps that delete what no reconcile would (`reconcile::ends::retention`).

use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use orchestrator_crds::approval::ToolApproval;
use orchestrator_crds::shared::CONFIG_LABEL;
use orchestrator_crds::taskrun::TaskRun;
use tokio::sync::{Notify, mpsc};

use crate::catalog::{self, CatalogStore};
use crate::metrics::Metrics;
use crate::reconcile::facts::{self, CachedJob, Index, children};
use crate::reconcile::{self, Context};
use crate::settings::Settings;
use crate::{backoff, namespaces, notify, render};

/// Objects per page when a watch lists (on start and after a watch expired). The client's
/// default, 500, means 8 MB of JSON per page of Jobs, four watches at once, when the operator
/// restarts with thousands of tasks: a memory peak of its own (docs/benchmarks.md).
const LIST_PAGE_SIZE: u32 = 100;

/// What the controller is given by the operator's run: the catalog and its changes, the
/// metrics, and who the operator is (its events' reporter).
pub struct Parts {
    pub catalog: CatalogStore,
    pub metrics: Arc<Metrics>,
    pub identity: String,
    pub catalog_changed: mpsc::Receiver<()>,
}

/// Runs the controller, with its watches and the sweeps, until the controller ends.
pub async fn run(client: Client, settings: &Settings, parts: Parts) {
    let Parts {
        catalog,
        metrics,
        identity,
        catalog_changed: changed_rx,
    } = parts;
    // Approval notifications, off the reconcile path (see notify.rs).
    let notifier = settings.approval_webhook_url.as_deref().and_then(|url| {
        notify::Notifier::start(url, settings.approval_webhook_format, metrics.clone())
            .inspect_err(|error| tracing::error!(%error, "approval webhook off"))
            .ok()
    });
    let watched = settings.watched();
    tracing::info!(watching = %watched.describe(), "reconciling TaskRuns");
    let selector = watcher::Config::default()
        .labels(&render::managed_selector())
        .page_size(LIST_PAGE_SIZE);
    // Of the children, only what reconcile reads is kept (see reconcile::facts), which
    // keeps the operator small with thousands of tasks and saves reads per reconcile; the
    // objects themselves go on to the controller, which reconciles their owner.
    let (jobs, config_maps, leases) = (Index::default(), Index::default(), Index::default());
    let decisions = Index::default();
    let job_events = children::reflect(
        namespaces::watch::<CachedJob>(&client, &watched, selector.clone()),
        jobs.clone(),
        children::job_facts,
    )
    .touched_objects();
    let config_map_events = children::reflect(
        namespaces::watch::<ConfigMap>(&client, &watched, selector.clone()),
        config_maps.clone(),
        children::config_map_facts,
    )
    .touched_objects();
    // The task Leases, where each proxy reports the version it serves (metadata only).
    let lease_events = children::reflect(
        namespaces::watch::<PartialObjectMeta<Lease>>(&client, &watched, selector),
        leases.clone(),
        facts::lease::lease_facts,
    )
    .touched_objects();
    // People's decisions on held calls; each reconciles the TaskRun it names.
    let decision_events = children::reflect(
        namespaces::watch::<ToolApproval>(
            &client,
            &watched,
            watcher::Config::default().page_size(LIST_PAGE_SIZE),
        ),
        decisions.clone(),
        facts::decision::decision_facts,
    )
    .touched_objects();
    // With a shared proxy: the shared tasks' ConfigMaps in its namespace (a change or
    // deletion reconciles the task it names; see reconcile::facts::shared).
    let shared_config_maps = Index::default();
    let shared_events: BoxStream<'static, watcher::Result<ConfigMap>> =
        match settings.shared_proxy() {
            Some(proxy) => children::reflect(
                backoff::watch(
                    watcher::watcher(
                        Api::<ConfigMap>::namespaced(client.clone(), &proxy.namespace),
                        watcher::Config::default()
                            .labels(&format!("{CONFIG_LABEL}=true"))
                            .page_size(LIST_PAGE_SIZE),
                    )
                    .boxed(),
                ),
                shared_config_maps.clone(),
                facts::shared::facts,
            )
            .touched_objects()
            .boxed(),
            None => futures::stream::pending().boxed(),
        };
    let ctx = Arc::new(Context {
        jobs,
        config_maps,
        leases,
        decisions,
        shared_config_maps: shared_config_maps.clone(),
        default_proxy_mode: settings.default_proxy_mode,
        client: client.clone(),
        render: settings.render(),
        catalog,
        metrics: metrics.clone(),
        reporter: Reporter {
            controller: reconcile::MANAGER.into(),
            instance: Some(identity.clone()),
        },
        retention_seconds: settings.retention_seconds_after_finished,
        notifier,
    });
    let (taskruns, taskruns_writer) = reflector::store();
    // A deleted TaskRun's shared ConfigMap goes at once (no finalizer: the sweep, told).
    let taskrun_deleted = Arc::new(Notify::new());
    let shared_sweep = {
        let (taskruns, client) = (taskruns.clone(), client.clone());
        let (watched, kick) = (settings.watched(), taskrun_deleted.clone());
        let proxy = settings.shared_proxy();
        async move {
            match proxy {
                Some(proxy) => {
                    reconcile::retention::sweep_shared(
                        taskruns,
                        client,
                        shared_config_maps,
                        (proxy.namespace, watched),
                        kick,
                    )
                    .await
                }
                None => std::future::pending().await,
            }
        }
    };
    let sweep = {
        let (taskruns, client) = (taskruns.clone(), client.clone());
        let max_finished = settings.max_finished_per_namespace;
        async move {
            match max_finished {
                Some(max) => reconcile::retention::sweep(taskruns, client, metrics, max).await,
                None => std::future::pending().await,
            }
        }
    };
    let controller = controller(
        client.clone(),
        settings,
        ctx,
        (changed_rx, taskrun_deleted),
        (taskruns, taskruns_writer),
        (job_events, config_map_events, lease_events),
        (decision_events, shared_events),
    );
    tokio::select! {
        () = controller => {},
        () = sweep => {},
        () = shared_sweep => {},
    }
}

/// The controller: TaskRuns, plus the ConfigMaps and Jobs they own (a change or deletion of a
/// child reconciles its TaskRun), plus every TaskRun again when the catalog changes.
fn controller<J, C, L>(
    client: Client,
    settings: &Settings,
    ctx: Arc<Context>,
    (catalog_changed, taskrun_deleted): (mpsc::Receiver<()>, Arc<Notify>),
    (taskruns, writer): (Store<TaskRun>, reflector::store::Writer<TaskRun>),
    (jobs, config_maps, leases): (J, C, L),
    (decisions, shared): (
        impl futures::Stream<Item = Result<ToolApproval, watcher::Error>> + Send + 'static,
        BoxStream<'static, watcher::Result<ConfigMap>>,
    ),
) -> impl Future<Output = ()>
where
    J: futures::Stream<Item = Result<CachedJob, watcher::Error>> + Send + 'static,
    C: futures::Stream<Item = Result<ConfigMap, watcher::Error>> + Send + 'static,
    L: futures::Stream<Item = Result<PartialObjectMeta<Lease>, watcher::Error>> + Send + 'static,
{
    // Trimmed to what reconcile reads (see reconcile::trim_taskrun). A deleted TaskRun has no
    // calls waiting any more (no reconcile follows a deletion to say so).
    let metrics = ctx.metrics.clone();
    let taskrun_events = namespaces::watch::<TaskRun>(
        &client,
        &settings.watched(),
        watcher::Config::default().page_size(LIST_PAGE_SIZE),
    )
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(tr) = event {
            let ns = tr.namespace().unwrap_or_default();
            metrics.approvals_pending(&ns, &tr.name_any(), 0, 0.0);
        }
    })
    .modify(reconcile::trim_taskrun)
    .reflect(writer)
    // After the cache dropped it: the sweep then finds its shared ConfigMap orphaned.
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(_) = event {
            taskrun_deleted.notify_one();
        }
    })
    .touched_objects();
    Controller::for_stream(taskrun_events, taskruns)
        .owns_stream(config_maps)
        .owns_stream(jobs)
        .owns_stream(leases)
        .watches_stream(decisions, |a: ToolApproval| {
            a.namespace()
                .map(|ns| ObjectRef::new(&a.spec.task_run).within(&ns))
        })
        .watches_stream(shared, |cm: ConfigMap| {
            facts::shared::task_of(&cm).map(|(ns, name)| ObjectRef::new(&name).within(&ns))
        })
        .reconcile_all_on(catalog::changes(catalog_changed))
        // Each watch backs off by itself; one shared backoff would stall them all (backoff.rs).
        .trigger_backoff(backoff::NoBackoff)
        // A short debounce folds the burst of child events that follows each write into one
        // reconcile (and lets the caches catch up with the writes).
        .with_config(
            controller::Config::default()
                .concurrency(settings.concurrency)
                .debounce(std::time::Duration::from_millis(100)),
        )
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller");
            }
        })
}
