//! Prometheus metrics (`GET /metrics`), typed with label structs. In shared mode one registry
//! serves every task: the per-task gauges (`context_version`, `config_loaded`,
//! `approvals_pending`) carry `namespace` and `taskrun` labels (each task's [`Metrics::for_task`]
//! handle sets its own series, removed with the task); the call and upstream families stay
//! unlabelled by task (cardinality).

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use std::{ops::Deref, sync::Arc};

pub mod model;

use crate::names::ServerName;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    server: String,
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    server: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabels {
    server: String,
    tool: String,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartLabels {
    server: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApprovalLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: &'static str,
}

#[derive(Clone)]
struct LatencyBuckets;

impl MetricConstructor<Histogram> for LatencyBuckets {
    fn new_metric(&self) -> Histogram {
        // 0.1 ms .. ~52 s: the proxy's own cost is sub-millisecond, tools can take long.
        Histogram::new(exponential_buckets(0.0001, 2.0, 20))
    }
}

/// The task of a shared proxy's per-task series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    namespace: String,
    taskrun: String,
}

/// The gauges that describe one task: plain in a sidecar (one task per process), by task in
/// shared mode.
enum PerTask {
    Plain {
        approvals_pending: Gauge,
        context_version: Gauge,
        config_loaded: Gauge,
    },
    ByTask {
        approvals_pending: Family<TaskLabels, Gauge>,
        context_version: Family<TaskLabels, Gauge>,
        config_loaded: Family<TaskLabels, Gauge>,
    },
}

/// The metrics of the process (cheap to clone a handle of: [`Metrics::for_task`]).
pub struct Metrics {
    families: Arc<Families>,
    /// Shared mode: the task this handle's per-task gauges are about.
    task: Option<TaskLabels>,
}

impl Deref for Metrics {
    type Target = Families;

    fn deref(&self) -> &Families {
        &self.families
    }
}

pub struct Families {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    call_seconds: Family<LatencyLabels, Histogram, LatencyBuckets>,
    starts: Family<StartLabels, Counter>,
    restarts: Family<ServerLabels, Counter>,
    start_failures: Family<ServerLabels, Counter>,
    exits: Family<ServerLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    list_changed: Family<KindLabels, Counter>,
    definition_changes: Family<ChangeLabels, Counter>,
    approvals: Family<ApprovalLabels, Counter>,
    /// The memory budget's pools: their bounds, and what they hold (read at each scrape).
    memory_limit: Family<PoolLabels, Gauge>,
    memory_in_use: Family<PoolLabels, Gauge>,
    per_task: PerTask,
    audit_otlp_dropped: Counter,
    /// The model gateway's series.
    pub model: model::ModelMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Every `outcome` of `mcp_proxy_approvals_total`: each series exists at 0 from the start, so an
/// alert's `increase()` sees the first one (a series that appears at 1 shows no increase) and a
/// dashboard shows 0 rather than no data.
pub const APPROVAL_OUTCOMES: [&str; 8] = [
    "approved",
    "rejected",
    "expired",
    "withdrawn",
    "mismatch",
    "busy",
    "unavailable",
    "too_large",
];

impl Metrics {
    /// A sidecar's metrics (one task: the per-task gauges without labels).
    pub fn new() -> Self {
        Self::build(false)
    }

    /// A shared proxy's metrics: the per-task gauges by `namespace` and `taskrun`.
    pub fn shared() -> Self {
        Self::build(true)
    }

    /// A handle whose per-task gauges are the series of task `namespace/taskrun` (in a
    /// sidecar's metrics, the same plain gauges).
    pub fn for_task(&self, namespace: &str, taskrun: &str) -> Self {
        Self {
            families: self.families.clone(),
            task: Some(TaskLabels {
                namespace: namespace.to_string(),
                taskrun: taskrun.to_string(),
            }),
        }
    }

    /// The task the model series of this handle carry: its own in shared mode, none in a
    /// sidecar (one task per process).
    pub fn model_task(&self) -> model::SeriesTask {
        match &self.per_task {
            PerTask::ByTask { .. } => model::SeriesTask(self.task.clone()),
            PerTask::Plain { .. } => model::SeriesTask::default(),
        }
    }

    /// Removes this task's per-task series (its task is no longer served).
    pub fn forget_task(&self) {
        if let (PerTask::ByTask { .. }, Some(task)) = (&self.per_task, &self.task) {
            self.model.forget(task);
        }
        if let (
            PerTask::ByTask {
                approvals_pending,
                context_version,
                config_loaded,
            },
            Some(task),
        ) = (&self.per_task, &self.task)
        {
            for family in [approvals_pending, context_version, config_loaded] {
                family.remove(task);
            }
        }
    }

    /// One per-task gauge: `plain` in a sidecar, this task's series in shared mode (none for
    /// a handle without a task).
    fn per_task(&self, pick: impl Fn(&PerTask) -> Either<'_>, value: i64) {
        match (pick(&self.per_task), &self.task) {
            (Either::Plain(gauge), _) => {
                gauge.set(value);
            }
            (Either::ByTask(family), Some(task)) => {
                family.get_or_create(task).set(value);
            }
            (Either::ByTask(_), None) => {}
        }
    }

    fn build(by_task: bool) -> Self {
        let mut registry = Registry::with_prefix("mcp_proxy");
        let calls = Family::<CallLabels, Counter>::default();
        let call_seconds = Family::new_with_constructor(LatencyBuckets);
        let starts = Family::<StartLabels, Counter>::default();
        let restarts = Family::<ServerLabels, Counter>::default();
        let start_failures = Family::<ServerLabels, Counter>::default();
        let exits = Family::<ServerLabels, Counter>::default();
        let reloads = Family::<ReloadLabels, Counter>::default();
        let list_changed = Family::<KindLabels, Counter>::default();
        let definition_changes = Family::<ChangeLabels, Counter>::default();
        let approvals = Family::<ApprovalLabels, Counter>::default();
        for outcome in APPROVAL_OUTCOMES {
            drop(approvals.get_or_create(&ApprovalLabels { outcome }));
        }
        let audit_otlp_dropped = Counter::default();
        let memory_limit = Family::<PoolLabels, Gauge>::default();
        let memory_in_use = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "memory_budget_bytes",
            "The memory budget's bound on each pool (bodies: large request bodies at once, parsed; tool_lists: one server's list; validators: schemas compiled)",
            memory_limit.clone(),
        );
        registry.register(
            "memory_in_use_bytes",
            "What each pool of the memory budget holds now (tool_lists: every list held)",
            memory_in_use.clone(),
        );
        registry.register(
            "build",
            "The proxy's build (always 1): its version",
            prometheus_client::metrics::info::Info::new(vec![(
                "version",
                env!("CARGO_PKG_VERSION"),
            )]),
        );
        registry.register(
            "tool_calls",
            "tools/call requests by server, tool and outcome (ok, tool_error, protocol_error, denied, rate_limited, invalid_arguments)",
            calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "tools/call latency as seen by the proxy, by server and outcome",
            call_seconds.clone(),
        );
        registry.register(
            "upstream_starts",
            "Upstream server starts, by reason",
            starts.clone(),
        );
        registry.register(
            "upstream_restarts",
            "Upstream starts after a crash or failure",
            restarts.clone(),
        );
        registry.register(
            "upstream_start_failures",
            "Upstream starts that failed",
            start_failures.clone(),
        );
        registry.register(
            "upstream_exits",
            "Upstream servers that went away unexpectedly",
            exits.clone(),
        );
        registry.register(
            "config_reloads",
            "Configs offered by a source (file, api), by result: ok (served), failed (invalid, the last good one stays), stale (its contextVersion is not above the one served)",
            reloads.clone(),
        );
        registry.register(
            "list_changed_notifications",
            "list_changed notifications sent to clients",
            list_changed.clone(),
        );
        registry.register(
            "tool_definition_changes",
            "Tool definitions that differ from their pin or the first seen, by action (block: hidden and refused, alert: still offered)",
            definition_changes.clone(),
        );
        registry.register(
            "approvals",
            "Calls that policy.requireApproval held (or could not hold), by outcome: approved, rejected, expired, withdrawn (cancelled by the client or shutdown), mismatch (decided under another digest: not made), busy (too many waiting), unavailable (no Lease to ask on), too_large (too large to show)",
            approvals.clone(),
        );
        const PENDING: &str = "Calls waiting for a person's decision now";
        const VERSION: &str = "contextVersion of the config in use";
        const LOADED: &str = "1 when a valid config is loaded";
        let per_task = if by_task {
            let per_task = PerTask::ByTask {
                approvals_pending: Default::default(),
                context_version: Default::default(),
                config_loaded: Default::default(),
            };
            if let PerTask::ByTask {
                approvals_pending,
                context_version,
                config_loaded,
            } = &per_task
            {
                registry.register("approvals_pending", PENDING, approvals_pending.clone());
                registry.register("context_version", VERSION, context_version.clone());
                registry.register("config_loaded", LOADED, config_loaded.clone());
            }
            per_task
        } else {
            let (approvals_pending, context_version, config_loaded) =
                (Gauge::default(), Gauge::default(), Gauge::default());
            registry.register("approvals_pending", PENDING, approvals_pending.clone());
            registry.register("context_version", VERSION, context_version.clone());
            registry.register("config_loaded", LOADED, config_loaded.clone());
            PerTask::Plain {
                approvals_pending,
                context_version,
                config_loaded,
            }
        };
        registry.register(
            "audit_otlp_dropped",
            "Audit records not exported over OTLP (--audit-otlp) because the queue to the collector was full; the stdout/file line is still written",
            audit_otlp_dropped.clone(),
        );
        let model = model::ModelMetrics::register(&mut registry);
        let families = Families {
            model,
            registry,
            calls,
            call_seconds,
            starts,
            restarts,
            start_failures,
            exits,
            reloads,
            list_changed,
            definition_changes,
            approvals,
            memory_limit,
            memory_in_use,
            per_task,
            audit_otlp_dropped,
        };
        Self {
            families: Arc::new(families),
            task: None,
        }
    }

    /// An audit record the OTLP export had no room for.
    pub fn audit_otlp_dropped(&self) {
        self.audit_otlp_dropped.inc();
    }

    pub fn call(&self, server: &str, tool: &str, outcome: &'static str, seconds: f64) {
        self.calls
            .get_or_create(&CallLabels {
                server: server.to_string(),
                tool: tool.to_string(),
                outcome,
            })
            .inc();
        self.call_seconds
            .get_or_create(&LatencyLabels {
                server: server.to_string(),
                outcome,
            })
            .observe(seconds);
    }

    pub fn definition_changed(&self, server: &ServerName, tool: &str, action: &'static str) {
        self.definition_changes
            .get_or_create(&ChangeLabels {
                server: server.to_string(),
                tool: tool.to_string(),
                action,
            })
            .inc();
    }

    /// A call held for approval (or refused a hold) ended with `outcome`.
    pub fn approval(&self, outcome: &'static str) {
        self.approvals
            .get_or_create(&ApprovalLabels { outcome })
            .inc();
    }

    /// How many calls wait for a decision now.
    pub fn approvals_pending(&self, count: usize) {
        self.per_task(
            |p| match p {
                PerTask::Plain {
                    approvals_pending, ..
                } => Either::Plain(approvals_pending),
                PerTask::ByTask {
                    approvals_pending, ..
                } => Either::ByTask(approvals_pending),
            },
            i64::try_from(count).unwrap_or(i64::MAX),
        );
    }

    pub fn upstream_started(&self, server: &ServerName, reason: &'static str, restart: bool) {
        self.starts
            .get_or_create(&StartLabels {
                server: server.to_string(),
                reason,
            })
            .inc();
        if restart {
            self.restarts
                .get_or_create(&ServerLabels {
                    server: server.to_string(),
                })
                .inc();
        }
    }

    /// The servers of a config about to be served: their restart, start-failure and exit
    /// counters exist at 0 from now on (see [`APPROVAL_OUTCOMES`] for why). A server removed
    /// later keeps its series (bounded by the servers a task was ever given).
    pub fn servers<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            let labels = ServerLabels {
                server: name.to_string(),
            };
            drop(self.restarts.get_or_create(&labels));
            drop(self.start_failures.get_or_create(&labels));
            drop(self.exits.get_or_create(&labels));
        }
    }

    pub fn upstream_start_failed(&self, server: &ServerName) {
        self.start_failures
            .get_or_create(&ServerLabels {
                server: server.to_string(),
            })
            .inc();
    }

    pub fn upstream_exited(&self, server: &ServerName) {
        self.exits
            .get_or_create(&ServerLabels {
                server: server.to_string(),
            })
            .inc();
    }

    /// A config offered by `source` (`file`, `api`): `result` is `ok`, `failed` or `stale`.
    pub fn reload(&self, source: &'static str, result: &'static str) {
        self.reloads
            .get_or_create(&ReloadLabels { result, source })
            .inc();
    }

    pub fn list_changed_sent(&self, kind: &'static str, count: usize) {
        self.list_changed
            .get_or_create(&KindLabels { kind })
            .inc_by(count as u64);
    }

    pub fn config_in_use(&self, version: u64) {
        self.per_task(
            |p| match p {
                PerTask::Plain {
                    context_version, ..
                } => Either::Plain(context_version),
                PerTask::ByTask {
                    context_version, ..
                } => Either::ByTask(context_version),
            },
            i64::try_from(version).unwrap_or(i64::MAX),
        );
        self.per_task(
            |p| match p {
                PerTask::Plain { config_loaded, .. } => Either::Plain(config_loaded),
                PerTask::ByTask { config_loaded, .. } => Either::ByTask(config_loaded),
            },
            1,
        );
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        for pool in crate::memory::Pool::ALL {
            let labels = PoolLabels { pool: pool.label() };
            let bytes = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.memory_limit
                .get_or_create(&labels)
                .set(bytes(pool.limit()));
            self.memory_in_use
                .get_or_create(&labels)
                .set(bytes(pool.in_use()));
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// One per-task gauge as [`PerTask`] holds it.
enum Either<'a> {
    Plain(&'a Gauge),
    ByTask(&'a Family<TaskLabels, Gauge>),
}

#[cfg(test)]
mod tests;
