//! The files of the task's ConfigMap: the proxy config the sidecar parses (`proxy.yaml`, the
//! `crds::proxy` schema), the agent's MCP client config pointing at its proxy only (the pod's or
//! the shared one: [`ProxyAccess`]), the agent's permission settings for its built-in tools, and
//! the inline task text. Never a Secret value: the proxy config names env vars, and their values
//! reach the pod through `secretKeyRef`.

use std::collections::BTreeMap;

use kube::ResourceExt;
use orchestrator_crds::approval::VERDICTS_KEY;
use orchestrator_crds::proxy::{
    AuditSpec, HttpSpec, PROXY_CONFIG_FILE, PolicySpec, ProxyConfig, ServerSpec, StdioSpec,
    TaskRef, ToolFilter, ToolPrefix,
};
use orchestrator_crds::shared::{TOKEN_DIR, TOKEN_FILE};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::result::{CREATED_BY_ANNOTATION, created_by};
use serde_json::json;

use super::pod::{PROXY_UID, TOOLS_DIR};
use super::resolve::{Problem, Resolved};
use super::zone::{zone_socket, zone_uid};

/// The agent's MCP client config (Claude Code `--mcp-config`).
pub const MCP_CONFIG_FILE: &str = "mcp-config.json";
/// The agent's settings with its built-in tool permissions (Claude Code `--settings`).
pub const SETTINGS_FILE: &str = "settings.json";
/// The task text when given inline.
pub const TASK_FILE: &str = "task.md";
/// Sidecar mode: the agent's `headersHelper` (see [`headers_script`]).
pub const HEADERS_HELPER_FILE: &str = "mcp-headers.sh";
/// The name of the proxy in the agent's MCP config; Claude Code names its tools
/// `mcp__orchestrator__<server>__<tool>`.
pub const PROXY_SERVER_NAME: &str = "orchestrator";

/// The rendered files; the proxy config is kept typed so the version can be set last.
#[derive(Clone, Debug)]
pub struct Files {
    proxy: ProxyConfig,
    mcp_config: String,
    /// Sidecar mode: the script printing the agent's credential header.
    headers_helper: String,
    settings: String,
    task: Option<String>,
    /// The agent's `apiKeyHelper` with a model (see [`ProxyAccess`]).
    api_key_helper: String,
    /// The model gateway's key helper for the agent (see `super::model`).
    model_key_helper: Option<String>,
}

impl Files {
    pub fn render(
        tr: &TaskRun,
        namespace: &str,
        resolved: &Resolved<'_>,
        proxy_addr: &str,
        access: ProxyAccess,
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
                }
            },
            servers,
            gateway: None,
        };
        Files {
            proxy,
            mcp_config: pretty(&mcp_config(&access)),
            headers_helper: headers_script(proxy_addr),
            settings: pretty(&settings(tr)),
            task: tr.spec.task.prompt.clone(),
            api_key_helper: access.api_key_helper,
            model_key_helper: None,
        }
    }

    /// The proxy config as rendered for the sidecar (`contextVersion` 0).
    pub fn proxy(&self) -> &ProxyConfig {
        &self.proxy
    }

    /// The task's proxy serves the model (`model`): its config's `gateway`, and the agent's
    /// settings name the key helper that prints the agent's credential (see [`ProxyAccess`]).
    pub fn use_gateway(
        &mut self,
        tr: &TaskRun,
        model: &orchestrator_crds::taskrun::model::ModelSpec,
    ) {
        use super::model::{gateway_spec, key_helper_script};
        self.proxy.gateway = Some(gateway_spec(tr, model));
        let mut settings = settings(tr);
        settings["apiKeyHelper"] = json!(self.api_key_helper);
        self.settings = pretty(&settings);
        self.model_key_helper = Some(key_helper_script(&self.headers_helper));
    }

    /// The agent's files: its MCP config, its settings and the inline task text (in either
    /// mode the task's ConfigMap holds them).
    pub fn agent_data(&self) -> BTreeMap<String, String> {
        let mut data = BTreeMap::from([
            (MCP_CONFIG_FILE.to_string(), self.mcp_config.clone()),
            (SETTINGS_FILE.to_string(), self.settings.clone()),
        ]);
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
        SETTINGS_FILE => " (spec.toolConfig.internalTools.permissions)",
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
        Some(SETTINGS_FILE) => "list fewer permission rules",
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

/// How the agent reaches its proxy, as its files name it (chosen by `placement`).
#[derive(Clone, Debug)]
pub struct ProxyAccess {
    /// The proxy's MCP URL.
    url: String,
    /// Claude Code's `headersHelper`: a shell command printing the agent's credential header.
    headers_helper: String,
    /// Claude Code's `apiKeyHelper` with a model: a shell command printing the agent's
    /// credential.
    api_key_helper: String,
}

impl ProxyAccess {
    /// Sidecar mode: the pod's proxy at `proxy_addr`; the helpers are the ConfigMap's scripts,
    /// which send the credential only to the proxy's uid ([`headers_script`]).
    pub fn sidecar(proxy_addr: &str) -> Self {
        use super::model::MODEL_KEY_HELPER_FILE;
        Self {
            url: format!("http://{proxy_addr}/mcp"),
            headers_helper: format!("sh {TOOLS_DIR}/{HEADERS_HELPER_FILE}"),
            api_key_helper: format!("sh {TOOLS_DIR}/{MODEL_KEY_HELPER_FILE}"),
        }
    }

    /// Shared mode: the shared proxy at `url`, reached with the pod's projected token (audience
    /// the shared proxy's, not the API server's), which the shared proxy reviews. Claude Code
    /// runs the helpers when it connects and reconnects, so a token the kubelet renewed in the
    /// file is the one sent after a reconnect.
    pub fn shared(url: &str) -> Self {
        Self {
            url: url.to_string(),
            headers_helper: headers_helper(),
            api_key_helper: format!("cat {TOKEN_DIR}/{TOKEN_FILE}"),
        }
    }
}

/// The proxy is the agent's only MCP server (used with `--strict-mcp-config`), reached with the
/// agent's credential (the proxy requires it): Claude Code runs `headersHelper` when it connects
/// and reconnects.
fn mcp_config(access: &ProxyAccess) -> serde_json::Value {
    json!({
        "mcpServers": {
            PROXY_SERVER_NAME: {
                "type": "http",
                "url": access.url,
                "headersHelper": access.headers_helper,
            }
        }
    })
}

/// Sidecar mode: a shell script printing `{"Authorization":"Bearer <the agent's token>"}`, but
/// only when the proxy's port on the pod's loopback is held by the proxy's uid (the kernel's
/// socket table, `/proc/net/tcp`, which shows the pod's network namespace): while the proxy
/// restarts, any other container of the pod could bind the port, and must not be sent the
/// token. The address is printed as the kernel holds it (little-endian on amd64 and arm64; the
/// big-endian form is accepted too).
pub fn headers_script(proxy_addr: &str) -> String {
    let port = proxy_addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .unwrap_or(8080);
    format!(
        r#"# Claude Code's headersHelper (sidecar mode): the agent's credential for its proxy, sent only
# when 127.0.0.1:{port} is held by the proxy's uid ({PROXY_UID}), never to another process of the pod.
port={port} uid={PROXY_UID} token=${{ORCHESTRATOR_MCP_TOKEN_FILE:-{TOKEN_DIR}/{TOKEN_FILE}}}
held=$(awk -v want="$(printf '%04X' "$port")" '$4 == "0A" {{ split($2, a, ":"); if (a[2] == want && (a[1] == "0100007F" || a[1] == "7F000001" || a[1] == "00000000")) {{ print $8; exit }} }}' /proc/net/tcp)
if [ "$held" != "$uid" ]; then
  echo "127.0.0.1:$port is held by uid ${{held:-nobody}}, not the MCP proxy's ($uid): the agent's token is not sent" >&2
  exit 1
fi
printf '{{"Authorization":"Bearer %s"}}' "$(cat "$token")"
"#
    )
}

/// Shared mode: the shell command printing `{"Authorization":"Bearer <token>"}` from the
/// projected token file (a JWT: base64url and dots, nothing to escape in JSON).
pub fn headers_helper() -> String {
    format!("printf '{{\"Authorization\":\"Bearer %s\"}}' \"$(cat {TOKEN_DIR}/{TOKEN_FILE})\"")
}

/// Claude Code permission settings for the built-in tools. `*` in `allow` (the default) means
/// every tool not denied: permission prompts are bypassed (nobody could answer them in a Job)
/// and deny rules still apply. The proxy's tools are always allowed here: the proxy itself
/// decides which of them exist.
fn settings(tr: &TaskRun) -> serde_json::Value {
    let p = &tr.spec.tool_config.internal_tools.permissions;
    let allow_all = p.allow.iter().any(|a| a == "*");
    let mut allow: Vec<String> = p.allow.iter().filter(|a| *a != "*").cloned().collect();
    allow.push(format!("mcp__{PROXY_SERVER_NAME}"));
    let mut permissions = json!({ "allow": allow, "deny": p.deny });
    if allow_all {
        permissions["defaultMode"] = json!("bypassPermissions");
    }
    json!({ "permissions": permissions })
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}
