//! The proxy config: parse strictly (every problem at once, each with a stable code), validate,
//! and normalize into [`Config`]. The rest of the proxy only ever sees [`Config`], never the
//! wire types of `orchestrator_crds::proxy`.

mod approval;
mod calls;
mod gateway;
mod normalize;
mod problem;
mod shape;
mod zone;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

pub use approval::{ApprovalPattern, ApprovalPolicy};
pub use gateway::{BUILT_IN_PRICES, CaSource, GatewayConfig, KeySource, Limits, PriceNanos};
use orchestrator_crds::proxy::{OnChange, ProxyConfig, RateLimits, Risk, ToolMode, ToolPrefix};
pub use problem::{Code, Problem, Problems, Severity};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    conditions::Conditions, decision::DecisionPoints, filter::ToolFilter, names::ServerName,
};

/// Default per-call timeout when `callTimeoutSeconds` is not set.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// A validated, normalized config.
#[derive(Debug)]
pub struct Config {
    pub context_version: u64,
    pub task_name: String,
    pub task_namespace: String,
    /// Who created the TaskRun (`task.createdBy`), for the audit records.
    pub task_created_by: Option<String>,
    /// The TaskRun's labels (`task.labels`), for conditions.
    pub task_labels: BTreeMap<String, String>,
    pub listen: SocketAddr,
    pub tool_prefix: ToolPrefix,
    /// Extra accepted `Host` header values besides the loopback names.
    pub allowed_hosts: Vec<String>,
    pub call_timeout: Duration,
    pub audit: AuditConfig,
    /// `policy.toolMode`: each tool offered as itself, or the four intent tools.
    pub tool_mode: ToolMode,
    /// `policy.maxRisk`: tools above it are hidden and refused.
    pub max_risk: Option<Risk>,
    /// `policy.validateArguments`: check arguments against the tool's input schema.
    pub validate_arguments: bool,
    /// `policy.onChange`: what a changed or mis-pinned tool definition does.
    pub on_change: OnChange,
    /// `policy.requireApproval`: calls that wait for a person's decision (none when unset).
    pub require_approval: Option<ApprovalPolicy>,
    /// `policy.conditions`: CEL conditions on calls, compiled.
    pub conditions: Arc<Conditions>,
    /// `policy.decisionPoints`: the policy services asked about each call.
    pub decision_points: Arc<DecisionPoints>,
    /// In file order; names are unique.
    pub servers: Vec<Arc<Server>>,
    /// `gateway`: the model API served at `/model` (none when unset).
    pub gateway: Option<Arc<GatewayConfig>>,
}

impl Config {
    pub fn server(&self, name: &str) -> Option<&Arc<Server>> {
        self.servers.iter().find(|s| s.name.as_str() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// Where audit lines go; stderr when `None`.
    pub path: Option<PathBuf>,
    pub include_arguments: bool,
}

/// One upstream server.
#[derive(Debug)]
pub struct Server {
    pub name: ServerName,
    pub enabled: bool,
    pub transport: Transport,
    pub filter: ToolFilter,
    /// Tool name -> risk class, overriding the server's annotations.
    pub risk: BTreeMap<String, Risk>,
    /// `rateLimit`: the server-wide and per-tool call rates.
    pub rate_limit: RateLimits,
    /// Tool name -> the definition hash it must have (`sha256:<hex>`).
    pub pins: BTreeMap<String, String>,
    /// The server's tools as pinned in the catalog (each hashes to its pin): listed before the
    /// server has run, so `tools/list` starts nothing. `None` when the config has none.
    pub definitions: Option<Arc<Vec<rmcp::model::Tool>>>,
    /// Hash of the transport spec: equal hashes mean "the same server process would be started".
    /// Keys the on-disk tool-list cache and decides whether a reload keeps a running upstream.
    pub spec_hash: SpecHash,
}

impl Server {
    /// Whether this server may ever be started: enabled, with at least one tool name that could
    /// pass its filter. A server whose tools are all disabled is never started.
    pub fn is_startable(&self) -> bool {
        self.enabled && !self.filter.denies_everything()
    }

    /// A tool's risk class: this server's `risk` entry for it, else from its annotations.
    pub fn risk_of(&self, tool: &rmcp::model::Tool) -> Risk {
        if let Some(risk) = self.risk.get(tool.name.as_ref()) {
            return *risk;
        }
        let hints = tool.annotations.as_ref();
        Risk::from_hints(
            hints.and_then(|a| a.read_only_hint),
            hints.and_then(|a| a.destructive_hint),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio(StdioTransport),
    Http(HttpTransport),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioTransport {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub pass_env: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// The zone's socket: the process runs in the server's own container (`env`, `passEnv` and
    /// `cwd` are then empty).
    pub socket: Option<PathBuf>,
    /// With `socket`: the uid the zone runs as (its socket's owner and the peer on it).
    pub zone_uid: Option<u32>,
    /// Shared mode: the zone's port on the task pod's IP (`TASK_POD_IP_ANNOTATION`), reached over
    /// TCP with the key in `zone_key` (env, passEnv and cwd are then empty, as with `socket`).
    pub zone_port: Option<u16>,
    /// Shared mode: the task's Secret key holding the zone's key (read through the API into
    /// `upstream::Shared::secrets`).
    pub zone_key: Option<orchestrator_crds::proxy::SecretKey>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTransport {
    pub url: String,
    /// Header name -> env var holding the value.
    pub headers_from_env: BTreeMap<String, String>,
    /// Header name -> the task's Secret and key holding the value (shared mode: read through
    /// the API into `upstream::Shared::secrets`).
    pub headers_from_secret: BTreeMap<String, orchestrator_crds::proxy::SecretKey>,
}

/// Hex SHA-256 (truncated) of a server's transport spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpecHash(pub String);

impl SpecHash {
    /// Hash of what decides which process (or endpoint) a server is. Secrets are not in the spec
    /// (only the names of the variables that carry them), so they never reach the hash either.
    pub(crate) fn of(transport: &Transport) -> SpecHash {
        let canonical = match transport {
            Transport::Stdio(s) => {
                let mut stdio = serde_json::json!({
                    "command": s.command,
                    "args": s.args,
                    "env": s.env,
                    "passEnv": s.pass_env,
                    "cwd": s.cwd,
                });
                // Only when set: the hashes (and caches) of servers without one stay as they were.
                if let Some(socket) = &s.socket {
                    stdio["socket"] = serde_json::json!(socket);
                }
                if let Some(uid) = s.zone_uid {
                    stdio["zoneUid"] = serde_json::json!(uid);
                }
                if let Some(port) = s.zone_port {
                    stdio["zonePort"] = serde_json::json!(port);
                }
                if let Some(key) = &s.zone_key {
                    stdio["zoneKey"] = serde_json::json!(key);
                }
                serde_json::json!({ "stdio": stdio })
            }
            Transport::Http(h) => {
                let mut http =
                    serde_json::json!({"url": h.url, "headersFromEnv": h.headers_from_env});
                // Only when set, as `socket`: the Secrets' names and keys, never their values.
                if !h.headers_from_secret.is_empty() {
                    http["headersFromSecret"] = serde_json::json!(h.headers_from_secret);
                }
                serde_json::json!({ "http": http })
            }
        };
        let digest = Sha256::digest(canonical.to_string().as_bytes());
        let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        SpecHash(hex)
    }
}

impl std::fmt::Display for SpecHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The outcome of loading a config: the config (when there are no errors) and every problem
/// (warnings ride along with a good config).
#[derive(Debug)]
pub struct Loaded {
    pub config: Option<Config>,
    pub problems: Problems,
}

/// Reads and validates a config file.
pub fn load_file(path: &Path) -> Loaded {
    match std::fs::read(path) {
        Ok(bytes) => load_bytes(&bytes),
        Err(e) => Loaded {
            config: None,
            problems: Problems(vec![Problem::new(
                Code::Read,
                "",
                format!("cannot read {}: {e}", path.display()),
            )]),
        },
    }
}

/// A valid config from text, for tests (panics with the problems otherwise).
#[cfg(test)]
pub fn valid(text: &str) -> Config {
    let loaded = load_bytes(text.as_bytes());
    loaded
        .config
        .unwrap_or_else(|| panic!("{}", loaded.problems))
}

/// Parses and validates config text (YAML or JSON, which is YAML too).
pub fn load_bytes(bytes: &[u8]) -> Loaded {
    let fail = |problems: Vec<Problem>| Loaded {
        config: None,
        problems: Problems(problems),
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return fail(vec![Problem::new(
            Code::Parse,
            "",
            "the file is not UTF-8 text",
        )]);
    };
    // YAML 1.2 booleans only: `off`, `y`, `no` stay strings (a server named `off` is a name).
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    let doc: Value = match serde_saphyr::from_str_with_options(text, options) {
        Ok(Value::Null) => {
            return fail(vec![Problem::new(Code::Parse, "", "the file is empty")]);
        }
        Ok(doc) => doc,
        Err(e) => {
            return fail(vec![Problem::new(
                Code::Parse,
                "",
                format!("not valid YAML/JSON: {e}"),
            )]);
        }
    };
    let schema = schemars::schema_for!(ProxyConfig);
    let found = shape::check(schema.as_value(), &doc);
    let mut problems: Vec<Problem> = found.iter().map(|f| f.problem.clone()).collect();
    annotate_server_names(&doc, &mut problems);

    // Carry on with what is usable, so semantic problems are reported in the same pass:
    // drop unknown keys, set aside servers with other structural problems.
    let mut pruned = doc.clone();
    let mut broken_servers = std::collections::HashSet::new();
    let mut top_level_broken = false;
    for f in &found {
        if f.problem.code == Code::UnknownKey {
            remove_pointer(&mut pruned, &f.pointer);
        } else if let Some(index) = server_index(&f.pointer) {
            broken_servers.insert(index);
        } else {
            top_level_broken = true;
        }
    }
    let raw_servers = pruned
        .get("servers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let servers: Vec<normalize::Entry> = raw_servers
        .iter()
        .enumerate()
        .map(|(index, raw)| normalize::Entry {
            index,
            name: raw.get("name").and_then(Value::as_str).map(str::to_string),
            spec: if broken_servers.contains(&index) {
                None
            } else {
                serde_json::from_value(raw.clone()).ok()
            },
        })
        .collect();
    let top: Option<ProxyConfig> = if top_level_broken {
        None
    } else {
        let mut top_doc = pruned;
        if let Some(map) = top_doc.as_object_mut() {
            map.insert("servers".into(), Value::Array(Vec::new()));
        }
        match serde_path_to_error::deserialize(&top_doc) {
            Ok(top) => Some(top),
            Err(e) => {
                let path = e.path().to_string();
                problems.push(Problem::new(
                    Code::BadValue,
                    path,
                    e.into_inner().to_string(),
                ));
                None
            }
        }
    };
    let mut loaded = normalize::normalize(top.as_ref(), &servers);
    if !problems.is_empty() {
        problems.append(&mut loaded.problems.0);
        problems.sort_by_key(|p| !p.is_error());
        loaded = Loaded {
            config: None,
            problems: Problems(problems),
        };
    }
    loaded
}

/// `/servers/3/...` -> 3.
fn server_index(pointer: &str) -> Option<usize> {
    pointer
        .strip_prefix("/servers/")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

fn remove_pointer(doc: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    if let Some(map) = doc.pointer_mut(parent).and_then(Value::as_object_mut) {
        map.remove(&key);
    }
}

/// Appends `(server "x")` to problems under `servers[i]` so a reader knows which one is meant.
fn annotate_server_names(doc: &Value, problems: &mut [Problem]) {
    for p in problems {
        let Some(rest) = p.path.strip_prefix("servers[") else {
            continue;
        };
        let Some(index) = rest.split(']').next().and_then(|i| i.parse::<usize>().ok()) else {
            continue;
        };
        if let Some(name) = doc
            .pointer(&format!("/servers/{index}/name"))
            .and_then(Value::as_str)
        {
            p.message.push_str(&format!(" (server {name:?})"));
        }
    }
}

#[cfg(test)]
mod tests;
