//! `version`: this CLI's version, and what the cluster runs: the Kubernetes version, the
//! operator's (its Deployment, found by the chart's labels: `app.kubernetes.io/version`, the
//! image) and the CRDs' (served and storage versions, the chart that installed them). A part
//! that cannot be read (forbidden, not installed) is said as such; only an API server that
//! cannot be reached at all fails the command (exit 1), as `kubectl version` does.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::args::{Global, VersionArgs};
use crate::connect::connect;
use crate::error::{Error, Result};
use crate::output::{self, Format};

/// The CLI's version (the crate's).
pub const CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit a release build was made from, when its build set `ORCHESTRATOR_GIT_COMMIT`.
pub const CLIENT_COMMIT: Option<&str> = option_env!("ORCHESTRATOR_GIT_COMMIT");

/// The API versions this CLI reads and writes.
pub const API_VERSIONS: &[&str] = &["orchestrator.io/v1"];

/// The labels the chart puts on the operator's Deployment (charts/orchestrator/_helpers.tpl).
pub const OPERATOR_SELECTOR: &str =
    "app.kubernetes.io/part-of=orchestrator,app.kubernetes.io/component=operator";

/// The CRDs the chart installs.
pub const CRDS: &[&str] = &["taskruns.orchestrator.io", "toolapprovals.orchestrator.io"];

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientVersion {
    pub version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<&'static str>,
    pub api_versions: &'static [&'static str],
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Operator {
    pub namespace: String,
    pub name: String,
    /// `app.kubernetes.io/version`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub images: Vec<String>,
    pub replicas: i32,
    pub ready_replicas: i32,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Crd {
    pub served: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    pub stored_versions: Vec<String>,
    /// The `helm.sh/chart` label: the chart (and its version) that installed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
}

/// The operator's Deployments (one per release of the chart; normally one).
#[derive(Clone, Debug, Serialize)]
pub struct Operators {
    pub deployments: Vec<Operator>,
}

/// One CRD, by name: what it is, or why it could not be read.
#[derive(Clone, Debug, Serialize)]
pub struct CrdPart {
    pub name: String,
    #[serde(flatten)]
    pub part: Part<Crd>,
}

/// A part of the answer, or why it could not be read.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Part<T> {
    Found(T),
    Unknown { error: String },
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub client: ClientVersion,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<Part<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator: Option<Part<Operators>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub crds: Vec<CrdPart>,
}

fn client() -> ClientVersion {
    ClientVersion {
        version: CLIENT_VERSION,
        commit: CLIENT_COMMIT,
        api_versions: API_VERSIONS,
    }
}

/// `version`.
pub async fn run(global: &Global, args: &VersionArgs) -> Result<()> {
    let mut report = Report {
        client: client(),
        kubernetes: None,
        operator: None,
        crds: Vec::new(),
    };
    if !args.client {
        let cluster = connect(global).await?;
        let info = cluster
            .client
            .apiserver_version()
            .await
            .map_err(|e| Error::kube("asking the API server its version", e))?;
        report.kubernetes = Some(Part::Found(info.git_version));
        report.operator = Some(operator(&cluster.client, &global.catalog_namespace).await);
        for name in CRDS {
            report.crds.push(CrdPart {
                name: name.to_string(),
                part: crd(&cluster.client, name).await,
            });
        }
    }
    let text = match &global.output {
        Format::Table | Format::Wide => text(&report),
        f => output::render(f, &report)?,
    };
    output::print(&text)
}

/// Why a read failed, in words: forbidden (RBAC) or the API server's message.
fn why(what: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!("not readable: you may not {what} ({})", s.message)
        }
        kube::Error::Api(s) => format!(
            "not readable: {what}: {} ({} {})",
            s.message, s.reason, s.code
        ),
        e => format!("not readable: {what}: {e}"),
    }
}

/// The operator's Deployments: in `namespace` (the chart's, as `--catalog-namespace` names
/// it), else in any namespace the caller may list.
async fn operator(client: &Client, namespace: &str) -> Part<Operators> {
    let found = |items: &[Deployment]| {
        Part::Found(Operators {
            deployments: items.iter().map(deployment).collect(),
        })
    };
    let params = ListParams::default().labels(OPERATOR_SELECTOR);
    let here: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let first = match here.list(&params).await {
        Ok(l) if !l.items.is_empty() => return found(&l.items),
        Ok(_) => format!("no Deployment labelled {OPERATOR_SELECTOR} in namespace {namespace}"),
        Err(e) => why(&format!("list deployments in namespace {namespace}"), &e),
    };
    let all: Api<Deployment> = Api::all(client.clone());
    match all.list(&params).await {
        Ok(l) if !l.items.is_empty() => found(&l.items),
        Ok(_) => Part::Unknown {
            error: format!(
                "not installed: no Deployment labelled {OPERATOR_SELECTOR} in any namespace"
            ),
        },
        Err(e) => Part::Unknown {
            error: format!(
                "{first}; {} (the chart's namespace is --catalog-namespace)",
                why("list deployments in all namespaces", &e)
            ),
        },
    }
}

fn deployment(d: &Deployment) -> Operator {
    let spec = d.spec.as_ref();
    let status = d.status.as_ref();
    Operator {
        namespace: d.namespace().unwrap_or_default(),
        name: d.name_any(),
        version: d.labels().get("app.kubernetes.io/version").cloned(),
        images: spec
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| {
                p.containers
                    .iter()
                    .filter_map(|c| c.image.clone())
                    .collect()
            })
            .unwrap_or_default(),
        replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
        ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
    }
}

async fn crd(client: &Client, name: &str) -> Part<Crd> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.get(name).await {
        Ok(c) => Part::Found(Crd {
            served: c
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect(),
            storage: c
                .spec
                .versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone()),
            stored_versions: c.status.and_then(|s| s.stored_versions).unwrap_or_default(),
            chart: c
                .metadata
                .labels
                .and_then(|l| l.get("helm.sh/chart").cloned()),
        }),
        Err(kube::Error::Api(s)) if s.code == 404 => Part::Unknown {
            error: format!("not installed: no CustomResourceDefinition {name}"),
        },
        Err(e) => Part::Unknown {
            error: why(&format!("get customresourcedefinition {name}"), &e),
        },
    }
}

/// The report for people.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let commit = r
        .client
        .commit
        .map(|c| format!(", commit {c}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "Client:      orchestrator-cli {}{commit} (API {})",
        r.client.version,
        r.client.api_versions.join(", ")
    );
    if let Some(k) = &r.kubernetes {
        let _ = writeln!(out, "Kubernetes:  {}", part(k, |v| v.clone()));
    }
    if let Some(o) = &r.operator {
        let lines = part(o, |ops| {
            ops.deployments
                .iter()
                .map(|o| {
                    format!(
                        "{} (Deployment {}/{}, image {}, {}/{} ready)",
                        o.version.as_deref().unwrap_or("version label not set"),
                        o.namespace,
                        o.name,
                        if o.images.is_empty() {
                            "-".to_string()
                        } else {
                            o.images.join(", ")
                        },
                        o.ready_replicas,
                        o.replicas
                    )
                })
                .collect::<Vec<_>>()
                .join("\n             ")
        });
        let _ = writeln!(out, "Operator:    {lines}");
    }
    for (i, c) in r.crds.iter().enumerate() {
        let label = if i == 0 { "CRDs:" } else { "" };
        let name = &c.name;
        let line = part(&c.part, |c| {
            format!(
                "served {}, storage {}, stored {}{}",
                c.served.join(","),
                c.storage.as_deref().unwrap_or("-"),
                if c.stored_versions.is_empty() {
                    "-".to_string()
                } else {
                    c.stored_versions.join(",")
                },
                c.chart
                    .as_ref()
                    .map(|ch| format!(", installed by chart {ch}"))
                    .unwrap_or_default()
            )
        });
        let _ = writeln!(out, "{label:<13}{name}: {line}");
    }
    out
}

fn part<T>(p: &Part<T>, f: impl Fn(&T) -> String) -> String {
    match p {
        Part::Found(t) => f(t),
        Part::Unknown { error } => error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_is_shown_or_said_why_not() {
        let r = Report {
            client: ClientVersion {
                version: "0.2.0",
                commit: None,
                api_versions: API_VERSIONS,
            },
            kubernetes: Some(Part::Found("v1.35.4".into())),
            operator: Some(Part::Unknown {
                error: "not readable: you may not list deployments".into(),
            }),
            crds: vec![
                CrdPart {
                    name: "taskruns.orchestrator.io".into(),
                    part: Part::Found(Crd {
                        served: vec!["v1".into()],
                        storage: Some("v1".into()),
                        stored_versions: vec!["v1".into()],
                        chart: Some("orchestrator-0.2.0".into()),
                    }),
                },
                CrdPart {
                    name: "toolapprovals.orchestrator.io".into(),
                    part: Part::Unknown {
                        error: "not installed: no CustomResourceDefinition toolapprovals.orchestrator.io".into(),
                    },
                },
            ],
        };
        assert_eq!(
            text(&r),
            "Client:      orchestrator-cli 0.2.0 (API orchestrator.io/v1)\n\
             Kubernetes:  v1.35.4\n\
             Operator:    not readable: you may not list deployments\n\
             CRDs:        taskruns.orchestrator.io: served v1, storage v1, stored v1, installed by chart orchestrator-0.2.0\n\
             \x20            toolapprovals.orchestrator.io: not installed: no CustomResourceDefinition toolapprovals.orchestrator.io\n"
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(
            json["operator"]["error"],
            "not readable: you may not list deployments"
        );
        assert_eq!(json["crds"][0]["name"], "taskruns.orchestrator.io");
        assert_eq!(json["crds"][0]["storage"], "v1");
        assert!(
            json["crds"][1]["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("not installed"))
        );
    }
}
