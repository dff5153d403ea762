//! Every Kubernetes API verb the operator uses, per resource: the source of the RBAC rules the
//! Helm chart grants (least privilege), in both of its installs, and of the table in
//! `docs/operator.md` (a test keeps the two equal; `e2e/tests/chart.rs` checks the rendered
//! chart against [`RULES`]). Watching means `list` + `watch`; a server-side apply that may create
//! the object needs `create` besides `patch`. At start the operator checks that it holds the
//! task rules in every namespace it is told to watch ([`check_namespaces`]).

use k8s_openapi::api::authorization::v1::{
    ResourceRule, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

/// Where a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Wherever TaskRuns are: every namespace (the chart's ClusterRole), or each namespace of
    /// `--namespace` (the chart's `watchNamespaces`: a Role in each).
    Tasks,
    /// Only the `--lease-namespace` (the release namespace): the chart's local Role.
    LeaseNamespace,
    /// Only the catalog ConfigMap, by name, in `--catalog-namespace` (the release namespace):
    /// the chart's local Role.
    Catalog,
    /// Only `--shared-proxy-namespace` (the release namespace), with a shared proxy
    /// (`sharedProxy.enabled`): the chart's shared-proxy Role.
    SharedProxy,
}

/// How the chart installs the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// `watchNamespaces` empty: TaskRuns in every namespace.
    ClusterWide,
    /// `watchNamespaces: [a, b]`: TaskRuns in those only; nothing cluster-wide.
    Namespaced,
}

impl Scope {
    /// What grants a rule of this scope in `install` (the table's columns).
    pub fn granted_by(self, install: Install) -> &'static str {
        match (self, install) {
            (Scope::Tasks, Install::ClusterWide) => "ClusterRole",
            (Scope::Tasks, Install::Namespaced) => "Role in each watched namespace",
            (Scope::LeaseNamespace, _) => "release namespace's Role",
            (Scope::Catalog, _) => "release namespace's Role, by name",
            (Scope::SharedProxy, _) => {
                "release namespace's shared-proxy Role (sharedProxy.enabled)"
            }
        }
    }
}

/// One RBAC rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API group (`""` for the core group).
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// What the operator does with it.
    pub why: &'static str,
    pub scope: Scope,
}

/// The operator's rules. Namespaced resources are used in every watched namespace (all, unless
/// `--namespace` is set), except the leader-election Lease ([`Scope::LeaseNamespace`]) and the
/// catalog ConfigMap ([`Scope::Catalog`]). Nothing cluster-scoped is read or written, so a
/// namespaced install needs no cluster-wide permission at all.
pub const RULES: &[Rule] = &[
    Rule {
        group: "orchestrator.io",
        resource: "taskruns",
        verbs: &["get", "list", "watch", "delete"],
        why: "the controller's watch of TaskRuns; a fresh read of a finished one whose spec changed (the cache keeps no task text for it), and of the tools in force when a blocked or finished task's status is written (the cache keeps their digest), and of who changed the tools, the tools before and the history when a new context version is recorded (status.contextHistory; the cache keeps none of them); delete a finished one after its retention or beyond --max-finished-per-namespace (its children go by owner reference)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "orchestrator.io",
        resource: "toolapprovals",
        verbs: &["list", "watch"],
        why: "people's decisions on calls a task's proxy holds for approval (watch; each reconciles the TaskRun it names)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "orchestrator.io",
        resource: "taskruns/status",
        verbs: &["patch"],
        why: "status by server-side apply (status.contextHistory and status.approvals each under a field manager of its own)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "the task ConfigMaps (watch, fresh read before a version bump or when the cache does not show the TaskRun's own, server-side apply; the approval verdicts under a field manager of their own)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "batch",
        resource: "jobs",
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        why: "the task Jobs (watch, read on a cache miss or when the cached one is not the TaskRun's, server-side apply once, delete after ttlSecondsAfterFinished)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "",
        resource: "pods",
        verbs: &["list", "patch"],
        why: "a running task's pods get the new contextVersion as an annotation, so the kubelet updates their config volume at once instead of at its next periodic sync (list, patch); when a task's Job fails: the agent container's exit code and reason, for the TaskRun's status (list, once per failed task); and, once per running task, the pod its proxy runs in, to bind the task's Lease to that pod's uid (only that pod's proxy may write the Lease)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "",
        resource: "serviceaccounts",
        verbs: &["create", "patch"],
        why: "each task pod's own ServiceAccount (server-side apply once, before the Job; none when the TaskRun names one); right before, a dry-run patch that changes nothing tells whether one of that name exists that is not the TaskRun's (it adopts nothing; no get needed)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resource: "roles",
        verbs: &["create", "patch"],
        why: "each task's Role: read only its own ConfigMap, and in shared mode get the task's Secrets by name (the operator holds those permissions itself, so the API server lets it grant them); the same dry-run check first",
        scope: Scope::Tasks,
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: &["create", "patch"],
        why: "binds the task's Role to the task pod's ServiceAccount, or in shared mode (`<taskrun>-shared-proxy`) to the shared proxy's instead; the same dry-run check first",
        scope: Scope::Tasks,
    },
    Rule {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "each task's Lease, where its proxy reports the contextVersion it serves (server-side apply once, before the Job, the same dry-run check first; watch, metadata only, for status.servedContextVersion); get and patch also because the task's Role grants them; and the binding annotations (proxy-pod-uid) under a field manager of their own",
        scope: Scope::Tasks,
    },
    Rule {
        group: "",
        resource: "secrets",
        verbs: &["get", "create"],
        why: "check that the Secret keys a new pod needs exist (key names only; values are never used); in shared mode the task's Role grants get on them by name, and the operator creates the task's <taskrun>-zone-keys Secret once (it reads an existing one's metadata only, to check that the TaskRun owns it, and never updates or deletes one; the owner reference deletes it with the TaskRun); in sidecar mode it creates the namespace's orchestrator-task-auditor Secret (the auditors' token for the proxies' read-only endpoints) when missing (create only; an existing one is used as it is)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        why: "the label orchestrator.io/proxy-mode on a TaskRun's Namespace, read once per task before its mode is recorded (status.proxyMode); with watchNamespaces the Role in each namespace grants get on that Namespace object itself (nothing cluster-wide)",
        scope: Scope::Tasks,
    },
    Rule {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create"],
        why: "events on TaskRuns (each published once, never patched into a series); the task pods' Roles grant create too, for the proxy's events on its TaskRun",
        scope: Scope::Tasks,
    },
    Rule {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        why: "leader election (create the Lease, then server-side apply with a resourceVersion precondition)",
        scope: Scope::LeaseNamespace,
    },
    Rule {
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch"],
        why: "the catalog ConfigMap (watch by name, `--catalog-namespace`; a change reconciles every TaskRun)",
        scope: Scope::Catalog,
    },
    Rule {
        group: "",
        resource: "configmaps",
        verbs: &["list", "watch", "create", "patch", "delete"],
        why: "shared mode: each shared task's ConfigMap task.<namespace>.<taskrun> in the shared proxy's namespace (watch of the labelled ones, server-side apply, the approval verdicts, the pod binding annotations; delete when the task ends, and the sweep of those whose TaskRun is gone)",
        scope: Scope::SharedProxy,
    },
];

/// The rules as a Markdown table (what `docs/operator.md` holds between its RBAC markers).
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| API group | resource | verbs | default install | `watchNamespaces` install | why |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in RULES {
        let group = if r.group.is_empty() {
            "\"\" (core)"
        } else {
            r.group
        };
        out += &format!(
            "| {group} | {} | {} | {} | {} | {} |\n",
            r.resource,
            r.verbs.join(", "),
            r.scope.granted_by(Install::ClusterWide),
            r.scope.granted_by(Install::Namespaced),
            r.why
        );
    }
    out
}

/// What of the [`Scope::Tasks`] rules `granted` (the rules the API server says the operator has
/// in one namespace) lacks: one `resource.group: verbs` line per rule with a verb missing. A rule
/// limited to some names grants nothing here (the operator needs every object of its kind).
pub fn missing(granted: &[ResourceRule]) -> Vec<String> {
    let covers = |list: &Option<Vec<String>>, want: &str| {
        list.iter().flatten().any(|v| v == "*" || v == want)
    };
    let grants = |group: &str, resource: &str, verb: &str| {
        granted.iter().any(|g| {
            g.resource_names.as_ref().is_none_or(Vec::is_empty)
                && covers(&g.api_groups, group)
                && covers(&g.resources, resource)
                && g.verbs.iter().any(|v| v == "*" || v == verb)
        })
    };
    RULES
        .iter()
        .filter(|r| r.scope == Scope::Tasks)
        .filter_map(|r| {
            let lacking: Vec<&str> = r
                .verbs
                .iter()
                .copied()
                .filter(|v| !grants(r.group, r.resource, v))
                .collect();
            let group = if r.group.is_empty() { "core" } else { r.group };
            (!lacking.is_empty())
                .then(|| format!("{} ({group}): {}", r.resource, lacking.join(", ")))
        })
        .collect()
}

/// Checks with the API server (a SelfSubjectRulesReview per namespace, which every
/// authenticated account may ask for) that the operator holds every [`Scope::Tasks`] rule in
/// each of `namespaces`; `Err` names each namespace and everything it lacks there. A review the
/// API server cannot answer completely (another authorizer than RBAC) only warns.
pub async fn check_namespaces(client: &Client, namespaces: &[String]) -> Result<(), String> {
    let reviews: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let mut problems = Vec::new();
    for ns in namespaces {
        let review = SelfSubjectRulesReview {
            spec: SelfSubjectRulesReviewSpec {
                namespace: Some(ns.clone()),
            },
            ..Default::default()
        };
        let status = match reviews.create(&PostParams::default(), &review).await {
            Ok(review) => review.status.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(namespace = %ns, error = %e, "could not review the operator's permissions");
                continue;
            }
        };
        let lacking = missing(&status.resource_rules);
        if lacking.is_empty() {
            continue;
        }
        if status.incomplete {
            tracing::warn!(namespace = %ns, lacking = %lacking.join("; "),
                "the API server's review of the operator's permissions is incomplete; it may lack these");
            continue;
        }
        problems.push(format!("namespace {ns}: {}", lacking.join("; ")));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the operator's account may not do what it needs in the namespaces it watches \
         (--namespace / ORCH_WATCH_NAMESPACE; chart: watchNamespaces, which makes a Role in each): {}",
        problems.join(" | ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> ResourceRule {
        let strings = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect());
        ResourceRule {
            api_groups: strings(groups),
            resources: strings(resources),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resource_names: None,
        }
    }

    #[test]
    fn the_task_rules_are_missing_until_granted() {
        // The chart's Role in a watched namespace: exactly the task rules.
        let role: Vec<ResourceRule> = RULES
            .iter()
            .filter(|r| r.scope == Scope::Tasks)
            .map(|r| rule(&[r.group], &[r.resource], r.verbs))
            .collect();
        assert_eq!(missing(&role), Vec::<String>::new());
        // An admin.
        assert!(missing(&[rule(&["*"], &["*"], &["*"])]).is_empty());
        // Nothing but what every account has.
        let basic = [rule(
            &["authorization.k8s.io"],
            &["selfsubjectrulesreviews"],
            &["create"],
        )];
        let lacking = missing(&basic);
        assert_eq!(
            lacking.len(),
            RULES.iter().filter(|r| r.scope == Scope::Tasks).count()
        );
        assert_eq!(
            lacking[0],
            "taskruns (orchestrator.io): get, list, watch, delete"
        );
        // One verb short, and a rule limited to names.
        let mut short = role.clone();
        short.retain(|r| r.resources.as_deref() != Some(&["pods".to_string()]));
        short.push(rule(&[""], &["pods"], &["list"]));
        let mut named = rule(&[""], &["pods"], &["patch"]);
        named.resource_names = Some(vec!["one".into()]);
        short.push(named);
        assert_eq!(missing(&short), ["pods (core): patch"]);
    }

    #[test]
    fn docs_list_exactly_these_verbs() {
        let doc = include_str!("../../docs/operator.md");
        let start = "<!-- rbac:begin (generated from operator/src/rbac.rs; a test checks it) -->\n";
        let (_, rest) = doc
            .split_once(start)
            .expect("docs/operator.md has the rbac:begin marker");
        let (table, _) = rest
            .split_once("<!-- rbac:end -->")
            .expect("rbac:end marker");
        assert_eq!(
            table,
            super::markdown_table(),
            "update docs/operator.md from rbac::markdown_table()"
        );
    }
}
