//! What the caller may do with the tasks of a namespace, asked of the API server with the
//! caller's own credentials (SelfSubjectAccessReview, `authorization.k8s.io/v1`), so the page can
//! disable a button and say why instead of failing after the click. Advice only: the API server
//! still decides every request the buttons make (a 403 stays a 403).
//!
//! Each action is checked for exactly what its command does: approve and reject create a
//! ToolApproval (`task approve|reject`), add-context and cancel patch the TaskRun, the log is
//! `pods/log` of a pod found by listing the Job's pods (`task logs`).

use futures::future::join_all;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Serialize;

/// One permission an action needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
}

impl Need {
    const fn new(verb: &'static str, group: &'static str, resource: &'static str) -> Self {
        Need {
            verb,
            group,
            resource,
            subresource: "",
        }
    }

    /// `toolapprovals.orchestrator.io`, `pods/log`: as RBAC rules and kubectl name them.
    pub fn what(&self) -> String {
        let resource = match self.group {
            "" => self.resource.to_string(),
            g => format!("{}.{g}", self.resource),
        };
        match self.subresource {
            "" => resource,
            s => format!("{resource}/{s}"),
        }
    }
}

/// An action of the page and what it needs, in the order they are checked.
#[derive(Debug)]
pub struct Action {
    /// The key in the answer (`approve`, `context`, `cancel`, `logs`).
    pub key: &'static str,
    /// What the action is, after "which … needs".
    pub doing: &'static str,
    pub needs: &'static [Need],
}

const TOOLAPPROVALS: Need = Need::new("create", "orchestrator.io", "toolapprovals");
const PATCH_TASKRUNS: Need = Need::new("patch", "orchestrator.io", "taskruns");

/// Every action the page asks about.
pub const ACTIONS: [Action; 4] = [
    Action {
        key: "approve",
        doing: "approving or rejecting a call (a ToolApproval in your name; the chart's orchestrator-approver role grants it)",
        needs: &[TOOLAPPROVALS],
    },
    Action {
        key: "context",
        doing: "changing the task's tools or budget (task add-context)",
        needs: &[PATCH_TASKRUNS],
    },
    Action {
        key: "cancel",
        doing: "cancelling the task (task cancel)",
        needs: &[PATCH_TASKRUNS],
    },
    Action {
        key: "logs",
        doing: "reading the task pod's log (task logs)",
        needs: &[
            Need::new("list", "", "pods"),
            Need {
                subresource: "log",
                ..Need::new("get", "", "pods")
            },
        ],
    },
];

/// What the API server said of one action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// `None`: it could not be asked (the button stays enabled; the API server decides).
    pub allowed: Option<bool>,
    /// Why not, or why unknown, in words for the page.
    pub reason: Option<String>,
}

/// The API server's answer to one review: allowed, and its reason or evaluation error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Allowed,
    Denied {
        said: String,
    },
    /// The review itself failed (refused, unreachable).
    Failed(String),
}

/// The review of `need` in namespace `ns`, for the caller (no user is named: it is the one
/// whose credentials make the request).
pub fn review(need: &Need, ns: &str) -> SelfSubjectAccessReview {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.to_string()),
                verb: Some(need.verb.to_string()),
                group: Some(need.group.to_string()),
                resource: Some(need.resource.to_string()),
                subresource: text(need.subresource),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Asks the API server about `need` in `ns`.
async fn ask(client: &Client, need: &Need, ns: &str) -> Answer {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &review(need, ns)).await {
        Ok(r) => {
            let status = r.status.unwrap_or_default();
            if status.allowed && !status.denied.unwrap_or(false) {
                Answer::Allowed
            } else {
                let said = [status.reason, status.evaluation_error]
                    .into_iter()
                    .flatten()
                    .filter(|s| !s.trim().is_empty())
                    .collect::<Vec<_>>()
                    .join("; ");
                Answer::Denied { said }
            }
        }
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// The verdict on `action` from the answers about its needs (in order).
pub fn verdict(action: &Action, answers: &[Answer], ns: &str, user: Option<&str>) -> Verdict {
    let who = user.map_or("you".to_string(), |u| format!("you ({u})"));
    for (need, answer) in action.needs.iter().zip(answers) {
        match answer {
            Answer::Allowed => {}
            Answer::Denied { said } => {
                let said = match said.as_str() {
                    "" => String::new(),
                    s => format!(" (the API server: {s})"),
                };
                return Verdict {
                    allowed: Some(false),
                    reason: Some(format!(
                        "{who} may not {} {} in namespace {ns}, which {} needs{said}",
                        need.verb,
                        need.what(),
                        action.doing
                    )),
                };
            }
            Answer::Failed(e) => {
                return Verdict {
                    allowed: None,
                    reason: Some(format!(
                        "could not ask the API server whether {who} may {} {} in namespace {ns} ({e}); the API server decides when you try",
                        need.verb,
                        need.what()
                    )),
                };
            }
        }
    }
    Verdict {
        allowed: Some(true),
        reason: None,
    }
}

/// What the caller may do in `ns`: `{"approve": Verdict, "context": …, "cancel": …, "logs": …}`
/// (every distinct permission asked once, all at the same time).
pub async fn check(client: &Client, ns: &str, user: Option<&str>) -> serde_json::Value {
    let mut needs: Vec<Need> = Vec::new();
    for n in ACTIONS.iter().flat_map(|a| a.needs) {
        if !needs.contains(n) {
            needs.push(*n);
        }
    }
    let answers = join_all(needs.iter().map(|n| ask(client, n, ns))).await;
    let answer_of = |n: &Need| {
        needs
            .iter()
            .position(|m| m == n)
            .and_then(|i| answers.get(i).cloned())
            .unwrap_or_else(|| Answer::Failed("not asked".into()))
    };
    let mut out = serde_json::Map::new();
    out.insert("namespace".into(), ns.into());
    for action in &ACTIONS {
        let answers: Vec<Answer> = action.needs.iter().map(answer_of).collect();
        let v = verdict(action, &answers, ns, user);
        out.insert(
            action.key.into(),
            serde_json::to_value(v).unwrap_or_default(),
        );
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_who_what_where_and_what_for() {
        let approve = &ACTIONS[0];
        let v = verdict(
            approve,
            &[Answer::Denied { said: "".into() }],
            "team-a",
            Some("mallory"),
        );
        assert_eq!(v.allowed, Some(false));
        assert_eq!(
            v.reason.as_deref(),
            Some(
                "you (mallory) may not create toolapprovals.orchestrator.io in namespace team-a, \
                 which approving or rejecting a call (a ToolApproval in your name; the chart's \
                 orchestrator-approver role grants it) needs"
            )
        );
        let logs = &ACTIONS[3];
        let v = verdict(
            logs,
            &[
                Answer::Allowed,
                Answer::Denied {
                    said: "no RBAC policy matched".into(),
                },
            ],
            "ns",
            None,
        );
        let reason = v.reason.unwrap_or_default();
        assert!(
            reason.starts_with("you may not get pods/log in namespace ns")
                && reason.ends_with("(the API server: no RBAC policy matched)"),
            "{reason}"
        );
        assert_eq!(
            verdict(logs, &[Answer::Allowed, Answer::Allowed], "ns", None),
            Verdict {
                allowed: Some(true),
                reason: None
            }
        );
        let unknown = verdict(approve, &[Answer::Failed("timed out".into())], "ns", None);
        assert_eq!(unknown.allowed, None);
        assert!(
            unknown.reason.is_some_and(|r| r.contains("timed out")),
            "unknown says why"
        );
    }

    #[test]
    fn the_review_asks_exactly_what_the_command_does() {
        let r = serde_json::to_value(review(&ACTIONS[0].needs[0], "team-a")).unwrap_or_default();
        assert_eq!(r["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(r["kind"], "SelfSubjectAccessReview");
        assert_eq!(
            r["spec"]["resourceAttributes"],
            serde_json::json!({"namespace": "team-a", "verb": "create",
                "group": "orchestrator.io", "resource": "toolapprovals"})
        );
        let r = serde_json::to_value(review(&ACTIONS[3].needs[1], "ns")).unwrap_or_default();
        assert_eq!(
            r["spec"]["resourceAttributes"],
            serde_json::json!({"namespace": "ns", "verb": "get", "group": "",
                "resource": "pods", "subresource": "log"})
        );
    }
}
