//! The exposed tool table: which upstream server and tool each exposed name routes to, built from
//! the config and the tool lists known so far. A [`Router`] is immutable; a config reload or a new
//! tool list builds a new one that replaces the old one atomically.

use std::{collections::HashMap, sync::Arc};

use orchestrator_crds::proxy::{OnChange, PREFIX_SEPARATOR, Risk, ToolPrefix};
use rmcp::model::{JsonObject, Tool};

use crate::{
    config::{Config, Server},
    filter::{Rule, Verdict},
    names::{ExposedToolName, ServerName, ToolName},
    policy::{
        definitions::{Change, DefinitionHash, KnownList},
        refusal::Target,
    },
};

/// Where an exposed tool goes.
#[derive(Clone, Debug)]
pub struct Route {
    pub server: Arc<Server>,
    pub tool: ToolName,
    pub risk: Risk,
    /// The hash of the tool's definition (keys its compiled input schema).
    pub definition: DefinitionHash,
    pub input_schema: Arc<JsonObject>,
    /// What the server's annotations say, for intent mode's check (the class above also
    /// follows a `risk` override).
    pub hints: Hints,
}

impl Route {
    /// The tool, as a refusal of a call to it names it.
    pub fn target(&self) -> Target {
        Target {
            server: self.server.name.clone(),
            tool: self.tool.as_str().to_string(),
            risk: Some(self.risk),
            listed: Some(true),
        }
    }
}

/// A tool's `readOnlyHint` and `destructiveHint`, as its server gave them (`None`: not said).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
}

impl Hints {
    pub fn of(tool: &Tool) -> Self {
        let annotations = tool.annotations.as_ref();
        Self {
            read_only: annotations.and_then(|a| a.read_only_hint),
            destructive: annotations.and_then(|a| a.destructive_hint),
        }
    }
}

/// One upstream tool known to the proxy, with its verdict (for `GET /tools`).
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownTool {
    pub server: ServerName,
    pub tool: ToolName,
    /// The name clients see, when exposed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exposed_as: Option<ExposedToolName>,
    /// Its risk class (see `Server::risk_of`).
    pub risk: Risk,
    /// The hash of its definition (what a server's `pins` name).
    pub definition: DefinitionHash,
    /// How the definition differs from its pin or the first one seen, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub definition_change: Option<Change>,
    pub verdict: Verdict,
}

/// A tool whose definition is not the approved one, and what the policy does about it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DefinitionChange {
    pub server: ServerName,
    pub tool: ToolName,
    pub change: Change,
    pub on_change: OnChange,
}

/// The answer to "where does this exposed name go?".
#[derive(Debug)]
pub enum Lookup<'a> {
    /// Exposed: forward to this route.
    Routed(&'a Route),
    /// A tool the upstream has, hidden by a rule.
    Denied {
        server: ServerName,
        tool: ToolName,
        rule: Rule,
        /// Its risk class, when its server's list is known.
        risk: Option<Risk>,
    },
    /// Would be decided by these servers' tool lists, which are not known yet.
    NeedsLists(Vec<Arc<Server>>),
    /// No such tool.
    Unknown,
}

/// An immutable snapshot of the exposed tool table.
#[derive(Debug, Default)]
pub struct Router {
    tools: Arc<Vec<Tool>>,
    routes: HashMap<ExposedToolName, Route>,
    known: Vec<KnownTool>,
    changes: Vec<DefinitionChange>,
    prefix: ToolPrefix,
    /// Servers that are startable and whose list is not known.
    missing: Vec<Arc<Server>>,
    /// Servers whose list is the other revision's, until this revision's is known.
    borrowed: Vec<Arc<Server>>,
    servers: Vec<Arc<Server>>,
}

/// The exposed name of an upstream tool.
pub fn exposed_name(prefix: ToolPrefix, server: &ServerName, tool: &str) -> ExposedToolName {
    match prefix {
        ToolPrefix::Server => ExposedToolName::new(format!("{server}{PREFIX_SEPARATOR}{tool}")),
        ToolPrefix::None => ExposedToolName::new(tool),
    }
}

impl Router {
    /// Builds the table from `config` and the tool lists known per server. `lists` may miss
    /// servers (not started yet); those are reported by [`Router::missing_lists`].
    pub fn build(config: &Config, lists: &HashMap<ServerName, KnownList>) -> Router {
        let mut tools = Vec::new();
        let mut routes = HashMap::new();
        let mut known = Vec::new();
        let mut changes = Vec::new();
        let mut missing = Vec::new();
        for server in &config.servers {
            let Some(list) = lists.get(&server.name) else {
                if server.is_startable() {
                    missing.push(server.clone());
                }
                continue;
            };
            for (tool, seen) in list.tools.iter().zip(list.seen.iter()) {
                let risk = server.risk_of(tool);
                let change = Change::of(server, &tool.name, seen);
                let verdict = match (server.filter.verdict(&tool.name), config.max_risk) {
                    (Verdict::Allowed { .. }, Some(max_risk)) if risk > max_risk => {
                        Verdict::Denied {
                            rule: Rule::AboveMaxRisk { risk, max_risk },
                        }
                    }
                    (verdict, _) => verdict,
                };
                let verdict = match (verdict, &change, config.on_change) {
                    (Verdict::Allowed { .. }, Some(change), OnChange::Block) => Verdict::Denied {
                        rule: Rule::DefinitionChanged {
                            what: change.describe(server.name.as_str(), &tool.name),
                        },
                    },
                    (verdict, ..) => verdict,
                };
                if let Some(change) = &change {
                    changes.push(DefinitionChange {
                        server: server.name.clone(),
                        tool: ToolName::new(tool.name.as_ref()),
                        change: change.clone(),
                        on_change: config.on_change,
                    });
                }
                let name = exposed_name(config.tool_prefix, &server.name, &tool.name);
                let exposed = verdict.is_allowed() && !routes.contains_key(&name);
                if verdict.is_allowed() && !exposed {
                    // Load-time validation makes this unreachable; keep the first, say so.
                    tracing::error!(tool = %name, server = %server.name, "exposed tool name collision; keeping the first");
                }
                if exposed {
                    let mut visible = tool.clone();
                    visible.name = name.as_str().to_string().into();
                    tools.push(visible);
                    routes.insert(
                        name.clone(),
                        Route {
                            server: server.clone(),
                            tool: ToolName::new(tool.name.as_ref()),
                            risk,
                            definition: seen.hash.clone(),
                            input_schema: tool.input_schema.clone(),
                            hints: Hints::of(tool),
                        },
                    );
                }
                known.push(KnownTool {
                    server: server.name.clone(),
                    tool: ToolName::new(tool.name.as_ref()),
                    exposed_as: exposed.then_some(name),
                    risk,
                    definition: seen.hash.clone(),
                    definition_change: change,
                    verdict,
                });
            }
        }
        Router {
            tools: Arc::new(tools),
            routes,
            known,
            changes,
            prefix: config.tool_prefix,
            missing,
            borrowed: Vec::new(),
            servers: config.servers.clone(),
        }
    }

    /// The same table, noting that the lists of `servers` are borrowed from the other
    /// revision: a name they do not list may still be theirs.
    pub fn with_borrowed(mut self, servers: Vec<Arc<Server>>) -> Self {
        self.borrowed = servers;
        self
    }

    /// The exposed tools, ready for `tools/list`.
    pub fn tools(&self) -> Arc<Vec<Tool>> {
        self.tools.clone()
    }

    /// Every upstream tool known so far, exposed or not.
    pub fn known(&self) -> &[KnownTool] {
        &self.known
    }

    /// Tools whose definition is not the approved one (hidden under `onChange: block`).
    pub fn changes(&self) -> &[DefinitionChange] {
        &self.changes
    }

    /// Startable servers whose tool list is not known yet.
    pub fn missing_lists(&self) -> &[Arc<Server>] {
        &self.missing
    }

    pub fn route(&self, exposed: &str) -> Option<&Route> {
        self.routes.get(exposed)
    }

    /// Whether an upstream listed `exposed` (on offer or not). Only such names, never a name a
    /// client made up, become metric labels.
    pub fn is_listed(&self, exposed: &str) -> bool {
        self.routes.contains_key(exposed) || self.known_tool(exposed).is_some()
    }

    fn known_tool(&self, exposed: &str) -> Option<&KnownTool> {
        self.known
            .iter()
            .find(|k| exposed_name(self.prefix, &k.server, k.tool.as_str()).as_str() == exposed)
    }

    /// Servers whose list a session of this table's revision needs fetched before it is
    /// answered: unknown ones, and ones whose list is borrowed from the other revision.
    pub fn lists_to_fetch(&self) -> Vec<Arc<Server>> {
        self.missing.iter().chain(&self.borrowed).cloned().collect()
    }

    /// Decides where an exposed name goes, or why it goes nowhere.
    pub fn lookup(&self, exposed: &str) -> Lookup<'_> {
        if let Some(route) = self.routes.get(exposed) {
            // From the other revision's list: this revision's own decides first.
            if let Some(borrowed) = self.borrowed.iter().find(|s| s.name == route.server.name) {
                return Lookup::NeedsLists(vec![borrowed.clone()]);
            }
            return Lookup::Routed(route);
        }
        if let Some(k) = self.known_tool(exposed) {
            return Lookup::Denied {
                server: k.server.clone(),
                tool: k.tool.clone(),
                rule: k.verdict.rule().clone(),
                risk: Some(k.risk),
            };
        }
        // The name may belong to a server whose list is not known yet.
        let candidates: Vec<Arc<Server>> = match self.prefix {
            ToolPrefix::Server => {
                let Some((server, tool)) = exposed.split_once(PREFIX_SEPARATOR) else {
                    return Lookup::Unknown;
                };
                let Some(s) = self.servers.iter().find(|s| s.name.as_str() == server) else {
                    return Lookup::Unknown;
                };
                let verdict = s.filter.verdict(tool);
                if !verdict.is_allowed() {
                    // Refuse without starting the server: the rule decides whatever its list says.
                    return Lookup::Denied {
                        server: s.name.clone(),
                        tool: ToolName::new(tool),
                        rule: verdict.rule().clone(),
                        risk: None,
                    };
                }
                let mut candidates = self.lists_to_fetch();
                candidates.retain(|m| m.name == s.name);
                candidates
            }
            ToolPrefix::None => {
                let mut candidates = self.lists_to_fetch();
                candidates.retain(|m| m.filter.verdict(exposed).is_allowed());
                candidates
            }
        };
        if candidates.is_empty() {
            Lookup::Unknown
        } else {
            Lookup::NeedsLists(candidates)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
