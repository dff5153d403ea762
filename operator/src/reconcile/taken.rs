//! The operator adopts nothing: a child's name (the TaskRun's, `<taskrun>-tools` for the
//! ConfigMap) may already be taken by an object of that kind that is not this TaskRun's child
//! (no controller owner reference with its uid): someone else's ServiceAccount, Role, Lease, or
//! the children of an earlier TaskRun of the same name that the garbage collector has not
//! removed yet. A server-side apply with force would take such an object over, and deleting the
//! TaskRun would then delete it; so the TaskRun is blocked instead (`NameTaken`, see
//! `steps/refuse.rs`), before any child is applied, and the object is left as it is.
//!
//! What is read for it: the Job and the ConfigMap come from the caches, read afresh only when the
//! cache does not show them as this TaskRun's (`observe.rs`, `config.rs`); the pod's identity
//! ([`identity`]) only when the Job is about to be created.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;
use serde_json::json;

use super::facts::children::controller;
use crate::error::Result;
use crate::render::Problem;
use crate::render::identity::Identity;

/// The condition reason.
pub const NAME_TAKEN: &str = "NameTaken";

/// Why `meta`, an existing object of `kind` that a child of `tr` would be, is not its to apply;
/// `None` when it is this TaskRun's child.
pub fn judge(kind: &str, meta: &ObjectMeta, tr: &TaskRun) -> Option<Problem> {
    let owner = controller(meta);
    let uid = tr.uid().unwrap_or_default();
    if owner.is_some_and(|o| !uid.is_empty() && o.uid == uid) {
        return None;
    }
    let ns = meta
        .namespace
        .clone()
        .or(tr.namespace())
        .unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let taskrun = tr.name_any();
    let delete = format!("kubectl -n {ns} delete {} {name}", kind.to_lowercase());
    let message = match owner {
        // Deleted and created again: the first one's children go with it, soon.
        Some(o) if o.kind == TaskRun::kind(&()) && o.name == taskrun => format!(
            "{kind} {ns}/{name} exists and is not this TaskRun's: it belongs to an earlier TaskRun \
             {taskrun} (uid {}), and the garbage collector deletes it once that one is gone; this \
             TaskRun starts then. If it stays (the earlier TaskRun was deleted orphaning its \
             children), rename the TaskRun or delete the {kind} ({delete})",
            o.uid
        ),
        Some(o) => format!(
            "{kind} {ns}/{name} exists and is not this TaskRun's (its controller is {} {}): the \
             operator takes over no object it did not create; rename the TaskRun, or delete the \
             {kind} if nothing needs it ({delete})",
            o.kind, o.name
        ),
        None => format!(
            "{kind} {ns}/{name} exists and is not this TaskRun's (it has no controller): the \
             operator takes over no object it did not create; rename the TaskRun, or delete the \
             {kind} if nothing needs it ({delete})"
        ),
    };
    Some(Problem {
        reason: NAME_TAKEN,
        message,
    })
}

/// The pod's identity objects (its ServiceAccount unless the TaskRun names one, Role,
/// RoleBinding and Lease) that exist and are not this TaskRun's. Read only before the Job is
/// created: they are applied only then.
pub async fn identity(
    client: &Client,
    ns: &str,
    tr: &TaskRun,
    identity: &Identity,
) -> Result<Vec<Problem>> {
    let name = tr.name_any();
    let (sa, role, binding, lease, shared_binding) = tokio::try_join!(
        async {
            match &identity.service_account {
                Some(_) => read::<ServiceAccount>(client, ns, &name).await,
                None => Ok(None),
            }
        },
        read::<Role>(client, ns, &name),
        async {
            match &identity.role_binding {
                Some(_) => read::<RoleBinding>(client, ns, &name).await,
                None => Ok(None),
            }
        },
        async {
            match &identity.lease {
                Some(_) => read::<Lease>(client, ns, &name).await,
                None => Ok(None),
            }
        },
        async {
            match identity
                .shared_binding
                .as_ref()
                .and_then(|b| b.metadata.name.as_deref())
            {
                Some(shared) => read::<RoleBinding>(client, ns, shared).await,
                None => Ok(None),
            }
        },
    )?;
    let found = [
        ("ServiceAccount", sa),
        ("Role", role),
        ("RoleBinding", binding),
        ("Lease", lease),
        ("RoleBinding", shared_binding),
    ];
    Ok(found
        .iter()
        .filter_map(|(kind, meta)| judge(kind, meta.as_ref()?, tr))
        .collect())
}

/// The metadata of the object `name` of kind `K`, if it exists. Read with a server-side dry run
/// of an empty merge patch, which changes nothing (not even `managedFields` or the
/// `resourceVersion`): it needs only the `patch` the operator holds for its server-side applies,
/// not a `get` on ServiceAccounts, Roles and RoleBindings.
async fn read<K>(client: &Client, ns: &str, name: &str) -> Result<Option<ObjectMeta>>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + serde::de::DeserializeOwned,
    K: std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    match api
        .patch_metadata(name, &dry_run, &Patch::Merge(json!({})))
        .await
    {
        Ok(object) => Ok(Some(object.metadata)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taskrun() -> TaskRun {
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "namespace": "n", "uid": "u1"},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "p"},
                     "toolConfig": {"mcpServers": []}}
        }))
        .expect("a TaskRun")
    }

    fn meta(owners: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({"name": "t", "namespace": "n", "ownerReferences": owners}))
            .expect("metadata")
    }

    fn owner(kind: &str, name: &str, uid: &str, controller: bool) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": controller})
    }

    #[test]
    fn only_a_controller_reference_with_the_taskruns_uid_makes_an_object_its_child() {
        let tr = taskrun();
        assert_eq!(
            judge(
                "Role",
                &meta(json!([owner("TaskRun", "t", "u1", true)])),
                &tr
            ),
            None
        );
        // Not the controller, no owner, another controller, an earlier TaskRun of the name.
        for (owners, says) in [
            (
                json!([owner("TaskRun", "t", "u1", false)]),
                "it has no controller",
            ),
            (json!(null), "it has no controller"),
            (
                json!([owner("Deployment", "web", "d1", true)]),
                "its controller is Deployment web",
            ),
            (
                json!([owner("TaskRun", "t", "u0", true)]),
                "an earlier TaskRun t (uid u0)",
            ),
        ] {
            let problem = judge("Role", &meta(owners), &tr).expect("not its own");
            assert_eq!(problem.reason, NAME_TAKEN);
            assert!(
                problem
                    .message
                    .starts_with("Role n/t exists and is not this TaskRun's")
                    && problem.message.contains(says)
                    && problem.message.contains("kubectl -n n delete role t"),
                "{}",
                problem.message
            );
        }
    }
}
