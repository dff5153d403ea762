//! The catalog: where the CLI reads it (`--catalog FILE`, else the ConfigMap the Helm chart
//! creates and the operator reads), and the `catalog list` / `catalog show` commands.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use orchestrator_crds::catalog::{CATALOG_KEY, Catalog, CatalogServer};

use crate::args::Global;
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result, is_not_found};
use crate::output::{self, Format, Table};

/// Loads the catalog from `--catalog` or, failing that, from the cluster.
pub async fn load(global: &Global, cluster: Option<&Cluster>) -> Result<Catalog> {
    if let Some(path) = &global.catalog {
        return load_file(path);
    }
    let owned;
    let cluster = match cluster {
        Some(c) => c,
        None => {
            owned = connect(global).await?;
            &owned
        }
    };
    load_configmap(cluster, &global.catalog_namespace, &global.catalog_name).await
}

/// The catalog from `--catalog FILE`, if given: read before connecting so that bad input is
/// refused even when the cluster is unreachable.
pub fn load_local(global: &Global) -> Result<Option<Catalog>> {
    global.catalog.as_deref().map(load_file).transpose()
}

/// Reads and validates a catalog file.
pub fn load_file(path: &Path) -> Result<Catalog> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound(format!("catalog file {} does not exist", path.display()))
        } else {
            Error::Catalog(format!("reading catalog {}: {e}", path.display()))
        }
    })?;
    Catalog::parse(&text).map_err(|e| Error::Catalog(format!("{}: {e}", path.display())))
}

async fn load_configmap(cluster: &Cluster, namespace: &str, name: &str) -> Result<Catalog> {
    let reference = format!("{namespace}/{name}");
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), namespace);
    let cm = api.get(name).await.map_err(|e| {
        if is_not_found(&e) {
            Error::NotFound(format!(
                "the catalog ConfigMap {reference} does not exist: is the orchestrator chart \
                 installed there? Point to it with --catalog-namespace and --catalog-name \
                 (or $ORCH_CATALOG_NAMESPACE, $ORCH_CATALOG_NAME), or read a file with \
                 --catalog FILE"
            ))
        } else {
            Error::kube(format!("reading the catalog ConfigMap {reference}"), e)
        }
    })?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CATALOG_KEY))
        .ok_or_else(|| {
            Error::Catalog(format!(
                "the catalog ConfigMap {reference} has no key {CATALOG_KEY}"
            ))
        })?;
    Catalog::parse(text).map_err(|e| Error::Catalog(format!("ConfigMap {reference}: {e}")))
}

/// `catalog list`.
pub async fn list(global: &Global) -> Result<()> {
    let catalog = load(global, None).await?;
    let text = match &global.output {
        Format::Table | Format::Wide => list_table(&catalog),
        f => output::render(f, &catalog)?,
    };
    output::print(&text)
}

/// `catalog show SERVER`.
pub async fn show(global: &Global, server: &str) -> Result<()> {
    let catalog = load(global, None).await?;
    let Some(entry) = catalog.get(server) else {
        return Err(Error::NotFound(format!(
            "the catalog has no server {server:?}; known servers: {}",
            catalog.names().join(", ")
        )));
    };
    let text = match &global.output {
        Format::Table | Format::Wide => show_text(entry),
        f => output::render(f, entry)?,
    };
    output::print(&text)
}

/// The `catalog list` table.
pub fn list_table(catalog: &Catalog) -> String {
    let mut servers: Vec<&CatalogServer> = catalog.servers.iter().collect();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut t = Table::new(&["NAME", "TRANSPORT", "TOOLS", "SECRETS", "DESCRIPTION"]);
    for s in servers {
        let tools = if s.tools.is_empty() {
            "?".to_string()
        } else {
            s.tools.len().to_string()
        };
        let secrets: Vec<&str> = s.secret_env.iter().map(|e| e.name.as_str()).collect();
        t.row(vec![
            s.name.clone(),
            transport(s).to_string(),
            tools,
            if secrets.is_empty() {
                "-".into()
            } else {
                secrets.join(",")
            },
            shorten(&s.description, 70),
        ]);
    }
    t.render_with(output::headers())
}

/// `stdio` or `http`: how the proxy reaches the server.
pub fn transport(s: &CatalogServer) -> &'static str {
    match (&s.stdio, &s.http) {
        (Some(_), _) => "stdio",
        (None, Some(_)) => "http",
        (None, None) => "-",
    }
}

/// The `catalog show` text.
pub fn show_text(s: &CatalogServer) -> String {
    let mut out = format!("Name:         {}\n", s.name);
    if !s.description.is_empty() {
        out.push_str(&format!("Description:  {}\n", s.description));
    }
    if let Some(stdio) = &s.stdio {
        let mut cmd = vec![stdio.command.clone()];
        cmd.extend(stdio.args.iter().cloned());
        out.push_str(&format!("Transport:    stdio: {}\n", cmd.join(" ")));
        for (k, v) in &stdio.env {
            out.push_str(&format!("  env {k}={v}\n"));
        }
    }
    if let Some(http) = &s.http {
        out.push_str(&format!("Transport:    http: {}\n", http.url));
    }
    if !s.secret_env.is_empty() {
        out.push_str("Secrets:\n");
        let mut t = Table::new(&["ENV", "SECRET", "KEY", "REQUIRED", "DESCRIPTION"]);
        for e in &s.secret_env {
            t.row(vec![
                e.name.clone(),
                e.secret_name
                    .clone()
                    .unwrap_or_else(|| "(set in the TaskRun)".into()),
                e.secret_key.clone(),
                if e.optional { "no" } else { "yes" }.into(),
                e.description.clone(),
            ]);
        }
        out.push_str(&indent(&t.render()));
    }
    if s.tools.is_empty() {
        out.push_str("Tools:        not listed in the catalog (the server decides)\n");
    } else {
        out.push_str(&format!("Tools ({}):\n", s.tools.len()));
        let mut t = Table::new(&["NAME", "CATEGORY", "RISK", "DESCRIPTION"]);
        for tool in &s.tools {
            t.row(vec![
                tool.name.clone(),
                tool.category.clone().unwrap_or_default(),
                risk_text(tool.risk),
                tool.description.clone(),
            ]);
        }
        out.push_str(&indent(&t.render()));
        out.push_str(
            "  (RISK \"-\": the class comes from the server's annotations when the proxy lists the tool)\n",
        );
    }
    out
}

/// A catalog tool's risk class, `-` when the server's annotations decide it.
pub fn risk_text(risk: Option<orchestrator_crds::proxy::Risk>) -> String {
    risk.map_or_else(|| "-".to_string(), |r| r.to_string())
}

/// At most `max` characters, cut at a word with "..." (the full text is in `catalog show`).
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max - 3).collect();
    let cut = cut.rsplit_once(' ').map_or(cut.as_str(), |(head, _)| head);
    format!("{}...", cut.trim_end_matches([',', ';', ':', ' ']))
}

/// Indents every line by two spaces.
pub fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"
servers:
  - name: time
    description: Current time and time zones
    stdio: {command: mcp-server-time, args: ["--local-timezone", "UTC"]}
    tools:
      - {name: get_current_time, description: Now, category: read}
      - {name: convert_time, description: Convert, category: read, risk: read}
  - name: github
    description: GitHub API
    stdio: {command: github-mcp-server, args: [stdio]}
    secretEnv:
      - {name: GITHUB_PERSONAL_ACCESS_TOKEN, secretName: github, secretKey: token}
"#,
        )
        .expect("valid")
    }

    #[test]
    fn list_shows_each_server_sorted() {
        assert_eq!(
            list_table(&catalog()),
            "NAME     TRANSPORT   TOOLS   SECRETS                        DESCRIPTION\n\
             github   stdio       ?       GITHUB_PERSONAL_ACCESS_TOKEN   GitHub API\n\
             time     stdio       2       -                              Current time and time zones\n"
        );
    }

    #[test]
    fn long_descriptions_are_cut_at_a_word() {
        assert_eq!(shorten("short", 10), "short");
        assert_eq!(shorten("one two three four", 12), "one two...");
    }

    #[test]
    fn show_lists_transport_secrets_and_tools() {
        let c = catalog();
        let text = show_text(c.get("time").expect("time"));
        assert_eq!(
            text,
            "Name:         time\n\
             Description:  Current time and time zones\n\
             Transport:    stdio: mcp-server-time --local-timezone UTC\n\
             Tools (2):\n  \
               NAME               CATEGORY   RISK   DESCRIPTION\n  \
               get_current_time   read       -      Now\n  \
               convert_time       read       read   Convert\n  \
               (RISK \"-\": the class comes from the server's annotations when the proxy lists the tool)\n"
        );
        let text = show_text(c.get("github").expect("github"));
        assert!(
            text.contains("GITHUB_PERSONAL_ACCESS_TOKEN   github   token"),
            "{text}"
        );
        assert!(text.contains("not listed in the catalog"), "{text}");
    }
}
