//! What the page's buttons and panels ask for, each done by the command the CLI has for it, as
//! the caller: approve/reject ([`crate::task::approve`]), add-context
//! ([`crate::task::add_context`]), cancel ([`crate::task::lifecycle`]), the audit
//! ([`crate::task::audit`]). A refusal comes back with the API server's status (a 403 stays a
//! 403) and the CLI's own words.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use orchestrator_crds::approval::Decision;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Console, access, podlog};
use crate::args::DecideArgs;
use crate::connect::Cluster;
use crate::error::Error;
use crate::merge::{self, Request};
use crate::task::{add_context, approve, audit, lifecycle};
use crate::toolspec::parse_specs;
use crate::{catalog, task};

/// An error as the page shows it: `{"error", "status", "reason"}` with that HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub reason: String,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            reason: "BadRequest".into(),
            message: message.into(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, reason) = match &e {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => (
                s.code,
                if s.reason.is_empty() {
                    StatusCode::from_u16(s.code)
                        .ok()
                        .and_then(|c| c.canonical_reason())
                        .unwrap_or("Error")
                        .to_string()
                } else {
                    s.reason.clone()
                },
            ),
            Error::Usage(_) => (400, "BadRequest".into()),
            Error::NotFound(_) => (404, "NotFound".into()),
            Error::Failed(_) => (409, "Conflict".into()),
            Error::Timeout { .. } => (504, "GatewayTimeout".into()),
            Error::Kube { .. } | Error::Config(_) | Error::Catalog(_) | Error::Cluster(_) => {
                (502, "BadGateway".into())
            }
            Error::Output(_) => (500, "InternalError".into()),
        };
        ApiError {
            status,
            reason,
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let body = json!({"error": self.message, "status": self.status, "reason": self.reason});
        (status, Json(body)).into_response()
    }
}

type Answer = Result<Json<Value>, ApiError>;

/// The request's JSON body, or a 400 saying what is wrong with it.
fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(b)| b)
        .map_err(|e| ApiError::bad_request(format!("the request body: {}", e.body_text())))
}

/// `GET /api/session`.
pub async fn session(State(console): State<Arc<Console>>) -> Json<Value> {
    Json(json!({
        "user": console.user,
        "namespace": console.namespace(),
        "allNamespaces": console.namespace().is_none(),
    }))
}

/// `GET /api/catalog`: server and tool names, for the grant form's suggestions.
pub async fn catalog(State(console): State<Arc<Console>>) -> Answer {
    let cluster = console.cluster(None);
    let catalog = catalog::load(&console.global, Some(&cluster)).await?;
    let servers: Vec<Value> = catalog
        .servers
        .iter()
        .map(|s| json!({"name": s.name, "tools": s.tools.iter().map(|t| &t.name).collect::<Vec<_>>()}))
        .collect();
    Ok(Json(json!({ "servers": servers })))
}

#[derive(Deserialize)]
pub struct AuditQuery {
    limit: Option<u32>,
}

/// `GET /api/namespaces/{ns}/tasks/{name}/audit?limit=N`.
pub async fn audit(
    State(console): State<Arc<Console>>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<AuditQuery>,
) -> Answer {
    let cluster = console.task_cluster(&ns, &name)?;
    let tr = task::get_named(&cluster, &name).await?;
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let read = audit::read(&cluster, &tr, &format!("limit={limit}")).await?;
    let v = read.value;
    Ok(Json(json!({
        "pod": read.pod,
        "records": v["records"],
        "matched": v["matched"],
        "dropped": v["dropped"],
    })))
}

/// `GET /api/namespaces/{ns}/access`: what the caller may do with the namespace's tasks, in the
/// API server's words (SelfSubjectAccessReviews); the page disables what it may not.
pub async fn access(State(console): State<Arc<Console>>, Path(ns): Path<String>) -> Answer {
    scoped_namespace(&console, &ns)?;
    Ok(Json(
        access::check(&console.client, &ns, console.user.as_deref()).await,
    ))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogsQuery {
    container: Option<String>,
    tail_lines: Option<i64>,
}

/// `GET /api/namespaces/{ns}/tasks/{name}/logs?container=agent|proxy&tailLines=N`: the end of
/// the log of the task pod's container, as `task logs --tail N` reads it.
pub async fn logs(
    State(console): State<Arc<Console>>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<LogsQuery>,
) -> Answer {
    let cluster = console.task_cluster(&ns, &name)?;
    let container = podlog::container(q.container.as_deref()).map_err(ApiError::bad_request)?;
    let tr = task::get_named(&cluster, &name).await?;
    let read = podlog::read(&cluster, &tr, container, q.tail_lines.unwrap_or(500)).await?;
    Ok(Json(serde_json::to_value(read).unwrap_or_default()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    digest: String,
}

/// `POST /api/namespaces/{ns}/tasks/{name}/approvals/{id}`: `task approve|reject --digest`.
pub async fn decide(
    State(console): State<Arc<Console>>,
    Path((ns, name, id)): Path<(String, String, String)>,
    b: Result<Json<DecideBody>, JsonRejection>,
) -> Answer {
    let b = body(b)?;
    let cluster = console.task_cluster(&ns, &name)?;
    check_id(&id)?;
    let decision = match b.decision.as_str() {
        "approve" => Decision::Approve,
        "reject" => Decision::Reject,
        other => {
            return Err(ApiError::bad_request(format!(
                "decision {other:?}: give \"approve\" or \"reject\""
            )));
        }
    };
    let args = DecideArgs {
        task_name: name,
        id,
        reason: b.reason.filter(|r| !r.trim().is_empty()),
        digest: Some(b.digest),
    };
    let decided = approve::decide_quietly(&cluster, &args, decision).await?;
    let state = match decided {
        approve::Decided::Recorded(_) => match decision {
            Decision::Approve => "approved",
            Decision::Reject => "rejected",
        },
        approve::Decided::NotYetApplied(_) => "pending",
    };
    Ok(Json(json!({"message": decided.text(), "state": state})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextBody {
    #[serde(default)]
    enable: Vec<String>,
    #[serde(default)]
    disable: Vec<String>,
    /// `FIELD=VALUE` items, as `--budget` takes them.
    #[serde(default)]
    budget: Vec<String>,
}

/// `POST /api/namespaces/{ns}/tasks/{name}/context`: `task add-context`, tools and budget.
pub async fn context(
    State(console): State<Arc<Console>>,
    Path((ns, name)): Path<(String, String)>,
    b: Result<Json<ContextBody>, JsonRejection>,
) -> Answer {
    let b = body(b)?;
    let cluster = console.task_cluster(&ns, &name)?;
    let request = Request {
        enable: parse_specs("--enable-tools", &b.enable)?,
        disable: parse_specs("--disable-tools", &b.disable)?,
    };
    let budget = b
        .budget
        .iter()
        .map(|item| {
            crate::budget::parse(item).map_err(|e| ApiError::bad_request(format!("budget: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if request.enable.is_empty() && request.disable.is_empty() && budget.is_empty() {
        return Err(ApiError::bad_request(
            "nothing to change: give tools to enable and/or disable, as server:tool, and/or \
             budget changes, as FIELD=VALUE",
        ));
    }
    merge::check_contradictions(&request)?;
    let catalog = catalog::load(&console.global, Some(&cluster)).await?;
    let mut notes = add_context::check_request(&catalog, &request)?;
    // Who the API server said the caller is, asked once when the console started.
    let user = console.user.as_deref();
    let change = add_context::Change {
        request: &request,
        budget: &budget,
        conditions: None,
    };
    let report = add_context::update_all(&cluster, &name, &change, &catalog, false, user).await?;
    notes.extend(report.notes.iter().cloned());
    let budget = report
        .budget
        .as_ref()
        .map(|b| crate::budget::describe(&b.before, &b.after));
    Ok(Json(json!({
        "message": add_context::render_report(&report).trim_end(),
        "notes": notes,
        "report": report,
        "budget": budget,
    })))
}

/// `POST /api/namespaces/{ns}/tasks/{name}/cancel`: `task cancel`.
pub async fn cancel(
    State(console): State<Arc<Console>>,
    Path((ns, name)): Path<(String, String)>,
) -> Answer {
    let cluster = console.task_cluster(&ns, &name)?;
    let tr = task::get_named(&cluster, &name).await?;
    let message = match lifecycle::request_cancel(&cluster, &task::api(&cluster), tr).await? {
        lifecycle::Asked::ByMe(me) => {
            format!("cancel requested: TaskRun {name}, by {me}; the operator stops its Job")
        }
        lifecycle::Asked::Already(who) => {
            format!("TaskRun {name}: {who} asked to cancel it already; nothing was written")
        }
    };
    Ok(Json(json!({ "message": message })))
}

/// An approval id as the proxy makes them (hex); anything else is not one.
fn check_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::bad_request(format!(
            "{id:?} is not an approval request id"
        )));
    }
    Ok(())
}

/// A Kubernetes object name (DNS-1123 subdomain): path segments that are not one never reach
/// the API server (`%2F` would otherwise make a name another path).
pub fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The cluster for a task of namespace `ns` (`-n` consoles refuse other namespaces).
pub fn scoped(console: &Console, ns: &str, name: &str) -> Result<Cluster, ApiError> {
    if !is_object_name(ns) || !is_object_name(name) {
        return Err(ApiError::bad_request(format!(
            "{ns:?}/{name:?} does not name a TaskRun (namespace/name, lowercase DNS names)"
        )));
    }
    scoped_namespace(console, ns)?;
    Ok(console.cluster(Some(ns)))
}

/// Refuses a namespace that is not a name, or not the `-n` console's.
fn scoped_namespace(console: &Console, ns: &str) -> Result<(), ApiError> {
    if !is_object_name(ns) {
        return Err(ApiError::bad_request(format!(
            "{ns:?} does not name a namespace (a lowercase DNS name)"
        )));
    }
    if let Some(mine) = console.namespace()
        && mine != ns
    {
        return Err(ApiError {
            status: 404,
            reason: "NotFound".into(),
            message: format!(
                "this console shows namespace {mine} only; start it with -n {ns} or -A"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_servers_refusal_keeps_its_status_and_reason() {
        let status = kube::core::Status::failure(
            "toolapprovals.orchestrator.io is forbidden: User \"viewer\" cannot create resource",
            "Forbidden",
        )
        .with_code(403);
        let e = Error::kube(
            "approving request ab12 of TaskRun t as viewer",
            kube::Error::Api(Box::new(status)),
        );
        let a = ApiError::from(e);
        assert_eq!((a.status, a.reason.as_str()), (403, "Forbidden"));
        assert!(
            a.message.starts_with("approving request ab12"),
            "{}",
            a.message
        );
        assert!(
            a.message.contains("cannot create resource"),
            "{}",
            a.message
        );
        let a = ApiError::from(Error::Usage("bad".into()));
        assert_eq!((a.status, a.reason.as_str()), (400, "BadRequest"));
        assert_eq!(ApiError::from(Error::Failed("done".into())).status, 409);
    }

    #[test]
    fn path_segments_must_be_names() {
        assert!(is_object_name("task-1001"));
        assert!(is_object_name("a.b"));
        for bad in [
            "",
            "A",
            "x/status",
            "-x",
            "x-",
            "../x",
            "x%2Fy",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
        assert!(check_id("ab12cd34").is_ok());
        assert!(check_id("ab/12").is_err());
    }
}
