//! The model gateway in the pod (issue 42): with `spec.model` (or the operator's default
//! credential) the model key is in a Secret volume of the proxy's container only, the proxy's
//! config has the gateway and the budget, and the agent is pointed at the proxy with its own
//! credential as the API key; never a key in the agent's env.

use orchestrator_crds::taskrun::KeyRef;
use orchestrator_crds::taskrun::model::{Budget, ModelSpec};

use super::tests::{catalog, containers, pod, settings, task_1001};
use super::*;

/// The sample without its agent env key, with `spec.model` and a budget.
fn with_model() -> TaskRun {
    let mut tr = task_1001();
    tr.spec.agent = None;
    tr.spec.model = Some(ModelSpec {
        secret_key_ref: KeyRef {
            name: "anthropic".into(),
            key: "api-key".into(),
        },
        endpoint: None,
        models: vec!["claude-sonnet-*".into()],
        ca_config_map_key_ref: None,
    });
    tr.spec.budget = Some(Budget {
        output_tokens: Some(50_000),
        cost_usd: Some("2.50".into()),
        ..Budget::default()
    });
    tr
}

/// The sample as TaskRuns were written before the gateway: the key in the agent's env.
fn with_agent_key() -> TaskRun {
    let mut tr = task_1001();
    tr.spec.model = None;
    tr.spec.budget = None;
    tr.spec.agent = Some(
        serde_json::from_value(serde_json::json!({"env": [{
            "name": "ANTHROPIC_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "anthropic", "key": "api-key"}},
        }]}))
        .expect("an agent spec"),
    );
    tr
}

fn test_settings(default_model: Option<ModelSpec>) -> RenderSettings {
    RenderSettings {
        default_model,
        ..settings()
    }
}

/// The pod's volume `name`.
fn volume(
    pod: &k8s_openapi::api::core::v1::PodSpec,
    name: &str,
) -> k8s_openapi::api::core::v1::Volume {
    pod.volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("the pod has no volume {name}"))
}

/// The proxy's container mounts volume `name`, and no other container does.
fn only_the_proxy_mounts(pod: &k8s_openapi::api::core::v1::PodSpec, name: &str) {
    for c in containers(pod) {
        let mounts = c.volume_mounts.iter().flatten().any(|m| m.name == name);
        assert_eq!(mounts, c.name == "mcp-proxy", "{}", c.name);
    }
}

fn plan_with(tr: &TaskRun, settings: &RenderSettings) -> Result<Plan, Vec<Problem>> {
    render(tr, &catalog(), settings)
}

#[test]
fn the_key_is_mounted_in_the_proxys_container_only_and_the_agent_gets_the_proxys_url() {
    let plan = plan_with(&with_model(), &test_settings(None)).expect("renders");
    let pod = pod(&plan);
    let volume = volume(&pod, "model-key")
        .secret
        .expect("the model key's volume");
    assert_eq!(volume.secret_name.as_deref(), Some("anthropic"));
    let items = volume.items.unwrap_or_default();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("api-key", "api-key")
    );
    only_the_proxy_mounts(&pod, "model-key");
    for c in containers(&pod) {
        // No container gets a key in its env, from any Secret.
        for e in c.env.iter().flatten() {
            assert!(
                !e.name.contains("API_KEY") && !e.name.contains("AUTH_TOKEN"),
                "{}: {}",
                c.name,
                e.name
            );
        }
    }
    let agent = containers(&pod)
        .into_iter()
        .find(|c| c.name == "agent")
        .expect("agent");
    let base = agent
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "ANTHROPIC_BASE_URL")
        .and_then(|e| e.value.clone());
    assert_eq!(base.as_deref(), Some("http://127.0.0.1:8080/model"));

    let data = plan.config_map(3).data.unwrap_or_default();
    let proxy: orchestrator_crds::proxy::ProxyConfig =
        serde_saphyr::from_str(&data["proxy.yaml"]).expect("proxy.yaml");
    let gateway = proxy.gateway.expect("the gateway");
    assert_eq!(gateway.endpoint, "https://api.anthropic.com");
    assert_eq!(gateway.key_file, "/etc/orchestrator/model/api-key");
    assert_eq!(gateway.models, ["claude-sonnet-*"]);
    assert_eq!(gateway.budget.output_tokens, Some(50_000));
    assert_eq!(gateway.budget.cost_usd.as_deref(), Some("2.50"));
    let settings: serde_json::Value =
        serde_json::from_str(&data["settings.json"]).expect("settings");
    assert_eq!(
        settings["apiKeyHelper"],
        "sh /etc/orchestrator/tools/model-key.sh"
    );
    assert!(data["model-key.sh"].contains("/proc/net/tcp"));
    assert!(
        !data.values().any(|v| v.contains("sk-ant")),
        "no key in the ConfigMap"
    );
}

#[test]
fn a_raised_budget_changes_the_config_and_nothing_else() {
    let settings = test_settings(None);
    let before = plan_with(&with_model(), &settings).expect("renders");
    let mut raised = with_model();
    raised.spec.budget = Some(Budget {
        output_tokens: Some(500_000),
        ..Budget::default()
    });
    let after = plan_with(&raised, &settings).expect("renders");
    assert_ne!(
        before.config_hash(),
        after.config_hash(),
        "a new contextVersion"
    );
    assert_eq!(
        serde_json::to_value(before.job()).expect("json"),
        serde_json::to_value(after.job()).expect("json"),
        "the pod stays"
    );
}

#[test]
fn the_default_credential_serves_a_task_that_names_none_but_not_one_with_its_own_key() {
    let default = ModelSpec {
        secret_key_ref: KeyRef {
            name: "orchestrator-model".into(),
            key: "api-key".into(),
        },
        endpoint: Some("https://llm.internal.example".into()),
        models: Vec::new(),
        ca_config_map_key_ref: None,
    };
    let settings = test_settings(Some(default));
    let mut plain = with_model();
    plain.spec.model = None;
    let plan = plan_with(&plain, &settings).expect("renders");
    let data = plan.config_map(1).data.unwrap_or_default();
    assert!(data["proxy.yaml"].contains("https://llm.internal.example"));
    let secret = pod(&plan)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "model-key")
        .and_then(|v| v.secret.clone())
        .and_then(|s| s.secret_name);
    assert_eq!(secret.as_deref(), Some("orchestrator-model"));
    let optional = pod(&plan)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "model-key")
        .and_then(|v| v.secret.clone())
        .and_then(|s| s.optional);
    assert_eq!(
        optional,
        Some(true),
        "a namespace may not have the default's Secret"
    );

    // A TaskRun written before the gateway (its key in the agent's env): no gateway, as before.
    let older = plan_with(&with_agent_key(), &settings).expect("renders");
    let data = older.config_map(1).data.unwrap_or_default();
    assert!(!data["proxy.yaml"].contains("gateway"));
    assert!(!data.contains_key("model-key.sh"));

    // Both: refused, naming the field to remove.
    let mut both = with_agent_key();
    both.spec.model = with_model().spec.model;
    let problems = plan_with(&both, &settings).expect_err("refused");
    assert_eq!(problems[0].reason, "ModelKeyInAgent");
    assert!(
        problems[0].message.contains("ANTHROPIC_API_KEY"),
        "{}",
        problems[0].message
    );
}

#[test]
fn the_key_helper_checks_the_port_like_the_headers_helper_and_prints_the_token() {
    let script = model::key_helper_script(&files::headers_script("127.0.0.1:8080"));
    assert!(script.contains("/proc/net/tcp"), "{script}");
    assert!(script.ends_with("cat \"$token\"\n"), "{script}");
    assert!(!script.contains("Authorization"), "{script}");
    assert!(
        script.starts_with("# The model key helper (sidecar mode; Claude Code's apiKeyHelper"),
        "{script}"
    );
}

#[test]
fn the_endpoints_cas_come_from_a_configmap_mounted_in_the_proxys_container_only() {
    let mut tr = with_model();
    if let Some(model) = tr.spec.model.as_mut() {
        model.endpoint = Some("https://llm.internal.example".into());
        model.ca_config_map_key_ref = Some(KeyRef {
            name: "llm-ca".into(),
            key: "ca.crt".into(),
        });
    }
    let plan = plan_with(&tr, &test_settings(None)).expect("renders");
    let data = plan.config_map(1).data.unwrap_or_default();
    let proxy: serde_json::Value = serde_saphyr::from_str(&data["proxy.yaml"]).expect("yaml");
    assert_eq!(
        proxy["gateway"]["caFile"],
        "/etc/orchestrator/model-ca/ca.pem"
    );
    let spec = pod(&plan);
    let ca = volume(&spec, "model-ca").config_map.expect("the CA volume");
    assert_eq!(ca.name, "llm-ca");
    let items = ca.items.unwrap_or_default();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("ca.crt", "ca.pem")
    );
    assert_eq!(ca.optional, None, "the pod waits for its CAs");
    only_the_proxy_mounts(&spec, "model-ca");
    // Without one: no volume, no caFile.
    let plan = plan_with(&with_model(), &test_settings(None)).expect("renders");
    let data = plan.config_map(1).data.unwrap_or_default();
    assert!(!data["proxy.yaml"].contains("caFile"));
    assert!(
        !pod(&plan)
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == "model-ca")
    );
}

/// Shared mode: the shared proxy serves the model. Its config names the key and CAs by their
/// Secret and ConfigMap keys (read through the API, which the task's Role allows by name); the
/// pod has neither; the agent is pointed at the shared proxy's `/model` with its pod's token.
#[test]
fn in_shared_mode_the_shared_proxy_reads_the_key_and_the_pod_has_none() {
    let mut tr = with_model();
    tr.spec.proxy =
        Some(serde_json::from_value(serde_json::json!({"mode": "shared"})).expect("proxy"));
    if let Some(model) = tr.spec.model.as_mut() {
        model.ca_config_map_key_ref = Some(KeyRef {
            name: "llm-ca".into(),
            key: "ca.crt".into(),
        });
    }
    let settings = RenderSettings {
        shared_proxy: Some(super::shared_tests::shared_proxy()),
        ..test_settings(None)
    };
    let plan = render_mode(&tr, &catalog(), &settings, ProxyMode::Shared)
        .unwrap_or_else(|p| panic!("renders: {p:?}"));
    let shared = plan.shared().expect("a shared config");
    let config: orchestrator_crds::proxy::ProxyConfig =
        serde_saphyr::from_str(&shared.proxy_yaml(1)).expect("the shared proxy's config");
    let gateway = config.gateway.expect("a gateway");
    assert_eq!(
        gateway.key_file, "",
        "no file: the shared proxy has no mount of it"
    );
    assert_eq!(
        gateway
            .key_secret
            .as_ref()
            .map(|k| (k.name.as_str(), k.key.as_str())),
        Some(("anthropic", "api-key"))
    );
    assert_eq!(
        gateway
            .ca_config_map
            .as_ref()
            .map(|k| (k.name.as_str(), k.key.as_str())),
        Some(("llm-ca", "ca.crt"))
    );
    assert_eq!(gateway.ca_file, None);
    assert_eq!(gateway.budget.output_tokens, Some(50_000));
    assert_eq!(gateway.models, ["claude-sonnet-*"]);
    // The pod: no volume of the Secret or the CAs, no key in any container's env; the agent
    // talks to the shared proxy's /model.
    let pod = pod(&plan);
    for v in pod.volumes.iter().flatten() {
        assert!(
            v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) != Some("anthropic")
                && v.config_map.as_ref().map(|c| c.name.as_str()) != Some("llm-ca"),
            "{v:?}"
        );
    }
    let agent = containers(&pod)
        .into_iter()
        .find(|c| c.name == "agent")
        .expect("the agent");
    let env: Vec<(String, Option<String>)> = agent
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    assert!(
        env.contains(&(
            "ANTHROPIC_BASE_URL".into(),
            Some("http://orchestrator-mcp-proxy.orchestrator-system.svc:8080/model".into())
        )),
        "{env:?}"
    );
    assert!(
        !env.iter()
            .any(|(n, _)| n == "ANTHROPIC_API_KEY" || n == "ANTHROPIC_AUTH_TOKEN"),
        "{env:?}"
    );
    // The agent's settings print its projected token as the API key; no sidecar helper script.
    let data = plan.config_map(1).data.unwrap_or_default();
    let agent_settings: serde_json::Value =
        serde_json::from_str(&data[super::files::SETTINGS_FILE]).expect("settings JSON");
    assert_eq!(
        agent_settings["apiKeyHelper"],
        "cat /var/run/secrets/orchestrator.io/mcp/token"
    );
    assert!(
        !data.contains_key(super::model::MODEL_KEY_HELPER_FILE),
        "{:?}",
        data.keys()
    );
    // The Role lets the shared proxy read the key's Secret and the CAs' ConfigMap, by name.
    let rules = plan.identity().role.rules.clone().unwrap_or_default();
    let names = |resource: &str, verbs: &[&str]| -> Vec<String> {
        rules
            .iter()
            .filter(|r| r.resources.as_deref() == Some(&[resource.to_string()]))
            .filter(|r| r.verbs == verbs)
            .flat_map(|r| r.resource_names.clone().unwrap_or_default())
            .collect()
    };
    assert!(names("secrets", &["get"]).contains(&"anthropic".to_string()));
    assert_eq!(names("configmaps", &["get"]), ["llm-ca"]);
}

#[test]
fn the_shared_proxys_model_url_is_its_origin_and_model() {
    for (mcp, model) in [
        (
            "http://proxy.sys.svc:8080/mcp",
            "http://proxy.sys.svc:8080/model",
        ),
        (
            "https://proxy.example.com/mcp/",
            "https://proxy.example.com/model",
        ),
        ("http://10.0.0.5:8080", "http://10.0.0.5:8080/model"),
    ] {
        assert_eq!(super::model::shared_base_url(mcp), model);
    }
}
