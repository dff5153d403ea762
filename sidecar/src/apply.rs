//! The one decision about which config is served, shared by every source of config (the mounted
//! file, the ConfigMap watched through the API): parse and validate the bytes, refuse an invalid
//! config (the last good one stays), and with two sources serve only a config whose
//! `contextVersion` is above the one served, so the slower source never takes the proxy back.
//! Publishes the version served, for the report to the API (`api::lease`).

use std::sync::Arc;

use tokio::sync::{Mutex, watch};

use crate::{
    config::{self, Loaded},
    proxy::Proxy,
};

/// Where a config came from (the `source` label of `mcp_proxy_config_reloads_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The mounted config file.
    File,
    /// The task's ConfigMap, watched through the Kubernetes API.
    Api,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Api => "api",
        }
    }
}

/// What became of an offered config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It is served now.
    Applied,
    /// Valid, but its `contextVersion` is not above the one served: ignored.
    Stale,
    /// Invalid: the last good config stays.
    Invalid,
}

/// Decides, for both sources, whether an offered config is served.
pub struct Applier {
    proxy: Arc<Proxy>,
    /// With two sources, only a higher `contextVersion` is applied (never backwards; equal is a
    /// no-op). With the file alone, every valid change applies, as it always has.
    monotonic: bool,
    /// One decision at a time, held until the config is served, so two sources cannot race.
    turn: Mutex<()>,
    served: watch::Sender<Option<u64>>,
}

impl Applier {
    pub fn new(proxy: Arc<Proxy>, monotonic: bool) -> Arc<Self> {
        Arc::new(Self {
            proxy,
            monotonic,
            turn: Mutex::new(()),
            served: watch::Sender::new(None),
        })
    }

    /// The `contextVersion` being served (`None` until a valid config is); only the latest
    /// value is kept.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    pub fn served(&self) -> watch::Receiver<Option<u64>> {
        self.served.subscribe()
    }

    /// The config at start (from the file): every problem is logged; not counted as a reload
    /// unless it is invalid.
    pub async fn initial(&self, origin: &str, loaded: Loaded) -> Outcome {
        for p in &loaded.problems.0 {
            if p.is_error() {
                tracing::error!(code = %p.code, path = %p.path, "{}", p.message);
            } else {
                tracing::warn!(code = %p.code, path = %p.path, "{}", p.message);
            }
        }
        match loaded.config {
            Some(config) => {
                let _turn = self.turn.lock().await;
                let version = config.context_version;
                self.proxy.apply_config(config).await;
                self.served.send_replace(Some(version));
                Outcome::Applied
            }
            None => {
                self.proxy.metrics.reload(Source::File.label(), "failed");
                tracing::error!(
                    source = origin,
                    "no valid config; not ready until the file is fixed"
                );
                Outcome::Invalid
            }
        }
    }

    /// A changed config from `source` (`origin` names it in logs: the file, the ConfigMap).
    pub async fn offer(&self, source: Source, origin: &str, bytes: &[u8]) -> Outcome {
        let loaded = config::load_bytes(bytes);
        for p in loaded.problems.warnings() {
            tracing::warn!(code = %p.code, path = %p.path, "{}", p.message);
        }
        let Some(config) = loaded.config else {
            for p in loaded.problems.errors() {
                tracing::error!(code = %p.code, path = %p.path, "{}", p.message);
            }
            self.reject(
                source,
                origin,
                &format!("{} errors", loaded.problems.errors().count()),
            );
            return Outcome::Invalid;
        };
        let _turn = self.turn.lock().await;
        let before = self.proxy.snapshot();
        let version = config.context_version;
        if self.monotonic
            && let Some(served) = before.as_ref().map(|b| b.config.context_version)
            && version <= served
        {
            self.proxy.metrics.reload(source.label(), "stale");
            tracing::info!(
                source = source.label(),
                origin,
                context_version = version,
                served,
                "config not newer than the one served; ignored"
            );
            return Outcome::Stale;
        }
        self.proxy.metrics.reload(source.label(), "ok");
        if let Some(old) = &before
            && old.config.listen != config.listen
        {
            tracing::warn!(old = %old.config.listen, new = %config.listen, "listen changed; it takes effect only after a restart");
        }
        tracing::info!(
            source = source.label(),
            origin,
            context_version = version,
            "config changed; applying it"
        );
        self.proxy.apply_config(config).await;
        self.served.send_replace(Some(version));
        Outcome::Applied
    }

    /// A change from `source` that carries no usable config (`why`): counted as a failed reload,
    /// the last good config stays.
    pub fn reject(&self, source: Source, origin: &str, why: &str) {
        self.proxy.metrics.reload(source.label(), "failed");
        tracing::error!(
            source = source.label(),
            origin,
            "config change rejected: {why}; keeping the last good config"
        );
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::{
        audit::Audit,
        metrics::Metrics,
        upstream::{Deps, Shared, pool::Pool},
    };

    fn proxy() -> Arc<Proxy> {
        let metrics = Arc::new(Metrics::new());
        let deps = Deps {
            shared: Arc::new(Shared::new(None)),
            events: mpsc::unbounded_channel().0,
            metrics: metrics.clone(),
            start_timeout: std::time::Duration::from_secs(1),
            kill_grace: std::time::Duration::from_secs(1),
            guard: None,
            pod_name: None,
        };
        Proxy::new(Pool::new(deps), metrics, Audit::start())
    }

    fn at(version: u64) -> Vec<u8> {
        format!("contextVersion: {version}\ntask: {{name: t, namespace: n}}\nservers:\n  - name: a\n    stdio: {{command: x}}\n").into_bytes()
    }

    fn served(applier: &Applier) -> Option<u64> {
        *applier.served().borrow()
    }

    #[tokio::test]
    async fn with_two_sources_only_a_higher_context_version_is_served() {
        let applier = Applier::new(proxy(), true);
        let first = config::load_bytes(&at(1));
        assert_eq!(applier.initial("file", first).await, Outcome::Applied);
        assert_eq!(served(&applier), Some(1));
        assert_eq!(
            applier.offer(Source::Api, "cm", &at(3)).await,
            Outcome::Applied
        );
        // The file catching up late, with a lower or the same version, changes nothing.
        assert_eq!(
            applier.offer(Source::File, "f", &at(2)).await,
            Outcome::Stale
        );
        assert_eq!(
            applier.offer(Source::File, "f", &at(3)).await,
            Outcome::Stale
        );
        assert_eq!(
            applier.offer(Source::Api, "cm", b"contextVersion: [").await,
            Outcome::Invalid
        );
        assert_eq!(served(&applier), Some(3));
        assert_eq!(
            applier.offer(Source::File, "f", &at(4)).await,
            Outcome::Applied
        );
        assert_eq!(served(&applier), Some(4));
        let text = applier.proxy.metrics.encode();
        for needle in [
            r#"mcp_proxy_config_reloads_total{result="ok",source="api"} 1"#,
            r#"mcp_proxy_config_reloads_total{result="ok",source="file"} 1"#,
            r#"mcp_proxy_config_reloads_total{result="stale",source="file"} 2"#,
            r#"mcp_proxy_config_reloads_total{result="failed",source="api"} 1"#,
            "mcp_proxy_context_version 4",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }

    #[tokio::test]
    async fn with_the_file_alone_every_valid_change_is_served_as_before() {
        let applier = Applier::new(proxy(), false);
        assert_eq!(
            applier.initial("file", config::load_bytes(&at(5))).await,
            Outcome::Applied
        );
        assert_eq!(
            applier.offer(Source::File, "f", &at(5)).await,
            Outcome::Applied
        );
        assert_eq!(
            applier.offer(Source::File, "f", &at(2)).await,
            Outcome::Applied
        );
        assert_eq!(served(&applier), Some(2));
    }

    #[tokio::test]
    async fn an_invalid_config_at_start_serves_nothing_until_a_valid_one_comes() {
        let applier = Applier::new(proxy(), true);
        assert_eq!(
            applier
                .initial("file", config::load_bytes(b"contextVersion: ["))
                .await,
            Outcome::Invalid
        );
        assert_eq!(served(&applier), None);
        assert_eq!(
            applier.offer(Source::Api, "cm", &at(1)).await,
            Outcome::Applied
        );
        assert_eq!(served(&applier), Some(1));
    }
}
