//! Every Kubernetes API verb the operator uses, per resource: the source of the RBAC rules the
//! Helm chart grants (least privilege) and of the table in `docs/operator.md` (a test keeps the
//! two equal). Watching means `list` + `watch`; a server-side apply that may create the object
//! needs `create` besides `patch`.

/// One RBAC rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API group (`""` for the core group).
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// What the operator does with it.
    pub why: &'static str,
}

/// The operator's rules. Namespaced resources are used in every watched namespace (all, unless
/// `--namespace` is set); leases only in `--lease-namespace`, the catalog ConfigMap only in
/// `--catalog-namespace`.
pub const RULES: &[Rule] = &[
    Rule {
        group: "orchestrator.io",
        resource: "taskruns",
        verbs: &["get", "list", "watch", "delete"],
        why: "the controller's watch of TaskRuns; a fresh read of a finished one whose spec changed (the cache keeps no task text for it); delete a finished one after its retention or beyond --max-finished-per-namespace (its children go by owner reference)",
    },
    Rule {
        group: "orchestrator.io",
        resource: "taskruns/status",
        verbs: &["patch"],
        why: "status by server-side apply",
    },
    Rule {
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "the task ConfigMaps (watch, fresh read before a version bump, server-side apply) and the catalog ConfigMap (watch)",
    },
    Rule {
        group: "batch",
        resource: "jobs",
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        why: "the task Jobs (watch, read on a cache miss, server-side apply once, delete after ttlSecondsAfterFinished)",
    },
    Rule {
        group: "",
        resource: "pods",
        verbs: &["list", "patch"],
        why: "a running task's pods get the new contextVersion as an annotation, so the kubelet updates their config volume at once instead of at its next periodic sync (list, patch); when a task's Job fails: the agent container's exit code and reason, for the TaskRun's status (list, once per failed task)",
    },
    Rule {
        group: "",
        resource: "secrets",
        verbs: &["get"],
        why: "check that the Secret keys a new pod needs exist (key names only; values are never used)",
    },
    Rule {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create"],
        why: "events on TaskRuns (each published once, never patched into a series)",
    },
    Rule {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        why: "leader election (create the Lease, then server-side apply with a resourceVersion precondition)",
    },
];

/// The rules as a Markdown table (what `docs/operator.md` holds between its RBAC markers).
pub fn markdown_table() -> String {
    let mut out = String::from("| API group | resource | verbs | why |\n|---|---|---|---|\n");
    for r in RULES {
        let group = if r.group.is_empty() {
            "\"\" (core)"
        } else {
            r.group
        };
        out += &format!(
            "| {group} | {} | {} | {} |\n",
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
