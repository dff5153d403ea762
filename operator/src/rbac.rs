//! Every Kubernetes API verb the operator uses, per resource: the source of the RBAC rules the
//! Helm chart grants (least privilege) and of the table in `docs/operator.md` (a test keeps the
//! two equal). Watching means `list` + `watch`; a server-side apply that may create the object
//! needs `create` besides `patch`.

/// Where a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Wherever TaskRuns are (every namespace, or `--namespace`): the chart's ClusterRole.
    Tasks,
    /// Only the `--lease-namespace` (the release namespace): the chart's local Role.
    LeaseNamespace,
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
/// catalog ConfigMap (only in `--catalog-namespace`).
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
        why: "the task ConfigMaps (watch, fresh read before a version bump or when the cache does not show the TaskRun's own, server-side apply; the approval verdicts under a field manager of their own) and the catalog ConfigMap (watch)",
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
        why: "a running task's pods get the new contextVersion as an annotation, so the kubelet updates their config volume at once instead of at its next periodic sync (list, patch); when a task's Job fails: the agent container's exit code and reason, for the TaskRun's status (list, once per failed task)",
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
        why: "each task's Role: read only its own ConfigMap (the operator holds that permission itself, so the API server lets it grant it); the same dry-run check first",
        scope: Scope::Tasks,
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: &["create", "patch"],
        why: "binds the task's Role to the task pod's ServiceAccount; the same dry-run check first",
        scope: Scope::Tasks,
    },
    Rule {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "each task's Lease, where its proxy reports the contextVersion it serves (server-side apply once, before the Job, the same dry-run check first; watch, metadata only, for status.servedContextVersion); get and patch also because the task's Role grants them",
        scope: Scope::Tasks,
    },
    Rule {
        group: "",
        resource: "secrets",
        verbs: &["get"],
        why: "check that the Secret keys a new pod needs exist (key names only; values are never used)",
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
];

/// The rules as a Markdown table (what `docs/operator.md` holds between its RBAC markers).
pub fn markdown_table() -> String {
    let mut out =
        String::from("| API group | resource | verbs | where | why |\n|---|---|---|---|---|\n");
    for r in RULES {
        let group = if r.group.is_empty() {
            "\"\" (core)"
        } else {
            r.group
        };
        let scope = match r.scope {
            Scope::Tasks => "task namespaces",
            Scope::LeaseNamespace => "`--lease-namespace`",
        };
        out += &format!(
            "| {group} | {} | {} | {scope} | {} |\n",
            r.resource,
            r.verbs.join(", "),
            r.why
        );
    }
    out
}

#[cfg(test)]
mod tests {
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
