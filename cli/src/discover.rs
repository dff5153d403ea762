//! `catalog discover SERVER` and `catalog pin SERVER`: start the server the way the proxy in a
//! pod would (its catalog command, or its URL), list its real tools with their annotations, risk
//! class and definition hash, and compare them with the catalog entry.
//!
//! The server runs locally, with this process's environment (so a Secret the server needs comes
//! from a variable of the same name) plus the catalog's literal `env`. The pod's shared directory
//! `/workspace` in the command's arguments and env values is mapped to `--workspace DIR` (default:
//! a fresh temporary directory).

use std::{collections::BTreeSet, path::Path, time::Duration};

use orchestrator_crds::{
    catalog::{CatalogServer, CatalogTool},
    policy::{definition_hash, short_pin},
    tools::Risk,
};
use rmcp::{
    ServiceExt,
    model::Tool,
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Serialize;

use crate::args::Global;
use crate::catalog::{load, shorten};
use crate::catalog_write;
use crate::error::{Error, Result};
use crate::output::{self, Format, Table};

/// Where the pod mounts the task's shared directory.
const POD_WORKSPACE: &str = "/workspace";
/// How long the server may take to start and list its tools.
const LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// One tool as the server offers it, and how it compares with the catalog.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// From the catalog's `risk` when it names one, else from the annotations.
    pub risk: Risk,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// `sha256:<hex>` over the whole tool as listed (what the proxy computes and `pins` hold).
    pub definition: String,
    /// The tool as listed (what `catalog pin --write` stores as its `definition`).
    #[serde(skip)]
    pub listed: serde_json::Value,
    /// `listed` (the catalog lists it), `new` (it does not).
    pub catalog: &'static str,
    /// `matches`, `differs` (the catalog's pin is another hash) or `none`.
    pub pin: &'static str,
}

/// What discovery found for one server.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    pub server: String,
    pub tools: Vec<Found>,
    /// Tools the catalog lists that the server does not offer.
    pub gone: Vec<String>,
}

impl Discovery {
    /// Whether the catalog entry says something the server does not: a tool gone, a tool it does
    /// not list, a pin that differs.
    pub fn drifted(&self) -> bool {
        !self.gone.is_empty()
            || self
                .tools
                .iter()
                .any(|t| t.catalog == "new" || t.pin == "differs")
    }
}

/// Compares the tools a server offers with its catalog entry.
pub fn compare(entry: &CatalogServer, tools: &[Tool]) -> Discovery {
    let offered: BTreeSet<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let found = tools
        .iter()
        .map(|tool| {
            let listed = entry.tools.iter().find(|t| t.name == tool.name);
            let hints = tool.annotations.as_ref();
            let (read_only, destructive) = (
                hints.and_then(|a| a.read_only_hint),
                hints.and_then(|a| a.destructive_hint),
            );
            let definition = definition_hash(tool);
            let pin = match listed.and_then(|t| t.pin.as_deref()) {
                None => "none",
                Some(pin) if pin == definition => "matches",
                Some(_) => "differs",
            };
            Found {
                name: tool.name.to_string(),
                description: tool.description.as_deref().unwrap_or_default().to_string(),
                risk: listed
                    .and_then(|t| t.risk)
                    .unwrap_or_else(|| Risk::from_hints(read_only, destructive)),
                read_only_hint: read_only,
                destructive_hint: destructive,
                definition,
                listed: serde_json::to_value(tool).unwrap_or_default(),
                catalog: if listed.is_some() { "listed" } else { "new" },
                pin,
            }
        })
        .collect();
    Discovery {
        server: entry.name.clone(),
        tools: found,
        gone: entry
            .tools
            .iter()
            .filter(|t| !offered.contains(t.name.as_str()))
            .map(|t| t.name.clone())
            .collect(),
    }
}

/// Starts (or connects to) the catalog's `server` and lists its tools.
pub async fn list_tools(entry: &CatalogServer, workspace: &Path) -> Result<Vec<Tool>> {
    let listing = async {
        if let Some(stdio) = &entry.stdio {
            let map = |s: &str| match s.strip_prefix(POD_WORKSPACE) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                    format!("{}{rest}", workspace.display())
                }
                _ => s.to_string(),
            };
            let mut cmd = tokio::process::Command::new(&stdio.command);
            cmd.args(stdio.args.iter().map(|a| map(a)))
                .envs(stdio.env.iter().map(|(k, v)| (k, map(v))));
            let spawned = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::null())
                .spawn();
            let (transport, _) = spawned.map_err(|e| {
                Error::Failed(format!(
                    "starting {:?} (servers[{}].stdio.command): {e}; is it installed here?",
                    stdio.command, entry.name
                ))
            })?;
            let client = client_config().serve(transport).await.map_err(|e| {
                Error::Failed(format!("{}: the server did not start MCP: {e}", entry.name))
            })?;
            list_and_close(&entry.name, client).await
        } else if let Some(http) = &entry.http {
            let mut headers = std::collections::HashMap::new();
            for (header, env) in &http.headers_from_env {
                let value = std::env::var(env).map_err(|_| {
                    Error::Usage(format!(
                        "{}: header {header} comes from ${env}, which is not set here",
                        entry.name
                    ))
                })?;
                let name = http::HeaderName::try_from(header.as_str())
                    .map_err(|e| Error::Catalog(format!("header {header:?}: {e}")))?;
                let value = http::HeaderValue::try_from(value)
                    .map_err(|e| Error::Usage(format!("${env}: {e}")))?;
                headers.insert(name, value);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(http.url.as_str())
                .custom_headers(headers);
            let transport = StreamableHttpClientTransport::from_config(config);
            let client = client_config().serve(transport).await.map_err(|e| {
                Error::Failed(format!("{}: connecting to {}: {e}", entry.name, http.url))
            })?;
            list_and_close(&entry.name, client).await
        } else {
            Err(Error::Catalog(format!(
                "servers[{}] has neither stdio nor http",
                entry.name
            )))
        }
    };
    tokio::time::timeout(LIST_TIMEOUT, listing)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("{} to start and list its tools", entry.name),
            after: LIST_TIMEOUT,
        })?
}

/// The client discovery connects as: it declares roots, sampling and elicitation (form and URL),
/// so a server that offers some tools only to clients declaring them (server-everything does)
/// lists them too, and a pin covers every tool an agent may be offered.
fn client_config() -> rmcp::model::ClientConfig {
    let capabilities = serde_json::from_value(serde_json::json!({
        "roots": {"listChanged": true},
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
    }))
    .unwrap_or_default();
    rmcp::model::ClientConfig::new(
        capabilities,
        rmcp::model::Implementation::new("orchestrator-cli", env!("CARGO_PKG_VERSION")),
    )
}

/// Lists a connected server's tools, then closes the connection (and stops a child).
async fn list_and_close(
    name: &str,
    client: rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>,
) -> Result<Vec<Tool>> {
    let tools = client.peer().list_all_tools().await;
    let _ = client.cancel().await;
    tools.map_err(|e| Error::Failed(format!("{name}: tools/list failed: {e}")))
}

async fn discover_one(
    global: &Global,
    server: &str,
    workspace: Option<&Path>,
) -> Result<(CatalogServer, Discovery)> {
    let catalog = load(global, None).await?;
    let Some(entry) = catalog.get(server) else {
        return Err(Error::NotFound(format!(
            "the catalog has no server {server:?}; known servers: {}",
            catalog.names().join(", ")
        )));
    };
    let temp;
    let workspace = match workspace {
        Some(dir) => dir,
        None => {
            temp = tempfile::tempdir()
                .map_err(|e| Error::Failed(format!("creating a workspace directory: {e}")))?;
            temp.path()
        }
    };
    let tools = list_tools(entry, workspace).await?;
    Ok((entry.clone(), compare(entry, &tools)))
}

/// `catalog discover SERVER [--check]`.
pub async fn discover(
    global: &Global,
    server: &str,
    workspace: Option<&Path>,
    check: bool,
    write: Option<&Path>,
) -> Result<()> {
    let (entry, found) = discover_one(global, server, workspace).await?;
    let text = match &global.output {
        Format::Table | Format::Wide => table(&found),
        f => output::render(f, &found)?,
    };
    output::print(&text)?;
    if let Some(path) = write {
        catalog_write::write(path, server, &updated_tools(&entry, &found, false))?;
        output::note(&format!(
            "wrote the tools of {server} to {}",
            path.display()
        ));
    }
    if check && found.drifted() {
        return Err(Error::Failed(format!(
            "the catalog entry of {server} does not match the server (see above)"
        )));
    }
    Ok(())
}

/// `catalog pin SERVER`: the `tools` entries with each tool's pin, ready for the catalog.
pub async fn pin(
    global: &Global,
    server: &str,
    workspace: Option<&Path>,
    write: Option<&Path>,
) -> Result<()> {
    let (entry, found) = discover_one(global, server, workspace).await?;
    if let Some(path) = write {
        catalog_write::write(path, server, &updated_tools(&entry, &found, true))?;
        output::note(&format!(
            "pinned the {} tools of {server} in {}",
            found.tools.len(),
            path.display()
        ));
        return Ok(());
    }
    if !global.output.is_table() {
        let pins: Vec<_> = found
            .tools
            .iter()
            .map(|t| serde_json::json!({"name": t.name, "pin": t.definition, "definition": t.listed}))
            .collect();
        return output::print(&output::render(&global.output, &pins)?);
    }
    let mut out = format!(
        "# {server}: the definition hash of each tool it offers now; put `pin` on the catalog's tools[]\n"
    );
    for t in &found.tools {
        out.push_str(&format!(
            "- {{name: {}, pin: \"{}\"}}\n",
            t.name, t.definition
        ));
    }
    output::print(&out)
}

fn table(d: &Discovery) -> String {
    let mut t = Table::new(&["TOOL", "RISK", "HINTS", "DEFINITION", "CATALOG", "PIN"]);
    for f in &d.tools {
        let hints: Vec<&str> = [
            (f.read_only_hint == Some(true)).then_some("readOnly"),
            (f.destructive_hint == Some(true)).then_some("destructive"),
        ]
        .into_iter()
        .flatten()
        .collect();
        t.row(vec![
            f.name.clone(),
            f.risk.to_string(),
            if hints.is_empty() {
                "-".into()
            } else {
                hints.join(",")
            },
            short_pin(&f.definition).to_string(),
            f.catalog.to_string(),
            f.pin.to_string(),
        ]);
    }
    let mut out = format!("{}: {} tools offered\n", d.server, d.tools.len());
    out.push_str(&t.render());
    if !d.gone.is_empty() {
        out.push_str(&format!(
            "In the catalog but not offered by the server: {}\n",
            d.gone.join(", ")
        ));
    }
    out
}

/// A description longer than this is cut (at a word) for the catalog; `catalog show` and the
/// server have the whole text.
const DESCRIPTION_MAX: usize = 200;

/// The tools the server offers now, in its order: a tool the catalog lists keeps its entry
/// (category, risk, description, pin); a new one gets the first line of the server's
/// description. Tools the server no longer offers are left out. With `pin`, every tool's pin is
/// its definition hash now.
pub fn updated_tools(entry: &CatalogServer, found: &Discovery, pin: bool) -> Vec<CatalogTool> {
    found
        .tools
        .iter()
        .map(|f| {
            let mut tool = entry
                .tools
                .iter()
                .find(|t| t.name == f.name)
                .cloned()
                .unwrap_or_else(|| CatalogTool {
                    name: f.name.clone(),
                    description: first_line(&f.description),
                    category: None,
                    risk: None,
                    pin: None,
                    definition: None,
                });
            if pin {
                tool.pin = Some(f.definition.clone());
                tool.definition = Some(f.listed.clone());
            }
            tool
        })
        .collect()
}

fn first_line(description: &str) -> String {
    shorten(
        description.lines().next().unwrap_or("").trim(),
        DESCRIPTION_MAX,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchestrator_crds::catalog::Catalog;

    fn tool(name: &str, read_only: Option<bool>) -> Tool {
        let mut t = Tool::default();
        t.name = name.to_string().into();
        if let Some(r) = read_only {
            t.annotations = Some(rmcp::model::ToolAnnotations::new().read_only(r));
        }
        t
    }

    #[test]
    fn discovery_flags_gone_and_new_tools_and_pins_that_differ() {
        let catalog = Catalog::parse(&format!(
            r#"
servers:
  - name: s
    stdio: {{command: x}}
    tools:
      - {{name: read, pin: "sha256:{}"}}
      - {{name: write, risk: destructive}}
      - {{name: vanished}}
"#,
            "0".repeat(64)
        ))
        .expect("catalog");
        let entry = catalog.get("s").expect("s");
        let found = compare(
            entry,
            &[
                tool("read", Some(true)),
                tool("write", None),
                tool("fresh", None),
            ],
        );
        let rows: Vec<(&str, Risk, &str, &str)> = found
            .tools
            .iter()
            .map(|t| (t.name.as_str(), t.risk, t.catalog, t.pin))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("read", Risk::Read, "listed", "differs"),
                ("write", Risk::Destructive, "listed", "none"),
                ("fresh", Risk::Write, "new", "none"),
            ]
        );
        assert_eq!(found.gone, vec!["vanished"]);
        assert!(found.drifted());
        let text = table(&found);
        assert!(
            text.contains("In the catalog but not offered by the server: vanished"),
            "{text}"
        );
    }
}
