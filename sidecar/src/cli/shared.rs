//! `orchestrator-mcp-proxy shared`: the flags of shared mode (one process serving many tasks,
//! `crate::tenant`), and its start (runtime, logs, [`crate::run::run_shared`]).

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use clap::Args;
use orchestrator_crds::shared::DEFAULT_AUDIENCE;

use super::common::CommonArgs;
use crate::{telemetry, tenant::mode::SharedOptions};

/// Where a pod finds its namespace when `--namespace` and `POD_NAMESPACE` are unset.
const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[derive(Args, Clone, Debug)]
// The common flags' help, worded for many tasks.
#[command(mut_arg("max_sessions", |a| a.help("Initialize-era HTTP sessions open at once, per task")))]
#[command(mut_arg("header_read_timeout_seconds", |a| a.help(
    "Seconds an HTTP request's headers may take to arrive before its connection is closed"
)))]
pub struct SharedArgs {
    /// Listen address of MCP (`/mcp`, with `Authorization: Bearer <token>`), `/healthz` and
    /// `/readyz`.
    #[arg(long, env = "MCP_PROXY_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// The namespace of the tasks' ConfigMaps (the proxy's own; default: POD_NAMESPACE, else the
    /// in-cluster namespace file).
    #[arg(long, env = "POD_NAMESPACE", value_parser = super::nonempty)]
    namespace: Option<String>,
    /// The audience the agents' tokens must be issued for.
    #[arg(long, env = "MCP_PROXY_AUDIENCE", default_value = DEFAULT_AUDIENCE, value_parser = super::nonempty)]
    audience: String,
    /// Accept a task's token only from its pod's IP (the ConfigMap's task-pod-ip). Turn off only
    /// behind something that rewrites source addresses (a mesh that SNATs): a token copied out of
    /// its pod then works from anywhere that reaches the proxy.
    #[arg(long, env = "MCP_PROXY_CHECK_PEER_ADDRESS", default_value_t = true, action = clap::ArgAction::Set)]
    check_peer_address: bool,
    /// Serve `GET /metrics` (every task's, and nothing else) on this address.
    #[arg(long, env = "MCP_PROXY_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// This replica's pod name (the Leases' holder, the Events' reporting instance).
    #[arg(long, env = "POD_NAME", value_parser = super::nonempty)]
    pod_name: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
    /// Also export each audit record as an OTLP log record.
    #[arg(long, env = "MCP_PROXY_AUDIT_OTLP")]
    audit_otlp: bool,
    /// Runtime threads (0: one per CPU). A shared proxy serves many agents at once.
    #[arg(long, default_value_t = 0, env = "MCP_PROXY_THREADS")]
    threads: usize,
}

impl SharedArgs {
    /// The options, with the namespace resolved; `Err` names what is missing.
    pub fn options(&self) -> Result<SharedOptions, String> {
        let namespace = match &self.namespace {
            Some(ns) => ns.clone(),
            None => std::fs::read_to_string(NAMESPACE_FILE)
                .map(|ns| ns.trim().to_string())
                .ok()
                .filter(|ns| !ns.is_empty())
                .ok_or_else(|| {
                    format!("--namespace is required outside a pod (or POD_NAMESPACE; {NAMESPACE_FILE} cannot be read)")
                })?,
        };
        Ok(SharedOptions {
            listen: self.listen,
            namespace,
            audience: self.audience.clone(),
            check_peer: self.check_peer_address,
            pod_name: self.pod_name.clone(),
            kill_grace: Duration::from_secs(5),
            runtime: self.common.settings(self.metrics_listen, self.audit_otlp),
        })
    }

    pub fn run(&self, log_format: telemetry::LogFormat) -> ExitCode {
        let options = match self.options() {
            Ok(options) => options,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if self.threads > 0 {
            builder.worker_threads(self.threads);
        }
        let runtime = match builder.enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: cannot start the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let result = runtime.block_on(async move {
            let telemetry = telemetry::init(log_format);
            let result = crate::run::run_shared(options).await;
            telemetry.shutdown().await;
            result
        });
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Top {
        #[command(flatten)]
        shared: SharedArgs,
    }

    #[test]
    fn the_flags_and_their_defaults_are_the_ones_the_chart_uses() {
        let top =
            Top::try_parse_from(["x", "--namespace", "orch", "--check-peer-address", "false"])
                .expect("the flags parse");
        let o = top.shared.options().expect("options");
        assert_eq!(o.listen, "0.0.0.0:8080".parse().expect("addr"));
        assert_eq!(
            (o.namespace.as_str(), o.audience.as_str()),
            ("orch", DEFAULT_AUDIENCE)
        );
        assert!(!o.check_peer);
        let on = Top::try_parse_from(["x", "--namespace", "orch"]).expect("the flags parse");
        assert!(on.shared.options().expect("options").check_peer);
        assert!(Top::try_parse_from(["x", "--check-peer-address", "maybe"]).is_err());
        assert!(Top::try_parse_from(["x", "--audience", ""]).is_err());
    }
}
