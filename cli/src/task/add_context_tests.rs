//! Unit tests of `task add-context` (the patch, the report, the pod's servers).

use super::add_context::*;
use crate::effective::diff;
use crate::merge::{self, Request};
use crate::toolspec::parse_specs;
use kube::core::DynamicObject;
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::taskrun::ToolConfig;
use orchestrator_crds::taskrun::{McpServer, TaskRun};
use serde_json::{Value, json};

#[test]
fn patch_keeps_unknown_fields_of_existing_entries() {
    let data = json!({"spec": {"toolConfig": {"mcpServers": [
        {"name": "github", "enabled": true, "tools": {"allow": ["a"], "futureField": 1},
         "secretRefs": [{"env": "T", "name": "s"}], "futureTop": "x"}
    ]}}});
    let mut github = McpServer::new("github", &["a", "b"], &["c"]);
    github.enabled = true;
    let patched = patched_servers(&data, &[github, McpServer::new("time", &["*"], &[])]);
    assert_eq!(
        patched,
        json!([
            {"name": "github", "enabled": true,
             "tools": {"allow": ["a", "b"], "deny": ["c"], "futureField": 1},
             "secretRefs": [{"env": "T", "name": "s"}], "futureTop": "x"},
            {"name": "time", "enabled": true, "tools": {"allow": ["*"]}}
        ])
    );
}

#[test]
fn a_server_the_running_pod_was_not_created_with_is_refused_before_writing() {
    let catalog = Catalog::parse(include_str!("../../../config/catalog.yaml")).expect("catalog");
    let mut tr: TaskRun = serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-7", "namespace": "n"},
        "spec": {"taskId": 7, "serviceName": "s", "task": {"prompt": "p"},
                 "toolConfig": {"mcpServers": [{"name": "time"}, {"name": "git", "enabled": false}]}}
    }))
    .expect("a TaskRun");
    let request = Request {
        enable: parse_specs(
            "--enable-tools",
            &[
                "memory:read_graph".to_string(),
                "git:git_status".to_string(),
            ],
        )
        .expect("specs"),
        disable: vec![],
    };
    let after = merge::apply(&tr.spec.tool_config, &request, &catalog).expect("merges");
    // Before the operator created the pod, any server may still be added.
    assert!(check_servers_in_pod(&tr, &after.config.mcp_servers, &catalog).is_ok());
    tr.status = Some(orchestrator_crds::taskrun::TaskRunStatus {
        job_name: Some("task-7".into()),
        ..Default::default()
    });
    let err = check_servers_in_pod(&tr, &after.config.mcp_servers, &catalog)
        .expect_err("memory has no container in the pod")
        .to_string();
    assert!(
        err.contains("cannot add server memory to TaskRun task-7"),
        "{err}"
    );
    assert!(
        err.contains("(time, git)") && err.contains("submit a new task"),
        "{err}"
    );
    // git was listed (disabled): enabling it is fine.
    let git_only = Request {
        enable: parse_specs("--enable-tools", &["git:git_status".to_string()]).expect("specs"),
        disable: vec![],
    };
    let after = merge::apply(&tr.spec.tool_config, &git_only, &catalog).expect("merges");
    assert!(check_servers_in_pod(&tr, &after.config.mcp_servers, &catalog).is_ok());
}

fn read(metadata: Value, spec: Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": metadata, "spec": spec}),
    )
    .expect("a TaskRun")
}

#[test]
fn the_patch_tests_the_list_it_was_computed_from() {
    let data = read(
        json!({"name": "t", "generation": 4}),
        json!({"toolConfig": {"mcpServers": [{"name": "time", "enabled": true}]}}),
    );
    let time = [McpServer::new("time", &["get_current_time"], &[])];
    let patch = guarded_patch(&data, &time, None);
    assert_eq!(
        serde_json::to_value(&patch).expect("serializes"),
        json!([
            {"op": "test", "path": "/spec/toolConfig/mcpServers",
             "value": [{"name": "time", "enabled": true}]},
            {"op": "add", "path": "/spec/toolConfig/mcpServers",
             "value": [{"name": "time", "enabled": true, "tools": {"allow": ["get_current_time"]}}]},
        ])
    );
    let none = guarded_patch(
        &read(json!({"name": "t"}), json!({})),
        &[McpServer::new("time", &["*"], &[])],
        None,
    );
    assert_eq!(
        serde_json::to_value(&none).expect("serializes"),
        json!([
            {"op": "test", "path": "/spec/toolConfig", "value": null},
            {"op": "add", "path": "/spec/toolConfig",
             "value": {"mcpServers": [{"name": "time", "enabled": true, "tools": {"allow": ["*"]}}]}},
        ])
    );
    // Who asked: the annotation names the generation this write makes, which the
    // generation test guarantees.
    let by_alice = guarded_patch(&data, &time, Some("alice"));
    let ops = serde_json::to_value(&by_alice).expect("serializes");
    assert_eq!(
        ops[1],
        json!({"op": "test", "path": "/metadata/generation", "value": 4})
    );
    assert_eq!(
        ops[4],
        json!({"op": "add", "path": "/metadata/annotations",
               "value": {"orchestrator.io/requested-by": r#"{"user":"alice","generation":5}"#}})
    );
}

#[test]
fn report_marks_added_removed_and_kept_tools() {
    let catalog = Catalog::parse(
        "servers:\n  - name: filesystem\n    stdio: {command: f}\n    tools: [{name: read_file}, {name: delete_file}]\n  - {name: memory, stdio: {command: m}}\n  - {name: github, stdio: {command: g}}\n",
    )
    .expect("valid");
    let before = ToolConfig {
        mcp_servers: vec![
            McpServer::new("filesystem", &[], &[]),
            McpServer::new("memory", &[], &[]),
        ],
        ..Default::default()
    };
    let mut after = before.clone();
    after.mcp_servers[0].tools.deny = vec!["delete_file".into()];
    after
        .mcp_servers
        .push(McpServer::new("github", &["merge_pr"], &[]));
    let report = Report {
        name: "task-1".into(),
        namespace: "ns".into(),
        changed: true,
        dry_run: false,
        generation: Some(2),
        attempts: 2,
        budget: None,
        conditions: None,
        servers: diff(&before, &after, Some(&catalog)),
        context_version: Some(3),
        served_context_version: Some(3),
        notes: vec![],
    };
    assert_eq!(
        render_report(&report),
        "TaskRun task-1 in namespace ns: tools before → after\n\
         filesystem: 2 tools → 1 tool\n\
         \x20 - delete_file\n\
         \x20   read_file\n\
         github: off → 1 tool\n\
         \x20 + merge_pr\n\
         memory: allow all (unchanged)\n\
         updated: generation 2 after 2 attempts (concurrent writers)\n\
         synced: the operator rendered context version 3\n\
         served: the task pod's proxy serves context version 3\n"
    );
}

#[test]
fn the_budget_is_tested_as_read_and_replaced_or_removed() {
    use crate::budget::{apply, describe, parse};
    let changes: Vec<(String, Value)> = [
        "outputTokens=50000",
        "costUsd=2.50",
        "requests=none",
        "wallTimeSeconds=7200",
    ]
    .iter()
    .map(|t| parse(t).expect("parses"))
    .collect();
    let before =
        json!({"outputTokens": 2000, "requests": 10, "someNewLimit": 60, "wallTimeSeconds": 600});
    let after = apply(Some(&before), &changes);
    // Unknown fields (a newer CRD) are kept; `none` removes a limit.
    assert_eq!(
        after,
        json!({"outputTokens": 50000, "costUsd": "2.50", "someNewLimit": 60, "wallTimeSeconds": 7200})
    );
    assert_eq!(
        describe(&before, &after),
        "outputTokens 2000 → 50000, costUsd none → 2.50, requests 10 → none, wallTimeSeconds 600 → 7200"
    );
    let ops = serde_json::to_value(budget_ops(&before, &after)).expect("serializes");
    assert_eq!(
        ops,
        json!([
            {"op": "test", "path": "/spec/budget", "value": before},
            {"op": "add", "path": "/spec/budget", "value": after},
        ])
    );
    // No budget before: tested as null. Every limit lifted: the field goes.
    let ops =
        serde_json::to_value(budget_ops(&Value::Null, &json!({"requests": 3}))).expect("json");
    assert_eq!(
        ops[0],
        json!({"op": "test", "path": "/spec/budget", "value": null})
    );
    let lifted = apply(
        Some(&json!({"requests": 3})),
        &[parse("requests=none").expect("parses")],
    );
    assert_eq!(lifted, Value::Null);
    let ops = serde_json::to_value(budget_ops(&json!({"requests": 3}), &lifted)).expect("json");
    assert_eq!(ops[1], json!({"op": "remove", "path": "/spec/budget"}));
    // Bad input names the field and the form.
    for (bad, says) in [
        ("outputTokens", "expected FIELD=VALUE"),
        ("tokens=5", "no budget field \"tokens\""),
        ("outputTokens=-1", "outputTokens is a whole number"),
        ("costUsd=2,50", "costUsd is USD as a decimal"),
        ("wallTimeSeconds=1h", "wallTimeSeconds is a whole number"),
    ] {
        let e = parse(bad).expect_err(bad);
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn conditions_are_read_checked_and_written_guarded() {
    use crate::conditions::{conditions_ops, read_conditions};
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "- name: under-src\n  tools: [\"filesystem/write_*\"]\n  when: '!args.path.startsWith(\"/workspace/src/\")'\n  message: writes go under src\n",
    )
    .expect("write");
    let list = read_conditions(&good).expect("reads");
    assert_eq!(list[0].name, "under-src");
    // A bad expression: nothing is written, the message names the entry and the position.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "- {name: a, when: 'args.path =='}\n- {name: a, when: 'argz'}\n",
    )
    .expect("write");
    let e = read_conditions(&bad).expect_err("refused").to_string();
    assert!(
        e.contains("nothing was changed")
            && e.contains("--conditions[0].when: condition \"a\": at 1:")
            && e.contains("--conditions[1].name")
            && e.contains("unknown variable `argz`"),
        "{e}"
    );
    let e = read_conditions(&dir.path().join("missing.yaml")).expect_err("no file");
    assert!(e.to_string().contains("--conditions"), "{e}");

    // A TaskRun with a policy: test the list, then replace it (or remove it for []).
    let after = serde_json::to_value(&list).expect("json");
    let read = json!({"spec": {"toolConfig": {"policy": {"maxRisk": "write"}}}});
    let ops = serde_json::to_value(conditions_ops(&read, &Value::Null, &after)).expect("json");
    assert_eq!(
        ops,
        json!([
            {"op": "test", "path": "/spec/toolConfig/policy/conditions", "value": null},
            {"op": "add", "path": "/spec/toolConfig/policy/conditions", "value": after},
        ])
    );
    let read = json!({"spec": {"toolConfig": {"policy": {"conditions": after.clone()}}}});
    let ops = serde_json::to_value(conditions_ops(&read, &after, &Value::Null)).expect("json");
    assert_eq!(
        ops[1],
        json!({"op": "remove", "path": "/spec/toolConfig/policy/conditions"})
    );
    // No policy yet: it is made, after testing there was none.
    let read = json!({"spec": {"toolConfig": {"mcpServers": []}}});
    let ops = serde_json::to_value(conditions_ops(&read, &Value::Null, &after)).expect("json");
    assert_eq!(
        ops,
        json!([
            {"op": "test", "path": "/spec/toolConfig/policy", "value": null},
            {"op": "add", "path": "/spec/toolConfig/policy", "value": {"conditions": after}},
        ])
    );
}
