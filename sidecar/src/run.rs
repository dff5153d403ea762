//! Wiring of the two modes, each handed to the one runtime ([`crate::runtime::serve`]: listeners,
//! metrics, audit export, signals, drain). [`run`]: sidecar mode, one task: load the config, start
//! the front (HTTP or stdio), the reload watcher and the upstream event loop ([`Task`]).
//! [`run_shared`]: shared mode, many tasks (`crate::tenant`).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use axum::Router;
use orchestrator_crds::proxy::DEFAULT_LISTEN;
use rmcp::{
    RoleServer, ServiceExt,
    service::{RunningService, RunningServiceCancellationToken},
};
use tokio::{net::TcpListener, sync::mpsc};
use tokio_util::sync::CancellationToken;

use crate::{
    api::{self, ApiOptions},
    apply::Applier,
    audit, config,
    gateway::Gateway,
    metrics::Metrics,
    proxy::Proxy,
    reaper, reload,
    runtime::{self, Mode},
    server::{
        Front,
        auth::{AgentToken, AuditorToken, ClientAuth},
        http,
    },
    tenant::{self, mode::SharedOptions},
    upstream::{Deps, Shared, cache::DiskCache, guard::Guard, pool::Pool},
};

/// Runtime options (command-line flags); the rest comes from the config file.
#[derive(Clone, Debug)]
pub struct Options {
    pub config: PathBuf,
    /// Serve MCP on stdin/stdout instead of HTTP.
    pub stdio: bool,
    /// Overrides `listen` from the config (and, with `--stdio`, enables the HTTP endpoints).
    pub listen: Option<SocketAddr>,
    pub cache_dir: Option<PathBuf>,
    /// Time between SIGTERM and SIGKILL for children.
    pub kill_grace: Duration,
    /// Quiet time after the last change of the config directory before reloading.
    pub reload_debounce: Duration,
    /// The values of the task's Secrets (`<secret>/<key>` files), masked in what a call held
    /// for approval shows.
    pub mask_secrets_dir: Option<PathBuf>,
    /// The Kubernetes API objects to use (none: the mounted file only).
    pub api: ApiOptions,
    /// Where to write (or find) the agent's token; the HTTP front then requires it.
    pub client_token_file: Option<PathBuf>,
    /// The auditors' token (read-only endpoints).
    pub auditor_token_file: Option<PathBuf>,
    /// What both modes share: grace, timeouts, session limits, metrics listener, OTLP audit.
    pub runtime: runtime::Settings,
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    crate::memory::install(opts.runtime.memory.clone());
    reaper::start();
    let metrics = Arc::new(Metrics::new());
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let guard = Arc::new(Guard::default());
    let deps = Deps {
        shared: Arc::new(Shared::new(opts.cache_dir.clone().map(DiskCache::new))),
        events: events_tx,
        metrics: metrics.clone(),
        start_timeout: opts.runtime.start_timeout,
        kill_grace: opts.kill_grace,
        guard: Some(guard.clone()),
        pod_name: opts.api.pod_name.clone(),
    };
    // Before any tool list is seen: what the task's earlier proxies saw first.
    let api_client = api::connect(&opts.api).await;
    api::restore_baseline(api_client.as_ref(), &opts.api, &deps.shared).await;
    let pool = Pool::new(deps);
    // Without audit.path the records are the audit stream: stdout, unless stdout is MCP.
    let stream = audit::Stream::for_front(opts.stdio);
    let audit = runtime::audit(stream, &metrics, &opts.runtime)?;
    let proxy = Proxy::new(pool, metrics.clone(), audit);
    if let Some(dir) = &opts.mask_secrets_dir {
        proxy.approvals.mask_secrets_from(dir.clone());
    }

    let (loaded, print) = match std::fs::read(&opts.config) {
        Ok(bytes) => (
            config::load_bytes(&bytes),
            Some(reload::fingerprint(&bytes)),
        ),
        Err(_) => (config::load_file(&opts.config), None),
    };
    let config_listen = loaded.config.as_ref().map(|c| c.listen);
    // With the API watch there are two sources, and only a higher contextVersion wins.
    let applier = Applier::new(proxy.clone(), opts.api.watch_config_map.is_some());
    applier
        .initial(&opts.config.display().to_string(), loaded)
        .await;

    {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            while let Some(event) = events_rx.recv().await {
                let proxy = proxy.clone();
                tokio::spawn(async move { proxy.on_upstream_event(event).await });
            }
        });
    }
    let watcher = reload::watch(
        opts.config.clone(),
        opts.reload_debounce,
        print,
        applier.clone(),
    )?;
    // The model gateway: one per proxy, its counts taken up from the task's Lease before it
    // serves (a restarted proxy does not start the budget again).
    let gateway = Gateway::new(proxy.clone());
    let usage_task = api::model_usage(api_client.as_ref(), &opts.api, &gateway).await;
    let api_tasks = Some(api::start(api_client, &opts.api, &applier).await);

    let audit = proxy.audit.clone();
    let task = Task {
        listen: opts.listen.or(config_listen),
        proxy,
        gateway,
        usage_task,
        api_tasks,
        _watcher: watcher,
        guard,
        sessions_cancel: CancellationToken::new(),
        stdio: None,
        stdio_cancel: None,
        opts,
    };
    let settings = task.opts.runtime.clone();
    runtime::serve(&settings, task, audit).await
}

/// Sidecar mode as the runtime runs it: one task's proxy, its model gateway, its config sources.
struct Task {
    opts: Options,
    /// `--listen`, else the config's `listen`.
    listen: Option<SocketAddr>,
    proxy: Arc<Proxy>,
    gateway: Arc<Gateway>,
    usage_task: Option<api::usage::Reporter>,
    /// The API watches; dropped at shutdown (no config change from the API while stopping).
    api_tasks: Option<api::ApiTasks>,
    /// The mounted file's watcher, kept for the process's life.
    _watcher: reload::WatchGuard,
    guard: Arc<Guard>,
    sessions_cancel: CancellationToken,
    /// The stdio session, from [`Mode::start`] until it ends (or the process stops).
    stdio: Option<RunningService<RoleServer, Front>>,
    stdio_cancel: Option<RunningServiceCancellationToken>,
}

impl Mode for Task {
    const BYE: &'static str = "all upstream servers stopped; bye";

    async fn listen(&mut self) -> anyhow::Result<Option<(TcpListener, Router)>> {
        let opts = &self.opts;
        if opts.stdio && opts.listen.is_none() {
            return Ok(None);
        }
        let listen = self.listen.unwrap_or_else(|| {
            DEFAULT_LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)))
        });
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| bind_failed(listen, &e))?;
        // Only once the port is ours: the agent's client finds the token when the proxy is the
        // one listening.
        let auth = client_auth(opts)?;
        if auth.is_open() {
            tracing::warn!(%listen, "no --client-token-file: every process that reaches {listen} is served as the agent (the operator always sets it in a task pod)");
        }
        let settings = http::Settings {
            listen,
            session_idle: opts.runtime.session_idle,
            max_sessions: opts.runtime.max_sessions,
            auth,
            gateway: Some(self.gateway.clone()),
        };
        let app = http::app(self.proxy.clone(), &settings, self.sessions_cancel.clone());
        tracing::info!(%listen, "serving MCP at http://{listen}/mcp");
        Ok(Some((listener, app)))
    }

    fn metrics_app(&self, addr: SocketAddr) -> Router {
        http::metrics_app(self.proxy.clone(), addr)
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        if !self.opts.stdio {
            return Ok(());
        }
        let service = Front::new(self.proxy.clone())
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("stdio session failed to start: {e}"))?;
        tracing::info!("serving MCP on stdio");
        self.stdio_cancel = Some(service.cancellation_token());
        self.stdio = Some(service);
        Ok(())
    }

    async fn ended(&mut self) {
        let Some(service) = self.stdio.take() else {
            return std::future::pending().await;
        };
        let _ = service.waiting().await;
        tracing::info!("the stdio client went away");
    }

    fn freeze(&mut self) {
        if let Some(cancel) = self.stdio_cancel.take() {
            cancel.cancel();
        }
        self.api_tasks = None;
    }

    async fn drain(self, grace: Duration) {
        self.proxy.drain(grace).await;
        // Every model request has settled: the final count goes to the Lease (status.usage).
        if let Some(reporter) = self.usage_task {
            reporter.finish(&self.gateway).await;
        }
        self.sessions_cancel.cancel();
        self.proxy.pool.shutdown().await;
        self.guard.finish();
    }
}

/// The HTTP front's credentials from the flags: the agent's token is created (or found) now.
fn client_auth(opts: &Options) -> anyhow::Result<ClientAuth> {
    let agent = opts
        .client_token_file
        .as_deref()
        .map(AgentToken::load_or_create)
        .transpose()?;
    let auditor = opts.auditor_token_file.clone().map(AuditorToken::new);
    Ok(ClientAuth::new(agent, auditor))
}

/// Why the listener could not be bound, naming who holds the port when another process of the
/// pod does (its uid, from the socket table).
fn bind_failed(listen: SocketAddr, e: &std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        let holders = crate::probe::listeners(listen).unwrap_or_default();
        if let Some(uid) = holders.first() {
            return anyhow::anyhow!(
                "cannot listen on {listen}: it is held by uid {uid} (another process of the pod \
                 took the proxy's port; the agent's client will not send its token there)"
            );
        }
    }
    anyhow::anyhow!("cannot listen on {listen}: {e}")
}

/// Serves every task whose ConfigMap is labelled for the shared proxy in `opts.namespace`.
pub async fn run_shared(opts: SharedOptions) -> anyhow::Result<()> {
    crate::memory::install(opts.runtime.memory.clone());
    let (tenants, audit) = tenant::mode::Shared::new(&opts).await?;
    runtime::serve(&opts.runtime, tenants, audit).await
}
