//! Semantic validation of a structurally valid config, and normalization into [`Config`].
//! Every check runs; all problems are returned together.

use std::{collections::HashMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use orchestrator_crds::{
    policy::is_pin,
    proxy::{PREFIX_SEPARATOR, ProxyConfig, ServerSpec, ToolPrefix},
};

use super::{
    ApprovalPolicy, AuditConfig, Code, Config, DEFAULT_CALL_TIMEOUT, HttpTransport, Loaded,
    Problem, Problems, Server, SpecHash, StdioTransport, Transport, zone,
};
use crate::{
    filter::ToolFilter,
    names::{ServerName, clip},
};

/// Longest accepted server name: it prefixes every exposed tool name, and clients limit those.
const MAX_SERVER_NAME: usize = 64;

/// One `servers[]` entry: its spec when it is structurally sound, else just its name.
pub(super) struct Entry {
    pub index: usize,
    pub name: Option<String>,
    pub spec: Option<ServerSpec>,
}

/// Validates the top level (`None` when it is structurally broken) and the servers; returns a
/// config only when nothing is wrong.
pub(super) fn normalize(top: Option<&ProxyConfig>, entries: &[Entry]) -> Loaded {
    let mut problems = Vec::new();
    let servers = check_servers(entries, &mut problems);
    let Some(wire) = top else {
        return Loaded {
            config: None,
            problems: sorted(problems),
        };
    };
    if wire.tool_prefix == ToolPrefix::None {
        let startable: Vec<&Arc<Server>> = servers
            .iter()
            .filter(|(_, s)| s.is_startable())
            .map(|(_, s)| s)
            .collect();
        let index_of = |name: &ServerName| {
            servers
                .iter()
                .find(|(_, s)| s.name == *name)
                .map(|(i, _)| *i)
                .unwrap_or_default()
        };
        check_unprefixed_collisions(&startable, index_of, &mut problems);
    }

    let listen = match wire.listen.parse::<SocketAddr>() {
        Ok(addr) => {
            if addr.ip().is_unspecified() {
                problems.push(Problem::new(
                    Code::WideListen,
                    "listen",
                    format!(
                        "{addr} accepts connections on every interface; use 127.0.0.1 or the pod IP"
                    ),
                ));
            }
            Some(addr)
        }
        Err(_) => {
            problems.push(Problem::new(
                Code::BadListen,
                "listen",
                format!(
                    "{:?} is not an IP:port address, e.g. \"127.0.0.1:8080\"",
                    wire.listen
                ),
            ));
            None
        }
    };

    for (i, host) in wire.allowed_hosts.iter().enumerate() {
        if !is_host_or_authority(host) {
            problems.push(Problem::new(
                Code::BadHost,
                format!("allowedHosts[{i}]"),
                format!("{host:?} is not a host name, IP or host:port (no scheme, no path)"),
            ));
        }
    }

    let call_timeout = match wire.call_timeout_seconds {
        Some(0) => {
            problems.push(Problem::new(
                Code::BadTimeout,
                "callTimeoutSeconds",
                "must be at least 1; leave it out for the default (300)",
            ));
            DEFAULT_CALL_TIMEOUT
        }
        Some(s) => Duration::from_secs(s),
        None => DEFAULT_CALL_TIMEOUT,
    };

    if wire
        .audit
        .path
        .as_deref()
        .is_some_and(|p| p.trim().is_empty())
    {
        problems.push(Problem::new(
            Code::BadPath,
            "audit.path",
            "empty path; leave it out to write audit lines to stderr",
        ));
    }

    if wire.task.name.trim().is_empty() {
        problems.push(Problem::new(
            Code::BadValue,
            "task.name",
            "must not be empty",
        ));
    }

    let require_approval = wire
        .policy
        .require_approval
        .as_ref()
        .map(|wire| ApprovalPolicy::normalize(wire, &mut problems));
    let (conditions, decision_points) = super::calls::compile(&wire.policy, &mut problems);
    let gateway = (wire.gateway.as_ref())
        .and_then(|wire| super::GatewayConfig::normalize(wire, &mut problems).map(Arc::new));

    let problems = sorted(problems);
    if problems.has_errors() {
        return Loaded {
            config: None,
            problems,
        };
    }
    let Some(listen) = listen else {
        return Loaded {
            config: None,
            problems,
        };
    };
    let config = Config {
        context_version: wire.context_version,
        task_name: wire.task.name.clone(),
        task_namespace: wire.task.namespace.clone(),
        task_created_by: wire.task.created_by.clone(),
        task_labels: wire.task.labels.clone(),
        listen,
        tool_prefix: wire.tool_prefix,
        allowed_hosts: wire.allowed_hosts.clone(),
        call_timeout,
        audit: AuditConfig {
            path: wire.audit.path.as_ref().map(PathBuf::from),
            include_arguments: wire.audit.include_arguments,
        },
        tool_mode: wire.policy.tool_mode,
        max_risk: wire.policy.max_risk,
        validate_arguments: wire.policy.validate_arguments,
        on_change: wire.policy.on_change,
        require_approval,
        conditions: Arc::new(conditions),
        decision_points: Arc::new(decision_points),
        servers: servers.into_iter().map(|(_, s)| s).collect(),
        gateway,
    };
    Loaded {
        config: Some(config),
        problems,
    }
}

/// Per-server checks, duplicate names and "nothing enabled"; returns the servers that are sound,
/// with their index in the file.
fn check_servers(entries: &[Entry], problems: &mut Vec<Problem>) -> Vec<(usize, Arc<Server>)> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut servers = Vec::with_capacity(entries.len());
    for entry in entries {
        let at = format!("servers[{}]", entry.index);
        if let Some(name) = entry.name.as_deref() {
            if let Some(&first) = seen.get(name) {
                problems.push(Problem::new(
                    Code::DuplicateServer,
                    format!("{at}.name"),
                    format!("{name:?} is already the name of servers[{first}]; server names must be unique"),
                ));
            } else {
                seen.insert(name, entry.index);
            }
        }
        if let Some(spec) = &entry.spec
            && let Some(server) = server(spec, &at, problems)
        {
            servers.push((entry.index, Arc::new(server)));
        }
    }
    // Judged on the file, not on the servers that normalized: a structurally broken entry might
    // be meant as enabled, so it does not count as "nothing enabled".
    let any_startable = entries.iter().any(|e| match &e.spec {
        Some(s) => {
            s.enabled
                && !s
                    .tools
                    .deny
                    .iter()
                    .any(|p| !p.is_empty() && p.chars().all(|c| c == '*'))
        }
        None => true,
    });
    if !any_startable {
        problems.push(Problem::new(
            Code::NothingEnabled,
            "servers",
            "no server is enabled with any tool allowed: the task is offered no MCP tool (every \
             tool revoked); enable a server (enabled: true) whose tools.deny does not deny \
             everything to offer some",
        ));
    }
    servers
}

fn sorted(mut problems: Vec<Problem>) -> Problems {
    // Errors first; otherwise keep file order.
    problems.sort_by_key(|p| !p.is_error());
    Problems(problems)
}

fn server(spec: &ServerSpec, at: &str, problems: &mut Vec<Problem>) -> Option<Server> {
    let before = problems.iter().filter(|p| p.is_error()).count();
    check_server_name(&spec.name, at, problems);

    let transport = match (&spec.stdio, &spec.http) {
        (Some(stdio), None) => {
            if stdio.command.trim().is_empty() {
                problems.push(Problem::new(
                    Code::EmptyCommand,
                    format!("{at}.stdio.command"),
                    "the command to start the server is empty",
                ));
            }
            let mut names: HashMap<&str, &str> = HashMap::new();
            for name in stdio.env.keys() {
                check_env_name(name, &format!("{at}.stdio.env.{name}"), problems);
                names.insert(name, "env");
                if looks_secret(name) && !stdio.env[name].is_empty() {
                    problems.push(Problem::new(
                        Code::LiteralSecret,
                        format!("{at}.stdio.env.{name}"),
                        "this looks like a secret written into the config (a ConfigMap); deliver \
                         it as pod env from a Secret and list its name in passEnv instead",
                    ));
                }
            }
            for (j, name) in stdio.pass_env.iter().enumerate() {
                let path = format!("{at}.stdio.passEnv[{j}]");
                check_env_name(name, &path, problems);
                if let Some(first) = names.insert(name, "passEnv") {
                    problems.push(Problem::new(
                        Code::DuplicateEnv,
                        path,
                        format!("{name:?} is already set by {first}; set each variable once"),
                    ));
                }
            }
            if stdio.cwd.as_deref().is_some_and(|c| c.trim().is_empty()) {
                problems.push(Problem::new(
                    Code::BadPath,
                    format!("{at}.stdio.cwd"),
                    "empty path; leave cwd out to use the proxy's working directory",
                ));
            }
            zone::check_socket(stdio, &format!("{at}.stdio"), problems);
            let mut pass_env = stdio.pass_env.clone();
            pass_env.sort();
            Transport::Stdio(StdioTransport {
                command: stdio.command.clone(),
                args: stdio.args.clone(),
                env: stdio.env.clone(),
                pass_env,
                cwd: stdio.cwd.as_ref().map(PathBuf::from),
                socket: stdio.socket.as_ref().map(PathBuf::from),
                zone_uid: stdio.zone_uid,
                zone_port: stdio.zone_port,
                zone_key: stdio.zone_key.clone(),
            })
        }
        (None, Some(http)) => {
            check_url(&http.url, &format!("{at}.http.url"), problems);
            let from_secret = http
                .headers_from_secret
                .keys()
                .map(|h| (h, "headersFromSecret", None));
            let from_env = http
                .headers_from_env
                .iter()
                .map(|(h, v)| (h, "headersFromEnv", Some(v)));
            for (header, field, var) in from_env.chain(from_secret) {
                let path = format!("{at}.http.{field}.{header}");
                if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    problems.push(Problem::new(
                        Code::BadHeader,
                        path.clone(),
                        format!("{header:?} is not a valid HTTP header name"),
                    ));
                }
                var.inspect(|var| check_env_name(var, &path, problems));
            }
            Transport::Http(HttpTransport {
                url: http.url.clone(),
                headers_from_env: http.headers_from_env.clone(),
                headers_from_secret: http.headers_from_secret.clone(),
            })
        }
        (None, None) => {
            problems.push(Problem::new(
                Code::NoTransport,
                at.to_string(),
                "set how to reach the server: `stdio` (a command) or `http` (a URL)",
            ));
            return None;
        }
        (Some(_), Some(_)) => {
            problems.push(Problem::new(
                Code::TwoTransports,
                at.to_string(),
                "set only one of `stdio` and `http`",
            ));
            return None;
        }
    };

    let filter = match ToolFilter::compile(spec.enabled, &spec.tools.allow, &spec.tools.deny) {
        Ok(f) => Some(f),
        Err(errors) => {
            for e in errors {
                problems.push(Problem::new(
                    Code::BadPattern,
                    format!("{at}.tools.{}[{}]", e.list, e.index),
                    format!("bad glob pattern: {}", e.message),
                ));
            }
            None
        }
    };
    for tool in spec.risk.keys().filter(|t| t.trim().is_empty()) {
        problems.push(Problem::new(
            Code::BadValue,
            format!("{at}.risk.{tool:?}"),
            "an empty tool name; name the upstream tool whose risk class this sets",
        ));
    }
    check_policy(spec, at, problems);
    let definitions = definitions(spec, at, problems);
    let after = problems.iter().filter(|p| p.is_error()).count();
    if after > before {
        return None;
    }
    let spec_hash = SpecHash::of(&transport);
    Some(Server {
        name: ServerName::new(spec.name.as_str()),
        enabled: spec.enabled,
        transport,
        filter: filter?,
        risk: spec.risk.clone(),
        rate_limit: spec.rate_limit.clone(),
        pins: spec.pins.clone(),
        definitions,
        spec_hash,
    })
}

/// A server's pinned definitions (`definitions`): MCP tools, one per name, each hashing to its
/// pin. One that does not is refused with the config: a definition the proxy would list must be
/// the one approved.
fn definitions(
    spec: &ServerSpec,
    at: &str,
    problems: &mut Vec<Problem>,
) -> Option<Arc<Vec<rmcp::model::Tool>>> {
    if spec.definitions.is_empty() {
        return None;
    }
    let mut names = std::collections::BTreeSet::new();
    let mut tools = Vec::with_capacity(spec.definitions.len());
    for (i, value) in spec.definitions.iter().enumerate() {
        let path = format!("{at}.definitions[{i}]");
        let tool = match serde_json::from_value::<rmcp::model::Tool>(value.clone()) {
            Ok(tool) => tool,
            Err(e) => {
                problems.push(Problem::new(
                    Code::BadValue,
                    path,
                    format!("not an MCP tool definition ({e}); write definitions with `orchestrator-cli catalog pin --write`"),
                ));
                continue;
            }
        };
        let hash = orchestrator_crds::policy::definition_hash(&tool);
        let problem = match spec.pins.get(tool.name.as_ref()) {
            _ if !names.insert(tool.name.to_string()) => {
                Some(format!("{:?} is defined more than once", tool.name))
            }
            None => Some(format!(
                "{:?} has a definition but no pin; pins.{:?} must be its hash {hash}",
                tool.name, tool.name
            )),
            Some(pin) if *pin != hash => Some(format!(
                "the definition of {:?} hashes to {hash}, not to its pin {pin}; one of them was edited (`orchestrator-cli catalog pin --write` writes both)",
                tool.name
            )),
            Some(_) => None,
        };
        match problem {
            Some(message) => problems.push(Problem::new(Code::BadValue, path, message)),
            None => tools.push(tool),
        }
    }
    Some(Arc::new(tools))
}

/// A server's rate limits and pins: a burst needs a rate, tool names, the hash format.
fn check_policy(spec: &ServerSpec, at: &str, problems: &mut Vec<Problem>) {
    // Rates and bursts of 0 are refused by the shape check (minimum 1).
    let limits = &spec.rate_limit;
    if limits.per_minute.is_none() && limits.burst.is_some() {
        problems.push(Problem::new(
            Code::BadValue,
            format!("{at}.rateLimit.burst"),
            "a burst without perMinute limits nothing; set rateLimit.perMinute too",
        ));
    }
    let empty_names = limits
        .tools
        .keys()
        .map(|t| (t, "rateLimit.tools"))
        .chain(spec.pins.keys().map(|t| (t, "pins")));
    for (tool, field) in empty_names.filter(|(t, _)| t.trim().is_empty()) {
        problems.push(Problem::new(
            Code::BadValue,
            format!("{at}.{field}.{tool:?}"),
            "an empty tool name; name the upstream tool",
        ));
    }
    for (tool, pin) in spec.pins.iter().filter(|(_, p)| !is_pin(p)) {
        problems.push(Problem::new(
            Code::BadValue,
            format!("{at}.pins.{tool:?}"),
            format!(
                "{:?} is not a definition hash: `sha256:` and 64 lowercase hex digits (see GET /tools or `orchestrator-cli catalog pin`)",
                clip(pin)
            ),
        ));
    }
}

fn check_server_name(name: &str, at: &str, problems: &mut Vec<Problem>) {
    let path = format!("{at}.name");
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let starts_ends_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() || !valid_chars || !starts_ends_ok || name.len() > MAX_SERVER_NAME {
        problems.push(Problem::new(
            Code::BadName,
            path,
            format!(
                "{name:?} is not a usable server name: use 1-{MAX_SERVER_NAME} letters, digits, \
                 '-', '_' or '.', starting and ending with a letter or digit"
            ),
        ));
    } else if name.contains(PREFIX_SEPARATOR) {
        problems.push(Problem::new(
            Code::BadName,
            path,
            format!(
                "{name:?} contains {PREFIX_SEPARATOR:?}, the separator of exposed tool names \
                 (<server>{PREFIX_SEPARATOR}<tool>); rename it"
            ),
        ));
    }
}

/// With `toolPrefix: none`, two servers that could expose the same tool name are refused now,
/// not discovered at runtime. Provably disjoint means: both have allow lists of literal names
/// with no name in common.
fn check_unprefixed_collisions(
    startable: &[&Arc<Server>],
    index_of: impl Fn(&ServerName) -> usize,
    problems: &mut Vec<Problem>,
) {
    for (a_pos, a) in startable.iter().enumerate() {
        for b in &startable[a_pos + 1..] {
            let at = format!("servers[{}]", index_of(&b.name));
            match (a.filter.literal_allow_list(), b.filter.literal_allow_list()) {
                (Some(la), Some(lb)) => {
                    let common: Vec<&str> = la.iter().copied().filter(|n| lb.contains(n)).collect();
                    if !common.is_empty() {
                        problems.push(Problem::new(
                            Code::NameCollision,
                            format!("{at}.tools.allow"),
                            format!(
                                "with toolPrefix: none, servers {:?} and {:?} would both expose {}; \
                                 allow each name on one server only, or use toolPrefix: server",
                                a.name.as_str(),
                                b.name.as_str(),
                                common.join(", ")
                            ),
                        ));
                    }
                }
                _ => problems.push(Problem::new(
                    Code::NameCollision,
                    "toolPrefix",
                    format!(
                        "with toolPrefix: none, servers {:?} and {:?} may expose the same tool \
                         name; use toolPrefix: server, or give both a tools.allow list of \
                         literal, disjoint names",
                        a.name.as_str(),
                        b.name.as_str()
                    ),
                )),
            }
        }
    }
}

fn check_env_name(name: &str, path: &str, problems: &mut Vec<Problem>) {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        problems.push(Problem::new(
            Code::BadEnvName,
            path.to_string(),
            format!("{name:?} is not a usable environment variable name (letters, digits, '_', '.', '-'; not starting with a digit)"),
        ));
    }
}

fn check_url(url: &str, path: &str, problems: &mut Vec<Problem>) {
    let ok = url
        .parse::<http::Uri>()
        .ok()
        .is_some_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
    if !ok {
        problems.push(Problem::new(
            Code::BadUrl,
            path.to_string(),
            format!("{url:?} is not an absolute http:// or https:// URL"),
        ));
    }
}

fn is_host_or_authority(host: &str) -> bool {
    !host.is_empty()
        && !host.contains("://")
        && !host.contains('/')
        && format!("http://{host}/")
            .parse::<http::Uri>()
            .is_ok_and(|u| u.host().is_some())
}

fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "API_KEY",
        "APIKEY",
        "PRIVATE_KEY",
        "CREDENTIAL",
    ]
    .iter()
    .any(|w| upper.contains(w))
}
