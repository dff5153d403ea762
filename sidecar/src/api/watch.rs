//! Follows the task's ConfigMap through the API (list + watch restricted to it by a field
//! selector, as its Role's `resourceNames` require) and offers each new `proxy.yaml` to
//! [`Applier`]; each new `approvals.json` (the operator's verdicts on held calls) goes to
//! `crate::approval`, without any reload. kube's watcher resumes by itself after a lost connection or an API server
//! restart (re-watch, or re-list when the resource version is gone), paced by `super::backoff`;
//! we log the state changes, not every retry.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    runtime::watcher::{self, Event},
};

use orchestrator_crds::approval::VERDICTS_KEY;

use crate::{
    apply::{Applier, Source},
    reload::fingerprint,
};

/// The ConfigMap key holding the proxy config (the mounted file's name).
pub const CONFIG_KEY: &str = "proxy.yaml";

/// Runs until the task is aborted (the watcher stream itself never ends).
pub async fn follow(api: Api<ConfigMap>, origin: String, name: String, applier: Arc<Applier>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = super::backoff::watch(watcher::watcher(api, config).boxed());
    futures::pin_mut!(stream);
    let mut follower = Follower {
        origin,
        applier,
        last: None,
        last_verdicts: None,
        state: State::Starting,
        seen_in_list: false,
    };
    tracing::info!(configmap = %follower.origin, "watching the config through the API");
    while let Some(event) = stream.next().await {
        follower.on(event).await;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Starting,
    Watching,
    Failing,
}

struct Follower {
    origin: String,
    applier: Arc<Applier>,
    /// Fingerprint of the last `proxy.yaml` offered: a re-list after a reconnect re-delivers
    /// the object, which must not count as a change (nor an invalid one as another failure).
    last: Option<Option<[u8; 32]>>,
    /// Fingerprint of the last `approvals.json` handed on (`None`: none yet, or the key is gone).
    last_verdicts: Option<[u8; 32]>,
    state: State,
    seen_in_list: bool,
}

impl Follower {
    async fn on(&mut self, event: Result<Event<ConfigMap>, watcher::Error>) {
        match event {
            Ok(Event::Init) => self.seen_in_list = false,
            Ok(Event::InitApply(cm)) => {
                self.seen_in_list = true;
                self.connected();
                self.offer(cm).await;
            }
            Ok(Event::InitDone) => {
                self.connected();
                if !self.seen_in_list {
                    tracing::warn!(configmap = %self.origin, "the ConfigMap does not exist (yet); watching for it");
                }
            }
            Ok(Event::Apply(cm)) => {
                self.connected();
                self.offer(cm).await;
            }
            Ok(Event::Delete(_)) => {
                tracing::warn!(configmap = %self.origin, "the ConfigMap was deleted; keeping the config served");
            }
            Err(e) => {
                if self.state != State::Failing {
                    // The error names the request and the server's answer, never the token.
                    tracing::warn!(configmap = %self.origin, error = %e, "the ConfigMap watch failed; retrying with backoff (the mounted file still applies changes)");
                } else {
                    tracing::debug!(configmap = %self.origin, error = %e, "the ConfigMap watch failed again");
                }
                self.state = State::Failing;
            }
        }
    }

    fn connected(&mut self) {
        match self.state {
            State::Watching => {}
            State::Starting => {
                tracing::info!(configmap = %self.origin, "the ConfigMap watch is connected")
            }
            State::Failing => {
                tracing::info!(configmap = %self.origin, "the ConfigMap watch resumed")
            }
        }
        self.state = State::Watching;
    }

    async fn offer(&mut self, cm: ConfigMap) {
        let mut data = cm.data.unwrap_or_default();
        let verdicts = data.remove(VERDICTS_KEY);
        let print = verdicts.as_deref().map(|v| fingerprint(v.as_bytes()));
        if print != self.last_verdicts {
            self.last_verdicts = print;
            if let Some(verdicts) = verdicts {
                self.applier
                    .proxy()
                    .approvals
                    .verdicts(&self.origin, verdicts.as_bytes());
            }
        }
        let bytes = data.remove(CONFIG_KEY).map(String::into_bytes);
        let print = Some(bytes.as_deref().map(fingerprint));
        if print == self.last {
            return;
        }
        self.last = print;
        match bytes {
            Some(bytes) => {
                self.applier.offer(Source::Api, &self.origin, &bytes).await;
            }
            None => self.applier.reject(
                Source::Api,
                &self.origin,
                &format!("the ConfigMap has no data key {CONFIG_KEY}"),
            ),
        }
    }
}
