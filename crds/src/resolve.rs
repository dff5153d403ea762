//! Resolves a TaskRun's `toolConfig` against the catalog: which catalog entry each server is,
//! where each env var it needs comes from, and everything that is wrong with it (each problem
//! with the condition reason the status will carry); and which Secret keys the proxy masks
//! ([`mask_keys`]). Pure. The operator renders from it, and `orchestrator-cli task validate`
//! runs the same checks before a TaskRun is applied.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;

use crate::catalog::{Catalog, CatalogServer};
use crate::condition;
use crate::taskrun::{McpServer, TaskRunSpec, ToolPolicy, permission_rules};
use crate::tools::ToolFilter;

/// One thing the operator cannot accept in a TaskRun (the API server could not judge it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The condition reason, e.g. `UnknownServer`.
    pub reason: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A server of the task matched with its catalog entry.
#[derive(Clone, Debug)]
pub struct ResolvedServer<'a> {
    pub spec: &'a McpServer,
    pub entry: &'a CatalogServer,
}

/// An env var of the proxy container that comes from a Secret key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretBinding {
    pub env: String,
    pub secret: String,
    pub key: String,
    /// The pod may start without it: the server is disabled or the catalog marks it optional.
    pub optional: bool,
    /// The servers that need it.
    pub servers: Vec<String>,
}

/// The resolved tool configuration.
#[derive(Clone, Debug)]
pub struct Resolved<'a> {
    pub servers: Vec<ResolvedServer<'a>>,
    /// Sorted by env name; one binding per env var.
    pub secrets: Vec<SecretBinding>,
}

/// Matches every server against the catalog and reports all problems at once.
pub fn resolve<'a>(
    spec: &'a TaskRunSpec,
    catalog: &'a Catalog,
) -> Result<Resolved<'a>, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut servers = Vec::new();
    let unknown: Vec<&str> = spec
        .tool_config
        .mcp_servers
        .iter()
        .filter(|s| catalog.get(&s.name).is_none())
        .map(|s| s.name.as_str())
        .collect();
    if !unknown.is_empty() {
        problems.push(Problem {
            reason: "UnknownServer",
            message: format!(
                "spec.toolConfig.mcpServers names {} not in the catalog; known servers: {}",
                quoted(&unknown),
                catalog.names().join(", ")
            ),
        });
    }
    let mut bindings: BTreeMap<String, SecretBinding> = BTreeMap::new();
    for server in &spec.tool_config.mcp_servers {
        let Some(entry) = catalog.get(&server.name) else {
            continue;
        };
        if let Err(errors) =
            ToolFilter::compile(server.enabled, &server.tools.allow, &server.tools.deny)
        {
            for e in errors {
                problems.push(Problem {
                    reason: "BadPattern",
                    message: format!(
                        "spec.toolConfig.mcpServers[{}].tools.{}[{}]: pattern {:?} is not a valid glob: {}",
                        server.name, e.list, e.index, e.pattern, e.message
                    ),
                });
            }
        }
        for r in &server.secret_refs {
            if !entry.secret_env.iter().any(|e| e.name == r.env) {
                let declared: Vec<&str> =
                    entry.secret_env.iter().map(|e| e.name.as_str()).collect();
                problems.push(Problem {
                    reason: "UnknownSecretEnv",
                    message: format!(
                        "spec.toolConfig.mcpServers[{}].secretRefs: {} is not an env var the catalog lists for {} (it lists: {})",
                        server.name,
                        r.env,
                        server.name,
                        if declared.is_empty() { "none".to_string() } else { declared.join(", ") }
                    ),
                });
            }
        }
        for need in &entry.secret_env {
            let chosen = server.secret_refs.iter().find(|r| r.env == need.name);
            let (secret, key) = match (chosen, &need.secret_name) {
                (Some(r), _) => (
                    r.name.clone(),
                    r.key.clone().unwrap_or_else(|| need.secret_key.clone()),
                ),
                (None, Some(default)) => (default.clone(), need.secret_key.clone()),
                (None, None) if need.optional => continue,
                (None, None) => {
                    problems.push(Problem {
                        reason: "MissingSecretRef",
                        message: format!(
                            "server {} needs env {} from a Secret and the catalog names no default; add secretRefs: [{{env: {}, name: <secret>}}] (key defaults to {:?})",
                            server.name, need.name, need.name, need.secret_key
                        ),
                    });
                    continue;
                }
            };
            let optional = need.optional || !server.enabled;
            match bindings.get_mut(&need.name) {
                Some(b) if b.secret == secret && b.key == key => {
                    b.optional &= optional;
                    b.servers.push(server.name.clone());
                }
                Some(b) => problems.push(Problem {
                    reason: "SecretEnvConflict",
                    message: format!(
                        "env {} would come from Secret {}/{} for {} and from {}/{} for {}; the proxy has one environment, so point both at the same Secret key",
                        need.name, b.secret, b.key, b.servers.join(", "), secret, key, server.name
                    ),
                }),
                None => {
                    bindings.insert(
                        need.name.clone(),
                        SecretBinding {
                            env: need.name.clone(),
                            secret,
                            key,
                            optional,
                            servers: vec![server.name.clone()],
                        },
                    );
                }
            }
        }
        servers.push(ResolvedServer {
            spec: server,
            entry,
        });
    }
    problems.extend(spec_problems(spec));
    if problems.is_empty() {
        Ok(Resolved {
            servers,
            secrets: bindings.into_values().collect(),
        })
    } else {
        Err(problems)
    }
}

/// The problems of a TaskRun that need no catalog: its permission rules, CEL conditions and
/// decision point (the checks `task validate --offline` can still run).
pub fn spec_problems(spec: &TaskRunSpec) -> Vec<Problem> {
    let mut problems = Vec::new();
    // The CRD refuses these at admission; a TaskRun stored under an older CRD (Helm does not
    // upgrade CRDs) is refused here, before the agent could skip the rule and leave a tool on.
    let permissions = &spec.tool_config.internal_tools.permissions;
    for (field, list, rules) in [
        ("allow", permission_rules::List::Allow, &permissions.allow),
        ("deny", permission_rules::List::Deny, &permissions.deny),
    ] {
        for problem in rules
            .iter()
            .filter_map(|r| permission_rules::problem(r, list))
        {
            problems.push(Problem {
                reason: "InvalidPermissionRule",
                message: format!("spec.toolConfig.internalTools.permissions.{field}: {problem}"),
            });
        }
    }
    // CEL has no admission-time parser in the API server: the operator checks each condition
    // (`orchestrator-cli task validate` runs the same check).
    for (at, message) in condition::problems(
        &spec.tool_config.policy.conditions,
        "spec.toolConfig.policy.conditions",
    ) {
        problems.push(Problem {
            reason: "InvalidCondition",
            message: format!("{at}: {message}"),
        });
    }
    if let Some(point) = &spec.tool_config.policy.decision_point {
        for (at, message) in point.problems("spec.toolConfig.policy.decisionPoint") {
            problems.push(Problem {
                reason: "InvalidDecisionPoint",
                message: format!("{at}: {message}"),
            });
        }
    }
    problems
}

/// A Secret key whose value the proxy masks in the calls it shows for approval.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaskKey {
    pub secret: String,
    pub key: String,
    /// The pod may start without it (every binding of it is optional).
    pub optional: bool,
}

/// Every Secret key the task's pod gets, whichever container gets it: the servers' Secret env
/// (HTTP and stdio alike) and the agent's `env[].valueFrom.secretKeyRef`. The proxy masks their
/// values in what it shows an approver (the values an agent could pass in a call); sorted, one
/// each (required when any binding requires it).
pub fn mask_keys(secrets: &[SecretBinding], agent_env: &[EnvVar]) -> Vec<MaskKey> {
    let agent = agent_env
        .iter()
        .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        .map(|r| (r.name.clone(), r.key.clone(), r.optional.unwrap_or(false)));
    let servers = secrets
        .iter()
        .map(|b| (b.secret.clone(), b.key.clone(), b.optional));
    let mut keys: BTreeMap<(String, String), bool> = BTreeMap::new();
    for (secret, key, optional) in servers.chain(agent) {
        *keys.entry((secret, key)).or_insert(true) &= optional;
    }
    keys.into_iter()
        .map(|((secret, key), optional)| MaskKey {
            secret,
            key,
            optional,
        })
        .collect()
}

/// The catalog's known tools a server's patterns expose (deny wins; empty allow allows all)
/// and the policy's `maxRisk` lets through, by the classes the catalog and the TaskRun give (a
/// tool with neither is decided by the server's annotations, which only the proxy sees: it is
/// counted here), or `None` when the catalog does not list the server's tools.
pub fn exposed_tools(server: &ResolvedServer<'_>, policy: &ToolPolicy) -> Option<Vec<String>> {
    if server.entry.tools.is_empty() {
        return None;
    }
    // Bad patterns were reported by `resolve`; here they would only hide tools.
    let filter =
        ToolFilter::compile(true, &server.spec.tools.allow, &server.spec.tools.deny).ok()?;
    Some(
        server
            .entry
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .filter(|name| {
                filter.exposes(name)
                    && policy.admits(server.spec.known_risk(name, Some(server.entry)))
            })
            .map(str::to_string)
            .collect(),
    )
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
