//! The proxy core, independent of the front transport: the current config and exposed-tool table
//! (one `Arc` swapped atomically), `tools/list` (lazy, parallel starts of servers whose list is
//! unknown), config application, upstream list changes and draining on shutdown.
//!
//! Children: `call` (the `tools/call` pipeline: its steps in order, the approval wait, forward,
//! record), `intent` (intent mode's four tools and its two keys, steps of the pipeline),
//! `passthrough` (prompts, resources, completions, logging level: [`passthrough::Relay`]),
//! `bridge` (initialize-era upstreams asking 2026-07-28 clients). `Proxy` is implemented here,
//! in `call` and in `call::forward` only.

mod bridge;
mod call;
mod intent;
pub mod passthrough;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwapOption;
use orchestrator_crds::proxy::ToolMode;
use rmcp::model::{InputResponses, JsonObject, RequestId, RequestMetaObject, Tool};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    approval::Approvals,
    audit::Audit,
    config::{Config, Server},
    error::Error,
    metrics::Metrics,
    names::ServerName,
    policy::{arguments::Validators, limits::Limiters},
    router::{DefinitionChange, Router},
    session::{ListKind, Registry, SessionRef},
    sync,
    upstream::{Revision, handler::UpstreamEvent, pool::Pool},
};

/// Events about the task waiting for the API reporter; more are dropped (the log, the metric and
/// the audit line still have them).
const TASK_EVENTS_QUEUED: usize = 64;

/// Something about the task worth an Event on its TaskRun.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEvent {
    /// The TaskRun's name (the config's `task.name`).
    pub task: String,
    /// `PascalCase`, e.g. `ToolDefinitionChanged`.
    pub reason: &'static str,
    /// What the proxy did, e.g. `Quarantine`.
    pub action: &'static str,
    pub note: String,
}

/// Rounds of `input_required` the proxy drives for a client that cannot take them itself.
pub(crate) const MRTR_MAX_ROUNDS: usize = 10;

/// The config in use and the tool tables built from it, one per revision: a server may list
/// different tools to initialize-era and to 2026-07-28 sessions.
pub struct Snapshot {
    pub config: Arc<Config>,
    /// Indexed by [`Revision::slot`].
    routers: [Router; 2],
}

impl Snapshot {
    /// The table sessions of `revision` see.
    pub fn router(&self, revision: Revision) -> &Router {
        &self.routers[revision.slot()]
    }

    /// The table `session` sees.
    pub fn router_for(&self, session: &SessionRef) -> &Router {
        self.router(Revision::of_session(session))
    }

    /// Both tables (for what concerns every session: `GET /tools`, definition changes).
    pub fn routers(&self) -> &[Router; 2] {
        &self.routers
    }

    /// Whether an upstream listed `exposed` in either revision (see [`Router::is_listed`]).
    pub fn is_listed(&self, exposed: &str) -> bool {
        self.routers.iter().any(|r| r.is_listed(exposed))
    }
}

/// One `tools/call` as received from a client.
pub struct CallRequest {
    pub name: String,
    pub arguments: Option<JsonObject>,
    pub input_responses: Option<InputResponses>,
    pub request_state: Option<String>,
    pub meta: RequestMetaObject,
    pub request_id: RequestId,
    pub ct: CancellationToken,
    pub session: SessionRef,
    /// The intent declared with it in intent mode (set by `intent` for a `call_tool_*`); `None`
    /// for a direct call.
    pub intent: Option<intent::Declared>,
    /// Ends the call's answer stream to the client (an initialize-era HTTP session's POST
    /// stream), for when the upstream ends its own mid-call.
    pub stream_cut: Option<CancellationToken>,
}

pub struct Proxy {
    pub(crate) snapshot: ArcSwapOption<Snapshot>,
    /// Serializes router rebuilds so no update is lost between load and swap.
    pub(crate) rebuild: tokio::sync::Mutex<()>,
    pub pool: Pool,
    pub passthrough: passthrough::Passthrough,
    pub(crate) bridge: bridge::Bridge,
    pub sessions: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub(crate) audit: Audit,
    /// Rate limit buckets, kept across reloads.
    pub(crate) limiters: Limiters,
    /// Compiled input schemas, by definition hash.
    pub(crate) validators: Validators,
    /// Calls held for a person's decision (`policy.requireApproval`).
    pub approvals: Approvals,
    /// Events about the task for the API reporter (`api::events`), which takes the receiver.
    task_events: tokio::sync::mpsc::Sender<TaskEvent>,
    task_events_rx: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<TaskEvent>>>,
    pub(crate) calls_in_flight: AtomicUsize,
    pub(crate) idle: Notify,
    pub(crate) draining: AtomicBool,
    /// Cancelled when shutdown's grace is over: calls still running are answered with
    /// `PROXY.SHUTTING_DOWN` then.
    pub(crate) cut_off: CancellationToken,
}

impl Proxy {
    pub fn new(pool: Pool, metrics: Arc<Metrics>, audit: Audit) -> Arc<Self> {
        let (task_events, task_events_rx) = tokio::sync::mpsc::channel(TASK_EVENTS_QUEUED);
        let approvals = Approvals::new(metrics.clone());
        Arc::new(Self {
            snapshot: ArcSwapOption::empty(),
            rebuild: Default::default(),
            pool,
            passthrough: Default::default(),
            bridge: Default::default(),
            sessions: Default::default(),
            metrics,
            audit,
            limiters: Default::default(),
            validators: Default::default(),
            approvals,
            task_events,
            task_events_rx: std::sync::Mutex::new(Some(task_events_rx)),
            calls_in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            draining: AtomicBool::new(false),
            cut_off: CancellationToken::new(),
        })
    }

    /// The stream of events about the task, for the one reporter that publishes them (`None` once
    /// taken). Without a reporter, events beyond a small queue are dropped.
    pub fn take_task_events(&self) -> Option<tokio::sync::mpsc::Receiver<TaskEvent>> {
        sync::lock(&self.task_events_rx).take()
    }

    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snapshot.load_full()
    }

    /// Puts a validated config in use: swaps the table, stops what the config no longer needs
    /// (starting nothing), and tells every session when the tools on offer may have changed.
    pub async fn apply_config(self: &Arc<Self>, config: Config) {
        self.metrics
            .servers(config.servers.iter().map(|s| s.name.as_str()));
        let config = Arc::new(config);
        let changed = {
            let _guard = self.rebuild.lock().await;
            let before = self.snapshot();
            let routers = self.build_routers(&config);
            let changed = before.as_ref().is_none_or(|b| {
                intent::offer_changed(b.config.tool_mode, config.tool_mode, || {
                    surface_changed(&b.routers, &routers)
                })
            });
            self.install(
                before.as_deref(),
                Snapshot {
                    config: config.clone(),
                    routers,
                },
            );
            changed
        };
        self.limiters.retain(&config);
        self.metrics.config_in_use(config.context_version);
        tracing::info!(
            context_version = config.context_version,
            servers = config.servers.len(),
            startable = config.servers.iter().filter(|s| s.is_startable()).count(),
            "config in use"
        );
        self.pool.reconcile(&config).await;
        if changed {
            self.notify(ListKind::Tools).await;
        }
    }

    /// Rebuilds the table from the current config and known lists. Returns whether the tools on
    /// offer changed.
    pub(crate) async fn rebuild(&self) -> bool {
        let _guard = self.rebuild.lock().await;
        let Some(current) = self.snapshot() else {
            return false;
        };
        let routers = self.build_routers(&current.config);
        let mode = current.config.tool_mode;
        let changed =
            intent::offer_changed(mode, mode, || surface_changed(&current.routers, &routers));
        self.install(
            Some(&current),
            Snapshot {
                config: current.config.clone(),
                routers,
            },
        );
        changed
    }

    /// Each revision's table from `config` and the lists known in that revision.
    fn build_routers(&self, config: &Config) -> [Router; 2] {
        // In slot order.
        [Revision::Legacy, Revision::Modern].map(|revision| {
            let known = self.pool.known_lists(config, revision);
            Router::build(config, &known.lists).with_borrowed(known.borrowed)
        })
    }

    /// Puts a snapshot in use (the caller holds the rebuild lock) and reports the definition
    /// changes that `before`, the snapshot it replaces, did not have: each change once while it
    /// lasts, and nothing kept beyond the current table.
    fn install(&self, before: Option<&Snapshot>, snapshot: Snapshot) {
        let snapshot = Arc::new(snapshot);
        self.snapshot.store(Some(snapshot.clone()));
        let known: Vec<&DefinitionChange> = before
            .map(|b| b.routers.iter().flat_map(Router::changes).collect())
            .unwrap_or_default();
        let mut reported: Vec<&DefinitionChange> = Vec::new();
        for change in snapshot.routers.iter().flat_map(Router::changes) {
            // A list borrowed by the other revision shows its changes twice.
            if !known.contains(&change) && !reported.contains(&change) {
                self.ledger().definition_changed(&snapshot, change);
                reported.push(change);
            }
        }
    }

    pub async fn notify(&self, kind: ListKind) {
        let sent = self.sessions.notify_list_changed(kind).await;
        let label = match kind {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
        };
        self.metrics.list_changed_sent(label, sent);
        tracing::info!(kind = label, sessions = sent, "sent list_changed");
    }

    /// The exposed tools. Servers whose list is not known are started (in parallel) first;
    /// one that fails is left out and logged, the others are still listed. In intent mode: its
    /// four tools, starting nothing.
    pub async fn list_tools(&self, session: &SessionRef) -> Result<Arc<Vec<Tool>>, Error> {
        let snap = self.snapshot().ok_or(Error::NotReady)?;
        if snap.config.tool_mode == ToolMode::Intent {
            return Ok(intent::offered());
        }
        let (table, _) = self.with_lists(&snap, session).await;
        let table = table.ok_or(Error::NotReady)?;
        Ok(table.router_for(session).tools())
    }

    /// The table `session` sees once the lists it lacks are known: servers whose list is not
    /// are started (in parallel) first. Returns that table (`None` only without a config) and
    /// the servers that could not be started.
    pub(crate) async fn with_lists(
        &self,
        snap: &Arc<Snapshot>,
        session: &SessionRef,
    ) -> (Option<Arc<Snapshot>>, Vec<Error>) {
        let missing = snap.router_for(session).lists_to_fetch();
        if missing.is_empty() {
            return (Some(snap.clone()), Vec::new());
        }
        let errors = self.fetch_lists(&missing, session).await;
        self.rebuild().await;
        (self.snapshot(), errors)
    }

    /// Fetches the lists of `servers` in parallel; returns the failures (also logged). A server
    /// inside its restart backoff is left out (`Error::Backoff`).
    pub(crate) async fn fetch_lists(
        &self,
        servers: &[Arc<Server>],
        session: &SessionRef,
    ) -> Vec<Error> {
        let fetches = servers.iter().map(|s| async move {
            let result = self.pool.fetch_list(s, Some(session)).await;
            if let Err(e) = &result {
                tracing::warn!(server = %s.name, error = %e, "tool list unavailable; its tools are left out");
            }
            result.err()
        });
        futures::future::join_all(fetches)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Handles a change notified by an upstream: re-list it, and tell the clients when what they
    /// see changed (after the re-list, so a client that re-lists sees the new table). An
    /// announcement that changes nothing on offer is not passed on: servers announce at start
    /// (server-everything registers tools once initialized), and a change to tools the task does
    /// not offer is none of the client's business.
    pub async fn on_upstream_event(self: &Arc<Self>, event: UpstreamEvent) {
        match event {
            UpstreamEvent::ToolsChanged(name) => {
                let Some(server) = self
                    .snapshot()
                    .and_then(|s| s.config.server(name.as_str()).cloned())
                else {
                    return;
                };
                match self.pool.relist(&server).await {
                    Ok(changed) => {
                        tracing::info!(server = %name, changed, "upstream said its tool list changed");
                        if changed && self.rebuild().await {
                            self.notify(ListKind::Tools).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "could not re-list tools after list_changed")
                    }
                }
            }
            UpstreamEvent::ResourceUpdated(uri) => {
                for peer in self.passthrough.subscribers(&uri) {
                    let params = rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone());
                    let _ = peer.notify_resource_updated(params).await;
                }
                self.sessions.notify_resource_updated(&uri).await;
            }
            UpstreamEvent::PromptsChanged(_) => self.notify(ListKind::Prompts).await,
            UpstreamEvent::ResourcesChanged(_) => self.notify(ListKind::Resources).await,
        }
    }

    /// Refuses new calls and waits (up to `grace`) for the calls in flight to finish; the ones
    /// still running then are answered with `PROXY.SHUTTING_DOWN`.
    pub async fn drain(&self, grace: Duration) {
        self.draining.store(true, Ordering::Release);
        let deadline = tokio::time::Instant::now() + grace;
        if !self.wait_for_calls(deadline).await {
            tracing::warn!(
                calls = self.calls_in_flight.load(Ordering::Acquire),
                "grace period over; calls still in flight are answered with PROXY.SHUTTING_DOWN"
            );
            self.cut_off.cancel();
            // They return at once; a moment for that.
            self.wait_for_calls(tokio::time::Instant::now() + Duration::from_secs(1))
                .await;
        }
    }

    /// Waits until no call is in flight (true) or `deadline` (false). After a wait, gives the
    /// last results a moment to be written to their streams.
    async fn wait_for_calls(&self, deadline: tokio::time::Instant) -> bool {
        let mut waited = false;
        loop {
            let idle = self.idle.notified();
            let n = self.calls_in_flight.load(Ordering::Acquire);
            if n == 0 {
                if waited {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                return true;
            }
            if !waited {
                tracing::info!(calls = n, "waiting for calls in flight");
            }
            waited = true;
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return false;
            }
        }
    }

    /// The relayed rest: prompts, resources, completions, logging level, roots.
    pub fn relay(&self) -> passthrough::Relay<'_> {
        passthrough::Relay {
            pool: &self.pool,
            passthrough: &self.passthrough,
            current: &self.snapshot,
        }
    }

    /// Writes the audit lines still queued (at shutdown).
    pub fn flush_audit(&self) {
        self.audit.flush();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Per server: running state and calls in flight.
    pub fn upstream_states(&self) -> HashMap<ServerName, (&'static str, usize)> {
        self.pool.states()
    }
}

/// Whether clients should re-list: the exposed tools differ, or servers whose list is unknown
/// came or went (their tools appear only once listed).
fn surface_changed(before: &[Router; 2], after: &[Router; 2]) -> bool {
    let missing = |r: &Router| -> Vec<(String, String)> {
        r.missing_lists()
            .iter()
            .map(|s| (s.name.to_string(), s.spec_hash.to_string()))
            .collect()
    };
    before
        .iter()
        .zip(after)
        .any(|(b, a)| b.tools() != a.tools() || missing(b) != missing(a))
}

/// The client's `_meta` as the upstream should see it: trace context and custom keys pass; the
/// lifecycle keys are the proxy's to set (rmcp sets the upstream's own); 2026-07-28 context keys
/// are kept only for upstreams that speak it, so they carry what the client declared.
pub(crate) fn upstream_meta(
    client: &RequestMetaObject,
    modern_upstream: bool,
) -> RequestMetaObject {
    let mut meta = client.clone();
    let map = &mut meta.0.0;
    map.remove("progressToken");
    map.remove("io.modelcontextprotocol/protocolVersion");
    if !modern_upstream {
        map.remove("io.modelcontextprotocol/clientInfo");
        map.remove("io.modelcontextprotocol/clientCapabilities");
        map.remove("io.modelcontextprotocol/logLevel");
    }
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_meta_keeps_trace_context_and_drops_lifecycle_keys() {
        let mut meta = RequestMetaObject::new();
        meta.set_traceparent("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
        meta.set_progress_token(rmcp::model::ProgressToken(
            rmcp::model::NumberOrString::Number(7),
        ));
        meta.set_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28);
        meta.set_client_capabilities(Default::default());
        meta.0.0.insert("vendor/key".into(), serde_json::json!(1));
        let legacy = upstream_meta(&meta, false);
        assert!(legacy.get_traceparent().is_some());
        assert!(legacy.get_progress_token().is_none());
        assert!(legacy.protocol_version().is_none());
        assert!(legacy.client_capabilities().is_none());
        assert_eq!(legacy.0.0.get("vendor/key"), Some(&serde_json::json!(1)));
        let modern = upstream_meta(&meta, true);
        assert!(modern.client_capabilities().is_some());
        assert!(modern.protocol_version().is_none());
    }
}
