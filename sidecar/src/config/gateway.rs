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

    /// Input, output and cached input per million tokens in millionths of a USD (`1_250_000`:
    /// $1.25), for the APIs that charge nothing more to write the cache (OpenAI, Gemini).
    const fn micro_usd(input: u64, output: u64, cache_read: u64) -> Self {
        Self {
            input: input * 1000,
            output: output * 1000,
            cache_write: input * 1000,
            cache_read: cache_read * 1000,
        }
    }
}

/// The built-in prices (USD per million tokens, input / output), most specific glob first.
/// They are the providers' list prices as published when they were written (Anthropic's, then
/// OpenAI's and Google's; Gemini's for prompts up to 200k tokens), which a platform overrides or
/// extends with `prices` (its own contract, a newer model). `claude-opus-5*`: what Claude Code's
/// own cost table charges for it, the model it asks for by default. Last in each provider's
/// part, each family's dearest price for a version not listed yet, so that a cost budget never
/// undercounts a newer model (Claude Code asked for `claude-opus-5-5` before this table knew
/// it, and every request of a task with a cost budget was refused).
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
    // OpenAI: input, output, cached input.
    (
        "gpt-5*-pro*",
        PriceNanos::micro_usd(21_000_000, 168_000_000, 21_000_000),
    ),
    (
        "gpt-5*-nano*",
        PriceNanos::micro_usd(50_000, 400_000, 5_000),
    ),
    (
        "gpt-5*-mini*",
        PriceNanos::micro_usd(250_000, 2_000_000, 25_000),
    ),
    (
        "gpt-5.2*",
        PriceNanos::micro_usd(1_750_000, 14_000_000, 175_000),
    ),
    (
        "gpt-5.1*",
        PriceNanos::micro_usd(1_250_000, 10_000_000, 125_000),
    ),
    (
        "gpt-5",
        PriceNanos::micro_usd(1_250_000, 10_000_000, 125_000),
    ),
    (
        "gpt-5-*",
        PriceNanos::micro_usd(1_250_000, 10_000_000, 125_000),
    ),
    (
        "gpt-4.1-nano*",
        PriceNanos::micro_usd(100_000, 400_000, 25_000),
    ),
    (
        "gpt-4.1-mini*",
        PriceNanos::micro_usd(400_000, 1_600_000, 100_000),
    ),
    (
        "gpt-4.1*",
        PriceNanos::micro_usd(2_000_000, 8_000_000, 500_000),
    ),
    (
        "gpt-4o-mini*",
        PriceNanos::micro_usd(150_000, 600_000, 75_000),
    ),
    (
        "gpt-4o*",
        PriceNanos::micro_usd(2_500_000, 10_000_000, 1_250_000),
    ),
    (
        "o4-mini*",
        PriceNanos::micro_usd(1_100_000, 4_400_000, 275_000),
    ),
    (
        "o3-pro*",
        PriceNanos::micro_usd(20_000_000, 80_000_000, 20_000_000),
    ),
    (
        "o3-mini*",
        PriceNanos::micro_usd(1_100_000, 4_400_000, 550_000),
    ),
    ("o3*", PriceNanos::micro_usd(2_000_000, 8_000_000, 500_000)),
    (
        "codex-mini*",
        PriceNanos::micro_usd(1_500_000, 6_000_000, 375_000),
    ),
    (
        "gpt-5*",
        PriceNanos::micro_usd(1_750_000, 14_000_000, 175_000),
    ),
    // Gemini: input, output, cached input.
    (
        "gemini-3*-pro*",
        PriceNanos::micro_usd(2_000_000, 12_000_000, 200_000),
    ),
    // Not listed yet: Gemini 3 Flash's price, the dearer one (never an undercount).
    (
        "gemini-3*-flash-lite*",
        PriceNanos::micro_usd(500_000, 3_000_000, 50_000),
    ),
    (
        "gemini-3*-flash*",
        PriceNanos::micro_usd(500_000, 3_000_000, 50_000),
    ),
    (
        "gemini-2.5-pro*",
        PriceNanos::micro_usd(1_250_000, 10_000_000, 125_000),
    ),
    (
        "gemini-2.5-flash-lite*",
        PriceNanos::micro_usd(100_000, 400_000, 10_000),
    ),
    (
        "gemini-2.5-flash*",
        PriceNanos::micro_usd(300_000, 2_500_000, 30_000),
    ),
    (
        "gemini-2.0-flash-lite*",
        PriceNanos::micro_usd(75_000, 300_000, 18_750),
    ),
    (
        "gemini-2.0-flash*",
        PriceNanos::micro_usd(100_000, 400_000, 25_000),
    ),
    (
        "gemini-*pro*",
        PriceNanos::micro_usd(2_000_000, 12_000_000, 200_000),
    ),
    (
        "gemini-*flash-lite*",
        PriceNanos::micro_usd(100_000, 400_000, 10_000),
    ),
    (
        "gemini-*flash*",
        PriceNanos::micro_usd(500_000, 3_000_000, 50_000),
    ),
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
        } else if let Some(version) = api_version(&endpoint) {
            problems.push(Problem::new(
                Code::BadUrl,
                "gateway.endpoint",
                format!(
                    "{:?} ends in the API version /{version}: give the base URL without it \
                     (the gateway appends {})",
                    wire.endpoint,
                    paths_of(wire.provider)
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
            if wire.provider == Provider::Gemini && pattern.contains('/') {
                problems.push(Problem::new(
                    Code::BadPattern,
                    format!("gateway.models[{i}]"),
                    format!(
                        "{pattern:?} has a '/': the Gemini API names a model by one path \
                         segment (\"gemini-2.5-pro\", not \"models/gemini-2.5-pro\"), which \
                         the globs match"
                    ),
                ));
                continue;
            }
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

/// The API version an endpoint ends in (`v1`, `v1beta`): the gateway appends the version of
/// the paths it forwards itself.
fn api_version(endpoint: &str) -> Option<&str> {
    let last = endpoint.rsplit('/').next()?;
    let rest = last.strip_prefix('v')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let suffix = &rest[digits..];
    (digits > 0 && (suffix.is_empty() || suffix.starts_with("beta") || suffix.starts_with("alpha")))
        .then_some(last)
}

/// The paths the gateway forwards for `provider`, for a message.
fn paths_of(provider: Provider) -> &'static str {
    match provider {
        Provider::Anthropic => "/v1/messages",
        Provider::OpenAi => "/v1/responses and /v1/models",
        Provider::Gemini => "/v1beta/models/{model}:...",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn normalize(json: serde_json::Value) -> (Option<GatewayConfig>, Vec<Problem>) {
        let wire: GatewaySpec = serde_json::from_value(json).expect("a gateway");
        let mut problems = Vec::new();
        (GatewayConfig::normalize(&wire, &mut problems), problems)
    }

    fn fields(problems: &[Problem]) -> Vec<String> {
        problems.iter().map(|p| p.path.clone()).collect()
    }

    #[test]
    fn the_provider_chooses_the_api_and_a_bad_combination_names_the_field_and_the_fix() {
        for (provider, endpoint) in [
            ("openai", "https://api.openai.com"),
            ("gemini", "https://generativelanguage.googleapis.com/"),
            ("anthropic", "https://llm.example.com/anthropic"),
        ] {
            let (config, problems) = normalize(
                serde_json::json!({"provider": provider, "endpoint": endpoint, "keyFile": "/k"}),
            );
            let config = config.unwrap_or_else(|| panic!("{provider}: {problems:?}"));
            assert_eq!(config.provider.as_str(), provider);
            assert!(!config.endpoint.ends_with('/'));
        }
        // The version belongs to the paths the gateway appends, not to the endpoint.
        for (provider, endpoint, version) in [
            ("openai", "https://api.openai.com/v1", "/v1"),
            (
                "gemini",
                "https://generativelanguage.googleapis.com/v1beta/",
                "/v1beta",
            ),
            ("anthropic", "https://api.anthropic.com/v1", "/v1"),
        ] {
            let (config, problems) = normalize(
                serde_json::json!({"provider": provider, "endpoint": endpoint, "keyFile": "/k"}),
            );
            assert!(config.is_none(), "{endpoint}");
            assert_eq!(fields(&problems), ["gateway.endpoint"]);
            let message = &problems[0].message;
            assert!(
                message.contains(version) && message.contains("without it"),
                "{message}"
            );
        }
        // A Gemini model is one path segment: a glob with a '/' would never match.
        let (config, problems) = normalize(serde_json::json!({
            "provider": "gemini", "endpoint": "https://g.example", "keyFile": "/k",
            "models": ["models/gemini-*", "gemini-2.5-*"]
        }));
        assert!(config.is_none());
        assert_eq!(fields(&problems), ["gateway.models[0]"]);
        assert!(
            problems[0].message.contains("path"),
            "{}",
            problems[0].message
        );
        // An unknown provider is the schema's to refuse.
        let azure =
            serde_json::json!({"provider": "azure", "endpoint": "https://a", "keyFile": "/k"});
        assert!(serde_json::from_value::<GatewaySpec>(azure).is_err());
    }

    #[test]
    fn openai_and_gemini_models_have_list_prices_and_a_newer_one_its_familys_dearest() {
        let (config, problems) =
            normalize(serde_json::json!({"endpoint": "https://e.example", "keyFile": "/k"}));
        let config = config.unwrap_or_else(|| panic!("{problems:?}"));
        let price = |model: &str| {
            config
                .price(model)
                .map(|p| (p.input, p.output, p.cache_read))
                .unwrap_or_else(|| panic!("{model} has no price"))
        };
        let usd = |n: f64| (n * 1e9).round() as u64;
        assert_eq!(price("gpt-5"), (usd(1.25), usd(10.0), usd(0.125)));
        assert_eq!(
            price("gpt-5-2025-08-07"),
            (usd(1.25), usd(10.0), usd(0.125))
        );
        assert_eq!(price("gpt-5-codex"), price("gpt-5"));
        assert_eq!(price("gpt-5-mini"), (usd(0.25), usd(2.0), usd(0.025)));
        assert_eq!(price("gpt-5.1-codex-mini"), price("gpt-5-mini"));
        assert_eq!(price("gpt-5-nano"), (usd(0.05), usd(0.4), usd(0.005)));
        assert_eq!(price("gpt-5.2"), (usd(1.75), usd(14.0), usd(0.175)));
        assert_eq!(price("gpt-5-pro"), (usd(21.0), usd(168.0), usd(21.0)));
        // A version not listed yet: the family's dearest.
        assert_eq!(price("gpt-5.5"), price("gpt-5.2"));
        assert_eq!(price("gemini-2.5-pro"), (usd(1.25), usd(10.0), usd(0.125)));
        assert_eq!(price("gemini-2.5-flash"), (usd(0.3), usd(2.5), usd(0.03)));
        assert_eq!(
            price("gemini-2.5-flash-lite"),
            (usd(0.1), usd(0.4), usd(0.01))
        );
        assert_eq!(
            price("gemini-3-pro-preview"),
            (usd(2.0), usd(12.0), usd(0.2))
        );
        assert_eq!(
            price("gemini-3.1-pro-preview"),
            price("gemini-3-pro-preview")
        );
        assert_eq!(
            price("gemini-3.5-flash-lite"),
            price("gemini-3-flash-preview")
        );
        // OpenAI and Gemini charge nothing more for writing the cache.
        let gpt = config.price("gpt-5").expect("priced");
        assert_eq!(gpt.cache_write, gpt.input);
        assert!(config.price("llama-3.1-70b").is_none());
    }
}
