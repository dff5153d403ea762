//! The control plane `e2e/cluster` runs is a real one: the API server enforces CEL rules, the Job
//! controller, the scheduler and kwok's nodes take a Job to Complete, `/version` reports the
//! pinned release, and `down` leaves nothing behind.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use orchestrator_e2e::{
    TestNamespace, client, kubectl, pinned_version, wait_established, wait_for,
};
use serde_json::json;

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn version_reports_the_pinned_release() -> Result<()> {
    let pinned = pinned_version("K8S_VERSION")?;
    let info = client().await?.apiserver_version().await?;
    assert_eq!(info.git_version, pinned, "/version of the API server");

    let out = kubectl(&["version", "-o", "json"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        v["clientVersion"]["gitVersion"],
        pinned.as_str(),
        "kubectl's own version"
    );
    assert_eq!(
        v["serverVersion"]["gitVersion"],
        pinned.as_str(),
        "server version seen by kubectl"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn api_server_refuses_an_object_that_breaks_a_cel_rule() -> Result<()> {
    let client = client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let group = format!("cel{:x}.e2e.orchestrator.io", std::process::id());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("ranges.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "ranges", "singular": "range", "kind": "Range"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["min", "max"],
                        "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                        "x-kubernetes-validations": [{
                            "rule": "self.min <= self.max",
                            "message": "min must not be greater than max"
                        }]
                    }}
                }}
            }]
        }
    }))?;
    crds.create(&PostParams::default(), &crd).await?;
    let name = crd.name_any();
    wait_established(&client, &name).await?;

    let ns = TestNamespace::create(&client, "cel").await?;
    let gvk = GroupVersionKind::gvk(&group, "v1", "Range");
    let ranges: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let object = |name: &str, min: i64, max: i64| -> Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"), "kind": "Range",
            "metadata": {"name": name},
            "spec": {"min": min, "max": max}
        }))?)
    };
    // The new resource may take a moment to be served after Established.
    wait_for(
        "a valid object to be accepted",
        Duration::from_secs(30),
        || async {
            Ok(ranges
                .create(&PostParams::default(), &object("good", 1, 2)?)
                .await
                .ok())
        },
    )
    .await?;

    let err = ranges
        .create(&PostParams::default(), &object("bad", 3, 2)?)
        .await
        .expect_err("the API server must refuse min > max");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("min must not be greater than max"),
                "the refusal carries the rule's message: {}",
                status.message
            );
        }
        other => panic!("expected an API refusal, got {other:?}"),
    }
    assert!(ranges.get_opt("bad").await?.is_none(), "nothing was stored");

    ns.delete().await?;
    crds.delete(&name, &Default::default()).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up)"]
async fn job_is_run_by_the_controllers_on_a_kwok_node() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "job").await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "hello"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "hello", "image": "busybox", "command": ["true"]}]
            }}
        }
    }))?;
    let job = jobs.create(&PostParams::default(), &job).await?;
    let job_uid = job.uid().context("created job has a uid")?;

    // The Job controller creates the pod, owned by the Job...
    let pod = wait_for(
        "the Job controller to create a pod",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default().labels("job-name=hello"))
                .await?;
            Ok(list.items.into_iter().next())
        },
    )
    .await?;
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .context("pod has a controller")?;
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Job", job_uid.as_str())
    );

    // ...the scheduler binds it to a kwok node...
    let pod_name = pod.name_any();
    let node = wait_for(
        "the scheduler to bind the pod",
        Duration::from_secs(60),
        || async { Ok(pods.get(&pod_name).await?.spec.and_then(|s| s.node_name)) },
    )
    .await?;
    assert!(node.starts_with("kwok-node-"), "bound to {node}");

    // ...kwok runs it to Succeeded, and the Job controller marks the Job Complete.
    wait_for(
        "the Job to be Complete",
        Duration::from_secs(90),
        || async {
            let job = jobs.get("hello").await?;
            let complete = job
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True");
            Ok(complete.then_some(()))
        },
    )
    .await?;
    let phase = pods.get(&pod_name).await?.status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Succeeded"));

    ns.delete().await?;
    Ok(())
}
