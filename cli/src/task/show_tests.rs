//! `task get`, `list` and `describe`: the tables and the describe text.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::TaskRun;
use serde_json::json;

use super::show::*;

fn taskrun(name: &str, id: i64, service: &str, status: serde_json::Value) -> TaskRun {
    serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": name, "namespace": "team-a", "generation": 2,
                     "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"taskId": id, "serviceName": service,
                 "task": {"prompt": "# Fix the login bug\n\nDetails follow.\n"},
                 "toolConfig": {
                    "internalTools": {"permissions": {"allow": ["*"], "deny": ["WebFetch"]}},
                    "mcpServers": [
                        {"name": "filesystem", "tools": {"allow": ["*"], "deny": ["delete_file"]}},
                        {"name": "memory", "enabled": false}
                    ]}},
        "status": status,
    }))
    .expect("valid TaskRun")
}

fn now() -> Timestamp {
    "2025-01-01T00:05:00Z".parse().expect("valid")
}

#[test]
fn list_table_shows_the_printer_columns() {
    let items = [
        taskrun(
            "task-1001",
            1001,
            "todo-api",
            json!({"phase": "Running", "enabledToolCount": 4, "contextVersion": 2}),
        ),
        taskrun("task-7", 7, "web", json!(null)),
    ];
    assert_eq!(
        table(&items, false, now(), true),
        "NAME        TASK   SERVICE    PHASE     TOOLS    CONTEXT   RESULT   TURNS   COST   AGE\n\
         task-1001   1001   todo-api   Running   4        2                                 5m\n\
         task-7      7      web        <none>    <none>   <none>                            5m\n"
    );
    assert!(table(&items, true, now(), true).starts_with("NAMESPACE   NAME"));
}

#[test]
fn filters_by_phase_case_insensitively_and_service() {
    let items = vec![
        taskrun("a", 1, "web", json!({"phase": "Running"})),
        taskrun("b", 2, "web", json!({"phase": "Succeeded"})),
        taskrun("c", 3, "api", json!({"phase": "Running"})),
    ];
    let names = |v: Vec<TaskRun>| v.iter().map(|t| t.name_any()).collect::<Vec<_>>();
    assert_eq!(
        names(filter(items.clone(), Some("running"), None)),
        ["a", "c"]
    );
    assert_eq!(
        names(filter(items.clone(), Some("Running"), Some("web"))),
        ["a"]
    );
    assert_eq!(names(filter(items, None, Some("api"))), ["c"]);
}

#[test]
fn describe_shows_spec_status_conditions_tools_and_events() {
    let tr = taskrun(
        "task-1001",
        1001,
        "todo-api",
        json!({"phase": "Running", "observedGeneration": 1, "contextVersion": 1,
               "jobName": "task-1001", "configMapName": "task-1001-tools",
               "conditions": [{"type": "Ready", "status": "True", "reason": "JobRunning",
                               "message": "the agent runs", "lastTransitionTime": "2025-01-01T00:04:00Z"}],
               "contextHistory": [
                   {"contextVersion": 1, "generation": 1, "time": "2025-01-01T00:00:01Z",
                    "requestedBy": "alice", "source": "Annotation",
                    "added": ["filesystem/read_file", "memory/*"]},
                   {"contextVersion": 2, "generation": 2, "time": "2025-01-01T00:03:00Z",
                    "requestedBy": "kubectl-edit", "source": "FieldManager",
                    "removed": ["memory/*"]}]}),
    );
    let catalog = Catalog::parse(
        "servers:\n  - name: filesystem\n    stdio: {command: f}\n    tools: [{name: read_file}, {name: delete_file}]\n  - {name: memory, stdio: {command: m}}\n",
    )
    .expect("valid");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "e1", "namespace": "team-a"},
        "involvedObject": {"kind": "TaskRun", "name": "task-1001"},
        "reason": "ToolsUpdated", "type": "Normal", "message": "context version 1",
        "lastTimestamp": "2025-01-01T00:04:30Z"
    }))
    .expect("valid event");
    let text = describe_text(&tr, Some(&catalog), &[event], now());
    let expected = "\
Name:        task-1001
Namespace:   team-a
Task ID:     1001
Service:     todo-api
Phase:       Running
Created:     2025-01-01T00:00:00Z (5m ago)
Task:        inline, 3 lines: \"# Fix the login bug\"
Agent image: (the operator's default)
Generation:  2 (observed by the operator: 1)
Context:     version 1
Job:         task-1001
ConfigMap:   task-1001-tools
Result:      <none yet> (the agent reports when it finishes)
Conditions:
  TYPE    STATUS   REASON       AGE   MESSAGE
  Ready   True     JobRunning   60s   the agent runs
Tool config:
  agent built-in tools: allow all; deny WebFetch
  SERVER       ENABLED   ALLOW   DENY
  filesystem   yes       *       delete_file
  memory       no        (all)
Effective tools (computed from the spec and the catalog; the operator has not caught up):
  filesystem: read_file
  memory: off
Context history:
  VERSION   TIME                   BY                             CHANGES
  1         2025-01-01T00:00:01Z   alice                          +filesystem/read_file +memory/*
  2         2025-01-01T00:03:00Z   kubectl-edit (field manager)   -memory/*
Events:
  AGE   TYPE     REASON         OBJECT              MESSAGE
  30s   Normal   ToolsUpdated   taskrun/task-1001   context version 1
";
    assert_eq!(text, expected);
}

#[test]
fn describe_and_get_show_the_result_and_who_cancelled() {
    let tr = taskrun(
        "task-9",
        9,
        "web",
        json!({"phase": "Cancelled", "jobName": "task-9", "createdBy": "bob\u{1b}[2J",
               "cancellation": {"requestedBy": "alice", "time": "2025-01-01T00:04:00Z"},
               "result": {"subtype": "error_during_execution", "isError": true, "turns": 2,
                          "costUsd": "0.5", "text": "stopped\u{1b}]52;c;evil\u{7}"}}),
    );
    let text = describe_text(&tr, None, &[], now());
    assert!(text.contains("Phase:       Cancelled\n"), "{text}");
    assert!(text.contains("Created by:  bob\\u{1b}[2J\n"), "{text}");
    assert!(
        text.contains("Cancelled:   by alice at 2025-01-01T00:04:00Z (60s ago)\n"),
        "{text}"
    );
    assert!(
        text.contains("  Outcome:   error_during_execution\n  Error:     yes\n  Turns:     2\n"),
        "{text}"
    );
    assert!(
        text.contains("    stopped\\u{1b}]52;c;evil\\u{7}\n"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "no raw escape: {text:?}");
    let row = table(std::slice::from_ref(&tr), false, now(), true);
    assert!(
        row.lines().nth(1).is_some_and(|l| l.contains("Cancelled")
            && l.contains("error_during_execution")
            && l.contains("   2   ")
            && l.contains("$0.5")),
        "{row}"
    );
}

#[test]
fn describe_says_where_the_proxy_runs_and_who_reports_served() {
    let shared = taskrun(
        "task-3",
        3,
        "web",
        json!({"phase": "Running", "proxyMode": "shared", "servedContextVersion": 2}),
    );
    let text = describe_text(&shared, None, &[], now());
    assert!(
        text.contains("Proxy:       shared (the shared proxy Deployment serves this task)\n"),
        "{text}"
    );
    assert!(
        text.contains("Served:      version 2 (the shared proxy)\n"),
        "{text}"
    );
    let sidecar = taskrun(
        "task-4",
        4,
        "web",
        json!({"phase": "Running", "proxyMode": "sidecar", "servedContextVersion": 2}),
    );
    let text = describe_text(&sidecar, None, &[], now());
    assert!(
        text.contains("Proxy:       sidecar (in the task's pod)\n"),
        "{text}"
    );
    assert!(
        text.contains("Served:      version 2 (the task pod's proxy)\n"),
        "{text}"
    );
}

#[test]
fn describe_shows_the_proxys_count_beside_the_agents_claim_and_a_spent_budget() {
    let tr = taskrun(
        "task-9",
        9,
        "web",
        json!({"phase": "Running",
               "result": {"subtype": "success", "inputTokens": 10, "outputTokens": 1, "costUsd": "0.01"},
               "usage": {"inputTokens": 1200, "outputTokens": 345, "cacheCreationInputTokens": 100,
                         "cacheReadInputTokens": 4000, "costUsd": "0.0123", "requests": 7,
                         "refused": 2, "exceeded": "outputTokens"}}),
    );
    let text = describe_text(&tr, None, &[], now());
    assert!(
        text.contains("Usage (counted by the task's proxy from the model's answers):"),
        "{text}"
    );
    assert!(
        text.contains("  Requests:  7 (2 refused by the budget)"),
        "{text}"
    );
    assert!(
        text.contains("  Tokens:    5300 in (100 cache writes, 4000 cache reads), 345 out"),
        "{text}"
    );
    assert!(text.contains("  Cost:      $0.0123"), "{text}");
    assert!(text.contains("spent (spec.budget.outputTokens)"), "{text}");
    // The agent's claim is still shown, as its own.
    assert!(text.contains("Result (reported by the agent"), "{text}");
}
