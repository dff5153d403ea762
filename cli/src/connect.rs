//! Connecting to the cluster the way kubectl does: `--kubeconfig`, else `$KUBECONFIG` (a list of
//! files, merged), else `~/.kube/config`, else the pod's service account; `--context` picks the
//! context; the namespace is `-n`, else the context's, else `default`; `--as`/`--as-group`
//! impersonate.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::args::Global;
use crate::error::{Error, Result};

/// A client and the namespace commands work in.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    pub namespace: String,
}

/// Builds the client from the global flags.
pub async fn connect(global: &Global) -> Result<Cluster> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                Error::Config(format!(
                    "reading kubeconfig {}: {}",
                    path.display(),
                    chain(&e)
                ))
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| {
                    Error::Config(format!("kubeconfig {}: {}", path.display(), chain(&e)))
                })?
        }
        None => match Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(kubeconfig_err) => {
                // No kubeconfig at all: inside a pod the service account still works (unless a
                // context was asked for, which only a kubeconfig can provide).
                let in_cluster = (global.context.is_none())
                    .then(Config::incluster)
                    .and_then(|r| r.ok());
                match in_cluster {
                    Some(config) => config,
                    None => {
                        return Err(Error::Config(format!(
                            "no usable kubeconfig ({}); pass --kubeconfig FILE or set $KUBECONFIG",
                            chain(&kubeconfig_err)
                        )));
                    }
                }
            }
        },
    };
    let mut config = config;
    if let Some(user) = &global.as_user {
        config.auth_info.impersonate = Some(user.clone());
        if !global.as_group.is_empty() {
            config.auth_info.impersonate_groups = Some(global.as_group.clone());
        }
    }
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config)
        .map_err(|e| Error::Config(format!("building the API client: {}", chain(&e))))?;
    Ok(Cluster { client, namespace })
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
