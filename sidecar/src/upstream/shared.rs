//! What all upstreams share: the capabilities each server spec offered when it last ran (in
//! memory and in the cache directory), the logging level clients asked for, and the task's
//! baseline of tool definitions.
// Logging is deprecated by SEP-2577 but still part of the legacy protocol versions relayed.
#![allow(deprecated)]

use std::{collections::HashMap, sync::Mutex};

use rmcp::model::{LoggingLevel, ServerCapabilities};

use super::cache;
use crate::{config::SpecHash, policy::definitions::Baseline, sync::lock};

/// What all upstreams share: capabilities seen per server spec (in memory and in the cache
/// directory) and the logging level clients asked for.
#[derive(Default)]
pub struct Shared {
    cache: Option<cache::DiskCache>,
    capabilities: Mutex<HashMap<SpecHash, ServerCapabilities>>,
    log_level: Mutex<Option<LoggingLevel>>,
    baseline: Baseline,
    secrets: SecretValues,
    zone_host: Mutex<Option<std::net::IpAddr>>,
}

/// The values of the task's Secret keys its HTTP servers' headers name (`headersFromSecret`),
/// as last read through the API (shared mode); never logged.
#[derive(Default)]
pub struct SecretValues(Mutex<HashMap<(String, String), String>>);

impl SecretValues {
    /// The value of `key` in Secret `secret`, when read.
    pub fn get(&self, secret: &str, key: &str) -> Option<String> {
        lock(&self.0)
            .get(&(secret.to_string(), key.to_string()))
            .cloned()
    }

    /// Replaces every value with `values`.
    pub fn replace(&self, values: HashMap<(String, String), String>) {
        *lock(&self.0) = values;
    }
}

impl Shared {
    pub fn new(cache: Option<cache::DiskCache>) -> Self {
        Self {
            cache,
            ..Default::default()
        }
    }

    /// The Secret values for `headersFromSecret` and the zones' keys (`zoneKey`).
    pub fn secrets(&self) -> &SecretValues {
        &self.secrets
    }

    /// Shared mode: the task pod's IP (its ConfigMap's `TASK_POD_IP_ANNOTATION`), where its
    /// zones listen (`zonePort`); none until the operator has bound the pod.
    pub fn zone_host(&self) -> Option<std::net::IpAddr> {
        *lock(&self.zone_host)
    }

    pub fn set_zone_host(&self, ip: Option<std::net::IpAddr>) {
        *lock(&self.zone_host) = ip;
    }

    pub fn cache(&self) -> Option<&cache::DiskCache> {
        self.cache.as_ref()
    }

    /// The first-seen tool definitions of the task's servers (restored from, and recorded to,
    /// the task's Lease when the proxy has API access).
    pub fn baseline(&self) -> &Baseline {
        &self.baseline
    }

    /// What a server (by spec) offered when it last ran, if known.
    pub fn capabilities(&self, hash: &SpecHash) -> Option<ServerCapabilities> {
        let mut caps = lock(&self.capabilities);
        if let Some(c) = caps.get(hash) {
            return Some(c.clone());
        }
        let loaded = self.cache.as_ref()?.load_capabilities(hash)?;
        caps.insert(hash.clone(), loaded.clone());
        Some(loaded)
    }

    pub(super) fn record_capabilities(&self, hash: &SpecHash, capabilities: &ServerCapabilities) {
        let mut caps = lock(&self.capabilities);
        if caps.get(hash) != Some(capabilities) {
            caps.insert(hash.clone(), capabilities.clone());
            if let Some(cache) = &self.cache {
                cache.store_capabilities(hash, capabilities);
            }
        }
    }

    pub fn set_log_level(&self, level: LoggingLevel) {
        *lock(&self.log_level) = Some(level);
    }

    pub(super) fn log_level(&self) -> Option<LoggingLevel> {
        *lock(&self.log_level)
    }
}
