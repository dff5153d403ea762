//! What the operator's flags decide about rendered objects ([`RenderSettings`]), and the shared
//! proxy they name ([`SharedProxy`]).

use orchestrator_crds::taskrun::AgentRuntime;

/// The sidecar's default port (the proxy's own default listen address is 127.0.0.1:8080).
pub const DEFAULT_SIDECAR_PORT: u16 = 8080;

/// What the operator's flags decide about rendered objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderSettings {
    /// Image of the MCP proxy sidecar.
    pub sidecar_image: String,
    /// Agent image when the TaskRun names none: Claude Code's (and a custom command's).
    pub agent_image: String,
    /// The other runtimes' images when the TaskRun names none.
    pub runtime_images: RuntimeImages,
    /// OTLP endpoint handed to every sidecar (`OTEL_EXPORTER_OTLP_ENDPOINT`), if any.
    pub sidecar_otlp_endpoint: Option<String>,
    /// The proxy's and its zones' log lines as JSON (`--log-format json`), as the operator's own
    /// (`--log-json`, the chart's `logJson`): one log format for every part of an install.
    pub sidecar_log_json: bool,
    /// The audit's OTLP logs endpoint: the proxy gets `--audit-otlp` and
    /// `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`. None: the audit stays on its stdout.
    pub sidecar_audit_otlp_endpoint: Option<String>,
    /// The loopback port the sidecar serves MCP on (the agent and the probes use it).
    pub sidecar_port: u16,
    /// The proxy watches its ConfigMap through the API and reports what it serves (a token of
    /// the task's identity in the proxy container only); see [`identity`].
    pub sidecar_api_watch: bool,
    /// `HOST:PORT` for KUBERNETES_SERVICE_HOST/PORT on the proxy container, if set.
    pub sidecar_kubernetes_service: Option<String>,
    /// Port of the proxy's metrics listener on the pod IP (`--metrics-listen`), if any.
    pub sidecar_metrics_port: Option<u16>,
    /// The shared proxy (`--shared-proxy-*`), when shared mode is on.
    pub shared_proxy: Option<SharedProxy>,
    /// The model credential of a TaskRun that names none (`--model-secret`).
    pub default_model: Option<orchestrator_crds::taskrun::model::ModelSpec>,
    /// The policy service every task's proxy asks about each call, before the TaskRun's own
    /// (`--decision-point-url`).
    pub decision_point: Option<orchestrator_crds::decision::DecisionPoint>,
}

/// The chart's shared proxy, as the operator's flags name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedProxy {
    /// Its MCP URL as task pods reach it (`--shared-proxy-url`).
    pub url: String,
    /// Its namespace: where each shared task's ConfigMap goes.
    pub namespace: String,
    /// Its ServiceAccount (in `namespace`).
    pub service_account: String,
    /// The audience of the agents' tokens.
    pub audience: String,
}

/// The agent images of the runtimes other than Claude Code (`--agent-image-codex`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeImages {
    pub codex: String,
    pub gemini_cli: String,
    pub opencode: String,
}

impl Default for RuntimeImages {
    fn default() -> Self {
        Self {
            codex: "orchestrator-agent-codex:latest".into(),
            gemini_cli: "orchestrator-agent-gemini-cli:latest".into(),
            opencode: "orchestrator-agent-opencode:latest".into(),
        }
    }
}

impl RenderSettings {
    /// The agent image for `runtime` when the TaskRun names none.
    pub fn agent_image_for(&self, runtime: AgentRuntime) -> &str {
        match runtime {
            AgentRuntime::ClaudeCode | AgentRuntime::Custom => &self.agent_image,
            AgentRuntime::Codex => &self.runtime_images.codex,
            AgentRuntime::GeminiCli => &self.runtime_images.gemini_cli,
            AgentRuntime::Opencode => &self.runtime_images.opencode,
        }
    }

    /// Where the proxy listens inside the pod: loopback only, the agent is in the same pod.
    pub fn proxy_addr(&self) -> String {
        format!("127.0.0.1:{}", self.sidecar_port)
    }
}
