//! `task validate FILE...`: every TaskRun of some manifests checked as the operator checks it
//! ([`orchestrator_crds::resolve`] against the catalog: what would otherwise come back as the
//! TaskRun's condition after it was applied) and as the API server takes it (a dry-run create:
//! the CRD's schema and rules, the admission policies for the caller). Nothing is written.

use std::path::Path;

use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::resolve;
use orchestrator_crds::taskrun::TaskRun;
use serde::Serialize;
use serde_json::Value;

use crate::args::{Global, ValidateArgs};
use crate::catalog;
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result, describe_kube_error};
use crate::output::{self, Format};

/// What `validate` found for one TaskRun of the files.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Where it is: the file, and `#N` (the Nth document, from 1) in a file of several.
    pub source: String,
    /// `metadata.name` (or `generateName` followed by `*`).
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub valid: bool,
    pub problems: Vec<Finding>,
    /// The checks that ran: `operator` (against the catalog), `operatorWithoutCatalog` (the
    /// checks that need none), `apiServer` (the dry run).
    pub checked: Vec<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One problem: the reason (the operator's condition reason, or the API server's) and what is
/// wrong, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub reason: String,
    pub message: String,
}

/// One document of a file: a TaskRun, or why it is not one.
#[derive(Debug)]
pub struct Document {
    pub source: String,
    pub name: String,
    pub taskrun: std::result::Result<TaskRun, Finding>,
    /// The document as written: what the dry run sends (fields our types do not know included,
    /// so that the API server's strict field validation names them).
    pub raw: Value,
}

pub async fn run(global: &Global, args: &ValidateArgs) -> Result<()> {
    let mut documents = Vec::new();
    let mut skipped = Vec::new();
    for path in &args.files {
        let (docs, others) = parse(&path.display().to_string(), &read(path)?)?;
        documents.extend(docs);
        skipped.extend(others);
    }
    if documents.is_empty() {
        return Err(Error::Usage(format!(
            "no TaskRun (apiVersion orchestrator.io/v1, kind TaskRun) in {}",
            shown(&args.files)
        )));
    }
    // A catalog file is read before connecting: bad input is refused even offline.
    let local = catalog::load_local(global)?;
    let cluster = match args.offline {
        true => None,
        false => Some(connect(global).await?),
    };
    let catalog = match (local, &cluster) {
        (Some(c), _) => Some(c),
        (None, Some(cluster)) => Some(catalog::load(global, Some(cluster)).await?),
        (None, None) => None,
    };
    let mut reports = Vec::new();
    for doc in documents {
        let mut report = check(doc, catalog.as_ref(), cluster.as_ref());
        if let (Some(cluster), Some(raw)) = (&cluster, report.1.take()) {
            dry_run(cluster, raw, &mut report.0).await?;
        }
        report.0.valid = report.0.problems.is_empty();
        reports.push(report.0);
    }
    let text = match &global.output {
        Format::Table | Format::Wide => table(&reports, catalog.is_some(), cluster.is_some()),
        f => output::render(f, &reports)?,
    };
    output::print(&text)?;
    if !skipped.is_empty() {
        eprintln!("not TaskRuns, not checked: {}", skipped.join(", "));
    }
    let invalid = reports.iter().filter(|r| !r.valid).count();
    match invalid {
        0 => Ok(()),
        n => Err(Error::Usage(format!(
            "{n} of {} TaskRuns would not be accepted as they are; nothing was applied",
            reports.len()
        ))),
    }
}

fn read(path: &Path) -> Result<String> {
    match path.as_os_str() == "-" {
        true => std::io::read_to_string(std::io::stdin()),
        false => std::fs::read_to_string(path),
    }
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::NotFound(format!("{} does not exist", path.display()))
        }
        _ => Error::Usage(format!("reading {}: {e}", path.display())),
    })
}

fn shown(files: &[std::path::PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(", ")
}

/// The TaskRuns of one file's text (YAML documents or JSON), and the `Kind/name` of each other
/// object in it. A file that is not YAML at all is bad input.
pub fn parse(file: &str, text: &str) -> Result<(Vec<Document>, Vec<String>)> {
    let values: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| Error::Usage(format!("{file}: not YAML or JSON: {e}")))?;
    let values: Vec<Value> = values.into_iter().filter(|v| !v.is_null()).collect();
    let several = values.len() > 1;
    let mut documents = Vec::new();
    let mut others = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let source = match several {
            true => format!("{file}#{}", i + 1),
            false => file.to_string(),
        };
        let field = |f: &str| {
            value
                .get(f)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        let meta = |f: &str| {
            value
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
        };
        let name = match (meta("name"), meta("generateName")) {
            (Some(name), _) => name.to_string(),
            (None, Some(prefix)) => format!("{prefix}*"),
            (None, None) => "(no name)".to_string(),
        };
        if kind != "TaskRun" || !api_version.starts_with("orchestrator.io/") {
            others.push(format!(
                "{source}: {} {name}",
                if kind.is_empty() { "(no kind)" } else { &kind }
            ));
            continue;
        }
        let taskrun = if api_version != "orchestrator.io/v1" {
            Err(Finding {
                reason: "UnknownVersion".into(),
                message: format!(
                    "apiVersion {api_version}: the TaskRun API is served as orchestrator.io/v1"
                ),
            })
        } else {
            serde_path_to_error::deserialize::<_, TaskRun>(value.clone()).map_err(|e| Finding {
                reason: "Malformed".into(),
                message: format!("{}: {}", e.path(), e.inner()),
            })
        };
        documents.push(Document {
            source,
            name,
            taskrun,
            raw: value,
        });
    }
    Ok((documents, others))
}

/// The operator's checks of one document (against the catalog when there is one). Returns the
/// document as written too, for the API server's dry run, when it parsed and a cluster is there
/// to ask.
pub fn check(
    doc: Document,
    catalog: Option<&Catalog>,
    cluster: Option<&Cluster>,
) -> (Report, Option<Value>) {
    let mut report = Report {
        source: doc.source,
        name: doc.name,
        namespace: None,
        valid: false,
        problems: Vec::new(),
        checked: Vec::new(),
        notes: Vec::new(),
    };
    let tr = match doc.taskrun {
        Ok(tr) => tr,
        Err(finding) => {
            report.problems.push(finding);
            return (report, None);
        }
    };
    report.namespace = tr
        .metadata
        .namespace
        .clone()
        .or_else(|| cluster.map(|c| c.namespace.clone()));
    let problems = match catalog {
        Some(catalog) => {
            report.checked.push("operator");
            resolve::resolve(&tr.spec, catalog)
                .err()
                .unwrap_or_default()
        }
        None => {
            report.checked.push("operatorWithoutCatalog");
            resolve::spec_problems(&tr.spec)
        }
    };
    report
        .problems
        .extend(problems.into_iter().map(|p| Finding {
            reason: p.reason.to_string(),
            message: p.message,
        }));
    (report, cluster.map(|_| doc.raw))
}

/// The API server's dry run of the create, of the document as written and with strict field
/// validation (as `kubectl apply` asks for it: a misspelt field is named, not dropped with the
/// policy under it). The CRD's schema and CEL rules run, and the admission policies as they
/// judge this caller. A name taken already is a note: the API server checks it last, so the rest
/// passed, and applying the file would update that TaskRun.
async fn dry_run(cluster: &Cluster, raw: Value, report: &mut Report) -> Result<()> {
    let namespace = report
        .namespace
        .clone()
        .unwrap_or_else(|| cluster.namespace.clone());
    report.checked.push("apiServer");
    let url = format!(
        "/apis/orchestrator.io/v1/namespaces/{namespace}/taskruns?dryRun=All&fieldValidation=Strict"
    );
    let body = serde_json::to_vec(&raw).map_err(|e| Error::Output(e.to_string()))?;
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| Error::Cluster(format!("building the dry run's request: {e}")))?;
    match cluster.client.request::<Value>(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            report.notes.push(format!(
                "a TaskRun named {} exists in namespace {namespace}: applying this updates it \
                 (checked here as a new one)",
                report.name
            ));
            Ok(())
        }
        Err(e) if refusal(&e) => {
            let reason = match &e {
                kube::Error::Api(s) if !s.reason.is_empty() => s.reason.clone(),
                _ => "Refused".to_string(),
            };
            report.problems.push(Finding {
                reason,
                message: describe_kube_error(&e),
            });
            Ok(())
        }
        Err(e) => Err(Error::kube(
            format!(
                "dry run of TaskRun {} in namespace {namespace}",
                report.name
            ),
            e,
        )),
    }
}

/// The API server judged the object (or the caller's right to create it), as opposed to failing.
fn refusal(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422))
}

fn table(reports: &[Report], with_catalog: bool, with_server: bool) -> String {
    let mut out = String::new();
    for r in reports {
        let place = r
            .namespace
            .as_deref()
            .map(|n| format!(" in {n}"))
            .unwrap_or_default();
        match r.problems.len() {
            0 => out.push_str(&format!("{}: TaskRun {}{place}: valid\n", r.source, r.name)),
            n => out.push_str(&format!(
                "{}: TaskRun {}{place}: {n} problem{}\n",
                r.source,
                r.name,
                if n == 1 { "" } else { "s" }
            )),
        }
        for p in &r.problems {
            out.push_str(&format!("  {}: {}\n", p.reason, p.message));
        }
        for note in &r.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    if !with_catalog {
        out.push_str(
            "(offline without --catalog: servers, tool patterns and Secret env were not checked)\n",
        );
    }
    if !with_server {
        out.push_str("(offline: the API server's schema and admission checks did not run)\n");
    }
    out
}
