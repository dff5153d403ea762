//! What a pod needs before it can start: the Secrets and task sources a new pod reads, and the
//! Secret env a running pod was created with. Secret values are never read into messages.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use orchestrator_crds::taskrun::TaskRun;

use super::children::JobFacts;
use crate::error::Result;
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

/// Secret env the current config needs that the existing pod's proxy container lacks.
pub fn env_not_in_pod(job: &JobFacts, plan: &Plan) -> Vec<Problem> {
    plan.required_secret_env()
        .filter(|b| !job.has_env(&b.env))
        .map(|b| Problem {
            reason: "SecretEnvNotInPod",
            message: format!(
                "server {} needs env {} from a Secret, but the running pod was created without it (a pod's env cannot change); \
                 list the server (enabled: false, with its secretRefs) when creating a TaskRun to enable it later",
                b.servers.join(", "),
                b.env
            ),
        })
        .collect()
}
