//! `task cancel`'s patch: the annotation is written only where it is absent and the phase is
//! still the one read.

use serde_json::json;

use super::lifecycle::cancel_patch;

#[test]
fn the_cancel_patch_tests_the_annotation_is_absent_and_the_phase_unchanged() {
    let running = json!({"metadata": {"annotations": {"a": "b"}}, "status": {"phase": "Running"}});
    assert_eq!(
        cancel_patch(&running, "alice"),
        [
            json!({"op": "test", "path": "/status/phase", "value": "Running"}),
            json!({"op": "test", "path": "/metadata/annotations/orchestrator.io~1cancel", "value": null}),
            json!({"op": "add", "path": "/metadata/annotations/orchestrator.io~1cancel",
                   "value": r#"{"user":"alice"}"#}),
        ]
    );
}

#[test]
fn without_annotations_or_status_the_patch_tests_there_are_none() {
    let bare = json!({"metadata": {"name": "t"}});
    assert_eq!(
        cancel_patch(&bare, "system:serviceaccount:team-a:bot"),
        [
            json!({"op": "test", "path": "/status", "value": null}),
            json!({"op": "test", "path": "/metadata/annotations", "value": null}),
            json!({"op": "add", "path": "/metadata/annotations",
                   "value": {"orchestrator.io/cancel": r#"{"user":"system:serviceaccount:team-a:bot"}"#}}),
        ]
    );
    let no_phase = json!({"metadata": {}, "status": {"jobName": "t"}});
    assert_eq!(
        cancel_patch(&no_phase, "bob")[0],
        json!({"op": "test", "path": "/status/phase", "value": null})
    );
}

#[test]
fn a_hostile_user_name_stays_inside_the_json_value() {
    // The name is the API server's, but whatever it holds is data in one JSON string.
    let ops = cancel_patch(&json!({"metadata": {}}), "eve\",\"user\":\"root");
    let value = ops[2]["value"]["orchestrator.io/cancel"]
        .as_str()
        .expect("a string");
    let parsed: serde_json::Value = serde_json::from_str(value).expect("valid JSON");
    assert_eq!(parsed, json!({"user": "eve\",\"user\":\"root"}));
}

fn taskrun(
    annotations: serde_json::Value,
    status: serde_json::Value,
) -> orchestrator_crds::taskrun::TaskRun {
    serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-7", "annotations": annotations},
        "spec": {"taskId": 7, "serviceName": "s", "task": {"prompt": "x"}},
        "status": status,
    }))
    .expect("valid TaskRun")
}

#[test]
fn a_finished_task_is_refused_naming_its_phase() {
    use super::lifecycle::check_cancellable;
    for phase in ["Succeeded", "Failed", "Cancelled"] {
        let err =
            check_cancellable(&taskrun(json!({}), json!({"phase": phase}))).expect_err("finished");
        assert_eq!(err.exit_code(), 5);
        let text = err.to_string();
        assert!(text.contains(&format!("its phase is {phase}")), "{text}");
        assert!(text.contains("nothing was written"), "{text}");
    }
    assert_eq!(
        check_cancellable(&taskrun(json!({}), json!({"phase": "Running"}))).expect("running"),
        None
    );
    let asked = taskrun(
        json!({"orchestrator.io/cancel": r#"{"user":"alice"}"#}),
        json!({"phase": "Pending"}),
    );
    assert_eq!(
        check_cancellable(&asked).expect("pending").as_deref(),
        Some("alice")
    );
}
