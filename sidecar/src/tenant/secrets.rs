//! The values of the task's Secret keys its HTTP servers' headers name (`headersFromSecret`)
//! and its stdio servers' zone keys (`zoneKey`),
//! read through the API with the shared proxy's identity (the task's Role grants `get` on those
//! Secrets by name), each time a config is offered. A Secret that cannot be read is logged
//! (naming it, never a value) and its headers are missing: that server's start then fails,
//! saying which key of which Secret.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::config::{Config, Transport};

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
