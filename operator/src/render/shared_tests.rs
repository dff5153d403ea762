//! Rendering in shared-service mode: snapshots of a shared task's Job, its ConfigMap in the task
//! namespace and its ConfigMap in the shared proxy's namespace, its stdio servers' zones (over
//! TCP, each with only its own key), and what such a task cannot have.

use k8s_openapi::api::core::v1::PodSpec;
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::proxy::{PROXY_CONFIG_FILE, ProxyConfig};
use orchestrator_crds::shared::{
    LEASE_MODE_ANNOTATION, ProxyMode, TASK_POD_IP_ANNOTATION, TASK_POD_UID_ANNOTATION, TOKEN_DIR,
};
use orchestrator_crds::taskrun::TaskRun;
use serde_json::json;

use super::files::{MCP_CONFIG_FILE, headers_helper};
use super::shared::{SHARED_PROXY_UNAVAILABLE, TaskPod};
use super::*;

/// The shipped catalog plus an HTTP server whose header comes from a Secret.
fn catalog() -> Catalog {
    let shipped = include_str!("../../../config/catalog.yaml");
    let tracker = r#"
  - name: tracker
    description: "An issue tracker over streamable HTTP"
    http:
      url: https://tracker.example.com/mcp
      headersFromEnv: {Authorization: TRACKER_TOKEN}
    secretEnv:
      - {name: TRACKER_TOKEN, secretName: tracker, secretKey: token}
"#;
    Catalog::parse(&format!("{shipped}{tracker}")).expect("catalog with tracker")
}

pub fn shared_proxy() -> SharedProxy {
    SharedProxy {
        url: "http://orchestrator-mcp-proxy.orchestrator-system.svc:8080/mcp".into(),
        namespace: "orchestrator-system".into(),
        service_account: "orchestrator-mcp-proxy".into(),
        audience: "orchestrator.io/mcp-proxy".into(),
    }
}

fn settings(shared: Option<SharedProxy>) -> RenderSettings {
    RenderSettings {
        sidecar_image: "ghcr.io/example/orchestrator-mcp-proxy:0.1.0".into(),
        agent_image: "ghcr.io/example/claude-code:1".into(),
        runtime_images: Default::default(),
        sidecar_otlp_endpoint: None,
        sidecar_log_json: false,
        sidecar_audit_otlp_endpoint: None,
        sidecar_port: DEFAULT_SIDECAR_PORT,
        sidecar_api_watch: true,
        sidecar_kubernetes_service: None,
        sidecar_metrics_port: None,
        shared_proxy: shared,
        default_model: None,
        decision_point: None,
    }
}

/// A task of one HTTP server (its token from the TaskRun's own Secret) and a disabled stdio one.
fn task(servers: serde_json::Value) -> TaskRun {
    serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-2001", "namespace": "team-a",
                     "uid": "0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c2001"},
        "spec": {"taskId": 2001, "serviceName": "todo-api", "task": {"prompt": "Triage."},
                 "activeDeadlineSeconds": 7200,
                 "proxy": {"mode": "shared"},
                 "agent": {"env": [{"name": "ANTHROPIC_API_KEY",
                     "valueFrom": {"secretKeyRef": {"name": "anthropic", "key": "api-key"}}}]},
                 "toolConfig": {"mcpServers": servers}}
    }))
    .expect("a TaskRun")
}

fn http_task() -> TaskRun {
    task(json!([
        {"name": "tracker", "secretRefs": [{"env": "TRACKER_TOKEN", "name": "team-a-tracker", "key": "pat"}]},
        {"name": "time", "enabled": false}
    ]))
}

fn shared_plan() -> Plan {
    render_mode(
        &http_task(),
        &catalog(),
        &settings(Some(shared_proxy())),
        ProxyMode::Shared,
    )
    .unwrap_or_else(|p| panic!("renders: {p:?}"))
}

fn pod(plan: &Plan) -> PodSpec {
    plan.job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec")
}

fn bound() -> TaskPod {
    TaskPod {
        uid: "5d1f0000-0000-4000-8000-0000000000a1".into(),
        ip: Some("10.244.0.17".into()),
    }
}

#[test]
fn shared_job_snapshot() {
    insta::assert_yaml_snapshot!(shared_plan().job());
}

#[test]
fn shared_task_config_map_snapshot() {
    insta::assert_yaml_snapshot!(shared_plan().config_map(1));
}

#[test]
fn shared_proxy_config_map_snapshot() {
    let plan = shared_plan();
    let shared = plan.shared().expect("shared");
    insta::assert_yaml_snapshot!(shared.config_map(
        1,
        plan.config_hash(),
        "Running",
        Some(&bound())
    ));
}

#[test]
fn the_pod_has_no_proxy_and_only_the_agent_holds_a_token_the_api_server_refuses() {
    let plan = shared_plan();
    let pod = pod(&plan);
    // No mcp-proxy: only the zone of the listed (disabled) stdio server `time`.
    let init: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["zone-time"]);
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.containers.len(), 1);
    let agent = &pod.containers[0];
    let env = |name: &str| {
        agent
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(env("ORCHESTRATOR_MCP_URL"), Some(shared_proxy().url));
    assert_eq!(
        env("ORCHESTRATOR_MCP_TOKEN_FILE").as_deref(),
        Some("/var/run/secrets/orchestrator.io/mcp/token")
    );
    let mounts: Vec<&str> = agent
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&TOKEN_DIR), "{mounts:?}");
    // The only token in the pod: the shared proxy's audience, bound to the pod, outliving the
    // deadline (7200 + 600 s); no API token, no mask volume, no Secret file.
    let volumes = pod.volumes.clone().unwrap_or_default();
    let tokens: Vec<_> = volumes
        .iter()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .collect();
    assert_eq!(tokens.len(), 1, "{volumes:?}");
    let token = tokens[0]
        .service_account_token
        .as_ref()
        .expect("a ServiceAccount token");
    assert_eq!(token.audience.as_deref(), Some("orchestrator.io/mcp-proxy"));
    assert_eq!(token.expiration_seconds, Some(7800));
    // The one Secret volume: the zone's key (see the zone test below), mounted in the agent not.
    let secrets: Vec<&str> = volumes
        .iter()
        .filter(|v| v.secret.is_some())
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(secrets, ["zone-0-key"]);
    assert!(
        agent
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.name != "zone-0-key")
    );
    // The Secret env the HTTP server needs is no container's: the shared proxy reads it.
    assert!(env("TRACKER_TOKEN").is_none());
    assert_eq!(plan.zoned_servers().collect::<Vec<_>>(), ["time"]);
}

#[test]
fn the_task_config_map_keeps_the_agents_files_and_the_proxy_gets_the_config_with_secret_headers() {
    let plan = shared_plan();
    let data = plan.config_map(3).data.unwrap_or_default();
    assert!(!data.contains_key(PROXY_CONFIG_FILE), "{:?}", data.keys());
    let mcp: serde_json::Value =
        serde_json::from_str(&data[MCP_CONFIG_FILE]).expect("mcp-config.json");
    let server = &mcp["mcpServers"]["orchestrator"];
    assert_eq!(server["url"], json!(shared_proxy().url));
    assert_eq!(server["headersHelper"], json!(headers_helper()));

    let shared = plan.shared().expect("shared");
    assert_eq!(shared.name(), "task.team-a.task-2001");
    assert_eq!(shared.namespace(), "orchestrator-system");
    let cm = shared.config_map(3, plan.config_hash(), "Pending", None);
    let annotations = cm.metadata.annotations.clone().unwrap_or_default();
    // No pod bound yet: the proxy serves no token for this task.
    assert!(!annotations.contains_key(TASK_POD_UID_ANNOTATION));
    assert!(!annotations.contains_key(TASK_POD_IP_ANNOTATION));
    assert!(cm.metadata.owner_references.is_none());
    let data = cm.data.unwrap_or_default();
    // The task's Secret keys the shared proxy masks in held calls: the servers' and the
    // agent's, as a sidecar's mask volume holds them.
    let masked: serde_json::Value =
        serde_json::from_str(&data[orchestrator_crds::approval::MASK_KEYS_KEY])
            .expect("mask-keys.json");
    assert_eq!(
        masked,
        json!([{"secret": "anthropic", "key": "api-key"}, {"secret": "team-a-tracker", "key": "pat"}])
    );
    let proxy: ProxyConfig =
        serde_saphyr::from_str(&data[PROXY_CONFIG_FILE]).expect("the proxy's schema");
    assert_eq!(proxy.context_version, 3);
    assert_eq!(
        proxy.task.uid.as_deref(),
        Some("0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c2001")
    );
    let http = proxy.servers[0].http.as_ref().expect("tracker is HTTP");
    assert!(http.headers_from_env.is_empty());
    let header = &http.headers_from_secret["Authorization"];
    assert_eq!(
        (header.name.as_str(), header.key.as_str()),
        ("team-a-tracker", "pat")
    );
}

#[test]
fn the_header_helper_prints_the_token_file_as_a_bearer_header() {
    let dir = std::env::temp_dir().join(format!("orch-helper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln";
    std::fs::write(dir.join("token"), format!("{token}\n")).expect("token file");
    let helper = headers_helper().replace(TOKEN_DIR, &dir.display().to_string());
    let out = std::process::Command::new("sh")
        .args(["-c", &helper])
        .output()
        .expect("sh runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let headers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON object");
    assert_eq!(headers, json!({"Authorization": format!("Bearer {token}")}));
}

#[test]
fn the_shared_proxy_may_read_the_tasks_secrets_by_name_and_write_its_lease() {
    let plan = shared_plan();
    let identity = plan.identity();
    let rules = identity.role.rules.clone().unwrap_or_default();
    let secrets = rules
        .iter()
        .find(|r| r.resources.as_deref() == Some(&["secrets".to_string()]))
        .expect("a Secret rule");
    assert_eq!(secrets.verbs, ["get"]);
    assert_eq!(
        secrets.resource_names.as_deref(),
        Some(
            &[
                "anthropic".to_string(),
                "team-a-tracker".to_string(),
                // The zone keys' Secret of the listed stdio server `time`.
                "task-2001-zone-keys".to_string()
            ][..]
        )
    );
    let binding = identity
        .shared_binding
        .as_ref()
        .expect("the shared binding");
    assert_eq!(
        binding.metadata.name.as_deref(),
        Some("task-2001-shared-proxy")
    );
    assert_eq!(binding.role_ref.name, "task-2001");
    let subject = &binding.subjects.as_ref().expect("subjects")[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("orchestrator-mcp-proxy", Some("orchestrator-system"))
    );
    let lease = identity.lease.as_ref().expect("a Lease");
    assert_eq!(
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEASE_MODE_ANNOTATION))
            .map(String::as_str),
        Some("shared")
    );
    // A task naming no Secret: no Secret rule at all (an empty resourceNames grants every one).
    let none = render_mode(
        &task(json!([{"name": "time", "enabled": false}])),
        &catalog(),
        &settings(Some(shared_proxy())),
        ProxyMode::Shared,
    )
    .expect("renders");
    let rules = none.identity().role.rules.clone().unwrap_or_default();
    assert!(
        rules
            .iter()
            .all(|r| r.resources.as_deref() != Some(&["secrets".to_string()])
                || r.resource_names.as_ref().is_some_and(|n| !n.is_empty())),
        "{rules:?}"
    );
}

#[test]
fn a_shared_task_without_a_shared_proxy_is_refused_with_the_fix() {
    let problems = render_mode(&http_task(), &catalog(), &settings(None), ProxyMode::Shared)
        .expect_err("no shared proxy");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, SHARED_PROXY_UNAVAILABLE);
    assert!(problems[0].message.contains("spec.proxy.mode: sidecar"));
}

/// A shared task with two stdio servers: each keeps its zone container (uid, Secrets,
/// workspace), which listens on the pod's IP with its own key; the shared proxy's config names
/// the port and the Secret key, and the task's Role lets it get that Secret.
#[test]
fn each_stdio_server_listens_on_the_pod_ip_with_only_its_own_key() {
    let tr = task(json!([{"name": "tracker"}, {"name": "time"}, {"name": "memory"}]));
    let plan = render_mode(
        &tr,
        &catalog(),
        &settings(Some(shared_proxy())),
        ProxyMode::Shared,
    )
    .unwrap_or_else(|p| panic!("renders: {p:?}"));
    let pod = pod(&plan);
    let zones = pod.init_containers.clone().unwrap_or_default();
    let names: Vec<&str> = zones.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["zone-time", "zone-memory"]);
    for (i, (zone, server)) in zones.iter().zip(["time", "memory"]).enumerate() {
        let command = zone.command.clone().unwrap_or_default();
        let dashes = command.iter().position(|a| a == "--").expect("--");
        assert_eq!(
            command[..dashes],
            [
                "orchestrator-mcp-proxy".to_string(),
                "--log-format=text".into(),
                "zone".into(),
                "--listen".into(),
                format!("$(POD_IP):{}", 9100 + i),
                "--key-file".into(),
                "/etc/orchestrator/zone-key/key".into(),
                "--server".into(),
                server.into(),
            ]
        );
        let pod_ip = zone
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "POD_IP")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(pod_ip, Some("status.podIP"));
        let mounts: Vec<(&str, &str)> = zone
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        let key_volume = format!("zone-{i}-key");
        assert!(
            mounts.contains(&(key_volume.as_str(), "/etc/orchestrator/zone-key")),
            "{mounts:?}"
        );
        assert!(
            mounts
                .iter()
                .all(|(_, p)| !p.starts_with("/run/orchestrator")),
            "no socket in shared mode: {mounts:?}"
        );
        // Its key volume projects its own item alone, and no other container mounts it.
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == key_volume)
            .and_then(|v| v.secret.clone())
            .expect("a key volume");
        assert_eq!(volume.secret_name.as_deref(), Some("task-2001-zone-keys"));
        let items: Vec<(&str, &str)> = volume
            .items
            .iter()
            .flatten()
            .map(|k| (k.key.as_str(), k.path.as_str()))
            .collect();
        assert_eq!(items, [(server, "key")]);
        let holders: Vec<&str> = pod
            .containers
            .iter()
            .chain(&zones)
            .filter(|c| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == key_volume)
            })
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(holders, [zone.name.as_str()]);
    }
    // The shared proxy's config: the port and the key's place, no socket.
    let shared = plan.shared().expect("shared");
    let config: ProxyConfig = serde_saphyr::from_str(&shared.proxy_yaml(1)).expect("proxy.yaml");
    for (i, server) in ["time", "memory"].iter().enumerate() {
        let stdio = config
            .servers
            .iter()
            .find(|s| s.name == *server)
            .and_then(|s| s.stdio.clone())
            .expect("a stdio server");
        assert_eq!(stdio.socket, None);
        assert_eq!(stdio.zone_port, Some(9100 + i as u16));
        let key = stdio.zone_key.expect("zoneKey");
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("task-2001-zone-keys", *server)
        );
    }
    // The shared proxy may get the Secret; the Secret itself is drawn by reconcile.
    let rules = plan.identity().role.rules.clone().unwrap_or_default();
    assert!(
        rules.iter().any(|r| r
            .resource_names
            .iter()
            .flatten()
            .any(|n| n == "task-2001-zone-keys")),
        "{rules:?}"
    );
    let secret = plan
        .zone_keys_secret(|| "k".into())
        .expect("a zone-keys Secret");
    assert_eq!(
        secret
            .string_data
            .unwrap_or_default()
            .into_keys()
            .collect::<Vec<_>>(),
        ["memory", "time"]
    );
    // A sidecar-mode plan of the same TaskRun has none (its zones use sockets).
    let sidecar = render_mode(&tr, &catalog(), &settings(None), ProxyMode::Sidecar)
        .expect("renders in sidecar mode");
    assert!(sidecar.zone_keys_secret(|| "k".into()).is_none());
}

#[test]
fn the_config_hash_follows_the_proxy_config_kept_in_the_shared_config_map() {
    let plan = |allow: &str| {
        render_mode(
            &task(json!([{"name": "tracker", "tools": {"allow": [allow]}}])),
            &catalog(),
            &settings(Some(shared_proxy())),
            ProxyMode::Shared,
        )
        .expect("renders")
    };
    let (a, b) = (plan("list_*"), plan("get_*"));
    // Only proxy.yaml differs, and it is not in the task's ConfigMap: the hash still moves.
    assert_eq!(a.config_map(1).data, b.config_map(1).data);
    assert_ne!(a.config_hash(), b.config_hash());
}
