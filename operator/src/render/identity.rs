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
//!
//! In shared mode ([`ProxyRights`], from `placement`) the task's proxy is the shared proxy's
//! ServiceAccount ([`SharedAccount`]): the
//! RoleBinding `<taskrun>-shared-proxy` binds the same Role to it instead of the pod's account
//! (the pod runs as its account with no rule at all), the Role may also `get`
//! the task's Secrets by name (the HTTP servers' headers, the masked values), and the Lease
//! carries [`LEASE_MODE_ANNOTATION`](orchestrator_crds::shared::LEASE_MODE_ANNOTATION) so the admission policy admits the shared proxy's writes
//! instead of a pod's. Nothing in the task's pod talks to the API.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use orchestrator_crds::approval::LEASE_LABEL;

/// The suffix of the shared proxy's RoleBinding (`<taskrun>-shared-proxy`).
pub const SHARED_BINDING_SUFFIX: &str = "-shared-proxy";

/// The objects that make up a task pod's identity.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The ServiceAccount the operator creates; `None` when the TaskRun names its own.
    pub service_account: Option<ServiceAccount>,
    pub role: Role,
    /// The Role bound to the pod's ServiceAccount; none in shared mode (nothing in the pod talks
    /// to the API, and the Role may read the task's Secrets: no other pod of the account may).
    pub role_binding: Option<RoleBinding>,
    /// The ServiceAccount the pod runs as.
    account: String,
    /// Where the proxy reports what it serves (with the API watch on, or in shared mode).
    pub lease: Option<Lease>,
    /// Shared mode: the Role bound to the shared proxy's ServiceAccount.
    pub shared_binding: Option<RoleBinding>,
}

impl Identity {
    /// The ServiceAccount the pod runs as.
    pub fn service_account_name(&self) -> &str {
        &self.account
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
    /// What the task's proxy may do besides reading the task's ConfigMap, and who it runs as.
    pub proxy: ProxyRights<'a>,
}

/// The task's proxy, as its identity sees it (its placement's answer, see `placement`).
pub struct ProxyRights<'a> {
    /// It reports to the Lease what it serves, and posts Events on its TaskRun.
    pub reports: bool,
    /// The Lease's annotations (shared mode: [`LEASE_MODE_ANNOTATION`](orchestrator_crds::shared::LEASE_MODE_ANNOTATION)).
    pub lease_annotations: Option<BTreeMap<String, String>>,
    /// The task's Secrets it may `get`, by name.
    pub secrets: Vec<String>,
    /// ConfigMaps of the task's namespace besides its own it reads (the model endpoint's CAs).
    pub config_maps: Vec<String>,
    /// The account it runs as when not the pod's (the shared proxy's), bound to the Role by
    /// `<taskrun>-shared-proxy`; `None`: the pod's account, bound by `<taskrun>`.
    pub account: Option<SharedAccount<'a>>,
}

/// The shared proxy's ServiceAccount.
pub struct SharedAccount<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
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
    // An empty resourceNames would grant every ConfigMap: only with names.
    let proxy = &input.proxy;
    if !proxy.config_maps.is_empty() {
        rules.push(PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into()],
            resource_names: Some(proxy.config_maps.clone()),
            ..Default::default()
        });
    }
    if proxy.reports {
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
    // An empty resourceNames would grant every Secret: only with names.
    if !proxy.secrets.is_empty() {
        rules.push(PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            verbs: vec!["get".into()],
            resource_names: Some(proxy.secrets.clone()),
            ..Default::default()
        });
    }
    let role = Role {
        metadata: meta(input.name),
        rules: Some(rules),
    };
    // Labelled so the chart's admission policy guards it: only the task pod's proxy may write
    // it (the pod the operator binds it to, see `reconcile/placement/binding.rs`).
    let lease = proxy.reports.then(|| {
        let mut metadata = meta(input.name);
        metadata
            .labels
            .get_or_insert_default()
            .insert(LEASE_LABEL.into(), "true".into());
        metadata.annotations.clone_from(&proxy.lease_annotations);
        Lease {
            metadata,
            ..Default::default()
        }
    });
    let binding = |name: &str, account: &str, namespace: &str| RoleBinding {
        metadata: meta(name),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: input.name.to_string(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.to_string(),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        }]),
    };
    let (role_binding, shared_binding) = match &proxy.account {
        None => (Some(binding(input.name, account, input.namespace)), None),
        Some(shared) => (
            None,
            Some(binding(
                &format!("{}{SHARED_BINDING_SUFFIX}", input.name),
                shared.service_account,
                shared.namespace,
            )),
        ),
    };
    Identity {
        service_account,
        role,
        role_binding,
        account: account.to_string(),
        lease,
        shared_binding,
    }
}
