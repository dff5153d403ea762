//! The orchestrator operator: reconciles `TaskRun`s into a ConfigMap (the proxy and agent
//! configuration) and a Job (the agent with the MCP proxy as a native sidecar).
//!
//! - [`render`]: pure TaskRun + catalog -> ConfigMap + Job.
//! - [`reconcile`]: applies what render returns (server-side apply), status, events.
//! - [`catalog`]: loads and watches the catalog ConfigMap.
//! - [`leader`]: Lease-based leader election.
//! - [`backoff`]: how the watches retry (each by itself, a 410 at once, at most 5 s apart).
//! - [`namespaces`]: the namespaces watched (all, or a list: one watch each, merged).
//! - [`metrics`], [`server`], [`telemetry`]: `/metrics`, `/healthz`, traces over OTLP.
//! - [`notify`]: the approval webhook (a POST when a call starts waiting for approval).
//! - [`settings`]: flags and env.
//! - [`rbac`]: every API verb the operator uses (the chart's RBAC).

pub mod backoff;
pub mod catalog;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod namespaces;
pub mod notify;
pub mod rbac;
pub mod reconcile;
pub mod render;
pub mod server;
pub mod settings;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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

pub use error::{Error, Result};
pub use settings::Settings;

use crate::catalog::CatalogStore;
use crate::metrics::Metrics;
use crate::namespaces::Watched;
use crate::reconcile::Context;
use crate::reconcile::facts::{self, CachedJob, Index, children};
use crate::server::Health;

/// Objects per page when a watch lists (on start and after a watch expired). The client's
/// default, 500, means 8 MB of JSON per page of Jobs, four watches at once, when the operator
/// restarts with thousands of tasks: a memory peak of its own (docs/benchmarks.md).
const LIST_PAGE_SIZE: u32 = 100;

/// Runs the operator until SIGTERM or Ctrl-C: telemetry, a client from the usual places
/// (`$KUBECONFIG`, `~/.kube/config`, or in-cluster), then [`run_with`].
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let _telemetry = telemetry::init(settings.otlp_endpoint.as_deref(), settings.log_json)?;
    let client = Client::try_default().await?;
    // A namespace the operator is told to watch but may not work in is said at once, with
    // everything it lacks there, rather than as a watch retrying forbidden lists.
    // A webhook URL that cannot work is said at once (without repeating it: it is a secret).
    if let Some(url) = settings.approval_webhook_url.as_deref() {
        notify::check_url(url).map_err(anyhow::Error::msg)?;
    }
    if let Watched::Only(namespaces) = settings.watched() {
        rbac::check_namespaces(&client, &namespaces)
            .await
            .map_err(anyhow::Error::msg)?;
    }
    run_with(client, settings, shutdown_signal()).await?;
    Ok(())
}

/// Runs the operator with `client` until `shutdown` completes: serves `/metrics` and `/healthz`,
/// waits for the leader Lease (if enabled), then runs the controller. Returns an error if the
/// lease is lost (the process should exit so that it restarts clean).
pub async fn run_with(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let health = Health::default();
    let server = tokio::spawn(server::serve(
        settings.bind,
        metrics.clone(),
        health.clone(),
    ));

    // Approval notifications, off the reconcile path (see notify.rs).
    let notifier = settings.approval_webhook_url.as_deref().and_then(|url| {
        notify::Notifier::start(url, settings.approval_webhook_format, metrics.clone())
            .inspect_err(|error| tracing::error!(%error, "approval webhook off"))
            .ok()
    });

    let catalog = CatalogStore::default();
    let (changed_tx, changed_rx) = mpsc::channel(1);
    let catalog_watch = tokio::spawn(catalog::watch(
        client.clone(),
        settings.catalog_namespace.clone(),
        settings.catalog_name.clone(),
        catalog.clone(),
        metrics.clone(),
        changed_tx,
    ));

    let mut shutdown = std::pin::pin!(shutdown);
    let identity = settings.identity();
    let mut elector = settings.leader_election.then(|| {
        leader::Elector::new(
            client.clone(),
            &settings.lease_namespace,
            &settings.lease_name,
            identity.clone(),
            settings.lease_duration(),
        )
    });
    let result = async {
        if let Some(elector) = elector.as_mut() {
            tokio::select! {
                acquired = elector.acquire() => acquired?,
                () = &mut shutdown => return Ok(()),
            }
        }
        health.leading.store(true, Ordering::Relaxed);
        let watched = settings.watched();
        tracing::info!(watching = %watched.describe(), "reconciling TaskRuns");
        let selector = watcher::Config::default()
            .labels(&render::managed_selector())
            .page_size(LIST_PAGE_SIZE);
        // Of the children, only what reconcile reads is kept (see reconcile::children), which
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
        // deletion reconciles the task it names; see reconcile::shared).
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
            async move {
                match settings.max_finished_per_namespace {
                    Some(max) => reconcile::retention::sweep(taskruns, client, metrics, max).await,
                    None => std::future::pending().await,
                }
            }
        };
        let controller = controller(
            client.clone(),
            &settings,
            ctx,
            (changed_rx, taskrun_deleted),
            (taskruns, taskruns_writer),
            (job_events, config_map_events, lease_events),
            (decision_events, shared_events),
        );
        let controller = async {
            tokio::select! {
                () = controller => {},
                () = sweep => {},
                () = shared_sweep => {},
            }
        };
        let hold = async {
            match elector.as_mut() {
                Some(e) => e.hold().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = controller => Ok(()),
            lost = hold => Err(lost),
            () = &mut shutdown => Ok(()),
        }
    }
    .await;
    health.leading.store(false, Ordering::Relaxed);
    if let Some(elector) = elector.as_mut() {
        elector.release().await;
    }
    // Each task gone before this returns, while the client they use still works: a watch that
    // outlives the runtime's shutdown would meet a closed client and retry at once, forever.
    server.abort();
    catalog_watch.abort();
    let _ = server.await;
    let _ = catalog_watch.await;
    tracing::info!("operator stopped");
    result
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

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
