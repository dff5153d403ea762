//! The chart's admission policies and metrics NetworkPolicies, rendered by `helm template` (helm
//! from the control-plane build, `common::rendered`): which objects each value makes,
//! and that the names they share with the operator (the task pods' labels, the metrics port's
//! name, the zones' ports, the annotations) are the operator's own constants. What the policies
//! decide is shown on the API server by `e2e/tests/python/test_admission.py`.

use kube::CustomResourceExt;
use orchestrator_crds::taskrun::result::CREATED_BY_ANNOTATION;
use orchestrator_crds::taskrun::{MAX_SERVERS, TaskRun};
use orchestrator_operator::render::MANAGED_BY;
use orchestrator_operator::render::job::METRICS_PORT_NAME;
use orchestrator_operator::render::zone::ZONE_PORT_BASE;
use serde_json::{Value, json};

mod common;
use common::rendered;

fn all<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// The named variable's expression of a policy.
fn variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    policy["spec"]["variables"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name))
        .and_then(|v| v["expression"].as_str())
        .unwrap_or_else(|| panic!("variable {name} in {policy}"))
}

const POLICIES: [&str; 3] = [
    "r-orchestrator-taskrun-references",
    "r-orchestrator-taskrun-placement",
    "r-orchestrator-taskrun-created-by",
];

#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn the_taskrun_policies_render_with_their_bindings_and_follow_the_values() {
    let docs = rendered(&[]).expect("renders");
    for name in POLICIES {
        let policy = named(&docs, "ValidatingAdmissionPolicy", name).expect(name);
        assert_eq!(policy["spec"]["failurePolicy"], "Fail", "{name}");
        let rule = &policy["spec"]["matchConstraints"]["resourceRules"][0];
        assert_eq!(rule["resources"], json!(["taskruns"]), "{name}");
        assert_eq!(rule["operations"], json!(["CREATE", "UPDATE"]), "{name}");
        // Every namespace in a cluster-wide install.
        assert!(
            policy["spec"]["matchConstraints"]["namespaceSelector"].is_null(),
            "{name}"
        );
        let binding = named(&docs, "ValidatingAdmissionPolicyBinding", name).expect(name);
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }
    // Every secretRef a server may have (the CRD's bound) is among the references checked.
    let crd = serde_json::to_value(TaskRun::crd()).expect("the CRD as JSON");
    let refs = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["toolConfig"]["properties"]["mcpServers"]["items"]["properties"]["secretRefs"];
    let max = refs["maxItems"].as_u64().expect("secretRefs has maxItems");
    let references = named(&docs, "ValidatingAdmissionPolicy", POLICIES[0]).expect("references");
    let server_refs = variable(references, "serverRefs");
    assert!(
        server_refs.contains(&format!("].secretRefs[{}]'", max - 1)),
        "{server_refs}"
    );
    assert!(
        !server_refs.contains(&format!("].secretRefs[{max}]'")),
        "{server_refs}"
    );
    // The created-by policy reads the annotation the operator and the CLI use.
    let created = named(&docs, "ValidatingAdmissionPolicy", POLICIES[2]).expect("created-by");
    assert!(variable(created, "new").contains(CREATED_BY_ANNOTATION));
    assert_eq!(
        created["spec"]["validations"].as_array().map(Vec::len),
        Some(2)
    );

    // The placement values are the allowed lists of the CEL (JSON lists are CEL lists).
    let placement = named(&docs, "ValidatingAdmissionPolicy", POLICIES[1]).expect("placement");
    assert!(
        variable(placement, "tolerationsAllowed")
            .starts_with(r#"["node.kubernetes.io/not-ready","node.kubernetes.io/unreachable"] + "#),
        "{}",
        variable(placement, "tolerationsAllowed")
    );
    assert!(variable(placement, "priorityClassesAllowed").starts_with("[] + "));
    assert!(variable(placement, "podAffinity").ends_with(r#": "sameNamespace""#));
    let conditions = placement["spec"]["matchConditions"].to_string();
    assert!(conditions.contains("may-not-create-pods"), "{conditions}");

    let docs = rendered(&[
        "watchNamespaces={team-a,team-b}",
        "admission.references.enabled=false",
        "admission.placement.tolerations={dedicated=agents,gpu}",
        "admission.placement.priorityClassNames={batch}",
        "admission.placement.podAffinity=none",
        "admission.placement.exemptPodCreators=false",
        "admission.createdBy.required=true",
    ])
    .expect("renders");
    assert!(named(&docs, "ValidatingAdmissionPolicy", POLICIES[0]).is_none());
    assert!(named(&docs, "ValidatingAdmissionPolicyBinding", POLICIES[0]).is_none());
    let placement = named(&docs, "ValidatingAdmissionPolicy", POLICIES[1]).expect("placement");
    assert!(
        variable(placement, "tolerationsAllowed").starts_with(r#"["dedicated=agents","gpu"] + "#)
    );
    assert!(variable(placement, "priorityClassesAllowed").starts_with(r#"["batch"] + "#));
    assert!(variable(placement, "podAffinity").ends_with(r#": "none""#));
    assert!(
        !placement["spec"]["matchConditions"]
            .to_string()
            .contains("may-not-create-pods")
    );
    for name in &POLICIES[1..] {
        let policy = named(&docs, "ValidatingAdmissionPolicy", name).expect(name);
        assert_eq!(
            policy["spec"]["matchConstraints"]["namespaceSelector"],
            json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                         "values": ["team-a", "team-b"]}]}),
            "{name}"
        );
    }
    let created = named(&docs, "ValidatingAdmissionPolicy", POLICIES[2]).expect("created-by");
    assert_eq!(
        created["spec"]["validations"].as_array().map(Vec::len),
        Some(3)
    );

    let docs = rendered(&["admission.placement.enabled=false"]).expect("renders");
    assert!(named(&docs, "ValidatingAdmissionPolicy", POLICIES[1]).is_none());
    let bad = rendered(&["admission.placement.podAffinity=sometimes"]).expect_err("refused");
    assert!(bad.contains("/admission/placement/podAffinity"), "{bad}");
    let bad = rendered(&[
        "admission.placement.tolerations={a,b,c}",
        "admission.placement.nodeSelectorKeys={x=y}",
    ])
    .expect_err("refused");
    assert!(
        bad.contains("/admission/placement/nodeSelectorKeys/0"),
        "{bad}"
    );
}

#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn the_lease_policy_checks_updates_and_deletes_by_all_but_the_operator() {
    let docs = rendered(&[]).expect("renders");
    let name = "r-orchestrator-proxy-lease-writer";
    let policy = named(&docs, "ValidatingAdmissionPolicy", name).expect(name);
    let rule = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["operations"], json!(["UPDATE", "DELETE"]));
    let conditions = policy["spec"]["matchConditions"]
        .as_array()
        .expect("matchConditions");
    // Two exemptions: the operator and the controller manager by name, and whoever may patch
    // TaskRuns' status (it could write the approvals the Lease feeds directly).
    assert_eq!(conditions.len(), 2, "{conditions:?}");
    let status_writers = conditions[1]["expression"].as_str().expect("an expression");
    assert!(
        status_writers.starts_with(
            "!authorizer.group('orchestrator.io').resource('taskruns').subresource('status')"
        ) && status_writers.contains(".check('patch').allowed()"),
        "{status_writers}"
    );
    let exempt = conditions[0]["expression"].as_str().expect("an expression");
    for who in [
        "system:serviceaccount:sys:r-orchestrator-operator",
        "system:kube-controller-manager",
        "system:serviceaccount:kube-system:generic-garbage-collector",
        "system:serviceaccount:kube-system:namespace-controller",
    ] {
        assert!(exempt.contains(&format!("'{who}'")), "{who} in {exempt}");
    }
    assert!(
        !exempt.contains("startsWith"),
        "every writer is matched: {exempt}"
    );
    assert!(policy["spec"]["matchConstraints"]["namespaceSelector"].is_null());

    let docs = rendered(&["watchNamespace=team-a"]).expect("renders");
    let policy = named(&docs, "ValidatingAdmissionPolicy", name).expect(name);
    assert_eq!(
        policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"],
        json!(["team-a"])
    );
}

#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn metrics_network_policies_are_off_by_default_and_admit_only_the_named_scraper() {
    let docs = rendered(&["sharedProxy.enabled=true"]).expect("renders");
    let policies = all(&docs, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "only the shared proxy's: {policies:?}");
    let shared = policies[0];
    let metrics_from = &shared["spec"]["ingress"][1]["from"];
    assert_eq!(
        metrics_from,
        &json!([{"namespaceSelector": {}}]),
        "off: any pod"
    );

    let refused = rendered(&["monitoring.networkPolicy.enabled=true", "watchNamespace=a"])
        .expect_err("a scraper must be named");
    assert!(refused.contains("name the scraper"), "{refused}");
    let scraper = [
        "monitoring.networkPolicy.enabled=true",
        "monitoring.networkPolicy.scraper.namespaceSelector.matchLabels.team=observability",
        "monitoring.networkPolicy.scraper.podSelector.matchLabels.app=vmagent",
    ];
    let refused = rendered(&scraper).expect_err("a cluster-wide install must list namespaces");
    assert!(
        refused.contains("list them in monitoring.networkPolicy.namespaces"),
        "{refused}"
    );
    let from = json!([{"namespaceSelector": {"matchLabels": {"team": "observability"}},
                       "podSelector": {"matchLabels": {"app": "vmagent"}}}]);

    let mut set = scraper.to_vec();
    set.extend([
        "watchNamespaces={team-a,team-b}",
        "sharedProxy.enabled=true",
    ]);
    let docs = rendered(&set).expect("renders");
    let task_pods: Vec<&Value> = all(&docs, "NetworkPolicy")
        .into_iter()
        .filter(|p| p["metadata"]["name"] == "r-orchestrator-task-pods")
        .collect();
    let namespaces: Vec<&Value> = task_pods
        .iter()
        .map(|p| &p["metadata"]["namespace"])
        .collect();
    assert_eq!(namespaces, [&json!("team-a"), &json!("team-b")]);
    for p in &task_pods {
        let spec = &p["spec"];
        // The labels the operator gives every task pod (render::job).
        assert_eq!(
            spec["podSelector"],
            json!({"matchLabels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                   "app.kubernetes.io/component": "agent"}})
        );
        assert_eq!(spec["policyTypes"], json!(["Ingress"]));
        let ingress = spec["ingress"].as_array().expect("ingress");
        assert_eq!(ingress.len(), 2, "{ingress:?}");
        assert_eq!(ingress[0]["from"], from);
        assert_eq!(
            ingress[0]["ports"],
            json!([{"port": METRICS_PORT_NAME, "protocol": "TCP"}])
        );
        // The shared proxy reaches each stdio server's zone on the pod's IP.
        assert_eq!(
            ingress[1]["from"],
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sys"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "orchestrator",
                        "app.kubernetes.io/instance": "r",
                        "app.kubernetes.io/component": "shared-mcp-proxy"}}}])
        );
        let last = ZONE_PORT_BASE + u16::try_from(MAX_SERVERS - 1).expect("a port");
        assert_eq!(
            ingress[1]["ports"],
            json!([{"port": ZONE_PORT_BASE, "endPort": last, "protocol": "TCP"}])
        );
    }
    let shared = named(&docs, "NetworkPolicy", "r-orchestrator-mcp-proxy").expect("shared");
    assert_eq!(shared["spec"]["ingress"][1]["from"], from);
    assert_eq!(shared["spec"]["ingress"][1]["ports"][0]["port"], "metrics");

    // Sidecar mode only, a cluster-wide install naming where task pods run.
    let mut set = scraper.to_vec();
    set.push("monitoring.networkPolicy.namespaces={agents}");
    let docs = rendered(&set).expect("renders");
    let policies = all(&docs, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "{policies:?}");
    assert_eq!(policies[0]["metadata"]["namespace"], "agents");
    assert_eq!(
        policies[0]["spec"]["ingress"].as_array().map(Vec::len),
        Some(1),
        "no shared proxy, no zone ports"
    );
}
