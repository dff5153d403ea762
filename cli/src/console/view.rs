//! What the page gets for one TaskRun ([`TaskView`]), pure: the list row and the detail in one
//! object, built with the same functions `task list` and `task describe` use, so the page and the
//! CLI cannot disagree. Nothing in it is secret: approval params come already masked.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use orchestrator_crds::approval::{Approval, ApprovalState, DigestCheck};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::{Cancellation, TaskResult, TaskRun};
use serde::Serialize;

use super::params;
use crate::task::{approve, result_view, show};

/// One TaskRun as the console shows it (the contract: docs/design/console.md).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub task_id: i64,
    pub service: String,
    pub created_at: Option<String>,
    pub phase: Option<&'static str>,
    pub generation: Option<i64>,
    pub observed_generation: Option<i64>,
    pub context_version: Option<i64>,
    pub served_context_version: Option<i64>,
    pub prompt: String,
    pub result: Option<TaskResult>,
    pub result_line: Option<String>,
    /// What the task's proxy counted of its model requests (`status.usage`), in one line.
    pub usage_line: Option<String>,
    /// The `spec.budget` field spent, while the gateway refuses the task's requests.
    pub budget_exceeded: Option<String>,
    pub cancellation: Option<Cancellation>,
    pub conditions: Vec<Condition>,
    pub tools: Tools,
    pub servers: Vec<ServerView>,
    pub history: Vec<HistoryRow>,
    pub approvals: Vec<ApprovalView>,
}

/// An approval as the page shows it: the status entry, and what its digest says of the params
/// it shows (recomputed here when nothing is masked, as `task approve` does before deciding).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView {
    #[serde(flatten)]
    pub approval: Approval,
    /// `covers` (recomputed from the params shown: it names exactly them), `salted` (something
    /// is masked or nothing is shown: only the proxy can check it), `mismatch` (the params shown
    /// are another call: it cannot be approved), `unreadable`.
    pub digest_check: &'static str,
    /// The params' `arguments` member laid out one value a line ([`params::arguments`]), what
    /// a person judges first; `None` when the params have no one `arguments` (or none are shown).
    pub arguments: Option<String>,
}

/// The effective tools, as `task describe` prints them.
#[derive(Clone, Debug, Serialize)]
pub struct Tools {
    pub source: &'static str,
    pub lines: Vec<String>,
}

/// One entry of `spec.toolConfig.mcpServers`.
#[derive(Clone, Debug, Serialize)]
pub struct ServerView {
    pub name: String,
    pub enabled: bool,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

/// One entry of `status.contextHistory`, as `task describe` words it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRow {
    pub context_version: i64,
    pub time: String,
    pub by: String,
    pub changes: String,
}

impl TaskView {
    pub fn new(tr: &TaskRun, catalog: Option<&Catalog>) -> Self {
        let status = tr.status.clone().unwrap_or_default();
        let (source, lines) = show::effective_lines(tr, catalog);
        let [outcome, turns, cost] = result_view::cells(tr);
        let result_line = status.result.as_ref().map(|_| {
            [
                outcome,
                if turns.is_empty() {
                    turns
                } else {
                    format!("{turns} turns")
                },
                cost,
            ]
            .into_iter()
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
            .join(", ")
        });
        let mut approvals = status.approvals.clone();
        // What waits first (a person's next job), then the newest.
        approvals.sort_by(|a, b| {
            let waiting = |x: &Approval| x.state != ApprovalState::Pending;
            waiting(a)
                .cmp(&waiting(b))
                .then_with(|| b.requested_at.cmp(&a.requested_at))
        });
        TaskView {
            namespace: tr.namespace().unwrap_or_default(),
            name: tr.name_any(),
            uid: tr.metadata.uid.clone().unwrap_or_default(),
            task_id: tr.spec.task_id,
            service: tr.spec.service_name.clone(),
            created_at: tr
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
            phase: status.phase.map(|p| p.as_str()),
            generation: tr.metadata.generation,
            observed_generation: status.observed_generation,
            context_version: status.context_version,
            served_context_version: status.served_context_version,
            prompt: show::task_summary(tr),
            result: status.result.clone(),
            result_line,
            usage_line: status.usage.as_ref().map(result_view::usage_line),
            budget_exceeded: status.usage.as_ref().and_then(|u| u.exceeded.clone()),
            cancellation: status.cancellation.clone(),
            conditions: status.conditions.clone(),
            tools: Tools { source, lines },
            servers: tr
                .spec
                .tool_config
                .mcp_servers
                .iter()
                .map(|s| ServerView {
                    name: s.name.clone(),
                    enabled: s.enabled,
                    allow: s.tools.allow.clone(),
                    deny: s.tools.deny.clone(),
                })
                .collect(),
            history: status
                .context_history
                .iter()
                .map(|e| HistoryRow {
                    context_version: e.context_version,
                    time: e.time.0.to_string(),
                    by: e.who(),
                    changes: e.changes(),
                })
                .collect(),
            approvals: approvals
                .into_iter()
                .map(|approval| ApprovalView {
                    digest_check: match approve::digest_check(
                        &approval,
                        &tr.namespace().unwrap_or_default(),
                        &tr.name_any(),
                    ) {
                        DigestCheck::Covers => "covers",
                        DigestCheck::Salted => "salted",
                        DigestCheck::Mismatch { .. } => "mismatch",
                        DigestCheck::Unreadable => "unreadable",
                    },
                    arguments: match approval.withheld {
                        Some(_) => None,
                        None => approval.params.as_deref().and_then(params::arguments),
                    },
                    approval,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(status: serde_json::Value) -> TaskRun {
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1",
            "kind": "TaskRun",
            "metadata": {"name": "t1", "namespace": "team-a", "uid": "u1", "generation": 2,
                         "creationTimestamp": "2026-11-27T10:00:00Z"},
            "spec": {"taskId": 7, "serviceName": "api",
                     "task": {"prompt": "<b>fix</b> the build\nand test"},
                     "toolConfig": {"mcpServers": [
                        {"name": "everything", "tools": {"allow": ["echo"]}},
                        {"name": "time", "enabled": false}]}},
            "status": status
        }))
        .expect("a TaskRun")
    }

    #[test]
    fn the_view_says_what_describe_says_and_puts_waiting_calls_first() {
        let approval = |id: &str, state: &str, at: &str| {
            json!({"id": id, "server": "everything", "tool": "echo", "digest": "sha256:00",
                   "contextVersion": 1, "params": "{\"arguments\":{}}", "paramsBytes": 16,
                   "requestedAt": at, "expiresAt": "2026-11-27T10:10:00Z", "state": state})
        };
        let tr = task(json!({
            "phase": "Running", "observedGeneration": 2, "contextVersion": 2,
            "servedContextVersion": 1,
            "tools": [{"server": "everything", "allow": ["echo"], "exposed": ["echo"]},
                      {"server": "time", "exposed": []}],
            "approvals": [approval("aaaa1111", "Approved", "2026-11-27T10:01:00Z"),
                          approval("bbbb2222", "Pending", "2026-11-27T10:00:30Z")],
        }));
        let view = TaskView::new(&tr, None);
        assert_eq!(view.tools.source, "reported by the operator");
        assert_eq!(view.tools.lines, ["everything: echo", "time: none"]);
        assert_eq!(view.phase, Some("Running"));
        assert_eq!(view.served_context_version, Some(1));
        assert_eq!(view.approvals[0].approval.id, "bbbb2222");
        assert_eq!(view.prompt, show::task_summary(&tr));
        assert_eq!(view.result_line, None);
        let json = serde_json::to_value(&view).expect("serializes");
        assert_eq!(json["approvals"][0]["state"], "Pending");
        // A fake digest over unmasked params: the page is told it names another call.
        assert_eq!(json["approvals"][0]["digestCheck"], "mismatch");
        // What a person judges first: the arguments, laid out; the params stay whole beside them.
        assert_eq!(json["approvals"][0]["arguments"], "{}");
        assert_eq!(json["approvals"][0]["params"], "{\"arguments\":{}}");
        assert_eq!(json["createdAt"], "2026-11-27T10:00:00Z");
        assert_eq!(json["servers"][1]["enabled"], false);
    }

    #[test]
    fn a_task_the_operator_has_not_seen_shows_its_spec() {
        let view = TaskView::new(&task(json!(null)), None);
        assert_eq!(view.phase, None);
        assert_eq!(view.tools.source, "from the spec; catalog unavailable");
        assert_eq!(view.tools.lines, ["everything: echo", "time: off"]);
    }

    #[test]
    fn a_finished_task_shows_its_result_in_one_line_and_whole() {
        let tr = task(json!({
            "phase": "Succeeded",
            "result": {"subtype": "success", "isError": false, "text": "<done>", "turns": 27,
                       "inputTokens": 111198, "outputTokens": 868, "costUsd": "0.462152"},
        }));
        let view = TaskView::new(&tr, None);
        assert_eq!(view.phase, Some("Succeeded"));
        assert_eq!(
            view.result_line.as_deref(),
            Some("success, 27 turns, $0.462152")
        );
        let json = serde_json::to_value(&view).expect("serializes");
        assert_eq!(json["result"]["text"], "<done>");
        assert_eq!(json["result"]["inputTokens"], 111198);
        assert_eq!(json["usageLine"], serde_json::Value::Null);
    }

    #[test]
    fn what_the_proxy_counted_is_one_line_and_a_spent_budget_is_named() {
        let tr = task(json!({
            "phase": "Running",
            "usage": {"inputTokens": 5000, "outputTokens": 150, "cacheCreationInputTokens": 300,
                      "cacheReadInputTokens": 100, "costUsd": "0.02", "requests": 6, "refused": 2,
                      "exceeded": "outputTokens"},
        }));
        let view = TaskView::new(&tr, None);
        assert_eq!(
            view.usage_line.as_deref(),
            Some(
                "6 requests (2 refused by the budget), 5400 tokens in, 150 out, $0.02; \
                 budget spent (spec.budget.outputTokens)"
            )
        );
        let json = serde_json::to_value(&view).expect("serializes");
        assert_eq!(json["budgetExceeded"], "outputTokens");
    }
}
