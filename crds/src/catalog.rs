//! The catalog: the MCP servers a TaskRun may name, how to start them, the env they need (and
//! from which Secret key), and, where known, their tools. The operator loads it from a ConfigMap
//! (key [`CATALOG_KEY`]) that the Helm chart creates; the CLI reads the same ConfigMap.
//!
//! [`Catalog::parse`] is strict: unknown keys are refused with the path of the field, and every
//! semantic problem is reported at once, each with a stable code (`CATALOG.*`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The ConfigMap key holding the catalog YAML.
pub const CATALOG_KEY: &str = "catalog.yaml";
/// The namespace of the catalog ConfigMap unless told otherwise: the default of the operator's
/// `--catalog-namespace` and of the CLI's (env `ORCH_CATALOG_NAMESPACE` for both).
pub const DEFAULT_CONFIG_MAP_NAMESPACE: &str = "orchestrator-system";
/// The name of the catalog ConfigMap unless told otherwise: the default of the operator's
/// `--catalog-name` and of the CLI's (env `ORCH_CATALOG_NAME` for both).
pub const DEFAULT_CONFIG_MAP_NAME: &str = "orchestrator-catalog";

/// The whole catalog.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Catalog {
    /// The known servers; names are unique.
    #[serde(default)]
    pub servers: Vec<CatalogServer>,
}

/// One known MCP server.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogServer {
    /// The name TaskRuns use (a DNS-1123 label); also the prefix of its exposed tools.
    pub name: String,
    /// What the server is for.
    #[serde(default)]
    pub description: String,
    /// Run it in its own container of the task pod (its zone), speaking MCP over stdio; the
    /// proxy starts its process on first use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdio: Option<CatalogStdio>,
    /// Reach it over streamable HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<CatalogHttp>,
    /// Env vars whose values come from a Secret, through `secretKeyRef` (never the ConfigMap):
    /// env of the server's own container for a stdio server, of the proxy for an HTTP one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<SecretEnv>,
    /// The server's tools, where known (for the CLI, status and documentation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<CatalogTool>,
}

/// How to start a stdio server.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogStdio {
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Literal, non-secret environment of the server's container (secrets go in `secretEnv`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory of the server (default: `/workspace` when it has the workspace,
    /// else its own `/tmp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// What the server's container may do with the task's `/workspace`, the directory the agent
    /// works in: `none` (the default: not mounted), `readOnly` or `readWrite`. Everything the
    /// agent writes there is the agent's: a server given the workspace reads files a
    /// prompt-injected agent may have shaped.
    #[serde(default, skip_serializing_if = "is_default")]
    pub workspace: WorkspaceAccess,
}

/// A stdio server's access to the task's `/workspace`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum WorkspaceAccess {
    /// Not mounted.
    #[default]
    None,
    /// Mounted read-only.
    ReadOnly,
    /// Mounted read-write.
    ReadWrite,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// How to reach an HTTP server.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogHttp {
    pub url: String,
    /// Header name -> the `secretEnv` entry holding its value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers_from_env: BTreeMap<String, String>,
    /// The server's tool list does not depend on the credential: tasks served by the shared
    /// proxy that name this server share its tool-list cache and connection pool (each request
    /// still carries its own task's credential). Default false: nothing is shared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shareable: bool,
}

/// An env var a server needs from a Secret.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretEnv {
    /// The variable's name.
    pub name: String,
    /// What it must hold.
    #[serde(default)]
    pub description: String,
    /// The Secret (in the TaskRun's namespace) it comes from unless the TaskRun says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// The key in that Secret.
    pub secret_key: String,
    /// The server works without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A tool a server is known to offer.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// A coarse grouping, e.g. `read`, `write`, `issues`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// The tool's risk class (`read`, `write`, `destructive`), instead of what the server's
    /// annotations say (for a server that gives none, or wrong ones); a TaskRun's server `risk`
    /// overrides it in turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<crate::tools::Risk>,
    /// The hash of the tool's definition as approved (`sha256:<hex>`, from `orchestrator-cli
    /// catalog pin`): a server offering a different definition has it quarantined or reported,
    /// per the TaskRun's `policy.onChange`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
    /// The tool's full definition as the server listed it when pinned (the MCP `Tool` object:
    /// name, title, description, inputSchema, outputSchema, annotations, `_meta`), written by
    /// `orchestrator-cli catalog pin --write`; needs `pin`, which must be its hash. When every
    /// tool of a server has one, a task's proxy lists the server's tools from these without
    /// starting it, and the server's own list is held to them (a tool it adds is a changed
    /// definition too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<serde_json::Value>,
}

impl CatalogServer {
    /// The server's pinned definitions, when every listed tool has one (and there is a tool):
    /// what the proxy lists for it before it starts. `None` otherwise.
    pub fn pinned_definitions(&self) -> Option<Vec<serde_json::Value>> {
        if self.tools.is_empty() {
            return None;
        }
        self.tools
            .iter()
            .map(|t| t.pin.as_ref().and(t.definition.clone()))
            .collect()
    }
}

/// One thing wrong with a catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Stable code, e.g. `CATALOG.DUPLICATE_SERVER`.
    pub code: &'static str,
    /// Where, e.g. `servers[2].name`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: {}", self.code, self.path, self.message)
    }
}

/// Every problem found in a catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid catalog ({} problem", self.problems.len())?;
        if self.problems.len() != 1 {
            write!(f, "s")?;
        }
        write!(f, ")")?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CatalogError {}

impl Catalog {
    /// Parses and validates catalog YAML, reporting every problem at once.
    pub fn parse(yaml: &str) -> Result<Catalog, CatalogError> {
        let catalog: Catalog = serde_saphyr::from_str(yaml).map_err(|e| CatalogError {
            problems: vec![Problem {
                code: "CATALOG.PARSE",
                path: "catalog.yaml".into(),
                message: e.to_string(),
            }],
        })?;
        let problems = catalog.problems();
        if problems.is_empty() {
            Ok(catalog)
        } else {
            Err(CatalogError { problems })
        }
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&CatalogServer> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// The names of all entries, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.servers.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names
    }

    /// Semantic checks (the parser already refused unknown keys and wrong types).
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            let at = |field: &str| format!("servers[{i}]{field}");
            if !is_dns1123_label(&s.name) {
                out.push(Problem {
                    code: "CATALOG.BAD_NAME",
                    path: at(".name"),
                    message: format!(
                        "{:?} is not a DNS-1123 label (lowercase letters, digits, '-'; at most 63)",
                        s.name
                    ),
                });
            }
            if !seen.insert(s.name.as_str()) {
                out.push(Problem {
                    code: "CATALOG.DUPLICATE_SERVER",
                    path: at(".name"),
                    message: format!("server {:?} is listed more than once", s.name),
                });
            }
            match (&s.stdio, &s.http) {
                (None, None) => out.push(Problem {
                    code: "CATALOG.NO_TRANSPORT",
                    path: at(""),
                    message: "set one of `stdio` or `http`".into(),
                }),
                (Some(_), Some(_)) => out.push(Problem {
                    code: "CATALOG.TWO_TRANSPORTS",
                    path: at(""),
                    message: "set only one of `stdio` or `http`".into(),
                }),
                _ => {}
            }
            if let Some(stdio) = &s.stdio {
                if stdio.command.trim().is_empty() {
                    out.push(Problem {
                        code: "CATALOG.EMPTY_COMMAND",
                        path: at(".stdio.command"),
                        message: "the command to start the server is empty".into(),
                    });
                }
                if let Some(cwd) = &stdio.cwd {
                    let in_workspace = cwd == "/workspace" || cwd.starts_with("/workspace/");
                    if !cwd.starts_with('/') {
                        out.push(Problem {
                            code: "CATALOG.BAD_CWD",
                            path: at(".stdio.cwd"),
                            message: format!("{cwd:?} is not an absolute path"),
                        });
                    } else if in_workspace && stdio.workspace == WorkspaceAccess::None {
                        out.push(Problem {
                            code: "CATALOG.CWD_NOT_MOUNTED",
                            path: at(".stdio.cwd"),
                            message: format!(
                                "{cwd:?} is in /workspace, which this server's container does not have; set `workspace: readOnly` or `readWrite`"
                            ),
                        });
                    }
                }
                for name in stdio.env.keys() {
                    if !is_env_name(name) {
                        out.push(Problem {
                            code: "CATALOG.BAD_ENV_NAME",
                            path: at(&format!(".stdio.env.{name}")),
                            message: format!("{name:?} is not an environment variable name"),
                        });
                    }
                    if s.secret_env.iter().any(|e| &e.name == name) {
                        out.push(Problem {
                            code: "CATALOG.DUPLICATE_ENV",
                            path: at(&format!(".stdio.env.{name}")),
                            message: format!("{name} is both a literal and a secretEnv variable"),
                        });
                    }
                }
            }
            if let Some(http) = &s.http {
                if !(http.url.starts_with("http://") || http.url.starts_with("https://")) {
                    out.push(Problem {
                        code: "CATALOG.BAD_URL",
                        path: at(".http.url"),
                        message: format!("{:?} is not an http:// or https:// URL", http.url),
                    });
                }
                for (header, env) in &http.headers_from_env {
                    if !s.secret_env.iter().any(|e| &e.name == env) {
                        out.push(Problem {
                            code: "CATALOG.UNDECLARED_HEADER_ENV",
                            path: at(&format!(".http.headersFromEnv.{header}")),
                            message: format!("{env} is not declared in this server's secretEnv"),
                        });
                    }
                }
            }
            let mut envs = BTreeSet::new();
            for (j, e) in s.secret_env.iter().enumerate() {
                if !is_env_name(&e.name) {
                    out.push(Problem {
                        code: "CATALOG.BAD_ENV_NAME",
                        path: at(&format!(".secretEnv[{j}].name")),
                        message: format!("{:?} is not an environment variable name", e.name),
                    });
                }
                if !envs.insert(e.name.as_str()) {
                    out.push(Problem {
                        code: "CATALOG.DUPLICATE_ENV",
                        path: at(&format!(".secretEnv[{j}].name")),
                        message: format!("{} is listed more than once", e.name),
                    });
                }
                if e.secret_key.is_empty() {
                    out.push(Problem {
                        code: "CATALOG.EMPTY_SECRET_KEY",
                        path: at(&format!(".secretEnv[{j}].secretKey")),
                        message: "name the key of the Secret that holds the value".into(),
                    });
                }
            }
            let mut tools = BTreeSet::new();
            for (j, t) in s.tools.iter().enumerate() {
                if t.name.is_empty() || !tools.insert(t.name.as_str()) {
                    out.push(Problem {
                        code: "CATALOG.DUPLICATE_TOOL",
                        path: at(&format!(".tools[{j}].name")),
                        message: format!("tool {:?} is empty or listed more than once", t.name),
                    });
                }
                if let Some(pin) = t.pin.as_deref().filter(|p| !crate::policy::is_pin(p)) {
                    out.push(Problem {
                        code: "CATALOG.BAD_PIN",
                        path: at(&format!(".tools[{j}].pin")),
                        message: format!(
                            "{pin:?} is not a definition hash: `sha256:` and 64 lowercase hex digits, as `orchestrator-cli catalog pin` prints"
                        ),
                    });
                }
                if let Some(definition) = &t.definition {
                    out.extend(
                        definition_problems(&t.name, t.pin.as_deref(), definition).map(
                            |(code, message)| Problem {
                                code,
                                path: at(&format!(".tools[{j}].definition")),
                                message,
                            },
                        ),
                    );
                }
            }
        }
        out
    }
}

/// What is wrong with a tool's stored `definition`: not a tool object of that name, or not what
/// its `pin` names.
fn definition_problems(
    name: &str,
    pin: Option<&str>,
    definition: &serde_json::Value,
) -> Option<(&'static str, String)> {
    const FIX: &str = "write it with `orchestrator-cli catalog pin SERVER --write CATALOG`, which stores the definition the server lists and its hash";
    let Some(object) = definition.as_object() else {
        return Some((
            "CATALOG.BAD_DEFINITION",
            format!("the definition of {name:?} is not an MCP Tool object; {FIX}"),
        ));
    };
    if object.get("name").and_then(|n| n.as_str()) != Some(name)
        || !object.get("inputSchema").is_some_and(|s| s.is_object())
    {
        return Some((
            "CATALOG.BAD_DEFINITION",
            format!(
                "the definition of {name:?} must have \"name\": {name:?} and an inputSchema object; {FIX}"
            ),
        ));
    }
    let hash = crate::policy::definition_hash(definition);
    match pin {
        None => Some((
            "CATALOG.DEFINITION_WITHOUT_PIN",
            format!("the definition of {name:?} has no pin; add pin: {hash:?} or {FIX}"),
        )),
        Some(pin) if pin != hash => Some((
            "CATALOG.DEFINITION_PIN_MISMATCH",
            format!(
                "the definition of {name:?} hashes to {hash}, not to its pin {pin}: one of them was edited; {FIX}"
            ),
        )),
        Some(_) => None,
    }
}

/// A DNS-1123 label: what Kubernetes requires of most names.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A portable environment variable name.
pub fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests;
