//! `gateway`: the model API the proxy serves the agent, normalized (the endpoint checked, the
//! model globs compiled, prices and the cost limit parsed to nano-dollars).

use std::path::PathBuf;

use globset::{Glob, GlobMatcher};
use orchestrator_crds::gateway::{GatewaySpec, ObjectKey, Price, Provider, parse_usd_nanos};

use super::problem::{Code, Problem};

/// A model's price: nano-dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriceNanos {
    pub input: u64,
    pub output: u64,
    pub cache_write: u64,
    pub cache_read: u64,
}

impl PriceNanos {
    /// Input and output per million tokens in USD; the cache prices by the providers' rule.
    const fn usd(input_cents: u64, output_cents: u64) -> Self {
        let (input, output) = (input_cents * 10_000_000, output_cents * 10_000_000);
        Self {
            input,
            output,
            cache_write: input * 5 / 4,
            cache_read: input / 10,
        }
    }
}

/// The built-in prices (USD per million tokens, input / output), most specific glob first:
/// what Anthropic lists for its models (`claude-opus-5*`: what Claude Code's own cost table
/// charges for it, the model it asks for by default). Last, each family's dearest price for a
/// version not listed yet, so that a cost budget never undercounts a newer model (Claude Code
/// asked for `claude-opus-5-5` before this table knew it, and every request of a task with a
/// cost budget was refused). A platform overrides or extends them with `prices`.
pub const BUILT_IN_PRICES: &[(&str, PriceNanos)] = &[
    ("claude-opus-5*", PriceNanos::usd(400, 2000)),
    ("claude-opus-4-5*", PriceNanos::usd(500, 2500)),
    ("claude-opus-4*", PriceNanos::usd(1500, 7500)),
    ("claude-3-opus*", PriceNanos::usd(1500, 7500)),
    ("claude-sonnet-4*", PriceNanos::usd(300, 1500)),
    ("claude-3-7-sonnet*", PriceNanos::usd(300, 1500)),
    ("claude-3-5-sonnet*", PriceNanos::usd(300, 1500)),
    ("claude-haiku-4*", PriceNanos::usd(100, 500)),
    ("claude-3-5-haiku*", PriceNanos::usd(80, 400)),
    ("claude-3-haiku*", PriceNanos::usd(25, 125)),
    ("claude-*opus*", PriceNanos::usd(1500, 7500)),
    ("claude-*sonnet*", PriceNanos::usd(300, 1500)),
    ("claude-*haiku*", PriceNanos::usd(100, 500)),
];

/// The limits of `gateway.budget` (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cost_nanos: Option<u64>,
    pub requests: Option<u64>,
    pub wall_time_seconds: Option<u64>,
}

/// Where the API key is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `keyFile`: a file the proxy reads at each request.
    File(PathBuf),
    /// `keySecret`: a Secret key of the task's namespace, read through the API (shared mode).
    Secret(ObjectKey),
}

/// Where the CAs trusted for the endpoint besides the system's are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// `caFile`.
    File(PathBuf),
    /// `caConfigMap`: a ConfigMap key of the task's namespace, read through the API.
    ConfigMap(ObjectKey),
}

/// A validated `gateway`.
#[derive(Debug)]
pub struct GatewayConfig {
    pub provider: Provider,
    /// Without a trailing `/`; paths are appended to it.
    pub endpoint: String,
    pub key: KeySource,
    pub ca: Option<CaSource>,
    /// Empty: any model.
    pub models: Vec<GlobMatcher>,
    pub limits: Limits,
    /// `prices` first (in name order), then [`BUILT_IN_PRICES`].
    prices: Vec<(GlobMatcher, PriceNanos)>,
}

impl GatewayConfig {
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m.is_match(model))
    }

    /// The price of `model`, if the table has one.
    pub fn price(&self, model: &str) -> Option<PriceNanos> {
        self.prices
            .iter()
            .find(|(glob, _)| glob.is_match(model))
            .map(|(_, p)| *p)
    }

    /// Checks `wire`, adding what is wrong to `problems` (paths under `gateway.`).
    pub(super) fn normalize(wire: &GatewaySpec, problems: &mut Vec<Problem>) -> Option<Self> {
        let before = problems.len();
        let endpoint = wire.endpoint.trim_end_matches('/').to_string();
        let uri = endpoint.parse::<http::Uri>().ok();
        let loopback = |host: &str| {
            host == "localhost"
                || host
                    .trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        };
        let sound = uri.as_ref().is_some_and(|u| {
            u.query().is_none()
                && match (u.scheme_str(), u.host()) {
                    (Some("https"), Some(_)) => true,
                    (Some("http"), Some(host)) => loopback(host),
                    _ => false,
                }
        });
        if !sound {
            problems.push(Problem::new(
                Code::BadUrl,
                "gateway.endpoint",
                format!(
                    "{:?} is not the model API's base URL: https://host[:port][/path] \
                     (http:// only to a loopback address), no query",
                    wire.endpoint
                ),
            ));
        }
        let named = |k: &ObjectKey| !k.name.trim().is_empty() && !k.key.trim().is_empty();
        let key = match (wire.key_file.trim(), &wire.key_secret) {
            ("", Some(secret)) if named(secret) => Some(KeySource::Secret(secret.clone())),
            ("", Some(_)) => {
                problems.push(Problem::new(
                    Code::BadValue,
                    "gateway.keySecret",
                    "name both the Secret (name) and its key (key)",
                ));
                None
            }
            ("", None) => {
                problems.push(Problem::new(
                    Code::BadPath,
                    "gateway.keyFile",
                    "empty: name the file holding the API key (the proxy's mount of the model \
                     Secret), or gateway.keySecret",
                ));
                None
            }
            (_, Some(_)) => {
                problems.push(Problem::new(
                    Code::BadValue,
                    "gateway.keySecret",
                    "gateway.keyFile and gateway.keySecret both name the key: keep one",
                ));
                None
            }
            (file, None) => Some(KeySource::File(PathBuf::from(file))),
        };
        let ca = match (wire.ca_file.as_deref().map(str::trim), &wire.ca_config_map) {
            (Some(""), _) => {
                problems.push(Problem::new(
                    Code::BadPath,
                    "gateway.caFile",
                    "empty path; leave it out to trust the system's CAs only",
                ));
                None
            }
            (Some(_), Some(_)) => {
                problems.push(Problem::new(
                    Code::BadValue,
                    "gateway.caConfigMap",
                    "gateway.caFile and gateway.caConfigMap both name the CAs: keep one",
                ));
                None
            }
            (Some(file), None) => Some(CaSource::File(PathBuf::from(file))),
            (None, Some(cm)) if named(cm) => Some(CaSource::ConfigMap(cm.clone())),
            (None, Some(_)) => {
                problems.push(Problem::new(
                    Code::BadValue,
                    "gateway.caConfigMap",
                    "name both the ConfigMap (name) and its key (key)",
                ));
                None
            }
            (None, None) => None,
        };
        let mut models = Vec::new();
        for (i, pattern) in wire.models.iter().enumerate() {
            match Glob::new(pattern) {
                Ok(glob) if !pattern.trim().is_empty() => models.push(glob.compile_matcher()),
                Ok(_) => problems.push(Problem::new(
                    Code::BadPattern,
                    format!("gateway.models[{i}]"),
                    "empty pattern",
                )),
                Err(e) => problems.push(Problem::new(
                    Code::BadPattern,
                    format!("gateway.models[{i}]"),
                    format!("{pattern:?} is not a glob: {e}"),
                )),
            }
        }
        let cost_nanos = wire.budget.cost_usd.as_deref().and_then(|usd| {
            let nanos = parse_usd_nanos(usd);
            if nanos.is_none() {
                problems.push(Problem::new(
                    Code::BadValue,
                    "gateway.budget.costUsd",
                    format!("{usd:?} is not an amount of USD like \"2.50\""),
                ));
            }
            nanos
        });
        let mut prices = Vec::new();
        for (pattern, price) in &wire.prices {
            let at = format!("gateway.prices[{pattern:?}]");
            let glob = Glob::new(pattern).map(|g| g.compile_matcher());
            if let Err(e) = &glob {
                problems.push(Problem::new(
                    Code::BadPattern,
                    at.clone(),
                    format!("{pattern:?} is not a glob: {e}"),
                ));
            }
            if let (Ok(glob), Some(price)) = (glob, price_nanos(price, &at, problems)) {
                prices.push((glob, price));
            }
        }
        for (pattern, price) in BUILT_IN_PRICES {
            if let Ok(glob) = Glob::new(pattern) {
                prices.push((glob.compile_matcher(), *price));
            }
        }
        let key = key?;
        (problems.len() == before).then_some(Self {
            provider: wire.provider,
            endpoint,
            key,
            ca,
            models,
            limits: Limits {
                input_tokens: wire.budget.input_tokens,
                output_tokens: wire.budget.output_tokens,
                cost_nanos,
                requests: wire.budget.requests,
                wall_time_seconds: wire.budget.wall_time_seconds,
            },
            prices,
        })
    }
}

fn price_nanos(price: &Price, at: &str, problems: &mut Vec<Problem>) -> Option<PriceNanos> {
    let mut field = |name: &str, text: &str| {
        let nanos = parse_usd_nanos(text);
        if nanos.is_none() {
            problems.push(Problem::new(
                Code::BadValue,
                format!("{at}.{name}"),
                format!("{text:?} is not a price in USD per million tokens like \"3\" or \"0.30\""),
            ));
        }
        nanos
    };
    let input = field("input", &price.input);
    let output = field("output", &price.output);
    let cache_write = price.cache_write.as_deref().map(|t| field("cacheWrite", t));
    let cache_read = price.cache_read.as_deref().map(|t| field("cacheRead", t));
    let (input, output) = (input?, output?);
    Some(PriceNanos {
        input,
        output,
        cache_write: cache_write.unwrap_or(Some(input.saturating_mul(5) / 4))?,
        cache_read: cache_read.unwrap_or(Some(input / 10))?,
    })
}
