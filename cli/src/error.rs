//! The CLI's one error type, and the exit code each kind of failure maps to.
//!
//! Exit codes (stable; scripts may rely on them, `docs/cli.md` lists them too):
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | the API server or the network failed, or refused a write (forbidden, invalid, too many conflicts) |
//! | 2 | bad input: flags, `server:tool` syntax, unknown server, contradictory request; nothing was written |
//! | 3 | not found: the task, the catalog, or a catalog server does not exist; no pod for `task logs` (not started yet, or gone) |
//! | 4 | timed out waiting (`--wait`, `--wait-synced` with `--timeout`) |
//! | 5 | the task failed or was cancelled (`--wait` saw phase `Failed` or `Cancelled`), `task cancel` of a finished task, or the operator refused a change (`--wait-synced`) |

use std::fmt::Write as _;
use std::time::Duration;

/// The result of every fallible CLI operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, grouped by what the user has to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong; nothing was sent to the API server.
    #[error("{0}")]
    Usage(String),

    /// A named thing does not exist.
    #[error("{0}")]
    NotFound(String),

    /// A wait ran out of time.
    #[error("timed out after {}s waiting for {what}", after.as_secs())]
    Timeout { what: String, after: Duration },

    /// The task failed, or the operator refused the change we waited for.
    #[error("{0}")]
    Failed(String),

    /// The API server refused a request or could not be reached.
    #[error("{action}: {}", describe_kube_error(source))]
    Kube {
        /// What we were doing, e.g. "creating TaskRun task-1001 in namespace team-a".
        action: String,
        #[source]
        source: kube::Error,
    },

    /// No usable kubeconfig / cluster connection settings.
    #[error("{0}")]
    Config(String),

    /// The catalog could not be read or is invalid.
    #[error("{0}")]
    Catalog(String),

    /// Anything else that went wrong talking to the cluster: too many lost races, a watch that
    /// keeps failing, an object that does not parse.
    #[error("{0}")]
    Cluster(String),

    /// Printing the result failed (e.g. a closed pipe).
    #[error("writing output: {0}")]
    Output(String),
}

impl Error {
    /// The process exit code for this error (see the module documentation).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::NotFound(_) => 3,
            Error::Timeout { .. } => 4,
            Error::Failed(_) => 5,
            Error::Kube { source, .. } if is_not_found(source) => 3,
            Error::Kube { .. }
            | Error::Config(_)
            | Error::Catalog(_)
            | Error::Cluster(_)
            | Error::Output(_) => 1,
        }
    }

    /// Wraps a kube error with what we were doing when it happened.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }
}

/// True for an HTTP 404 from the API server.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// True for an HTTP 409 Conflict (a stale resourceVersion or an existing name).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// A kube error in words: the API server's own message for refusals, the cause chain for
/// transport failures (never the `Debug` form of a struct).
pub fn describe_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let mut out = if status.message.is_empty() {
                "the API server refused the request".to_string()
            } else {
                status.message.clone()
            };
            // Some refusals keep the specifics in the causes (e.g. a failed JSON Patch).
            for cause in status.details.iter().flat_map(|d| &d.causes) {
                if !cause.message.is_empty() && !out.contains(&cause.message) {
                    let _ = write!(out, ": {}", cause.message);
                }
            }
            let hint = match status.code {
                401 => " — the credentials were not accepted; check --kubeconfig/--context",
                403 => " — your user lacks RBAC permission for this",
                404 if status
                    .message
                    .contains("the server could not find the requested resource") =>
                {
                    " — is the TaskRun CRD installed? (install the chart, or `kubectl apply -f crds/generated/taskrun.yaml`)"
                }
                _ => "",
            };
            out.push_str(hint);
            let reason = if status.reason.is_empty() {
                String::new()
            } else {
                format!("{} ", status.reason)
            };
            let _ = write!(out, " ({reason}HTTP {})", status.code);
            out
        }
        other => {
            let mut out = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(s) = source {
                let text = s.to_string();
                if !out.contains(&text) {
                    let _ = write!(out, ": {text}");
                }
                source = s.source();
            }
            out.push_str(" (is the cluster reachable? check --kubeconfig and --context)");
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut status = Status::failure(message, reason);
        status.code = code;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn exit_codes_follow_the_documented_table() {
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(Error::NotFound("x".into()).exit_code(), 3);
        let timeout = Error::Timeout {
            what: "x".into(),
            after: Duration::from_secs(1),
        };
        assert_eq!(timeout.exit_code(), 4);
        assert_eq!(Error::Failed("x".into()).exit_code(), 5);
        let missing = Error::kube("getting x", api_error(404, "NotFound", "gone"));
        assert_eq!(missing.exit_code(), 3);
        let forbidden = Error::kube("getting x", api_error(403, "Forbidden", "no"));
        assert_eq!(forbidden.exit_code(), 1);
    }

    #[test]
    fn api_refusals_are_shown_in_words() {
        let e = Error::kube(
            "creating TaskRun t in namespace n",
            api_error(422, "Invalid", "spec.taskId: Invalid value: -1"),
        );
        assert_eq!(
            e.to_string(),
            "creating TaskRun t in namespace n: spec.taskId: Invalid value: -1 (Invalid HTTP 422)"
        );
        let e = Error::kube(
            "listing TaskRuns",
            api_error(403, "Forbidden", "user x cannot list"),
        );
        assert!(e.to_string().contains("lacks RBAC permission"), "{e}");
        assert!(!e.to_string().contains("Status {"), "no Debug structs: {e}");
    }
}
