//! The model gateway's series (`crate::gateway`). The `model` label is the model the endpoint
//! answered as (never the name the agent sent, which it could vary without end); a request
//! refused before it was forwarded is counted under `model="-"`.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    model: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

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
}

impl ModelMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            seconds: Family::new_with_constructor(Buckets),
            refused: Family::default(),
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
        for limit in ["inputTokens", "outputTokens", "costUsd", "requests"] {
            drop(metrics.refused.get_or_create(&LimitLabels { limit }));
        }
        metrics
    }

    /// One request's end: its outcome, latency and what it used.
    pub fn request(&self, model: &str, outcome: &'static str, seconds: f64, tokens: [u64; 4]) {
        let model = model.to_string();
        self.requests
            .get_or_create(&RequestLabels {
                model: model.clone(),
                outcome,
            })
            .inc();
        self.seconds
            .get_or_create(&ModelLabels {
                model: model.clone(),
            })
            .observe(seconds);
        for (kind, n) in ["input", "output", "cache_creation", "cache_read"]
            .into_iter()
            .zip(tokens)
        {
            if n > 0 {
                self.tokens
                    .get_or_create(&TokenLabels {
                        model: model.clone(),
                        kind,
                    })
                    .inc_by(n);
            }
        }
    }

    pub fn cost(&self, model: &str, usd: f64) {
        self.cost
            .get_or_create(&ModelLabels {
                model: model.to_string(),
            })
            .inc_by(usd);
    }

    /// A request the budget refused (`limit`: the budget's field).
    pub fn refused(&self, limit: &'static str) {
        self.refused.get_or_create(&LimitLabels { limit }).inc();
        self.requests
            .get_or_create(&RequestLabels {
                model: "-".into(),
                outcome: "refused",
            })
            .inc();
    }
}
