//! The files of the task's ConfigMap: the proxy config the sidecar parses (`proxy.yaml`, the
//! `crds::proxy` schema), the runtime's files (its MCP client config pointing at its proxy only,
//! its settings for its built-in tools: `super::runtime`), the credential helpers of sidecar
//! mode, and the inline task text. Never a Secret value: the proxy config names env vars, and their values
//! reach the pod through `secretKeyRef`.

use std::collections::BTreeMap;

use kube::ResourceExt;
use orchestrator_crds::approval::VERDICTS_KEY;
use orchestrator_crds::proxy::{
    AuditSpec, HttpSpec, PROXY_CONFIG_FILE, PolicySpec, ProxyConfig, ServerSpec, StdioSpec,
    TaskRef, ToolFilter, ToolPrefix,
};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::result::{CREATED_BY_ANNOTATION, created_by};

use super::zone::{zone_socket, zone_uid};
use orchestrator_crds::resolve::{Problem, Resolved};

/// The task text when given inline.
pub const TASK_FILE: &str = "task.md";
pub use super::runtime::access::{HEADERS_HELPER_FILE, headers_helper, headers_script};
pub use super::runtime::claude_code::{MCP_CONFIG_FILE, SETTINGS_FILE};

/// The rendered files; the proxy config is kept typed so the version can be set last.
#[derive(Clone, Debug)]
pub struct Files {
    proxy: ProxyConfig,
    /// The runtime's files (its MCP config, settings, policy: `super::runtime`).
    agent: BTreeMap<String, String>,
    /// Sidecar mode: the script printing the agent's credential header.
    headers_helper: String,
    task: Option<String>,
    /// The model gateway's key helper for the agent (see `super::model`).
    model_key_helper: Option<String>,
}

impl Files {
    /// The chart's decision point, asked before the TaskRun's own (a tenant cannot leave it
    /// out), with the TaskRun's labels for its policy to read.
    pub fn ask_first(&mut self, tr: &TaskRun, point: &orchestrator_crds::decision::DecisionPoint) {
        self.proxy.policy.decision_points.insert(0, point.clone());
        self.proxy.task.labels = tr.labels().clone();
    }

    /// The proxy config for the task's servers, the runtime's files (`agent`) and the task text.
    pub fn render(
        tr: &TaskRun,
        namespace: &str,
        resolved: &Resolved<'_>,
        proxy_addr: &str,
        agent: BTreeMap<String, String>,
    ) -> Files {
        let servers = resolved
            .servers
            .iter()
            .map(|s| {
                ServerSpec {
                    name: s.spec.name.clone(),
                    enabled: s.spec.enabled,
                    // The server runs in its own container (see `job`): its env, Secrets and
                    // working directory are that container's; the proxy only has its socket.
                    stdio: s.entry.stdio.as_ref().map(|stdio| StdioSpec {
                        command: stdio.command.clone(),
                        args: stdio.args.clone(),
                        env: BTreeMap::new(),
                        pass_env: Vec::new(),
                        cwd: None,
                        socket: Some(zone_socket(&s.spec.name)),
                        zone_uid: zone_uid(resolved, &s.spec.name),
                        zone_port: None,
                        zone_key: None,
                    }),
                    http: s.entry.http.as_ref().map(|http| HttpSpec {
                        url: http.url.clone(),
                        headers_from_env: http.headers_from_env.clone(),
                        ..HttpSpec::default()
                    }),
                    tools: ToolFilter {
                        allow: s.spec.tools.allow.clone(),
                        deny: s.spec.tools.deny.clone(),
                    },
                    // The catalog's classes, the TaskRun's over them.
                    risk: s
                        .entry
                        .tools
                        .iter()
                        .filter_map(|t| Some((t.name.clone(), t.risk?)))
                        .chain(s.spec.risk.iter().map(|(t, r)| (t.clone(), *r)))
                        .collect(),
                    rate_limit: s.spec.rate_limit.clone(),
                    pins: s
                        .entry
                        .tools
                        .iter()
                        .filter_map(|t| Some((t.name.clone(), t.pin.clone()?)))
                        .collect(),
                    // Listed before the server starts, and its own list held to them.
                    definitions: s.entry.pinned_definitions().unwrap_or_default(),
                }
            })
            .collect();
        let proxy = ProxyConfig {
            context_version: 0,
            task: TaskRef {
                name: tr.name_any(),
                namespace: namespace.to_string(),
                uid: None,
                created_by: tr
                    .annotations()
                    .get(CREATED_BY_ANNOTATION)
                    .and_then(|v| created_by(v)),
                // Read by conditions and decision points only (`task.labels`): a config
                // without either is unchanged.
                labels: {
                    let policy = &tr.spec.tool_config.policy;
                    match policy.conditions.is_empty() && policy.decision_point.is_none() {
                        true => Default::default(),
                        false => tr.labels().clone(),
                    }
                },
            },
            listen: proxy_addr.to_string(),
            tool_prefix: ToolPrefix::Server,
            allowed_hosts: Vec::new(),
            call_timeout_seconds: None,
            audit: AuditSpec::default(),
            policy: {
                let policy = &tr.spec.tool_config.policy;
                PolicySpec {
                    tool_mode: policy.tool_mode.unwrap_or_default(),
                    max_risk: policy.max_risk,
                    validate_arguments: policy.validate_arguments.unwrap_or(true),
                    on_change: policy.on_change.unwrap_or_default(),
                    require_approval: policy.require_approval.clone(),
                    conditions: policy.conditions.clone(),
                    decision_points: policy.decision_point.iter().cloned().collect(),
                }
            },
            servers,
            gateway: None,
        };
        Files {
            proxy,
            agent,
            headers_helper: headers_script(proxy_addr),
            task: tr.spec.task.prompt.clone(),
            model_key_helper: None,
        }
    }

    /// The proxy config as rendered for the sidecar (`contextVersion` 0).
    pub fn proxy(&self) -> &ProxyConfig {
        &self.proxy
    }

    /// The task's proxy serves the model (`model`): its config's `gateway`, and (sidecar mode)
    /// the key helper that prints the agent's credential to the proxy's uid only.
    pub fn use_gateway(
        &mut self,
        tr: &TaskRun,
        model: &orchestrator_crds::taskrun::model::ModelSpec,
    ) {
        use super::model::{gateway_spec, key_helper_script};
        self.proxy.gateway = Some(gateway_spec(tr, model));
        self.model_key_helper = Some(key_helper_script(&self.headers_helper));
    }

    /// The agent's files: its runtime's and the inline task text (in either mode the task's
    /// ConfigMap holds them).
    pub fn agent_data(&self) -> BTreeMap<String, String> {
        let mut data = self.agent.clone();
        if let Some(task) = &self.task {
            data.insert(TASK_FILE.to_string(), task.clone());
        }
        data
    }

    /// The agent's files and the pod's proxy's, with `contextVersion` set: the proxy config,
    /// the credential helpers that check the proxy's port (what a sidecar's ConfigMap holds).
    pub fn data(&self, context_version: u64) -> BTreeMap<String, String> {
        let mut proxy = self.proxy.clone();
        proxy.context_version = context_version;
        let proxy_yaml = match serde_saphyr::to_string(&proxy) {
            Ok(text) => text,
            // Serializing plain structs of strings cannot fail; if it ever did, an unparsable
            // file makes the sidecar keep its last good config instead of running with a wrong one.
            Err(e) => format!("# render error: {e}\n"),
        };
        let mut data = self.agent_data();
        data.insert(PROXY_CONFIG_FILE.to_string(), proxy_yaml);
        data.insert(HEADERS_HELPER_FILE.to_string(), self.headers_helper.clone());
        if let Some(helper) = &self.model_key_helper {
            data.insert(
                super::model::MODEL_KEY_HELPER_FILE.to_string(),
                helper.clone(),
            );
        }
        data
    }
}

/// The most a ConfigMap may hold: the API server refuses one whose values (`data` and
/// `binaryData`) add up to more bytes than this (1 MiB; `ValidateConfigMap`).
pub const MAX_CONFIG_MAP_BYTES: usize = 1024 * 1024;

/// The condition reason.
pub const CONFIG_TOO_LARGE: &str = "ConfigTooLarge";

/// Why the ConfigMap `ns/name` with values of these sizes (key, bytes) cannot be stored: they add
/// up to more than [`MAX_CONFIG_MAP_BYTES`], counted as the API server counts them. Says how
/// large each key is and where it comes from, largest first, and what to change.
pub fn too_large<'a>(
    ns: &str,
    name: &str,
    values: impl IntoIterator<Item = (&'a str, usize)>,
) -> Option<Problem> {
    let mut sizes: Vec<(&str, usize)> = values.into_iter().collect();
    let total: usize = sizes.iter().map(|(_, n)| n).sum();
    if total <= MAX_CONFIG_MAP_BYTES {
        return None;
    }
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let source = |key: &str| match key {
        TASK_FILE => " (spec.task.prompt)",
        PROXY_CONFIG_FILE => {
            " (spec.toolConfig.mcpServers: the servers, their patterns and the catalog's tools)"
        }
        SETTINGS_FILE
        | super::runtime::gemini::POLICY_FILE
        | super::runtime::opencode::CONFIG_FILE => " (spec.toolConfig.internalTools.permissions)",
        VERDICTS_KEY => " (the verdicts on held calls)",
        _ => "",
    };
    let keys = sizes
        .iter()
        .map(|(key, n)| format!("{key}: {n} bytes{}", source(key)))
        .collect::<Vec<_>>()
        .join(", ");
    let fix = match sizes.first().map(|(key, _)| *key) {
        Some(TASK_FILE) => {
            "give the task text by reference instead (spec.task.configMapKeyRef or spec.task.secretKeyRef; \
             spec.task is immutable, so in a new TaskRun)"
        }
        Some(
            SETTINGS_FILE
            | super::runtime::gemini::POLICY_FILE
            | super::runtime::opencode::CONFIG_FILE,
        ) => "list fewer permission rules",
        _ => "list fewer servers or patterns",
    };
    Some(Problem {
        reason: CONFIG_TOO_LARGE,
        message: format!(
            "ConfigMap {ns}/{name} would hold {total} bytes of data, over the API server's limit of \
             {MAX_CONFIG_MAP_BYTES} bytes (1 MiB): {keys}; {fix}"
        ),
    })
}
