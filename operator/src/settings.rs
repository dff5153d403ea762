//! The operator's settings, from flags or env (the Helm chart passes them as env).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use orchestrator_crds::catalog::{DEFAULT_CONFIG_MAP_NAME, DEFAULT_CONFIG_MAP_NAMESPACE};
use orchestrator_crds::shared::{DEFAULT_AUDIENCE, ProxyMode};

use crate::namespaces::Watched;
use crate::render::{DEFAULT_SIDECAR_PORT, RenderSettings, SharedProxy};

/// Kubernetes operator for orchestrator TaskRuns: renders each TaskRun into a ConfigMap and a Job
/// whose pod runs the agent with the MCP proxy as a native sidecar.
#[derive(Parser, Clone, Debug)]
#[command(name = "orchestrator-operator", version)]
pub struct Settings {
    /// Only reconcile TaskRuns in these namespaces (comma-separated, or the flag repeated): one
    /// watch per namespace, so the operator needs permissions there only. All namespaces when
    /// unset or empty.
    #[arg(long = "namespace", env = "ORCH_WATCH_NAMESPACE", value_delimiter = ',',
          value_parser = namespace_name)]
    pub namespaces: Vec<String>,
    /// Namespace of the catalog ConfigMap.
    #[arg(
        long,
        env = "ORCH_CATALOG_NAMESPACE",
        default_value = DEFAULT_CONFIG_MAP_NAMESPACE
    )]
    pub catalog_namespace: String,
    /// Name of the catalog ConfigMap (key `catalog.yaml`).
    #[arg(
        long,
        env = "ORCH_CATALOG_NAME",
        default_value = DEFAULT_CONFIG_MAP_NAME
    )]
    pub catalog_name: String,
    /// Image of the MCP proxy sidecar put into every task pod.
    #[arg(
        long,
        env = "ORCH_SIDECAR_IMAGE",
        default_value = "orchestrator-mcp-proxy:latest"
    )]
    pub sidecar_image: String,
    /// Loopback port the sidecar serves MCP on in every task pod (change it if the agent image
    /// needs 8080 for itself).
    #[arg(long, env = "ORCH_SIDECAR_PORT", default_value_t = DEFAULT_SIDECAR_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_port: u16,
    /// Agent image for TaskRuns that name none: Claude Code's (runtime claude-code, and a
    /// custom command's).
    #[arg(long, env = "ORCH_AGENT_IMAGE", default_value = "claude-code:latest")]
    pub agent_image: String,
    /// Agent image for TaskRuns with runtime codex that name none (`codex` on its PATH).
    #[arg(
        long,
        env = "ORCH_AGENT_IMAGE_CODEX",
        default_value = "orchestrator-agent-codex:latest"
    )]
    pub agent_image_codex: String,
    /// Agent image for TaskRuns with runtime gemini-cli that name none (`gemini` on its PATH).
    #[arg(
        long,
        env = "ORCH_AGENT_IMAGE_GEMINI_CLI",
        default_value = "orchestrator-agent-gemini-cli:latest"
    )]
    pub agent_image_gemini_cli: String,
    /// Agent image for TaskRuns with runtime opencode that name none (`opencode` on its PATH).
    #[arg(
        long,
        env = "ORCH_AGENT_IMAGE_OPENCODE",
        default_value = "orchestrator-agent-opencode:latest"
    )]
    pub agent_image_opencode: String,
    /// OTLP (gRPC) endpoint for the operator's traces; off when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// OTLP endpoint given to every sidecar; defaults to --otlp-endpoint.
    #[arg(long, env = "ORCH_SIDECAR_OTLP_ENDPOINT")]
    pub sidecar_otlp_endpoint: Option<String>,
    /// Where every task pod's proxy also sends its audit records as OTLP log records (its
    /// `--audit-otlp`, to this OTEL_EXPORTER_OTLP_LOGS_ENDPOINT); unset or empty: the audit
    /// stays on the proxy's stdout only.
    #[arg(long, env = "ORCH_SIDECAR_AUDIT_OTLP_ENDPOINT")]
    pub sidecar_audit_otlp_endpoint: Option<String>,
    /// Let each task pod's proxy watch its ConfigMap through the API server (a token of the
    /// task's own identity, mounted into the proxy container only) and report the version it
    /// serves (`status.servedContextVersion`, condition `ToolsSynced`). Off: the proxy reads the
    /// mounted file only, no token is mounted, and nothing reports what is served.
    #[arg(long, env = "ORCH_SIDECAR_API_WATCH", default_value_t = true, action = clap::ArgAction::Set)]
    pub sidecar_api_watch: bool,
    /// HOST:PORT of the API server as task pods reach it, when the cluster's `kubernetes`
    /// Service does not work from pods (no kube-proxy): set as KUBERNETES_SERVICE_HOST/PORT on
    /// the proxy container. Default: the values the kubelet injects.
    #[arg(long, env = "ORCH_SIDECAR_KUBERNETES_SERVICE")]
    pub sidecar_kubernetes_service: Option<String>,
    /// Port of each task pod's proxy metrics listener on the pod's IP (only `/metrics`; the MCP
    /// listener stays on loopback), named `metrics` on the proxy container for a PodMonitor.
    /// Off when unset.
    #[arg(long, env = "ORCH_SIDECAR_METRICS_PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_metrics_port: Option<u16>,
    /// The default model credential: a TaskRun without `spec.model` (and without a model key in
    /// its agent's env) uses this Secret of its own namespace (`NAME/KEY`), read by its proxy
    /// only. Unset: no default (such a task's agent has no model key).
    #[arg(long, env = "ORCH_MODEL_SECRET", value_parser = orchestrator_crds::taskrun::KeyRef::parse_slash)]
    pub model_secret: Option<orchestrator_crds::taskrun::KeyRef>,
    /// The default credential's endpoint (with `--model-secret`).
    #[arg(long, env = "ORCH_MODEL_ENDPOINT")]
    pub model_endpoint: Option<String>,
    /// The default credential's endpoint CAs (with `--model-secret`): a ConfigMap key of each
    /// task's namespace (`NAME/KEY`) holding PEM certificates, trusted besides the system's.
    #[arg(long, env = "ORCH_MODEL_CA_CONFIGMAP", value_parser = orchestrator_crds::taskrun::KeyRef::parse_slash)]
    pub model_ca_config_map: Option<orchestrator_crds::taskrun::KeyRef>,
    /// A policy service every task's proxy asks about each call (Open Policy Agent's data API,
    /// e.g. `http://opa.policy.svc:8181/v1/data/orchestrator/decision`), before a TaskRun's own
    /// `toolConfig.policy.decisionPoint`: only an explicit allow lets a call go. Unset: none.
    #[arg(long, env = "ORCH_DECISION_POINT_URL", value_parser = decision_point_url)]
    pub decision_point_url: Option<String>,
    /// How long the proxies wait for its decision (10..=5000 ms); then the call is refused.
    #[arg(long, env = "ORCH_DECISION_POINT_TIMEOUT_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(10..=5000))]
    pub decision_point_timeout_ms: u32,
    /// Where a TaskRun's MCP proxy runs when neither its `spec.proxy.mode` nor the label
    /// `orchestrator.io/proxy-mode` on its Namespace says: `sidecar` (one proxy in each task
    /// pod) or `shared` (the chart's shared proxy Deployment, `--shared-proxy-url`).
    #[arg(long, env = "ORCH_DEFAULT_PROXY_MODE", default_value = "sidecar",
          value_parser = proxy_mode)]
    pub default_proxy_mode: ProxyMode,
    /// The shared proxy's MCP URL as task pods reach it (its Service:
    /// `http://<service>.<namespace>.svc:8080/mcp`). Unset: shared mode is off, and a TaskRun in
    /// shared mode is refused (`SharedProxyUnavailable`).
    #[arg(
        long,
        env = "ORCH_SHARED_PROXY_URL",
        requires = "shared_proxy_service_account"
    )]
    pub shared_proxy_url: Option<String>,
    /// The shared proxy's namespace, where the operator writes each shared task's ConfigMap
    /// (`task.<namespace>.<taskrun>`). Default: `--lease-namespace` (the release namespace).
    #[arg(long, env = "ORCH_SHARED_PROXY_NAMESPACE", value_parser = namespace_name)]
    pub shared_proxy_namespace: Option<String>,
    /// The shared proxy's ServiceAccount (in `--shared-proxy-namespace`): each shared task's Role
    /// is bound to it (`<taskrun>-shared-proxy`), and only it may write a shared task's Lease.
    #[arg(long, env = "ORCH_SHARED_PROXY_SERVICE_ACCOUNT")]
    pub shared_proxy_service_account: Option<String>,
    /// The audience of the token each shared task's agent presents to the shared proxy (not
    /// one the API server accepts).
    #[arg(long, env = "ORCH_SHARED_PROXY_AUDIENCE", default_value = DEFAULT_AUDIENCE)]
    pub shared_proxy_audience: String,
    /// URL the operator POSTs to when a call starts waiting for approval (a Slack incoming
    /// webhook, or any receiver of CloudEvents). A secret: give it through the environment from a
    /// Secret; it is never logged. Off when unset.
    #[arg(long, env = "ORCH_APPROVAL_WEBHOOK_URL", hide_env_values = true)]
    pub approval_webhook_url: Option<String>,
    /// The body the approval webhook gets: `slack` (`{"text": ...}`, Slack-compatible) or
    /// `cloudevents` (a CloudEvents 1.0 structured-mode JSON event).
    #[arg(long, env = "ORCH_APPROVAL_WEBHOOK_FORMAT", value_enum, default_value_t = WebhookFormat::Slack)]
    pub approval_webhook_format: WebhookFormat,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "ORCH_BIND", default_value = "127.0.0.1:8081")]
    pub bind: SocketAddr,
    /// Elect a leader through a Lease so several replicas are safe.
    #[arg(long, env = "ORCH_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "ORCH_LEASE_NAME", default_value = "orchestrator-operator")]
    pub lease_name: String,
    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        env = "ORCH_LEASE_NAMESPACE",
        default_value = "orchestrator-system"
    )]
    pub lease_namespace: String,
    /// This replica's identity in the Lease (the pod name in a cluster); hostname-pid if unset.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Seconds a leader's Lease stays valid without renewal.
    #[arg(long, env = "ORCH_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// TaskRuns reconciled at the same time.
    #[arg(long, env = "ORCH_CONCURRENCY", default_value_t = 32)]
    pub concurrency: u16,
    /// Seconds after a task finished when the operator deletes its TaskRun (its ConfigMap and Job
    /// go with it), for TaskRuns without `spec.retentionSecondsAfterFinished`. Unset: kept.
    #[arg(long, env = "ORCH_RETENTION_SECONDS_AFTER_FINISHED")]
    pub retention_seconds_after_finished: Option<u32>,
    /// The most finished TaskRuns kept per namespace: beyond it the operator deletes the ones that
    /// finished first (their ConfigMaps and Jobs go with them). Unset: no limit.
    #[arg(long, env = "ORCH_MAX_FINISHED_PER_NAMESPACE",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_finished_per_namespace: Option<u32>,
    /// Log as JSON lines.
    #[arg(long, env = "ORCH_LOG_JSON")]
    pub log_json: bool,
}

/// The body of the approval webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WebhookFormat {
    /// `{"text": "..."}`: Slack's incoming webhooks, and the many receivers that take its shape.
    Slack,
    /// CloudEvents 1.0, structured mode (`application/cloudevents+json`).
    Cloudevents,
}

impl Settings {
    /// Parses command-line style arguments (the first is the program name).
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from(args)
    }

    pub fn render(&self) -> RenderSettings {
        RenderSettings {
            sidecar_image: self.sidecar_image.clone(),
            agent_image: self.agent_image.clone(),
            runtime_images: crate::render::RuntimeImages {
                codex: self.agent_image_codex.clone(),
                gemini_cli: self.agent_image_gemini_cli.clone(),
                opencode: self.agent_image_opencode.clone(),
            },
            sidecar_log_json: self.log_json,
            sidecar_audit_otlp_endpoint: self
                .sidecar_audit_otlp_endpoint
                .clone()
                .filter(|e| !e.is_empty()),
            sidecar_otlp_endpoint: self
                .sidecar_otlp_endpoint
                .clone()
                .or_else(|| self.otlp_endpoint.clone()),
            sidecar_port: self.sidecar_port,
            sidecar_api_watch: self.sidecar_api_watch,
            sidecar_kubernetes_service: self.sidecar_kubernetes_service.clone(),
            sidecar_metrics_port: self.sidecar_metrics_port,
            shared_proxy: self.shared_proxy(),
            default_model: self.model_secret.clone().map(|secret_key_ref| {
                orchestrator_crds::taskrun::model::ModelSpec {
                    secret_key_ref,
                    endpoint: self.model_endpoint.clone(),
                    models: Vec::new(),
                    ca_config_map_key_ref: self.model_ca_config_map.clone(),
                }
            }),
            decision_point: self.decision_point_url.clone().map(|url| {
                orchestrator_crds::decision::DecisionPoint {
                    url,
                    timeout_milliseconds: Some(self.decision_point_timeout_ms),
                    cache: None,
                }
            }),
        }
    }

    /// The shared proxy, when `--shared-proxy-url` is set.
    pub fn shared_proxy(&self) -> Option<SharedProxy> {
        Some(SharedProxy {
            url: self.shared_proxy_url.clone()?,
            namespace: self
                .shared_proxy_namespace
                .clone()
                .unwrap_or_else(|| self.lease_namespace.clone()),
            service_account: self.shared_proxy_service_account.clone()?,
            audience: self.shared_proxy_audience.clone(),
        })
    }

    /// The namespaces whose TaskRuns are reconciled.
    pub fn watched(&self) -> Watched {
        Watched::new(&self.namespaces)
    }

    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration_seconds.max(2))
    }

    /// The identity written into the Lease and events.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "operator".into());
            format!("{host}-{}", std::process::id())
        })
    }
}

/// `sidecar` or `shared`.
fn proxy_mode(value: &str) -> Result<ProxyMode, String> {
    ProxyMode::parse(value.trim())
        .ok_or_else(|| format!("{value:?} is not a proxy mode (sidecar or shared)"))
}

/// A decision point's URL, held to what the proxy will take (an absolute http(s) URL).
fn decision_point_url(value: &str) -> Result<String, String> {
    let point = orchestrator_crds::decision::DecisionPoint {
        url: value.trim().to_string(),
        timeout_milliseconds: None,
        cache: None,
    };
    match point.problems("--decision-point-url").first() {
        Some((_, message)) => Err(message.clone()),
        None => Ok(point.url),
    }
}

/// A namespace's name (a DNS-1123 label), or empty (the chart's unset value: all namespaces).
fn namespace_name(value: &str) -> Result<String, String> {
    let value = value.trim();
    let label = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if label {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (a DNS-1123 label: lowercase letters, digits and '-')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_decision_point_is_rendered_for_every_task_and_a_bad_url_refused() {
        let s = parse(&[
            "--decision-point-url",
            "http://opa.policy.svc:8181/v1/data/orchestrator/decision",
            "--decision-point-timeout-ms",
            "250",
        ])
        .expect("parses");
        let point = s.render().decision_point.expect("a point");
        assert_eq!(
            point.url,
            "http://opa.policy.svc:8181/v1/data/orchestrator/decision"
        );
        assert_eq!(point.timeout_milliseconds, Some(250));
        let e = parse(&["--decision-point-url", "opa:8181"])
            .expect_err("refused")
            .to_string();
        assert!(e.contains("is not an absolute http(s) URL"), "{e}");
        assert!(parse(&["--decision-point-timeout-ms", "9"]).is_err());
    }

    fn parse(args: &[&str]) -> Result<Settings, clap::Error> {
        Settings::from_args(std::iter::once("orchestrator-operator").chain(args.iter().copied()))
    }

    #[test]
    fn shared_mode_needs_a_url_and_a_service_account_and_defaults_to_sidecar() {
        let plain = parse(&[]).expect("no flags");
        assert_eq!(plain.default_proxy_mode, ProxyMode::Sidecar);
        assert_eq!(plain.shared_proxy(), None);
        let shared = parse(&[
            "--default-proxy-mode",
            "shared",
            "--shared-proxy-url",
            "http://p.orchestrator-system.svc:8080/mcp",
            "--shared-proxy-service-account",
            "p",
        ])
        .expect("shared");
        assert_eq!(shared.default_proxy_mode, ProxyMode::Shared);
        let proxy = shared.shared_proxy().expect("configured");
        assert_eq!(
            (proxy.namespace.as_str(), proxy.audience.as_str()),
            ("orchestrator-system", DEFAULT_AUDIENCE)
        );
        let no_account = parse(&["--shared-proxy-url", "http://p/mcp"]).expect_err("no SA");
        assert!(
            no_account
                .to_string()
                .contains("--shared-proxy-service-account"),
            "{no_account}"
        );
        let bad = parse(&["--default-proxy-mode", "Shared"]).expect_err("case matters");
        assert!(bad.to_string().contains("is not a proxy mode"), "{bad}");
    }

    fn watched(args: &[&str]) -> Result<Watched, clap::Error> {
        let args = std::iter::once("orchestrator-operator").chain(args.iter().copied());
        Settings::from_args(args).map(|s| s.watched())
    }

    #[test]
    fn namespaces_come_as_a_list_or_one_by_one_and_none_means_all() {
        assert_eq!(watched(&[]).ok(), Some(Watched::All));
        assert_eq!(watched(&["--namespace", ""]).ok(), Some(Watched::All));
        assert_eq!(
            watched(&["--namespace", "team-a"]).ok(),
            Some(Watched::Only(vec!["team-a".into()]))
        );
        let both = Some(Watched::Only(vec!["team-a".into(), "team-b".into()]));
        assert_eq!(watched(&["--namespace", "team-a,team-b"]).ok(), both);
        assert_eq!(
            watched(&["--namespace", "team-a", "--namespace", "team-b"]).ok(),
            both
        );
        let bad = watched(&["--namespace", "team-a,Team_B"]).expect_err("not a label");
        assert!(
            bad.to_string()
                .contains("\"Team_B\" is not a namespace name"),
            "{bad}"
        );
    }
}
