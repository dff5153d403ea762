//! Prometheus metrics of the operator (served at `/metrics`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
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

/// The operator's metrics.
pub struct Metrics {
    pub registry: Registry,
    reconciles: Family<OutcomeLabels, Counter>,
    errors: Family<OutcomeLabels, Counter>,
    duration: Histogram,
    catalog_loads: Family<OutcomeLabels, Counter>,
    taskruns_deleted: Family<ReasonLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("orchestrator_operator");
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        let errors = Family::<OutcomeLabels, Counter>::default();
        let duration = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        let catalog_loads = Family::<OutcomeLabels, Counter>::default();
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
        let taskruns_deleted = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "taskruns_deleted",
            "Finished TaskRuns the operator deleted, by reason",
            taskruns_deleted.clone(),
        );
        Self {
            registry,
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

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
