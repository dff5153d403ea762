//! The values of the task's Secret keys its HTTP servers' headers name (`headersFromSecret`)
//! and its stdio servers' zone keys (`zoneKey`),
//! read through the API with the shared proxy's identity (the task's Role grants `get` on those
//! Secrets by name), each time a config is offered. A Secret that cannot be read is logged
//! (naming it, never a value) and its headers are missing: that server's start then fails,
//! saying which key of which Secret.
//!
//! And [`ModelKeys`]: the model gateway's key (`gateway.keySecret`) and CAs
//! (`gateway.caConfigMap`) of the task, read through the API the same way, kept a short while.
//!
//! And [`MaskValues`]: the values of every Secret key of the task (the operator lists them in
//! the task's ConfigMap, `mask-keys.json`; the headers' keys besides), read each time a call is
//! held, which the proxy masks in what it shows an approver, as a sidecar does with the files
//! of its mask volume.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use orchestrator_crds::approval::MaskKey;
use orchestrator_crds::gateway::ObjectKey;

use crate::approval::{SecretValues, mask::Values};
use crate::config::{Config, Transport};
use crate::sync::lock;

/// The task's Secret keys whose values its held calls show masked (shared mode).
pub struct MaskValues {
    api: Api<Secret>,
    /// What the operator lists (`mask-keys.json`), and what the config's headers name.
    keys: Mutex<(Vec<MaskKey>, Vec<MaskKey>)>,
}

impl MaskValues {
    /// For the task whose Secrets `api` reads (its namespace).
    pub fn new(api: Api<Secret>) -> Self {
        Self {
            api,
            keys: Mutex::default(),
        }
    }

    /// The keys the operator lists in the task's ConfigMap.
    pub fn listed(&self, keys: Vec<MaskKey>) {
        lock(&self.keys).0 = keys;
    }

    /// The keys the enabled HTTP servers' headers of `config` name.
    pub fn named_in(&self, config: &Config) {
        lock(&self.keys).1 = config
            .servers
            .iter()
            .filter(|s| s.enabled)
            .flat_map(|s| match &s.transport {
                Transport::Http(h) => h.headers_from_secret.values().collect::<Vec<_>>(),
                Transport::Stdio(_) => Vec::new(),
            })
            .map(|at| MaskKey {
                secret: at.name.clone(),
                key: at.key.clone(),
            })
            .collect();
    }

    fn keys(&self) -> BTreeSet<MaskKey> {
        let keys = lock(&self.keys);
        keys.0.iter().chain(&keys.1).cloned().collect()
    }
}

impl SecretValues for MaskValues {
    /// Each key's value as the API has it now. A Secret or key that does not exist has no value
    /// to mask (it cannot be in the task's pod either); one that cannot be read holds nothing:
    /// the error names it.
    fn read(&self) -> BoxFuture<'_, Result<Values, String>> {
        Box::pin(async move {
            let keys = self.keys();
            let names: BTreeSet<&String> = keys.iter().map(|k| &k.secret).collect();
            let mut values = Vec::new();
            for name in names {
                let secret = match self.api.get_opt(name).await {
                    Ok(Some(secret)) => secret,
                    Ok(None) => continue,
                    Err(e) => {
                        return Err(format!(
                            "cannot read the task's Secret {name} (its values are masked in what a person is shown): {e}"
                        ));
                    }
                };
                let data = secret.data.unwrap_or_default();
                for k in keys.iter().filter(|k| &k.secret == name) {
                    if let Some(value) = data
                        .get(&k.key)
                        .and_then(|v| String::from_utf8(v.0.clone()).ok())
                    {
                        values.push((k.secret.clone(), k.key.clone(), value));
                    }
                }
            }
            Ok(values)
        })
    }
}

/// How long a value read for the model gateway is used before it is read again (a rotated key
/// applies within this; a model request does not wait for the API server each time).
pub const MODEL_KEYS_FRESH: Duration = Duration::from_secs(30);

/// The task's model key and CAs, read through the API in its namespace and kept
/// [`MODEL_KEYS_FRESH`] (shared mode's [`crate::gateway::Reader`]).
pub struct ModelKeys {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    kept: Mutex<HashMap<Kept, (Instant, Vec<u8>)>>,
}

/// A value kept: whether it is a Secret's (else a ConfigMap's), and its name and key.
type Kept = (bool, ObjectKey);

impl ModelKeys {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client, namespace),
            kept: Mutex::default(),
        }
    }

    /// The key `at` of the object `what` names (kept a while): read with `api`, its value
    /// taken out by `value`; `secret` tells the kept Secrets' values from the ConfigMaps'.
    async fn read<K>(
        &self,
        api: &Api<K>,
        secret: bool,
        what: &str,
        at: &ObjectKey,
        value: impl FnOnce(K) -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>, String>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let id = (secret, at.clone());
        if let Some((_, value)) = lock(&self.kept)
            .get(&id)
            .filter(|(read, _)| read.elapsed() < MODEL_KEYS_FRESH)
        {
            return Ok(value.clone());
        }
        let object = api
            .get_opt(&at.name)
            .await
            .map_err(|e| format!("cannot read the task's {what} {}: {e}", at.name))?
            .ok_or_else(|| format!("the task's {what} {} does not exist", at.name))?;
        let value = value(object)
            .ok_or_else(|| format!("the task's {what} {} has no key {}", at.name, at.key))?;
        let mut kept = lock(&self.kept);
        kept.retain(|_, (read, _)| read.elapsed() < MODEL_KEYS_FRESH);
        kept.insert(id, (Instant::now(), value.clone()));
        Ok(value)
    }
}

impl crate::gateway::Reader for ModelKeys {
    fn secret<'a>(&'a self, at: &'a ObjectKey) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(
            self.read(&self.secrets, true, "model Secret", at, |s: Secret| {
                s.data.and_then(|mut d| d.remove(&at.key)).map(|v| v.0)
            }),
        )
    }

    fn config_map<'a>(&'a self, at: &'a ObjectKey) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(self.read(
            &self.config_maps,
            false,
            "CA ConfigMap",
            at,
            |c: ConfigMap| {
                c.data
                    .and_then(|mut d| d.remove(&at.key))
                    .map(String::into_bytes)
            },
        ))
    }
}

/// Every `(secret, key) -> value` the enabled servers of `config` name (HTTP headers, zone keys).
pub async fn read(api: &Api<Secret>, config: &Config) -> HashMap<(String, String), String> {
    let wanted: BTreeSet<(String, String)> = config
        .servers
        .iter()
        .filter(|s| s.enabled)
        .flat_map(|s| match &s.transport {
            Transport::Http(h) => h.headers_from_secret.values().collect::<Vec<_>>(),
            Transport::Stdio(s) => s.zone_key.iter().collect(),
        })
        .map(|at| (at.name.clone(), at.key.clone()))
        .collect();
    let names: BTreeSet<&String> = wanted.iter().map(|(name, _)| name).collect();
    let mut values = HashMap::new();
    for name in names {
        let secret = match api.get(name).await {
            Ok(secret) => secret,
            Err(e) => {
                tracing::warn!(secret = %name, error = %e, "cannot read the task's Secret (HTTP headers, zone keys); servers that need it will not start");
                continue;
            }
        };
        let data = secret.data.unwrap_or_default();
        for (_, key) in wanted.iter().filter(|(n, _)| n == name) {
            match data
                .get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
            {
                Some(value) => {
                    values.insert((name.clone(), key.clone()), value);
                }
                None => {
                    tracing::warn!(secret = %name, key = %key, "the task's Secret has no such key (or it is not text); servers that need it will not start")
                }
            }
        }
    }
    values
}
