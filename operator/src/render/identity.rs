//! The task pod's identity: least privilege. Each TaskRun gets a Role that can read exactly its
//! own ConfigMap (`get`, and `list`/`watch` narrowed to it by name) and nothing else, bound to
//! the pod's ServiceAccount: one the operator creates per TaskRun (named like the TaskRun, no
//! token automounted), or the TaskRun's `serviceAccountName` when it names one. All three carry
//! the TaskRun as controller owner, so the garbage collector removes them with it.
//!
//! With the proxy's API watch on (the default), the identity also gets a Lease named like the
//! TaskRun, created here, which it may only read and patch: the proxy reports there the
//! `contextVersion` it serves, and the operator surfaces it as `status.servedContextVersion`
//! and the condition `ToolsSynced`; and the calls it holds for approval. The Lease carries
//! [`LEASE_LABEL`], which puts it under the chart's admission policy: of the pods running the
//! ServiceAccount, only the task pod's proxy may write it. The token is mounted into the proxy container only
//! (`automountServiceAccountToken: false` for the pod, so the agent never gets one).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use orchestrator_crds::approval::LEASE_LABEL;

/// The objects that make up a task pod's identity.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The ServiceAccount the operator creates; `None` when the TaskRun names its own.
    pub service_account: Option<ServiceAccount>,
    pub role: Role,
    pub role_binding: RoleBinding,
    /// Where the proxy reports what it serves (with the API watch on).
    pub lease: Option<Lease>,
}

impl Identity {
    /// The ServiceAccount the pod runs as.
    pub fn service_account_name(&self) -> &str {
        self.role_binding
            .subjects
            .as_ref()
            .and_then(|s| s.first())
            .map_or("", |s| s.name.as_str())
    }
}

pub struct IdentityInput<'a> {
    /// The TaskRun's name: the name of the Role, the RoleBinding and the created ServiceAccount.
    pub name: &'a str,
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub owner: &'a OwnerReference,
    /// `spec.serviceAccountName`, when set.
    pub service_account_name: Option<&'a str>,
    pub config_map_name: &'a str,
    /// The proxy watches its ConfigMap and reports to the Lease.
    pub api_watch: bool,
}

pub fn render(input: IdentityInput<'_>) -> Identity {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(input.namespace.to_string()),
        labels: Some(input.labels.clone()),
        owner_references: Some(vec![input.owner.clone()]),
        ..Default::default()
    };
    let service_account = match input.service_account_name {
        Some(_) => None,
        None => Some(ServiceAccount {
            metadata: meta(input.name),
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
    };
    let account = input.service_account_name.unwrap_or(input.name);
    let mut rules = vec![PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        // `list` and `watch` are allowed by name only with a `metadata.name` field selector.
        verbs: vec!["get".into(), "list".into(), "watch".into()],
        resource_names: Some(vec![input.config_map_name.to_string()]),
        ..Default::default()
    }];
    if input.api_watch {
        rules.push(PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            verbs: vec!["get".into(), "patch".into()],
            resource_names: Some(vec![input.name.to_string()]),
            ..Default::default()
        });
        // Events on its TaskRun (a tool definition that changed): create only, one new Event
        // each. RBAC cannot narrow `create` by name.
        rules.push(PolicyRule {
            api_groups: Some(vec!["events.k8s.io".into()]),
            resources: Some(vec!["events".into()]),
            verbs: vec!["create".into()],
            ..Default::default()
        });
    }
    let role = Role {
        metadata: meta(input.name),
        rules: Some(rules),
    };
    // Labelled so the chart's admission policy guards it: only the task pod's proxy may write
    // it (the pod the operator binds it to, see `reconcile/binding.rs`).
    let lease = input.api_watch.then(|| {
        let mut metadata = meta(input.name);
        metadata
            .labels
            .get_or_insert_default()
            .insert(LEASE_LABEL.into(), "true".into());
        Lease {
            metadata,
            ..Default::default()
        }
    });
    let role_binding = RoleBinding {
        metadata: meta(input.name),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: input.name.to_string(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.to_string(),
            namespace: Some(input.namespace.to_string()),
            ..Default::default()
        }]),
    };
    Identity {
        service_account,
        role,
        role_binding,
        lease,
    }
}
