//! The model gateway's series (`crate::gateway`). The `model` label is the model the endpoint
//! answered as (never the name the agent sent, which it could vary without end); a request
//! refused before it was forwarded is counted under `model="-"`. In shared mode each series
//! also has the task's `namespace` and `taskrun` (what each task spent is the point of them),
//! removed with the task; a sidecar serves one task and has neither.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Mutex, atomic::AtomicU64},
};

use prometheus_client::{
    encoding::{EncodeLabelSet, LabelSetEncoder},
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// The task of a series: in shared mode its `namespace` and `taskrun`, in a sidecar nothing.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct SeriesTask(pub(super) Option<super::TaskLabels>);

impl EncodeLabelSet for SeriesTask {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        match &self.0 {
            Some(task) => task.encode(encoder),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    #[prometheus(flatten)]
    task: SeriesTask,
    model: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    #[prometheus(flatten)]
    task: SeriesTask,
    model: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    #[prometheus(flatten)]
    task: SeriesTask,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    #[prometheus(flatten)]
    task: SeriesTask,
    limit: &'static str,
}

const OUTCOMES: [&str; 4] = ["ok", "api_error", "refused", "failed"];
const KINDS: [&str; 4] = ["input", "output", "cache_creation", "cache_read"];
const LIMITS: [&str; 5] = [
    "inputTokens",
    "outputTokens",
    "costUsd",
    "requests",
    "wallTimeSeconds",
];

#[derive(Clone)]
struct Buckets;

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        // 1 ms .. ~9 min: a model request takes seconds to minutes.
        Histogram::new(exponential_buckets(0.001, 2.0, 20))
    }
}

pub struct ModelMetrics {
    requests: Family<RequestLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    cost: Family<ModelLabels, Counter<f64, AtomicU64>>,
    seconds: Family<ModelLabels, Histogram, Buckets>,
    refused: Family<LimitLabels, Counter>,
    /// Shared mode: the models each task's series name, to remove them with the task.
    models: Mutex<HashMap<super::TaskLabels, BTreeSet<String>>>,
}

impl ModelMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            seconds: Family::new_with_constructor(Buckets),
            refused: Family::default(),
            models: Mutex::default(),
        };
        registry.register(
            "model_requests",
            "Model API requests through the gateway, by model and outcome (ok, api_error: the endpoint's error status, refused: not forwarded, failed: the endpoint unreachable or the stream cut)",
            metrics.requests.clone(),
        );
        registry.register(
            "model_tokens",
            "Tokens the endpoint counted, by model and kind (input, output, cache_creation, cache_read)",
            metrics.tokens.clone(),
        );
        registry.register(
            "model_cost_usd",
            "What the requests cost by the gateway's price table, by model",
            metrics.cost.clone(),
        );
        registry.register(
            "model_request_duration_seconds",
            "Model request latency through the gateway (to the response's last byte), by model",
            metrics.seconds.clone(),
        );
        registry.register(
            "model_budget_refusals",
            "Model requests refused by the task's budget, by the limit they would pass",
            metrics.refused.clone(),
        );
        metrics.budget_series(&SeriesTask::default());
        metrics
    }

    /// Each limit's refusal series at 0 (an alert's `increase()` sees the first refusal).
    fn budget_series(&self, task: &SeriesTask) {
        for limit in LIMITS {
            drop(self.refused.get_or_create(&LimitLabels {
                task: task.clone(),
                limit,
            }));
        }
    }

    /// A task's series name `model` (shared mode: kept, to remove them with the task).
    fn named(&self, task: &SeriesTask, model: &str) {
        if let Some(t) = &task.0 {
            let mut models = crate::sync::lock(&self.models);
            let first = !models.contains_key(t);
            models
                .entry(t.clone())
                .or_default()
                .insert(model.to_string());
            drop(models);
            if first {
                self.budget_series(task);
            }
        }
    }

    /// One request's end: its outcome, latency and what it used.
    pub fn request(
        &self,
        task: &SeriesTask,
        model: &str,
        outcome: &'static str,
        seconds: f64,
        tokens: [u64; 4],
    ) {
        self.named(task, model);
        let model = model.to_string();
        self.requests
            .get_or_create(&RequestLabels {
                task: task.clone(),
                model: model.clone(),
                outcome,
            })
            .inc();
        self.seconds
            .get_or_create(&ModelLabels {
                task: task.clone(),
                model: model.clone(),
            })
            .observe(seconds);
        for (kind, n) in KINDS.into_iter().zip(tokens) {
            if n > 0 {
                self.tokens
                    .get_or_create(&TokenLabels {
                        task: task.clone(),
                        model: model.clone(),
                        kind,
                    })
                    .inc_by(n);
            }
        }
    }

    pub fn cost(&self, task: &SeriesTask, model: &str, usd: f64) {
        self.named(task, model);
        self.cost
            .get_or_create(&ModelLabels {
                task: task.clone(),
                model: model.to_string(),
            })
            .inc_by(usd);
    }

    /// A request the budget refused (`limit`: the budget's field).
    pub fn refused(&self, task: &SeriesTask, limit: &'static str) {
        self.named(task, "-");
        self.refused
            .get_or_create(&LimitLabels {
                task: task.clone(),
                limit,
            })
            .inc();
        self.requests
            .get_or_create(&RequestLabels {
                task: task.clone(),
                model: "-".into(),
                outcome: "refused",
            })
            .inc();
    }

    /// Removes every series of `task` (shared mode: it is no longer served).
    pub(super) fn forget(&self, task: &super::TaskLabels) {
        let models = crate::sync::lock(&self.models).remove(task);
        let at = SeriesTask(Some(task.clone()));
        for limit in LIMITS {
            self.refused.remove(&LimitLabels {
                task: at.clone(),
                limit,
            });
        }
        for model in models.into_iter().flatten() {
            for outcome in OUTCOMES {
                self.requests.remove(&RequestLabels {
                    task: at.clone(),
                    model: model.clone(),
                    outcome,
                });
            }
            for kind in KINDS {
                self.tokens.remove(&TokenLabels {
                    task: at.clone(),
                    model: model.clone(),
                    kind,
                });
            }
            let labels = ModelLabels {
                task: at.clone(),
                model,
            };
            self.cost.remove(&labels);
            self.seconds.remove(&labels);
        }
    }
}
