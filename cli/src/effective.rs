//! The tools an agent actually sees for a `toolConfig`, per server, and the difference between
//! two configs (what add-context prints as "before → after"). Pure.
//!
//! Where the catalog lists a server's tools, the effective set is the listed tools (plus any
//! tool named literally in the server's patterns) that pass the filter, with the sidecar's
//! semantics: a disabled server exposes nothing, deny wins, an empty allow list allows all.
//! Where it does not, and the allow list is not a plain list of names, the set cannot be known
//! without asking the server, so the patterns are shown instead.

use std::collections::{BTreeMap, BTreeSet};

use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::{McpServer, ToolConfig};
use serde::Serialize;

use orchestrator_crds::tools::ToolFilter;

use crate::toolspec::is_literal;

/// What one server exposes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum ServerTools {
    /// Switched off (`enabled: false`) or not in the task.
    Off,
    /// These tools, by name.
    Tools { tools: BTreeSet<String> },
    /// The tool names are unknown; these patterns decide.
    Patterns {
        allow: Vec<String>,
        deny: Vec<String>,
    },
}

impl ServerTools {
    /// How many tools, when known (`Off` is 0).
    pub fn count(&self) -> Option<usize> {
        match self {
            ServerTools::Off => Some(0),
            ServerTools::Tools { tools } => Some(tools.len()),
            ServerTools::Patterns { .. } => None,
        }
    }

    /// A short description: `off`, `3 tools`, `allow *; deny x`.
    pub fn summary(&self) -> String {
        match self {
            ServerTools::Off => "off".into(),
            ServerTools::Tools { tools } if tools.len() == 1 => "1 tool".into(),
            ServerTools::Tools { tools } => format!("{} tools", tools.len()),
            ServerTools::Patterns { allow, deny } => patterns_summary(allow, deny),
        }
    }
}

/// `allow a, b; deny c` (an empty allow list reads `allow all`).
pub fn patterns_summary(allow: &[String], deny: &[String]) -> String {
    let mut out = if allow.is_empty() {
        "allow all".to_string()
    } else {
        format!("allow {}", allow.join(", "))
    };
    if !deny.is_empty() {
        out.push_str(&format!("; deny {}", deny.join(", ")));
    }
    out
}

/// Effective tools of every server named in the config, by server name.
pub type Effective = BTreeMap<String, ServerTools>;

/// The effective tools of `config`. `extra` adds tool names to a server's known universe (used
/// by [`diff`] so that names appearing only in the other config line up).
pub fn effective(
    config: &ToolConfig,
    catalog: Option<&Catalog>,
    extra: &BTreeMap<String, BTreeSet<String>>,
) -> Effective {
    config
        .mcp_servers
        .iter()
        .map(|s| {
            let entry = catalog.and_then(|c| c.get(&s.name));
            let listed: BTreeSet<String> = entry
                .map(|c| c.tools.iter().map(|t| t.name.clone()).collect())
                .unwrap_or_default();
            let mut tools = server_tools(s, &listed, extra.get(&s.name));
            if let ServerTools::Tools { tools } = &mut tools {
                // As the proxy decides, where the class is known here.
                tools.retain(|t| config.policy.admits(s.known_risk(t, entry)));
            }
            (s.name.clone(), tools)
        })
        .collect()
}

fn server_tools(
    s: &McpServer,
    listed: &BTreeSet<String>,
    extra: Option<&BTreeSet<String>>,
) -> ServerTools {
    if !s.enabled {
        return ServerTools::Off;
    }
    let literal_allow = !s.tools.allow.is_empty() && s.tools.allow.iter().all(|a| is_literal(a));
    if listed.is_empty() && !literal_allow {
        return ServerTools::Patterns {
            allow: s.tools.allow.clone(),
            deny: s.tools.deny.clone(),
        };
    }
    let mut universe = listed.clone();
    universe.extend(literal_names(s));
    if let Some(extra) = extra {
        universe.extend(extra.iter().cloned());
    }
    // The sidecar's rule, from the crds crate; patterns that do not compile expose nothing, as
    // the sidecar would refuse them.
    let filter = ToolFilter::compile(s.enabled, &s.tools.allow, &s.tools.deny).ok();
    let tools = universe
        .into_iter()
        .filter(|t| filter.as_ref().is_some_and(|f| f.exposes(t)))
        .collect::<BTreeSet<_>>();
    ServerTools::Tools { tools }
}

fn literal_names(s: &McpServer) -> impl Iterator<Item = String> + '_ {
    s.tools
        .allow
        .iter()
        .chain(&s.tools.deny)
        .filter(|p| is_literal(p))
        .cloned()
}

/// One server's before → after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerChange {
    pub server: String,
    pub before: ServerTools,
    pub after: ServerTools,
    /// Tools exposed after and not before (when both sides are known by name).
    pub added: Vec<String>,
    /// Tools exposed before and not after.
    pub removed: Vec<String>,
}

impl ServerChange {
    pub fn changed(&self) -> bool {
        self.before != self.after
    }
}

/// Before → after for every server in either config, in name order.
pub fn diff(
    before: &ToolConfig,
    after: &ToolConfig,
    catalog: Option<&Catalog>,
) -> Vec<ServerChange> {
    // Names from both sides join each server's universe, so a tool enabled by name shows up
    // as added even when the catalog does not list it.
    let mut extra: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in before.mcp_servers.iter().chain(&after.mcp_servers) {
        extra
            .entry(s.name.clone())
            .or_default()
            .extend(literal_names(s));
    }
    let b = effective(before, catalog, &extra);
    let a = effective(after, catalog, &extra);
    let names: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    names
        .into_iter()
        .map(|name| {
            let before = b.get(name).cloned().unwrap_or(ServerTools::Off);
            let after = a.get(name).cloned().unwrap_or(ServerTools::Off);
            let set = |t: &ServerTools| match t {
                ServerTools::Tools { tools } => Some(tools.clone()),
                ServerTools::Off => Some(BTreeSet::new()),
                ServerTools::Patterns { .. } => None,
            };
            let (added, removed) = match (set(&before), set(&after)) {
                (Some(x), Some(y)) => (
                    y.difference(&x).cloned().collect(),
                    x.difference(&y).cloned().collect(),
                ),
                _ => (Vec::new(), Vec::new()),
            };
            ServerChange {
                server: name.clone(),
                before,
                after,
                added,
                removed,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchestrator_crds::tools::Risk;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"
servers:
  - name: filesystem
    stdio: {command: fs}
    tools: [{name: read_file}, {name: write_file}, {name: delete_file}]
  - name: memory
    stdio: {command: mem}
"#,
        )
        .expect("valid")
    }

    fn config(servers: Vec<McpServer>) -> ToolConfig {
        ToolConfig {
            mcp_servers: servers,
            ..Default::default()
        }
    }

    fn tools(names: &[&str]) -> ServerTools {
        ServerTools::Tools {
            tools: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn effective_follows_deny_wins_and_empty_allow_is_all() {
        let mut off = McpServer::new("memory", &[], &[]);
        off.enabled = false;
        let c = config(vec![McpServer::new("filesystem", &[], &["delete_*"]), off]);
        let e = effective(&c, Some(&catalog()), &BTreeMap::new());
        assert_eq!(e["filesystem"], tools(&["read_file", "write_file"]));
        assert_eq!(e["memory"], ServerTools::Off);
    }

    #[test]
    fn max_risk_hides_the_tools_whose_class_is_known_above_it() {
        let catalog = Catalog::parse(
            r#"
servers:
  - name: filesystem
    stdio: {command: fs}
    tools: [{name: read_file, risk: read}, {name: write_file}, {name: delete_file, risk: destructive}]
"#,
        )
        .expect("valid");
        let mut c = config(vec![McpServer::new("filesystem", &[], &[])]);
        c.policy.max_risk = Some(Risk::Write);
        let e = effective(&c, Some(&catalog), &BTreeMap::new());
        // write_file has no class here: the server's annotations decide, so it is counted.
        assert_eq!(e["filesystem"], tools(&["read_file", "write_file"]));
        // The TaskRun's class wins over the catalog's.
        c.mcp_servers[0].risk = [
            ("delete_file".to_string(), Risk::Write),
            ("write_file".to_string(), Risk::Destructive),
        ]
        .into();
        let e = effective(&c, Some(&catalog), &BTreeMap::new());
        assert_eq!(e["filesystem"], tools(&["delete_file", "read_file"]));
        c.policy.max_risk = None;
        let e = effective(&c, Some(&catalog), &BTreeMap::new());
        assert_eq!(e["filesystem"].count(), Some(3));
    }

    #[test]
    fn unknown_tool_lists_show_patterns_unless_the_allow_list_names_them() {
        let c = config(vec![McpServer::new("memory", &["*"], &["delete_entities"])]);
        let e = effective(&c, Some(&catalog()), &BTreeMap::new());
        assert_eq!(e["memory"].summary(), "allow *; deny delete_entities");
        assert_eq!(e["memory"].count(), None);
        let c = config(vec![McpServer::new(
            "memory",
            &["read_graph", "search_nodes"],
            &[],
        )]);
        let e = effective(&c, None, &BTreeMap::new());
        assert_eq!(e["memory"], tools(&["read_graph", "search_nodes"]));
    }

    #[test]
    fn diff_lists_added_and_removed_tools_including_unlisted_names() {
        let before = config(vec![McpServer::new("filesystem", &["*"], &[])]);
        let after = config(vec![
            McpServer::new("filesystem", &["*"], &["delete_file"]),
            McpServer::new("github", &["merge_pr"], &[]),
        ]);
        let d = diff(&before, &after, Some(&catalog()));
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].server, "filesystem");
        assert_eq!(d[0].removed, ["delete_file"]);
        assert!(d[0].added.is_empty());
        assert_eq!(d[1].server, "github");
        assert_eq!(
            (d[1].before.summary(), d[1].after.summary()),
            ("off".into(), "1 tool".into())
        );
        assert_eq!(d[1].added, ["merge_pr"]);
        assert!(d.iter().all(ServerChange::changed));
    }
}
