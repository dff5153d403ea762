//! Wiring: load the config, start the front (HTTP or stdio), the reload watcher and the upstream
//! event loop; on SIGTERM/SIGINT stop accepting, drain calls, stop every child. [`run_shared`]:
//! the same for shared mode (many tasks, `crate::tenant`).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use orchestrator_crds::proxy::DEFAULT_LISTEN;
use rmcp::ServiceExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    api::{self, ApiOptions},
    apply::Applier,
    audit::{self, Audit, otlp::AuditExport},
    config,
    metrics::Metrics,
    proxy::Proxy,
    reaper, reload,
    server::{
        Front,
        auth::{AgentToken, AuditorToken, ClientAuth},
        http, listener,
    },
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
    /// How long calls in flight may finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// Time between SIGTERM and SIGKILL for children.
    pub kill_grace: Duration,
    /// How long an upstream may take to start and answer the handshake.
    pub start_timeout: Duration,
    /// Quiet time after the last change of the config directory before reloading.
    pub reload_debounce: Duration,
    /// An HTTP session with no message either way for this long is closed (zero: never).
    pub session_idle: Duration,
    /// Initialize-era HTTP sessions open at once; over it `initialize` gets a JSON-RPC error.
    pub max_sessions: usize,
    /// An HTTP request's headers must arrive within this, or its connection is closed.
    pub header_read_timeout: Duration,
    /// The values of the task's Secrets (`<secret>/<key>` files), masked in what a call held
    /// for approval shows.
    pub mask_secrets_dir: Option<PathBuf>,
    /// The Kubernetes API objects to use (none: the mounted file only).
    pub api: ApiOptions,
    /// A second listener serving `GET /metrics` only (e.g. the pod IP, for a PodMonitor).
    pub metrics_listen: Option<SocketAddr>,
    /// Also export each audit record as an OTLP log record.
    pub audit_otlp: bool,
    /// Where to write (or find) the agent's token; the HTTP front then requires it.
    pub client_token_file: Option<PathBuf>,
    /// The auditors' token (read-only endpoints).
    pub auditor_token_file: Option<PathBuf>,
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    reaper::start();
    let metrics = Arc::new(Metrics::new());
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let guard = Arc::new(Guard::default());
    let deps = Deps {
        shared: Arc::new(Shared::new(opts.cache_dir.clone().map(DiskCache::new))),
        events: events_tx,
        metrics: metrics.clone(),
        start_timeout: opts.start_timeout,
        kill_grace: opts.kill_grace,
        guard: Some(guard.clone()),
        pod_name: opts.api.pod_name.clone(),
    };
    // Before any tool list is seen: what the task's earlier proxies saw first.
    let api_client = api::connect(&opts.api).await;
    api::restore_baseline(api_client.as_ref(), &opts.api, &deps.shared).await;
    let pool = Pool::new(deps);
    // Without audit.path the records are the audit stream: stdout, unless stdout is MCP.
    let audit = Audit::to_stream(audit::Stream::for_front(opts.stdio));
    let audit = if opts.audit_otlp {
        audit.with_otlp(Some(AuditExport::from_env(metrics.clone())?))
    } else {
        audit
    };
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
    let _watcher = reload::watch(
        opts.config.clone(),
        opts.reload_debounce,
        print,
        applier.clone(),
    )?;
    // The model gateway: one per proxy, its counts taken up from the task's Lease before it
    // serves (a restarted proxy does not start the budget again).
    let gateway = crate::gateway::Gateway::new(proxy.clone());
    let usage_task = api::model_usage(api_client.as_ref(), &opts.api, &gateway).await;
    let api_tasks = api::start(api_client, &opts.api, &applier).await;

    let sessions_cancel = CancellationToken::new();
    let accept_cancel = CancellationToken::new();
    let listen = opts.listen.or(config_listen);
    let http_wanted = !opts.stdio || opts.listen.is_some();
    if http_wanted {
        let listen = listen.unwrap_or_else(|| {
            DEFAULT_LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)))
        });
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| bind_failed(listen, &e))?;
        // Only once the port is ours: the agent's client finds the token when the proxy is the
        // one listening.
        let auth = client_auth(&opts)?;
        if auth.is_open() {
            tracing::warn!(%listen, "no --client-token-file: every process that reaches {listen} is served as the agent (the operator always sets it in a task pod)");
        }
        let settings = http::Settings {
            listen,
            session_idle: opts.session_idle,
            max_sessions: opts.max_sessions,
            auth,
            gateway: Some(gateway.clone()),
        };
        let app = http::app(proxy.clone(), &settings, sessions_cancel.clone());
        tracing::info!(%listen, "serving MCP at http://{listen}/mcp");
        tokio::spawn(listener::serve(
            listener,
            app,
            opts.header_read_timeout,
            accept_cancel.clone(),
        ));
    }

    if let Some(addr) = opts.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {addr} (--metrics-listen, MCP_PROXY_METRICS_LISTEN): {e}"
            )
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
        // The same bounds as the MCP listener: connections at once, header-read timeout.
        tokio::spawn(listener::serve(
            listener,
            http::metrics_app(proxy.clone(), addr),
            opts.header_read_timeout,
            accept_cancel.clone(),
        ));
    }

    if opts.stdio {
        let service = Front::new(proxy.clone())
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("stdio session failed to start: {e}"))?;
        tracing::info!("serving MCP on stdio");
        let cancel = service.cancellation_token();
        tokio::select! {
            _ = service.waiting() => tracing::info!("the stdio client went away"),
            signal = shutdown_signal() => {
                tracing::info!(%signal, "shutting down");
                cancel.cancel();
            }
        }
    } else {
        let signal = shutdown_signal().await;
        tracing::info!(%signal, "shutting down");
    }

    // No config change from the API while stopping; stop taking new connections and calls, let
    // calls in flight finish, then stop children.
    drop(api_tasks);
    accept_cancel.cancel();
    proxy.drain(opts.shutdown_grace).await;
    // Every model request has settled: the final count goes to the Lease (status.usage).
    if let Some(reporter) = usage_task {
        reporter.finish(&gateway).await;
    }
    sessions_cancel.cancel();
    proxy.pool.shutdown().await;
    guard.finish();
    proxy.flush_audit();
    let audit = proxy.audit.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(otlp) = audit.otlp() {
            otlp.shutdown();
        }
    })
    .await;
    tracing::info!("all upstream servers stopped; bye");
    Ok(())
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Shared mode's options (`orchestrator-mcp-proxy shared`).
#[derive(Clone, Debug)]
pub struct SharedOptions {
    pub listen: SocketAddr,
    /// Where the tasks' ConfigMaps are (the proxy's own namespace).
    pub namespace: String,
    /// The audience the agents' tokens must be for.
    pub audience: String,
    /// The connection must come from the task pod's IP.
    pub check_peer: bool,
    pub metrics_listen: Option<SocketAddr>,
    pub pod_name: Option<String>,
    pub shutdown_grace: Duration,
    pub kill_grace: Duration,
    pub start_timeout: Duration,
    pub session_idle: Duration,
    /// Initialize-era sessions per task.
    pub max_sessions: usize,
    pub header_read_timeout: Duration,
    pub audit_otlp: bool,
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
    use crate::tenant::{auth, dispatch, registry, watch};
    let client = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!(
            "cannot configure a Kubernetes API client (in-cluster config or $KUBECONFIG): {e}"
        )
    })?;
    let metrics = Arc::new(Metrics::shared());
    let audit = Audit::to_stream(audit::Stream::Stdout);
    let audit = if opts.audit_otlp {
        audit.with_otlp(Some(AuditExport::from_env(metrics.clone())?))
    } else {
        audit
    };
    let tenants = registry::Tenants::new(registry::Settings {
        client: client.clone(),
        metrics: metrics.clone(),
        audit: audit.clone(),
        http: http::Settings {
            listen: opts.listen,
            session_idle: opts.session_idle,
            max_sessions: opts.max_sessions,
            // Each request is authenticated by its token's TokenReview (`tenant::auth`).
            auth: ClientAuth::default(),
            // Shared mode serves no model yet (the operator refuses spec.model there).
            gateway: None,
        },
        start_timeout: opts.start_timeout,
        kill_grace: opts.kill_grace,
        pod_name: opts.pod_name.clone(),
        namespace: opts.namespace.clone(),
    });
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), &opts.namespace);
    let watch = tokio::spawn(watch::follow(configmaps, tenants.clone(), listed_tx));
    let front = Arc::new(dispatch::Front {
        auth: auth::Authenticator::new(
            Arc::new(auth::KubeReviewer(client)),
            opts.audience.clone(),
            auth::MAX_ENTRIES,
        ),
        tenants: tenants.clone(),
        check_peer: opts.check_peer,
        listed,
    });

    let accept_cancel = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (--listen): {e}", opts.listen))?;
    tracing::info!(listen = %opts.listen, namespace = %opts.namespace, audience = %opts.audience, check_peer = opts.check_peer, "serving the tasks' MCP at http://{}/mcp", opts.listen);
    tokio::spawn(listener::serve(
        listener,
        dispatch::app(front),
        opts.header_read_timeout,
        accept_cancel.clone(),
    ));
    if let Some(addr) = opts.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {addr} (--metrics-listen, MCP_PROXY_METRICS_LISTEN): {e}"
            )
        })?;
        tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
        tokio::spawn(listener::serve(
            listener,
            http::shared_metrics_app(metrics),
            opts.header_read_timeout,
            accept_cancel.clone(),
        ));
    }

    let signal = shutdown_signal().await;
    tracing::info!(%signal, "shutting down");
    watch.abort();
    accept_cancel.cancel();
    tenants.stop_all(opts.shutdown_grace).await;
    audit.flush();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(otlp) = audit.otlp() {
            otlp.shutdown();
        }
    })
    .await;
    tracing::info!("every task's upstreams stopped; bye");
    Ok(())
}
