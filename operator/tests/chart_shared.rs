//! The chart's shared proxy (`sharedProxy.enabled`), rendered by `helm template` (helm from the
//! control-plane build, `common::rendered`): the Deployment, its Service, HPA, PDB,
//! NetworkPolicy and RBAC, the operator's flags pointing at it, and the operator's Role there
//! exactly `rbac::RULES`' shared-proxy scope. Off by default: none of it is rendered.

use std::collections::BTreeSet;

use orchestrator_operator::rbac::{RULES, Scope};
use serde_json::{Value, json};

mod common;
use common::rendered;

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name}");
    found[0]
}

fn verbs(rule: &Value) -> BTreeSet<String> {
    rule["verbs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn the_shared_proxy_renders_with_its_autoscaler_and_the_operator_pointed_at_it() {
    let docs = rendered(&["sharedProxy.enabled=true"]).expect("renders");
    let name = "r-orchestrator-mcp-proxy";

    let hpa = find(&docs, "HorizontalPodAutoscaler", name);
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], name);
    assert_eq!(
        (&hpa["spec"]["minReplicas"], &hpa["spec"]["maxReplicas"]),
        (&json!(2), &json!(10))
    );
    let cpu = &hpa["spec"]["metrics"][0]["resource"];
    assert_eq!(cpu["name"], "cpu");
    assert_eq!(cpu["target"]["averageUtilization"], 70);

    let deployment = find(&docs, "Deployment", name);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], name);
    assert_eq!(pod["securityContext"]["runAsUser"], 65533);
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"], "orchestrator-mcp-proxy:0.2.0",
        "the sidecar's image"
    );
    // The chart's logJson (default true) sets the shared proxy's log format.
    assert_eq!(
        c["command"],
        json!(["orchestrator-mcp-proxy", "--log-format=json", "shared"])
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--listen=0.0.0.0:8080",
        "--namespace=$(POD_NAMESPACE)",
        "--audience=orchestrator.io/mcp-proxy",
        "--check-peer-address=true",
        "--pod-name=$(POD_NAME)",
    ] {
        assert!(args.contains(&want), "{want} in {args:?}");
    }
    // Its memory budget follows its container's limit (the Downward API), as a task pod's proxy's.
    let limit = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "MCP_PROXY_MEMORY_LIMIT")
        .expect("MCP_PROXY_MEMORY_LIMIT in the shared proxy's env");
    assert_eq!(
        limit["valueFrom"]["resourceFieldRef"],
        json!({"containerName": "mcp-proxy", "resource": "limits.memory"})
    );
    assert_eq!(
        c["readinessProbe"]["exec"]["command"],
        json!([
            "orchestrator-mcp-proxy",
            "probe",
            "http://127.0.0.1:8080/readyz"
        ])
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));

    let service = find(&docs, "Service", name);
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(service["spec"]["sessionAffinity"], "ClientIP");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
    let pdb = find(&docs, "PodDisruptionBudget", name);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let policy = find(&docs, "NetworkPolicy", name);
    assert_eq!(
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/managed-by"],
        "orchestrator-operator"
    );

    // Its RBAC: TokenReviews, and the ConfigMaps of its own namespace only.
    let delegator = find(
        &docs,
        "ClusterRoleBinding",
        &format!("{name}-auth-delegator"),
    );
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(delegator["subjects"][0]["name"], name);
    let role = find(&docs, "Role", name);
    assert_eq!(role["metadata"]["namespace"], "sys");
    assert_eq!(role["rules"].as_array().map(Vec::len), Some(2));
    assert_eq!(role["rules"][0]["resources"], json!(["configmaps"]));
    assert_eq!(
        verbs(&role["rules"][0]),
        ["get", "list", "watch"].map(String::from).into()
    );
    // Its sibling replicas' pods, get only: whether a call's holder is gone (adoption).
    assert_eq!(role["rules"][1]["resources"], json!(["pods"]));
    assert_eq!(verbs(&role["rules"][1]), ["get"].map(String::from).into());

    // The operator's Role there: exactly rbac::RULES' shared-proxy scope.
    let operator_role = find(&docs, "Role", "r-orchestrator-operator-shared-proxy");
    let want: BTreeSet<String> = RULES
        .iter()
        .filter(|r| r.scope == Scope::SharedProxy)
        .flat_map(|r| r.verbs.iter().map(|v| v.to_string()))
        .collect();
    assert_eq!(verbs(&operator_role["rules"][0]), want);
    assert!(
        RULES
            .iter()
            .filter(|r| r.scope == Scope::SharedProxy)
            .all(|r| r.resource == "configmaps" && r.group.is_empty())
    );

    // The operator's flags.
    let operator = find(&docs, "Deployment", "r-orchestrator-operator");
    let env = operator["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .clone();
    let value = |n: &str| {
        env.iter()
            .find(|e| e["name"] == n)
            .map(|e| e["value"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        value("ORCH_SHARED_PROXY_URL"),
        "http://r-orchestrator-mcp-proxy.sys.svc:8080/mcp"
    );
    assert_eq!(value("ORCH_SHARED_PROXY_NAMESPACE"), "sys");
    assert_eq!(value("ORCH_SHARED_PROXY_SERVICE_ACCOUNT"), name);
    assert_eq!(
        value("ORCH_SHARED_PROXY_AUDIENCE"),
        "orchestrator.io/mcp-proxy"
    );
    assert_eq!(value("ORCH_DEFAULT_PROXY_MODE"), "sidecar");

    // The Lease policy admits the shared proxy's account for shared tasks' Leases.
    let vap = find(
        &docs,
        "ValidatingAdmissionPolicy",
        "r-orchestrator-proxy-lease-writer",
    );
    let text = vap.to_string();
    assert!(
        text.contains("system:serviceaccount:sys:r-orchestrator-mcp-proxy"),
        "{text}"
    );
}

#[test]
#[ignore = "needs helm from the control-plane build (run ./test)"]
fn off_by_default_and_a_shared_default_without_it_is_refused() {
    let docs = rendered(&[]).expect("renders");
    for kind in [
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ] {
        assert!(docs.iter().all(|d| d["kind"] != kind), "{kind} rendered");
    }
    assert!(
        docs.iter()
            .all(|d| !d["metadata"]["name"].to_string().contains("mcp-proxy")),
        "nothing of the shared proxy"
    );
    let operator = find(&docs, "Deployment", "r-orchestrator-operator");
    let env = operator["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(!env.contains("ORCH_SHARED_PROXY_URL"), "{env}");

    let refused = rendered(&["defaultProxyMode=shared"]).expect_err("refused");
    assert!(
        refused.contains("defaultProxyMode: shared needs sharedProxy.enabled: true"),
        "{refused}"
    );
    let bad = rendered(&["sharedProxy.enabled=true", "sharedProxy.maxReplicas=0"])
        .expect_err("the schema refuses it");
    assert!(bad.contains("/sharedProxy/maxReplicas"), "{bad}");
}
