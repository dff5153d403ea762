//! Sidecar mode: the namespace's Secret `orchestrator-task-auditor` (`crds::shared::AUDITOR_SECRET`),
//! whose key `token` is the auditors' credential for the task proxies' read-only endpoints
//! (`GET /audit`, `/tools`, `/metrics`; never `/mcp`). Each task pod's proxy mounts it; who may
//! `get` this Secret by name (the documented `task-auditor` Role) may read the audit through
//! `pods/portforward`, and no one else. Created when missing, random, with no owner (it serves
//! every task of the namespace), and never written again: deleting it rotates it (the next task
//! creates a new one; running proxies read the file the kubelet updates, at each request). An
//! existing one is used as it is, so an admin may create it with a token of their choosing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use orchestrator_crds::shared::{AUDITOR_SECRET, AUDITOR_TOKEN_KEY};

use super::zone_keys::random_key;
use crate::error::Result;
use crate::reconcile::context::Context;
/// The Secret as created: a random token, labelled as the operator's.
pub fn secret(ns: &str, token: String) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(AUDITOR_SECRET.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "orchestrator-operator".to_string(),
                ),
                (
                    "app.kubernetes.io/component".to_string(),
                    "task-auditor".to_string(),
                ),
            ])),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(AUDITOR_TOKEN_KEY.to_string(), token)])),
        ..Default::default()
    }
}

/// Creates the namespace's auditor Secret unless it exists.
pub async fn create_if_missing(ctx: &Context, ns: &str) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .create(&PostParams::default(), &secret(ns, random_key()?))
        .await
    {
        // Made for an earlier task, or by an admin: it stays as it is.
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auditor_secret_holds_one_random_token_and_no_owner() {
        let (a, b) = (random_key().expect("a"), random_key().expect("b"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        let s = secret("team-a", a.clone());
        assert_eq!(s.metadata.name.as_deref(), Some(AUDITOR_SECRET));
        assert_eq!(s.metadata.namespace.as_deref(), Some("team-a"));
        assert!(s.metadata.owner_references.is_none());
        assert_eq!(
            s.string_data,
            Some(BTreeMap::from([(AUDITOR_TOKEN_KEY.to_string(), a)]))
        );
    }
}
