//! What a pod needs before it can start: the Secrets and task sources a new pod reads, and the
//! Secret env a running pod was created with. Secret values are never read into messages.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use orchestrator_crds::taskrun::TaskRun;

use super::facts::JobFacts;
use crate::error::Result;
use crate::render::job::PROXY_CONTAINER;
use crate::render::zone::{ZONE_CONTAINER_PREFIX, zone_container_name};
use crate::render::{Plan, Problem};

/// Secrets and task sources a new pod needs, checked before the Job is created.
pub async fn missing_inputs(
    tr: &TaskRun,
    plan: &Plan,
    client: &Client,
    ns: &str,
) -> Result<Vec<Problem>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut problems = Vec::new();
    for b in plan.required_secret_env() {
        let needed_by = format!("env {} of server {}", b.env, b.servers.join(", "));
        match secrets.get_opt(&b.secret).await? {
            None => problems.push(Problem {
                reason: "SecretNotFound",
                message: format!(
                    "Secret {ns}/{} (key {}) for {needed_by} does not exist; create it, e.g. kubectl -n {ns} create secret generic {} --from-literal={}=...",
                    b.secret, b.key, b.secret, b.key
                ),
            }),
            Some(s) if !has_key(&s, &b.key) => problems.push(Problem {
                reason: "SecretKeyNotFound",
                message: format!(
                    "Secret {ns}/{} has no key {} (needed for {needed_by}); it has: {}",
                    b.secret,
                    b.key,
                    keys(&s).join(", ")
                ),
            }),
            Some(_) => {}
        }
    }
    let task = &tr.spec.task;
    if let Some(r) = &task.secret_key_ref {
        match secrets.get_opt(&r.name).await? {
            Some(s) if has_key(&s, &r.key) => {}
            _ => problems.push(Problem {
                reason: "TaskSourceNotFound",
                message: format!(
                    "spec.task.secretKeyRef: Secret {ns}/{} with key {} not found",
                    r.name, r.key
                ),
            }),
        }
    }
    if let Some(r) = &task.config_map_key_ref {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let found = cms.get_opt(&r.name).await?.is_some_and(|c| {
            c.data.as_ref().is_some_and(|d| d.contains_key(&r.key))
                || c.binary_data
                    .as_ref()
                    .is_some_and(|d| d.contains_key(&r.key))
        });
        if !found {
            problems.push(Problem {
                reason: "TaskSourceNotFound",
                message: format!(
                    "spec.task.configMapKeyRef: ConfigMap {ns}/{} with key {} not found",
                    r.name, r.key
                ),
            });
        }
    }
    Ok(problems)
}

fn has_key(s: &Secret, key: &str) -> bool {
    s.data.as_ref().is_some_and(|d| d.contains_key(key))
        || s.string_data.as_ref().is_some_and(|d| d.contains_key(key))
}

/// Key names only: values are never read into messages.
fn keys(s: &Secret) -> Vec<String> {
    s.data.iter().flat_map(|d| d.keys().cloned()).collect()
}

/// What the current config needs that the running pod was created without: a container for
/// each stdio server (one cannot be added to a pod), and the Secret env of the container that
/// holds it (a pod's env cannot change either).
pub fn not_in_pod(job: &JobFacts, plan: &Plan) -> Vec<Problem> {
    let mut problems: Vec<Problem> = plan
        .zoned_servers()
        .filter(|s| !job.has_container(&zone_container_name(s)))
        .map(|s| Problem {
            reason: "ServerNotInPod",
            message: format!(
                "server {s} is not in the running task's pod: each stdio server runs in its own container, created with the pod, \
                 so a running task can only use the servers its TaskRun listed when it started; submit a new task that lists {s} \
                 (enabled: false lists it without its tools) to use it"
            ),
        })
        .collect();
    // A zone's uid (sidecar mode, the proxy config's `zoneUid`) and port (shared mode) are its
    // position among the stdio servers: the config must keep the pod's positions, or the proxy
    // would hold a zone to another's uid (and refuse to start it) or reach another's port.
    let in_pod: Vec<&str> = job
        .containers()
        .filter(|c| c.starts_with(ZONE_CONTAINER_PREFIX))
        .collect();
    for (at, server) in plan.zoned_servers().enumerate() {
        let container = zone_container_name(server);
        if let Some(was) = in_pod.iter().position(|c| *c == container)
            && was != at
        {
            problems.push(Problem {
                reason: "ServerMovedInPod",
                message: format!(
                    "server {server} is stdio server {} of the TaskRun, but the running task's pod was created with it as \
                     stdio server {} (each zone's uid and port follow that order): list the stdio servers in the order the \
                     task started with, and to stop using one set enabled: false instead of removing it",
                    at + 1,
                    was + 1
                ),
            });
        }
    }
    for b in plan.required_secret_env() {
        for server in &b.servers {
            let container = if plan.zoned_servers().any(|s| s == server) {
                zone_container_name(server)
            } else {
                PROXY_CONTAINER.to_string()
            };
            if job.has_container(&container) && !job.has_env(&container, &b.env) {
                problems.push(Problem {
                    reason: "SecretEnvNotInPod",
                    message: format!(
                        "server {server} needs env {} from a Secret, but the running pod was created without it (a pod's env cannot change); \
                         list the server (enabled: false, with its secretRefs) when creating a TaskRun to enable it later",
                        b.env
                    ),
                });
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use orchestrator_crds::catalog::Catalog;
    use serde_json::json;

    use super::*;
    use crate::reconcile::facts::CachedJob;
    use crate::render::{DEFAULT_SIDECAR_PORT, RenderSettings, render};

    fn plan(servers: serde_json::Value) -> Plan {
        let catalog =
            Catalog::parse(include_str!("../../../config/catalog.yaml")).expect("shipped catalog");
        let tr: TaskRun = serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "namespace": "n", "uid": "u"},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"},
                     "toolConfig": {"mcpServers": servers}}
        }))
        .expect("a TaskRun");
        let settings = RenderSettings {
            sidecar_image: "proxy".into(),
            agent_image: "agent".into(),
            runtime_images: Default::default(),
            sidecar_otlp_endpoint: None,
            sidecar_log_json: false,
            sidecar_audit_otlp_endpoint: None,
            sidecar_port: DEFAULT_SIDECAR_PORT,
            sidecar_api_watch: true,
            sidecar_kubernetes_service: None,
            sidecar_metrics_port: None,
            shared_proxy: None,
            default_model: None,
            decision_point: None,
        };
        render(&tr, &catalog, &settings).expect("renders")
    }

    /// The facts of the Job rendered for `servers`: the pod as it was created.
    fn created_with(servers: serde_json::Value) -> JobFacts {
        let job = serde_json::to_value(plan(servers).job()).expect("a Job");
        JobFacts::of(&serde_json::from_value::<CachedJob>(job).expect("reads back"))
    }

    #[test]
    fn a_server_added_after_the_pod_was_created_is_named_with_the_fix() {
        let pod = created_with(json!([{"name": "time"}]));
        assert!(not_in_pod(&pod, &plan(json!([{"name": "time"}]))).is_empty());
        let problems = not_in_pod(&pod, &plan(json!([{"name": "time"}, {"name": "git"}])));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].reason, "ServerNotInPod");
        assert!(
            problems[0]
                .message
                .contains("server git is not in the running task's pod")
                && problems[0]
                    .message
                    .contains("submit a new task that lists git"),
            "{}",
            problems[0].message
        );
        // Listed from the start, disabled: it has its container, and enabling it later is fine.
        let listed = created_with(json!([{"name": "time"}, {"name": "git", "enabled": false}]));
        assert!(not_in_pod(&listed, &plan(json!([{"name": "time"}, {"name": "git"}]))).is_empty());
    }

    #[test]
    fn a_stdio_server_moved_from_its_place_in_the_pod_is_named_with_the_fix() {
        let pod = created_with(json!([{"name": "time"}, {"name": "git"}, {"name": "memory"}]));
        // Disabled in place: fine. An HTTP server may come and go.
        let disabled =
            json!([{"name": "time", "enabled": false}, {"name": "git"}, {"name": "memory"}]);
        assert!(not_in_pod(&pod, &plan(disabled)).is_empty());
        // Removed, or reordered: the servers after it would be held to another zone's uid.
        let problems = not_in_pod(&pod, &plan(json!([{"name": "git"}, {"name": "memory"}])));
        let moved: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| (p.reason, p.message.split(' ').nth(1).unwrap_or_default()))
            .collect();
        assert_eq!(
            moved,
            [("ServerMovedInPod", "git"), ("ServerMovedInPod", "memory")]
        );
        assert!(
            problems[0].message.starts_with(
                "server git is stdio server 1 of the TaskRun, but the running task's pod was \
                 created with it as stdio server 2"
            ) && problems[0]
                .message
                .contains("set enabled: false instead of removing it"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn a_secret_the_servers_container_lacks_is_named() {
        let token = json!({"env": "GITHUB_PERSONAL_ACCESS_TOKEN", "name": "gh", "key": "token"});
        let with = json!([{"name": "time"}, {"name": "github", "secretRefs": [token]}]);
        assert!(not_in_pod(&created_with(with.clone()), &plan(with.clone())).is_empty());
        // A pod whose github container was created without the env (an older render).
        let job: CachedJob = serde_json::from_value(json!({
            "metadata": {"name": "t"},
            "spec": {"template": {"spec": {"initContainers": [
                {"name": "mcp-proxy", "env": [{"name": "GITHUB_PERSONAL_ACCESS_TOKEN"}]},
                {"name": "zone-time"}, {"name": "zone-github"}]}}}
        }))
        .expect("a Job");
        let problems = not_in_pod(&JobFacts::of(&job), &plan(with));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].reason, "SecretEnvNotInPod");
        assert!(
            problems[0]
                .message
                .contains("server github needs env GITHUB_PERSONAL_ACCESS_TOKEN")
        );
    }
}
