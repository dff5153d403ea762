//! Prometheus metrics of the operator (served at `/metrics`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `ok`, or the error class.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why: `retention` (its time after finishing passed) or `max_finished` (its namespace held
    /// more finished TaskRuns than allowed).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    /// The phase entered: `Pending`, `Running`, `Succeeded`, `Failed`, `Cancelled`.
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    pub namespace: String,
    pub taskrun: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotificationLabels {
    /// `slack` or `cloudevents`.
    pub format: String,
    /// `ok`, or why not: `http_<status>`, `timeout`, `error`, `dropped` (the queue was full).
    pub outcome: String,
}

/// The operator's metrics.
pub struct Metrics {
    pub registry: Registry,
    reconciles: Family<OutcomeLabels, Counter>,
    errors: Family<OutcomeLabels, Counter>,
    duration: Histogram,
    catalog_loads: Family<OutcomeLabels, Counter>,
    taskruns_deleted: Family<ReasonLabels, Counter>,
    phase_transitions: Family<PhaseLabels, Counter>,
    approvals_pending: Family<TaskLabels, Gauge>,
    approval_oldest_pending: Family<TaskLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    approval_notifications: Family<NotificationLabels, Counter>,
}

/// Every error class of `reconcile_errors_total` (`Error::metric_label`) and every reason of
/// `taskruns_deleted_total`: their series exist at 0 from the start, so an alert's `increase()`
/// sees the first error (a series that appears at 1 shows no increase) and a dashboard shows 0.
pub const ERROR_CLASSES: [&str; 7] = [
    "api",
    "client",
    "serialize",
    "invalid_object",
    "lease",
    "telemetry",
    "serve",
];
pub const DELETE_REASONS: [&str; 2] = ["retention", "max_finished"];

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("orchestrator_operator");
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        let errors = Family::<OutcomeLabels, Counter>::default();
        let duration = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        let catalog_loads = Family::<OutcomeLabels, Counter>::default();
        // Always one series: the OperatorAbsent alert fires when no operator exports it.
        registry.register(
            "build",
            "The operator's build (always 1): its version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register(
            "reconciles",
            "TaskRun reconciles by outcome",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed TaskRun reconciles by error class",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time one TaskRun reconcile took",
            duration.clone(),
        );
        registry.register(
            "catalog_loads",
            "Catalog ConfigMap loads by outcome",
            catalog_loads.clone(),
        );
        for outcome in ERROR_CLASSES {
            let labels = OutcomeLabels {
                outcome: outcome.to_string(),
            };
            drop(reconciles.get_or_create(&labels));
            drop(errors.get_or_create(&labels));
        }
        let taskruns_deleted = Family::<ReasonLabels, Counter>::default();
        for reason in DELETE_REASONS {
            drop(taskruns_deleted.get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            }));
        }
        registry.register(
            "taskruns_deleted",
            "Finished TaskRuns the operator deleted, by reason",
            taskruns_deleted.clone(),
        );
        let phase_transitions = Family::<PhaseLabels, Counter>::default();
        registry.register(
            "taskrun_phase_transitions",
            "TaskRuns entering a phase (the status write that changed it), by namespace and phase",
            phase_transitions.clone(),
        );
        let approvals_pending = Family::<TaskLabels, Gauge>::default();
        registry.register(
            "approvals_pending",
            "Calls waiting for a person's decision, per TaskRun (absent when none wait)",
            approvals_pending.clone(),
        );
        let approval_oldest_pending =
            Family::<TaskLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "approval_oldest_pending_timestamp_seconds",
            "Unix time the oldest waiting call of a TaskRun was held (age: time() minus this)",
            approval_oldest_pending.clone(),
        );
        let approval_notifications = Family::<NotificationLabels, Counter>::default();
        registry.register(
            "approval_notifications",
            "Approval webhook deliveries, by body format and outcome",
            approval_notifications.clone(),
        );
        Self {
            registry,
            phase_transitions,
            approvals_pending,
            approval_oldest_pending,
            approval_notifications,
            reconciles,
            errors,
            duration,
            catalog_loads,
            taskruns_deleted,
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, elapsed: Duration, error: Option<&'static str>) {
        self.duration.observe(elapsed.as_secs_f64());
        let outcome = error.unwrap_or("ok").to_string();
        self.reconciles
            .get_or_create(&OutcomeLabels {
                outcome: outcome.clone(),
            })
            .inc();
        if error.is_some() {
            self.errors.get_or_create(&OutcomeLabels { outcome }).inc();
        }
    }

    pub fn catalog_load(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "invalid" }.to_string();
        self.catalog_loads
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn taskrun_deleted(&self, reason: &str) {
        self.taskruns_deleted
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A TaskRun entered `phase` (count each status write that changes the phase once).
    pub fn phase_transition(&self, namespace: &str, phase: &str) {
        self.phase_transitions
            .get_or_create(&PhaseLabels {
                namespace: namespace.to_string(),
                phase: phase.to_string(),
            })
            .inc();
    }

    /// The calls of one TaskRun waiting for a decision: how many, and the Unix time the oldest
    /// was held. `count == 0` removes both series (a TaskRun with none waiting has none).
    pub fn approvals_pending(&self, namespace: &str, taskrun: &str, count: usize, oldest: f64) {
        let labels = TaskLabels {
            namespace: namespace.to_string(),
            taskrun: taskrun.to_string(),
        };
        if count == 0 {
            self.approvals_pending.remove(&labels);
            self.approval_oldest_pending.remove(&labels);
            return;
        }
        self.approvals_pending
            .get_or_create(&labels)
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.approval_oldest_pending
            .get_or_create(&labels)
            .set(oldest);
    }

    /// One approval webhook delivery and how it went.
    pub fn approval_notification(&self, format: &str, outcome: &str) {
        self.approval_notifications
            .get_or_create(&NotificationLabels {
                format: format.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;

    #[test]
    fn the_build_is_one_series_an_absent_alert_can_watch() {
        let text = Metrics::default().encode();
        assert!(
            text.lines().any(|l| l
                == format!(
                    "orchestrator_operator_build_info{{version=\"{}\"}} 1",
                    env!("CARGO_PKG_VERSION")
                )),
            "{text}"
        );
        assert!(
            text.contains("# TYPE orchestrator_operator_build info"),
            "{text}"
        );
    }
}
