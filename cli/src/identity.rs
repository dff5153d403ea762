//! Who the CLI acts as, as the API server sees it (a SelfSubjectReview: the user name after
//! authentication and any `--as`), written with each change in the TaskRun's
//! `orchestrator.io/requested-by` annotation for the operator's `status.contextHistory`.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, Client};
use orchestrator_crds::taskrun::history::{REQUESTED_BY_ANNOTATION, RequestedBy};
use serde_json::{Value, json};

use crate::output;

/// The user name the API server reports for this client; `None` (with a note) when it cannot
/// say (an API server older than 1.28, or the review refused): the change is then recorded
/// under its field manager.
pub async fn whoami(client: &Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    match api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(review) => review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .filter(|u| !u.is_empty()),
        Err(e) => {
            output::note(&format!(
                "could not ask the API server who you are ({e}); the task's history will name \
                 this CLI's field manager instead of you"
            ));
            None
        }
    }
}

/// JSON Patch operations writing the annotation for the change that makes `generation`: the
/// annotations map is added when the object had none (tested to still have none, so a map
/// another writer added meanwhile is never replaced).
pub fn annotation_ops(data: &Value, user: &str, generation: i64) -> Vec<Value> {
    let value = RequestedBy {
        user: user.to_string(),
        generation,
    }
    .to_annotation();
    match data.pointer("/metadata/annotations") {
        Some(a) if a.is_object() => {
            let key = REQUESTED_BY_ANNOTATION
                .replace('~', "~0")
                .replace('/', "~1");
            vec![
                json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": value}),
            ]
        }
        _ => vec![
            json!({"op": "test", "path": "/metadata/annotations", "value": Value::Null}),
            json!({"op": "add", "path": "/metadata/annotations", "value": {REQUESTED_BY_ANNOTATION: value}}),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_is_added_to_the_map_or_with_it() {
        let with = json!({"metadata": {"annotations": {"a": "b"}}});
        assert_eq!(
            annotation_ops(&with, "alice", 3),
            [
                json!({"op": "add", "path": "/metadata/annotations/orchestrator.io~1requested-by",
                    "value": r#"{"user":"alice","generation":3}"#})
            ]
        );
        let without = json!({"metadata": {}});
        assert_eq!(
            annotation_ops(&without, "bob", 2),
            [
                json!({"op": "test", "path": "/metadata/annotations", "value": null}),
                json!({"op": "add", "path": "/metadata/annotations",
                       "value": {"orchestrator.io/requested-by": r#"{"user":"bob","generation":2}"#}}),
            ]
        );
    }
}
