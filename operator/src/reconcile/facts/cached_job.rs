//! The Job as the operator reads it: identity, owners, status, and the names of its native
//! sidecars (the proxy, each server's zone) with their env names (which servers and Secrets the
//! running pod has). Deserialized straight from the API server's
//! JSON, so the pod template is never held: a `Job` is 2.7 KB before any of its strings, this is
//! about 600 bytes (docs/benchmarks.md, "Operator at scale"). The rendered Job is still a `Job`;
//! only what is read back is this.

use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// A Job, as read by the operator (the watch, the cache, a read, an apply's answer).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedJob {
    pub metadata: ObjectMeta,
    /// Per init container (`spec.template.spec.initContainers[]`): `<name>\t` and then
    /// `<name>\t<env name>` for each of its env vars.
    #[serde(rename = "spec", default, deserialize_with = "init_env_names")]
    pub init_env: Vec<String>,
    #[serde(default)]
    pub status: Option<JobStatus>,
}

impl k8s_openapi::Resource for CachedJob {
    const API_VERSION: &'static str = <Job as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Job as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Job as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Job as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Job as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Job as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CachedJob {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What is read of `spec`: the init containers' names and env names; everything else is skipped
/// by the deserializer.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Spec {
    template: Template,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Template {
    spec: Pod,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Pod {
    init_containers: Vec<Container>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Container {
    name: String,
    env: Vec<Named>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Named {
    name: String,
}

fn init_env_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let spec = Option::<Spec>::deserialize(d)?.unwrap_or_default();
    Ok(spec
        .template
        .spec
        .init_containers
        .into_iter()
        .flat_map(|c| {
            let container = format!("{}\t", c.name);
            std::iter::once(container.clone()).chain(
                c.env
                    .into_iter()
                    .map(move |e| format!("{container}{}", e.name)),
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_identity_status_and_the_sidecars_env_names_only() {
        let job: CachedJob = serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "t", "namespace": "n", "uid": "u",
                "ownerReferences": [{"apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
                    "name": "t", "uid": "o", "controller": true}]},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "initContainers": [
                    {"name": "zone-git"},
                    {"name": "mcp-proxy", "image": "p", "env": [
                        {"name": "HOME", "value": "/tmp"},
                        {"name": "GITHUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "gh", "key": "token"}}}
                    ]}
                ],
                "containers": [{"name": "agent", "image": "a", "env": [{"name": "NOT_THIS"}]}]
            }}},
            "status": {"active": 1}
        }))
        .expect("a Job");
        assert_eq!(
            job.init_env,
            [
                "zone-git\t",
                "mcp-proxy\t",
                "mcp-proxy\tHOME",
                "mcp-proxy\tGITHUB_TOKEN"
            ]
        );
        assert_eq!(job.status.and_then(|s| s.active), Some(1));
        assert_eq!(job.metadata.owner_references.map(|o| o.len()), Some(1));

        // Without a spec: no containers.
        let bare: CachedJob =
            serde_json::from_value(json!({"metadata": {"name": "t"}})).expect("a Job");
        assert!(bare.init_env.is_empty());
        let null_spec: CachedJob =
            serde_json::from_value(json!({"metadata": {"name": "t"}, "spec": null}))
                .expect("a Job");
        assert!(null_spec.init_env.is_empty());
    }
}
