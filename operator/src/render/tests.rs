//! Snapshot and property tests of rendering, on the samples in `config/samples/` and the real
//! catalog in `config/catalog.yaml`.

use k8s_openapi::api::core::v1::{Container, EnvVar};
use orchestrator_crds::catalog::Catalog;
use orchestrator_crds::proxy::{OnChange, ProxyConfig, Risk, ToolMode};
use orchestrator_crds::taskrun::{McpServer, TaskRun};

use super::*;

pub(super) fn catalog() -> Catalog {
    Catalog::parse(include_str!("../../../config/catalog.yaml")).expect("shipped catalog is valid")
}

pub(super) fn settings() -> RenderSettings {
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
        shared_proxy: None,
        default_model: None,
        decision_point: None,
    }
}

/// A sample as the API server would hand it to the operator: namespaced, with a uid.
fn sample(yaml: &str) -> TaskRun {
    let mut tr: TaskRun = serde_saphyr::from_str(yaml).expect("sample parses");
    tr.metadata.namespace = Some("team-a".into());
    tr.metadata.uid = Some("0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c1001".into());
    tr
}

pub(super) fn task_1001() -> TaskRun {
    sample(include_str!("../../../config/samples/taskrun.yaml"))
}

fn task_1002() -> TaskRun {
    sample(include_str!("../../../config/samples/taskrun-github.yaml"))
}

pub(super) fn plan(tr: &TaskRun) -> Plan {
    render(tr, &catalog(), &settings()).unwrap_or_else(|p| panic!("renders: {p:?}"))
}

fn proxy_container(plan: &Plan) -> Container {
    let spec = plan
        .job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    spec.init_containers.as_ref().expect("init containers")[0].clone()
}

#[test]
fn sample_config_map_snapshot() {
    insta::assert_yaml_snapshot!(plan(&task_1001()).config_map(1));
}

#[test]
fn sample_proxy_yaml_snapshot() {
    let data = plan(&task_1001()).config_map(1).data.expect("data");
    insta::assert_snapshot!(data["proxy.yaml"]);
}

#[test]
fn sample_job_snapshot() {
    insta::assert_yaml_snapshot!(plan(&task_1001()).job());
}

#[test]
fn github_sample_job_snapshot() {
    insta::assert_yaml_snapshot!(plan(&task_1002()).job());
}

/// Who created the TaskRun reaches the proxy (its audit records) when the annotation names
/// someone; nobody otherwise.
#[test]
fn the_proxy_config_names_who_created_the_taskrun() {
    let created_by = |tr: &TaskRun| {
        let data = plan(tr).config_map(1).data.expect("data");
        serde_saphyr::from_str::<ProxyConfig>(&data["proxy.yaml"])
            .expect("proxy.yaml")
            .task
            .created_by
    };
    let mut tr = task_1001();
    assert_eq!(created_by(&tr), None);
    tr.metadata.annotations = Some(
        [(
            "orchestrator.io/created-by".to_string(),
            r#"{"user":"alice@example.com"}"#.to_string(),
        )]
        .into(),
    );
    assert_eq!(created_by(&tr).as_deref(), Some("alice@example.com"));
}

#[test]
fn rendered_proxy_yaml_round_trips_into_the_sidecar_schema() {
    let cm = plan(&task_1002()).config_map(7);
    let data = cm.data.expect("data");
    let text = &data["proxy.yaml"];
    let parsed: ProxyConfig =
        serde_saphyr::from_str(text).expect("proxy.yaml parses as ProxyConfig");
    assert_eq!(parsed.context_version, 7);
    assert_eq!(
        (parsed.task.name.as_str(), parsed.task.namespace.as_str()),
        ("task-1002", "team-a")
    );
    let names: Vec<_> = parsed
        .servers
        .iter()
        .map(|s| (s.name.as_str(), s.enabled))
        .collect();
    assert_eq!(
        names,
        [("github", true), ("filesystem", true), ("git", false)]
    );
    let github = &parsed.servers[0];
    let stdio = github.stdio.as_ref().expect("github is a stdio server");
    assert_eq!(stdio.command, "mcp-server-github");
    // The server runs in its own container: the proxy has its socket, not its env.
    assert!(stdio.pass_env.is_empty() && stdio.env.is_empty() && stdio.cwd.is_none());
    assert_eq!(
        stdio.socket.as_deref(),
        Some("/run/orchestrator/zones/github/mcp.sock")
    );
    assert_eq!(github.tools.allow, ["list_*", "get_*", "search_*"]);
    assert_eq!(
        parsed.servers[1].tools.deny,
        ["move_file", "create_directory"]
    );
    // Re-serializing the parsed config gives the same text: nothing was dropped or defaulted away.
    assert_eq!(&serde_saphyr::to_string(&parsed).expect("serializes"), text);
}

#[test]
fn the_call_policy_rate_limits_and_the_catalogs_pins_reach_the_proxy() {
    let mut tr = task_1002();
    tr.spec.tool_config.policy.validate_arguments = Some(false);
    tr.spec.tool_config.policy.on_change = Some(OnChange::Alert);
    tr.spec.tool_config.policy.tool_mode = Some(ToolMode::Intent);
    tr.spec.tool_config.mcp_servers[0].rate_limit = serde_json::from_value(serde_json::json!(
        {"perMinute": 30, "tools": {"create_issue": {"perMinute": 2, "burst": 1}}}
    ))
    .expect("limits");
    let catalog = catalog();
    let rendered = render(&tr, &catalog, &settings()).unwrap_or_else(|p| panic!("{p:?}"));
    let data = rendered.config_map(1).data.expect("data");
    let parsed: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
    assert!(!parsed.policy.validate_arguments);
    assert_eq!(parsed.policy.on_change, OnChange::Alert);
    assert_eq!(parsed.policy.tool_mode, ToolMode::Intent);
    assert_eq!(
        parsed.servers[0].rate_limit,
        tr.spec.tool_config.mcp_servers[0].rate_limit
    );
    // Every tool of the shipped catalog is pinned: each server's pins and full definitions reach
    // its proxy, and each definition hashes to its pin.
    for server in &parsed.servers {
        let entry = catalog.get(&server.name).expect("in the catalog");
        let pins: std::collections::BTreeMap<String, String> = entry
            .tools
            .iter()
            .filter_map(|t| Some((t.name.clone(), t.pin.clone()?)))
            .collect();
        assert_eq!(server.pins, pins, "{}", server.name);
        assert_eq!(server.pins.len(), entry.tools.len(), "{}", server.name);
        assert_eq!(
            server.definitions.len(),
            entry.tools.len(),
            "{}",
            server.name
        );
        for definition in &server.definitions {
            let name = definition["name"].as_str().unwrap_or_default();
            assert_eq!(
                server.pins.get(name),
                Some(&orchestrator_crds::policy::definition_hash(definition)),
                "{}/{name}",
                server.name
            );
        }
    }
    // A server with a tool that has no definition gets none (its list comes from the server).
    let mut partly = catalog.clone();
    let github = partly
        .servers
        .iter_mut()
        .find(|s| s.name == "github")
        .expect("github");
    github.tools[0].definition = None;
    let github_tools = github.tools.len();
    let rendered = render(&tr, &partly, &settings()).unwrap_or_else(|p| panic!("{p:?}"));
    let data = rendered.config_map(1).data.expect("data");
    let parsed: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
    assert!(parsed.servers[0].definitions.is_empty());
    assert_eq!(parsed.servers[0].pins.len(), github_tools);
    // The defaults (validate, block) are what the proxy assumes; none is written.
    let plain = plan(&task_1002()).config_map(1).data.expect("data");
    assert!(
        !plain["proxy.yaml"].contains("policy"),
        "{}",
        plain["proxy.yaml"]
    );
}

#[test]
fn the_risk_policy_reaches_the_proxy_with_the_taskruns_classes_over_the_catalogs() {
    let mut tr = task_1002();
    tr.spec.tool_config.policy.max_risk = Some(Risk::Read);
    tr.spec.tool_config.mcp_servers[0].risk = [
        ("push_files".to_string(), Risk::Write),
        ("create_issue".to_string(), Risk::Read),
    ]
    .into();
    let data = plan(&tr).config_map(1).data.expect("data");
    let parsed: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
    assert_eq!(parsed.policy.max_risk, Some(Risk::Read));
    let github = &parsed.servers[0].risk;
    // The catalog's classes (config/catalog.yaml), the TaskRun's over them.
    assert_eq!(github.get("search_code"), Some(&Risk::Read));
    assert_eq!(github.get("merge_pull_request"), Some(&Risk::Destructive));
    assert_eq!(github.get("push_files"), Some(&Risk::Write));
    assert_eq!(github.get("create_issue"), Some(&Risk::Read));
    // No class in the catalog or the TaskRun: the server's annotations decide, so none is sent.
    assert_eq!(github.get("create_repository"), None);
    assert!(parsed.servers[1].risk.is_empty());
    // The status counts what the classes known here let through: of github's allowed list_*,
    // get_*, search_*, all read in the catalog, all stay; filesystem's have no class here.
    let status = plan(&tr);
    let github_exposed = status.tools[0].exposed.as_ref().expect("listed");
    assert!(github_exposed.iter().any(|t| t == "search_code"));
    tr.spec.tool_config.mcp_servers[0]
        .risk
        .insert("search_code".into(), Risk::Write);
    let stricter = plan(&tr);
    let stricter = stricter.tools[0].exposed.as_ref().expect("listed");
    assert!(!stricter.iter().any(|t| t == "search_code"), "{stricter:?}");
    assert_eq!(stricter.len() + 1, github_exposed.len());
    // Without a policy the proxy config carries none (and the sample's snapshot is unchanged).
    let plain = plan(&task_1002()).config_map(1).data.expect("data");
    assert!(!plain["proxy.yaml"].contains("policy"));
}

/// Every container of a pod: the init (native sidecar) containers, then the others.
pub(super) fn containers(pod: &k8s_openapi::api::core::v1::PodSpec) -> Vec<Container> {
    pod.init_containers
        .iter()
        .flatten()
        .chain(pod.containers.iter())
        .cloned()
        .collect()
}

pub(super) fn pod(plan: &Plan) -> k8s_openapi::api::core::v1::PodSpec {
    plan.job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec")
}

fn container(plan: &Plan, name: &str) -> Container {
    let pod = pod(plan);
    pod.init_containers
        .iter()
        .flatten()
        .chain(pod.containers.iter())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
        .clone()
}

fn env_names(c: &Container) -> Vec<String> {
    c.env.iter().flatten().map(|e| e.name.clone()).collect()
}

#[test]
fn a_servers_secret_reaches_only_its_own_container_as_a_secret_key_ref() {
    let plan = plan(&task_1002());
    let github = container(&plan, "zone-github");
    let token: &EnvVar = github
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "GITHUB_PERSONAL_ACCESS_TOKEN")
        .expect("token env");
    assert!(token.value.is_none());
    let selector = token
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("secretKeyRef");
    assert_eq!(
        (selector.name.as_str(), selector.key.as_str()),
        ("github", "token")
    );
    assert_eq!(
        selector.optional, None,
        "an enabled server's Secret is required"
    );
    // Neither the agent, nor the proxy, nor another server's container has it.
    for other in ["agent", "mcp-proxy", "zone-filesystem", "zone-git"] {
        let names = env_names(&container(&plan, other));
        assert!(
            !names.iter().any(|n| n == "GITHUB_PERSONAL_ACCESS_TOKEN"),
            "{other}: {names:?}"
        );
    }
}

#[test]
fn disabled_servers_get_optional_secret_refs() {
    let mut tr = task_1002();
    tr.spec.tool_config.mcp_servers[0].enabled = false;
    let plan = plan(&tr);
    let github = container(&plan, "zone-github");
    let token = github
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "GITHUB_PERSONAL_ACCESS_TOKEN")
        .expect("env");
    let optional = token
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .and_then(|s| s.optional);
    assert_eq!(optional, Some(true));
    assert_eq!(plan.required_secret_env().count(), 0);
}

#[test]
fn each_stdio_server_listed_gets_its_own_zone_uid_mounts_and_socket() {
    let plan = plan(&task_1002());
    let pod = pod(&plan);
    let init: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    // The proxy first; then every listed server, the disabled git too (a container cannot be
    // added to a running pod).
    assert_eq!(
        init,
        ["mcp-proxy", "zone-github", "zone-filesystem", "zone-git"]
    );
    assert_eq!(
        plan.zoned_servers().collect::<Vec<_>>(),
        ["github", "filesystem", "git"]
    );
    let uid = |c: &Container| {
        let sc = c.security_context.as_ref().expect("security context");
        assert_eq!(sc.run_as_user, sc.run_as_group, "{}", c.name);
        sc.run_as_user
    };
    let mut uids: Vec<Option<i64>> = pod.init_containers.iter().flatten().map(uid).collect();
    assert!(uids.iter().all(Option::is_some), "{uids:?}");
    // The agent runs as the pod's user; no two containers share a uid.
    uids.push(pod.security_context.as_ref().and_then(|s| s.run_as_user));
    assert!(
        pod.containers[0]
            .security_context
            .as_ref()
            .is_some_and(|s| s.run_as_user.is_none())
    );
    let distinct: std::collections::BTreeSet<_> = uids.iter().collect();
    assert_eq!(distinct.len(), uids.len(), "{uids:?}");

    let mounts = |c: &Container| -> Vec<(String, String, bool)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                (
                    m.name.clone(),
                    m.mount_path.clone(),
                    m.read_only == Some(true),
                )
            })
            .collect()
    };
    let has = |c: &Container, path: &str| mounts(c).iter().any(|(_, p, _)| p == path);
    // The workspace: the agent's, and the servers' whose catalog entry says so; not the proxy's.
    assert!(has(&container(&plan, "agent"), "/workspace"));
    assert!(has(&container(&plan, "zone-filesystem"), "/workspace"));
    assert!(has(&container(&plan, "zone-git"), "/workspace"));
    assert!(!has(&container(&plan, "zone-github"), "/workspace"));
    assert!(!has(&container(&plan, "mcp-proxy"), "/workspace"));
    // Each server's socket directory: in its container and the proxy's, nowhere else.
    let proxy = container(&plan, "mcp-proxy");
    let data = plan.config_map(1).data.expect("data");
    let config: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
    for (server, zone) in [
        ("github", "zone-github"),
        ("filesystem", "zone-filesystem"),
        ("git", "zone-git"),
    ] {
        let z = container(&plan, zone);
        let (volume, _, _) = mounts(&z)
            .into_iter()
            .find(|(_, p, _)| p == "/run/orchestrator/zone")
            .expect("socket dir");
        let holders: Vec<String> = pod
            .init_containers
            .iter()
            .flatten()
            .chain(pod.containers.iter())
            .filter(|c| mounts(c).iter().any(|(v, _, _)| *v == volume))
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(holders, ["mcp-proxy", zone], "{volume}");
        assert!(has(&proxy, &format!("/run/orchestrator/zones/{server}")));
        // Its own /tmp, nobody else's.
        let (tmp, _, _) = mounts(&z)
            .into_iter()
            .find(|(_, p, _)| p == "/tmp")
            .expect("tmp");
        assert!(!mounts(&proxy).iter().any(|(v, _, _)| *v == tmp));
        // The zone starts the server on the proxy's request only (the proxy's uid).
        let command = z.command.clone().expect("command");
        assert_eq!(
            command[..3],
            ["orchestrator-mcp-proxy", "--log-format=text", "zone"]
        );
        let peer = command
            .iter()
            .position(|a| a == "--peer-uid")
            .expect("peer uid");
        assert_eq!(
            Some(command[peer + 1].parse::<i64>().expect("uid")),
            uid(&proxy)
        );
        assert_eq!(z.restart_policy.as_deref(), Some("Always"));
        assert!(z.image == proxy.image);
        // It names its server; the proxy config names its uid (the proxy starts the server
        // only in a zone of that uid that names that server).
        let named = command
            .iter()
            .position(|a| a == "--server")
            .expect("--server");
        assert_eq!(command[named + 1], server);
        let stdio = config
            .servers
            .iter()
            .find(|s| s.name == server)
            .and_then(|s| s.stdio.clone())
            .expect("a stdio server");
        assert_eq!(stdio.zone_uid.map(i64::from), uid(&z), "{server}");
    }
    // The git server's env: the catalog's hardening, nothing of the proxy's.
    let git = container(&plan, "zone-git");
    let git_env = env_names(&git);
    assert!(git_env.iter().any(|n| n == "PYTHONPATH"), "{git_env:?}");
    assert!(
        !git_env.iter().any(|n| n.starts_with("MCP_PROXY_")),
        "{git_env:?}"
    );
    assert_eq!(git.working_dir.as_deref(), Some("/workspace"));
    assert_eq!(
        container(&plan, "zone-github").working_dir.as_deref(),
        Some("/tmp")
    );
}

#[test]
fn a_long_server_name_gets_a_short_container_name_that_stays_unique() {
    let a = zone::zone_container_name(&"a".repeat(63));
    let b = zone::zone_container_name(&format!("{}b", "a".repeat(62)));
    assert!(a.len() <= 63 && b.len() <= 63 && a != b, "{a} {b}");
    assert!(orchestrator_crds::catalog::is_dns1123_label(&a), "{a}");
    assert_eq!(zone::zone_container_name("git"), "zone-git");
}

#[test]
fn pod_is_restricted_and_the_proxy_is_a_native_sidecar() {
    let plan = plan(&task_1001());
    let pod = plan
        .job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod");
    let proxy = &pod.init_containers.as_ref().expect("init")[0];
    assert_eq!(proxy.restart_policy.as_deref(), Some("Always"));
    assert!(proxy.startup_probe.is_some() && proxy.readiness_probe.is_some());
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let sc = c.security_context.as_ref().expect("security context");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
        let drop = sc.capabilities.as_ref().and_then(|c| c.drop.clone());
        assert_eq!(drop, Some(vec!["ALL".to_string()]), "{}", c.name);
        assert_eq!(
            sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        for m in c.volume_mounts.iter().flatten() {
            assert!(
                m.sub_path.is_none(),
                "{}: subPath mounts are never updated",
                c.name
            );
        }
    }
    let tools = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "tools")
        .expect("tools volume");
    assert_eq!(
        tools.config_map.as_ref().map(|c| c.name.as_str()),
        Some("task-1001-tools")
    );
}

#[test]
fn config_hash_ignores_the_version_and_follows_the_tool_config() {
    let tr = task_1001();
    let a = plan(&tr);
    // proxy.yaml, mcp-config.json, mcp-headers.sh, model-key.sh, settings.json, task.md.
    assert_eq!(a.config_map(1).data.map(|d| d.len()), Some(6));
    let mut changed = tr.clone();
    changed.spec.tool_config.mcp_servers[0]
        .tools
        .allow
        .push("trigger-*".into());
    let b = plan(&changed);
    assert_ne!(a.config_hash(), b.config_hash());
    assert_eq!(a.config_hash(), plan(&tr).config_hash(), "deterministic");
    // The Job does not depend on the patterns: a tool change never needs a new pod.
    assert_eq!(a.job(), b.job());
}

#[test]
fn status_tools_list_what_the_patterns_expose() {
    let plan = plan(&task_1001());
    let everything = &plan.tools[0];
    assert_eq!(everything.server, "everything");
    let exposed = everything
        .exposed
        .clone()
        .expect("catalog lists everything's tools");
    assert!(exposed.contains(&"echo".to_string()) && exposed.contains(&"get-sum".to_string()));
    assert!(!exposed.contains(&"get-env".to_string()), "deny wins");
    assert!(!exposed.contains(&"trigger-long-running-operation".to_string()));
    let total: usize = plan
        .tools
        .iter()
        .filter_map(|t| t.exposed.as_ref())
        .map(Vec::len)
        .sum();
    assert_eq!(plan.enabled_tool_count, total as i64);
}

#[test]
fn unknown_servers_are_refused_naming_the_known_ones() {
    let mut tr = task_1001();
    tr.spec
        .tool_config
        .mcp_servers
        .push(McpServer::new("jira", &["*"], &[]));
    let problems = render(&tr, &catalog(), &settings()).expect_err("jira is unknown");
    assert_eq!(problems[0].reason, "UnknownServer");
    assert_eq!(
        problems[0].message,
        "spec.toolConfig.mcpServers names \"jira\" not in the catalog; known servers: everything, filesystem, git, github, memory, time"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut tr = task_1002();
    tr.spec.tool_config.mcp_servers[0].secret_refs[0].env = "GH_TOKEN".into();
    tr.spec.tool_config.mcp_servers[1].tools.allow = vec!["read_[".into()];
    let problems = render(&tr, &catalog(), &settings()).expect_err("two problems");
    let reasons: Vec<_> = problems.iter().map(|p| p.reason).collect();
    assert_eq!(reasons, ["UnknownSecretEnv", "BadPattern"]);
    assert!(
        problems[0]
            .message
            .contains("it lists: GITHUB_PERSONAL_ACCESS_TOKEN"),
        "{}",
        problems[0].message
    );
}

#[test]
fn a_permission_rule_the_agent_would_skip_is_refused_not_rendered() {
    let mut tr = task_1001();
    tr.spec.tool_config.internal_tools.permissions.deny =
        vec!["WebFetch".into(), "webfetch".into()];
    tr.spec.tool_config.internal_tools.permissions.allow = vec!["*".into(), "Bash(foo".into()];
    let problems = render(&tr, &catalog(), &settings()).expect_err("two bad rules");
    let messages: Vec<_> = problems
        .iter()
        .map(|p| (p.reason, p.message.as_str()))
        .collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages.iter().all(|(r, _)| *r == "InvalidPermissionRule"));
    assert!(
        messages[0].1.starts_with(
            "spec.toolConfig.internalTools.permissions.allow: rule \"Bash(foo\" is malformed"
        ),
        "{messages:?}"
    );
    assert!(
        messages[1].1.starts_with(
            "spec.toolConfig.internalTools.permissions.deny: rule \"webfetch\" names a tool in lower case"
        ),
        "{messages:?}"
    );
}

/// Conditions reach the proxy as written, with the TaskRun's labels (which they read); a
/// condition the proxy could not hold calls to is refused naming the entry, and nothing renders.
#[test]
fn conditions_are_rendered_with_the_labels_and_a_bad_one_is_refused() {
    let mut tr = task_1001();
    let labels = |tr: &TaskRun| {
        let data = plan(tr).config_map(1).data.expect("data");
        let parsed: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
        (parsed.task.labels, parsed.policy.conditions)
    };
    tr.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    // Without conditions the config carries no labels (it is as before conditions existed).
    assert_eq!(labels(&tr), (Default::default(), Vec::new()));
    tr.spec.tool_config.policy.conditions = serde_json::from_value(serde_json::json!([
        {"name": "under-src", "tools": ["filesystem/write_*"],
         "when": "!args.path.startsWith('/workspace/src/')", "message": "writes go under src"},
    ]))
    .expect("conditions");
    let (rendered_labels, conditions) = labels(&tr);
    assert_eq!(rendered_labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(conditions, tr.spec.tool_config.policy.conditions);

    tr.spec.tool_config.policy.conditions[0].when = "args.path.startsWith(".into();
    tr.spec.tool_config.policy.conditions[0].tools = vec!["write_*".into()];
    let problems = render(&tr, &catalog(), &settings()).expect_err("refused");
    let messages: Vec<_> = problems
        .iter()
        .map(|p| (p.reason, p.message.as_str()))
        .collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages.iter().all(|(r, _)| *r == "InvalidCondition"));
    assert!(
        messages[0]
            .1
            .starts_with("spec.toolConfig.policy.conditions[0].tools[0]: \"write_*\" has no '/'"),
        "{messages:?}"
    );
    assert!(
        messages[1].1.starts_with(
            "spec.toolConfig.policy.conditions[0].when: condition \"under-src\": at 1:"
        ),
        "{messages:?}"
    );
}

/// A decision point reaches the proxy (with the labels its policy may read); one the proxy could
/// not ask is refused naming the field.
#[test]
fn a_decision_point_is_rendered_and_a_bad_one_is_refused() {
    let mut tr = task_1001();
    tr.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    tr.spec.tool_config.policy.decision_point = serde_json::from_value(serde_json::json!(
        {"url": "http://opa.policy.svc:8181/v1/data/orchestrator/decision", "timeoutMilliseconds": 250}
    ))
    .expect("a point");
    let data = plan(&tr).config_map(1).data.expect("data");
    let parsed: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
    assert_eq!(
        parsed.policy.decision_points,
        tr.spec
            .tool_config
            .policy
            .decision_point
            .iter()
            .cloned()
            .collect::<Vec<_>>()
    );
    assert_eq!(
        parsed.task.labels.get("team").map(String::as_str),
        Some("a")
    );
    // The chart's is asked first, whatever the TaskRun says.
    let chart: orchestrator_crds::decision::DecisionPoint = serde_json::from_value(
        serde_json::json!({"url": "http://opa.platform.svc:8181/v1/data/platform/decision"}),
    )
    .expect("a point");
    let with_chart = RenderSettings {
        decision_point: Some(chart.clone()),
        ..settings()
    };
    let rendered = render(&tr, &catalog(), &with_chart).unwrap_or_else(|p| panic!("{p:?}"));
    let data = rendered.config_map(1).data.expect("data");
    let parsed: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("parses");
    assert_eq!(parsed.policy.decision_points.len(), 2);
    assert_eq!(parsed.policy.decision_points[0], chart);
    if let Some(point) = tr.spec.tool_config.policy.decision_point.as_mut() {
        point.url = "opa:8181".into();
    }
    let problems = render(&tr, &catalog(), &settings()).expect_err("refused");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, "InvalidDecisionPoint");
    assert!(
        problems[0].message.starts_with(
            "spec.toolConfig.policy.decisionPoint.url: \"opa:8181\" is not an absolute http(s) URL"
        ),
        "{}",
        problems[0].message
    );
}

/// Revoking every tool (every server disabled or denying `**`) renders: the proxy serves the
/// empty set. Refusing it would leave a running task's older, broader tools on offer.
#[test]
fn a_config_with_nothing_enabled_renders_an_empty_tool_set() {
    let mut tr = task_1001();
    for s in &mut tr.spec.tool_config.mcp_servers {
        s.tools.deny = vec!["**".into()];
    }
    let data = plan(&tr).config_map(2).data.expect("data");
    let parsed: ProxyConfig =
        serde_saphyr::from_str(&data["proxy.yaml"]).expect("proxy.yaml parses");
    assert!(!parsed.servers.is_empty());
    for server in &parsed.servers {
        assert_eq!(server.tools.deny, ["**"], "{}", server.name);
    }
}

#[test]
fn agent_settings_follow_the_internal_tool_permissions() {
    let data = plan(&task_1001()).config_map(1).data.expect("data");
    let settings: serde_json::Value = serde_json::from_str(&data["settings.json"]).expect("json");
    assert_eq!(
        settings["permissions"]["deny"],
        serde_json::json!(["WebFetch"])
    );
    assert_eq!(settings["permissions"]["defaultMode"], "bypassPermissions");
    let mcp: serde_json::Value = serde_json::from_str(&data["mcp-config.json"]).expect("json");
    assert_eq!(
        mcp["mcpServers"]["orchestrator"]["url"],
        "http://127.0.0.1:8080/mcp"
    );
    assert_eq!(
        mcp["mcpServers"].as_object().map(|o| o.len()),
        Some(1),
        "the proxy is the only server"
    );
}

#[test]
fn the_sidecar_port_reaches_the_proxy_the_agent_and_the_probes() {
    let settings = RenderSettings {
        sidecar_port: 18123,
        ..settings()
    };
    let plan = render(&task_1001(), &catalog(), &settings).expect("renders");
    let data = plan.config_map(1).data.expect("data");
    let proxy: ProxyConfig = serde_saphyr::from_str(&data["proxy.yaml"]).expect("proxy.yaml");
    assert_eq!(proxy.listen, "127.0.0.1:18123");
    assert!(data["mcp-config.json"].contains("\"http://127.0.0.1:18123/mcp\""));
    let proxy_container = proxy_container(&plan);
    for probe in [
        &proxy_container.startup_probe,
        &proxy_container.readiness_probe,
    ] {
        let command = probe
            .as_ref()
            .and_then(|p| p.exec.as_ref())
            .and_then(|e| e.command.clone())
            .expect("exec probe");
        assert_eq!(
            command.last().map(String::as_str),
            Some("http://127.0.0.1:18123/readyz")
        );
    }
    let job = plan.job();
    let agent = &job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod")
        .containers[0];
    let url = agent
        .env
        .as_ref()
        .and_then(|env| env.iter().find(|e| e.name == "ORCHESTRATOR_MCP_URL"))
        .and_then(|e| e.value.clone());
    assert_eq!(url.as_deref(), Some("http://127.0.0.1:18123/mcp"));
}

#[test]
fn pod_placement_reaches_the_pod_and_proxy_resources_replace_the_default() {
    let tr = sample(
        r#"
apiVersion: orchestrator.io/v1
kind: TaskRun
metadata: {name: placed}
spec:
  taskId: 7
  serviceName: svc
  task: {prompt: "do it"}
  serviceAccountName: task-runner
  podTemplate:
    nodeSelector: {e2e.orchestrator.io/node: real}
    tolerations:
      - {key: e2e.orchestrator.io/node, operator: Equal, value: real, effect: NoSchedule}
    imagePullSecrets: [{name: registry-creds}]
    priorityClassName: agents
    runtimeClassName: gvisor
  proxy:
    resources:
      requests: {cpu: 50m, memory: 64Mi}
      limits: {memory: 256Mi}
  agent:
    resources:
      limits: {memory: 2Gi}
  toolConfig:
    mcpServers: [{name: time}]
"#,
    );
    let rendered = plan(&tr);
    let job = rendered.job();
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("task-runner"));
    // The pod's identity is set; its token still reaches neither container.
    assert_eq!(pod.automount_service_account_token, Some(false));
    let selector = pod.node_selector.as_ref().expect("node selector");
    assert_eq!(selector["e2e.orchestrator.io/node"], "real");
    let tolerations = pod.tolerations.as_ref().expect("tolerations");
    assert_eq!(tolerations.len(), 1);
    assert_eq!(
        tolerations[0].key.as_deref(),
        Some("e2e.orchestrator.io/node")
    );
    assert_eq!(tolerations[0].effect.as_deref(), Some("NoSchedule"));
    let pull = pod.image_pull_secrets.as_ref().expect("image pull secrets");
    assert_eq!(pull[0].name, "registry-creds");
    assert_eq!(pod.priority_class_name.as_deref(), Some("agents"));
    assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));

    let proxy = proxy_container(&plan(&tr));
    let resources = proxy.resources.expect("proxy resources");
    let requests = resources.requests.expect("requests");
    assert_eq!(requests["cpu"].0, "50m");
    assert_eq!(requests["memory"].0, "64Mi");
    assert_eq!(resources.limits.expect("limits")["memory"].0, "256Mi");
    let agent = &pod.containers[0];
    assert_eq!(
        agent
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .expect("agent limits")["memory"]
            .0,
        "2Gi"
    );
}

#[test]
fn without_placement_the_pod_has_no_selector_and_the_proxy_default_resources() {
    let rendered = plan(&task_1001());
    let job = rendered.job();
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert!(pod.node_selector.is_none() && pod.tolerations.is_none());
    assert!(pod.image_pull_secrets.is_none());
    // The task's own identity, without a token in either container.
    assert_eq!(pod.service_account_name.as_deref(), Some("task-1001"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let resources = proxy_container(&plan(&task_1001()))
        .resources
        .expect("resources");
    assert_eq!(resources.limits.expect("limits")["memory"].0, "256Mi");
}

#[test]
fn the_pod_runs_as_an_identity_that_reads_only_its_own_config_map() {
    let rendered = plan(&task_1001());
    let id = rendered.identity();
    let sa = id
        .service_account
        .as_ref()
        .expect("a ServiceAccount per task");
    assert_eq!(sa.metadata.name.as_deref(), Some("task-1001"));
    assert_eq!(sa.automount_service_account_token, Some(false));
    let rules = id.role.rules.as_ref().expect("rules");
    assert_eq!(rules[0].api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["configmaps".to_string()][..])
    );
    assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&[rendered.config_map_name()][..])
    );
    // Its own Lease, to report what the proxy serves: read and patch only.
    assert_eq!(
        rules[1].api_groups.as_deref(),
        Some(&["coordination.k8s.io".to_string()][..])
    );
    assert_eq!(rules[1].verbs, ["get", "patch"]);
    // Events on its TaskRun, created only.
    assert_eq!(
        rules[2].api_groups.as_deref(),
        Some(&["events.k8s.io".to_string()][..])
    );
    assert_eq!(rules[2].verbs, ["create"]);
    assert_eq!(rules.len(), 3);
    assert_eq!(
        rules[1].resource_names.as_deref(),
        Some(&["task-1001".to_string()][..])
    );
    let lease = id.lease.as_ref().expect("the task's Lease");
    assert_eq!(lease.metadata.name.as_deref(), Some("task-1001"));
    let subjects = id
        .role_binding
        .as_ref()
        .expect("binding")
        .subjects
        .as_ref()
        .expect("subjects");
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("ServiceAccount", "task-1001")
    );
    assert_eq!(
        id.role_binding.as_ref().expect("binding").role_ref.name,
        "task-1001"
    );
    for meta in [
        &sa.metadata,
        &id.role.metadata,
        &id.role_binding.as_ref().expect("binding").metadata,
        &lease.metadata,
    ] {
        let owner = &meta.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("TaskRun", Some(true))
        );
        assert_eq!(meta.namespace.as_deref(), Some("team-a"));
    }
}

#[test]
fn a_taskrun_naming_a_service_account_gets_the_role_bound_to_it_and_none_created() {
    let mut tr = task_1001();
    tr.spec.service_account_name = Some("task-runner".into());
    let rendered = plan(&tr);
    let id = rendered.identity();
    assert!(id.service_account.is_none());
    let subjects = id
        .role_binding
        .as_ref()
        .expect("binding")
        .subjects
        .as_ref()
        .expect("subjects");
    assert_eq!(subjects[0].name, "task-runner");
    let pod = rendered
        .job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("task-runner"));
}

#[test]
fn only_the_proxy_container_gets_the_task_identitys_token() {
    let rendered = plan(&task_1001());
    let pod = rendered
        .job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
        .clone();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let token_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let mounts = |c: &Container| {
        c.volume_mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.mount_path == token_dir)
            .collect::<Vec<_>>()
    };
    let proxy = proxy_container(&rendered);
    let agent = &pod.containers[0];
    assert_eq!(mounts(&proxy).len(), 1);
    assert!(mounts(agent).is_empty(), "the agent gets no token");
    for zone in pod.init_containers.iter().flatten().skip(1) {
        assert!(mounts(zone).is_empty(), "{} gets no token", zone.name);
    }
    let volume = pod
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .find(|v| v.name == mounts(&proxy)[0].name)
        .expect("the token volume")
        .clone();
    let sources = volume
        .projected
        .expect("projected")
        .sources
        .expect("sources");
    assert!(sources.iter().any(|s| s.service_account_token.is_some()));
    let env = |c: &Container, name: &str| -> Option<EnvVar> {
        c.env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.name == name)
    };
    let value = |c: &Container, name: &str| env(c, name).and_then(|e| e.value);
    assert_eq!(
        value(&proxy, "MCP_PROXY_WATCH_CONFIG_MAP").as_deref(),
        Some("task-1001-tools")
    );
    assert_eq!(
        value(&proxy, "MCP_PROXY_SERVED_LEASE").as_deref(),
        Some("task-1001")
    );
    assert!(env(&proxy, "MCP_PROXY_POD_NAME").is_some_and(|e| e.value_from.is_some()));
    assert_eq!(
        value(&proxy, "MCP_PROXY_TASK_UID").as_deref(),
        Some("0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c1001")
    );
    assert!(env(&proxy, "KUBERNETES_SERVICE_HOST").is_none());
    assert!(env(agent, "MCP_PROXY_WATCH_CONFIG_MAP").is_none());

    // With the API watch off: no token, no Lease, no Lease rule; the file only.
    let off = RenderSettings {
        sidecar_api_watch: false,
        ..settings()
    };
    let off = render(&task_1001(), &catalog(), &off).expect("renders");
    let proxy = proxy_container(&off);
    assert!(mounts(&proxy).is_empty());
    assert!(env(&proxy, "MCP_PROXY_WATCH_CONFIG_MAP").is_none());
    assert!(off.identity().lease.is_none());
    assert_eq!(off.identity().role.rules.as_ref().map(Vec::len), Some(1));

    // Where pods cannot use the kubernetes Service: the API server's address for the proxy.
    let there = RenderSettings {
        sidecar_kubernetes_service: Some("127.0.0.1:6443".into()),
        sidecar_metrics_port: None,
        shared_proxy: None,
        default_model: None,
        decision_point: None,
        ..settings()
    };
    let there = render(&task_1001(), &catalog(), &there).expect("renders");
    let proxy = proxy_container(&there);
    assert_eq!(
        value(&proxy, "KUBERNETES_SERVICE_HOST").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        value(&proxy, "KUBERNETES_SERVICE_PORT").as_deref(),
        Some("6443")
    );
}

#[test]
fn a_config_map_over_one_mib_of_values_is_too_large_counted_as_the_api_server_counts() {
    let sizes = |data: &BTreeMap<String, String>| -> Vec<(String, usize)> {
        data.iter().map(|(k, v)| (k.clone(), v.len())).collect()
    };
    let check = |data: &BTreeMap<String, String>| {
        let sizes = sizes(data);
        files::too_large(
            "team-a",
            "t-tools",
            sizes.iter().map(|(k, n)| (k.as_str(), *n)),
        )
    };
    // The task text sized so the values add up to exactly 1 MiB at version 9: accepted; at
    // version 10 (one more digit in proxy.yaml) one byte too many. Bytes, not characters.
    let mut tr = task_1001();
    tr.spec.task.prompt = Some(String::new());
    let rest: usize = plan(&tr)
        .config_map(9)
        .data
        .iter()
        .flatten()
        .map(|(_, v)| v.len())
        .sum();
    let left = files::MAX_CONFIG_MAP_BYTES - rest;
    tr.spec.task.prompt = Some(format!("é{}", "x".repeat(left - 2)));
    let plan = plan(&tr);
    let data = |v| plan.config_map(v).data.unwrap_or_default();
    assert_eq!(check(&data(9)), None);
    let problem = check(&data(10)).expect("one byte over");
    assert_eq!(problem.reason, files::CONFIG_TOO_LARGE);
    assert!(
        problem.message.starts_with(&format!(
            "ConfigMap team-a/t-tools would hold {} bytes of data, over the API server's limit of 1048576 bytes (1 MiB): task.md: {left} bytes (spec.task.prompt), proxy.yaml: ",
            files::MAX_CONFIG_MAP_BYTES + 1
        )) && problem.message.ends_with("in a new TaskRun)"),
        "{}",
        problem.message
    );
    // Whatever is largest is named first, with its fix.
    let big = check(&BTreeMap::from([
        (
            "proxy.yaml".to_string(),
            "x".repeat(files::MAX_CONFIG_MAP_BYTES),
        ),
        ("task.md".to_string(), "x".into()),
    ]))
    .expect("too large");
    assert!(
        big.message
            .contains("proxy.yaml: 1048576 bytes (spec.toolConfig.mcpServers")
            && big.message.ends_with("list fewer servers or patterns"),
        "{}",
        big.message
    );
}

#[test]
fn every_secret_key_of_the_task_is_mounted_for_masking_in_the_proxy_only() {
    // task-1002: the github server (stdio, its token in its own container's env) and the agent's
    // API key; the github server disabled makes its key optional, an optional agent key stays so.
    let mut tr = task_1002();
    tr.spec.tool_config.mcp_servers[0].enabled = false;
    let agent = tr.spec.agent.get_or_insert_default();
    agent.env.push(EnvVar {
        name: "DEPLOY_PASSPHRASE".into(),
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            secret_key_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
                name: "deploy".into(),
                key: "passphrase".into(),
                optional: Some(true),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let rendered = plan(&tr);
    let pod = pod(&rendered);
    let mask_dir = "/etc/orchestrator/mask";
    let mounted = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == mask_dir)
            .map(|m| (m.name.clone(), m.read_only))
    };
    let proxy = proxy_container(&rendered);
    let (volume_name, read_only) = mounted(&proxy).expect("the proxy mounts the mask volume");
    assert_eq!(read_only, Some(true));
    assert!(
        proxy
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "MCP_PROXY_MASK_SECRETS_DIR" && e.value.as_deref() == Some(mask_dir))
    );
    // No other container: not the agent, not a server's zone.
    for c in pod
        .init_containers
        .iter()
        .flatten()
        .skip(1)
        .chain(&pod.containers)
    {
        assert!(mounted(c).is_none(), "{} mounts the mask volume", c.name);
        assert!(
            !c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == volume_name),
            "{}",
            c.name
        );
    }
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume_name)
        .expect("the mask volume")
        .clone();
    let projected = volume.projected.expect("projected");
    assert_eq!(projected.default_mode, Some(0o444));
    type Source = (String, Vec<(String, String)>, Option<bool>);
    let sources: Vec<Source> = projected
        .sources
        .into_iter()
        .flatten()
        .map(|s| {
            let s = s.secret.expect("only Secrets");
            let items = s
                .items
                .into_iter()
                .flatten()
                .map(|i| (i.key, i.path))
                .collect();
            (s.name, items, s.optional)
        })
        .collect();
    assert_eq!(
        sources,
        [
            (
                "anthropic".to_string(),
                vec![("api-key".to_string(), "anthropic/api-key".to_string())],
                None
            ),
            (
                "deploy".to_string(),
                vec![("passphrase".to_string(), "deploy/passphrase".to_string())],
                Some(true)
            ),
            (
                "github".to_string(),
                vec![("token".to_string(), "github/token".to_string())],
                Some(true)
            ),
        ]
    );

    // A task whose pod gets no Secret: no mask volume, no flag.
    let mut bare = task_1001();
    bare.spec.agent = None;
    let rendered = plan(&bare);
    let proxy = proxy_container(&rendered);
    assert!(mounted(&proxy).is_none());
    assert!(
        !env_names(&proxy)
            .iter()
            .any(|n| n == "MCP_PROXY_MASK_SECRETS_DIR")
    );
}

#[test]
fn a_secret_key_required_by_one_container_and_optional_for_another_is_required() {
    let binding = |optional: bool| SecretBinding {
        env: "T".into(),
        secret: "s".into(),
        key: "k".into(),
        optional,
        servers: vec!["x".into()],
    };
    let agent = |optional: Option<bool>| EnvVar {
        name: "A".into(),
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            secret_key_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
                name: "s".into(),
                key: "k".into(),
                optional,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let keys = resolve::mask_keys(&[binding(true)], &[agent(None)]);
    assert_eq!(
        keys,
        [resolve::MaskKey {
            secret: "s".into(),
            key: "k".into(),
            optional: false
        }]
    );
    assert!(resolve::mask_keys(&[binding(true)], &[agent(Some(true))])[0].optional);
}

#[test]
fn the_lease_carries_the_admission_policys_label() {
    let rendered = plan(&task_1001());
    let lease = rendered.identity().lease.clone().expect("a Lease");
    assert_eq!(
        lease
            .metadata
            .labels
            .unwrap_or_default()
            .get(orchestrator_crds::approval::LEASE_LABEL)
            .map(String::as_str),
        Some("true")
    );
    // Only the Lease: the label puts an object under the policy.
    assert!(
        rendered
            .identity()
            .role
            .metadata
            .labels
            .iter()
            .flatten()
            .all(|(k, _)| k != orchestrator_crds::approval::LEASE_LABEL)
    );
}

#[test]
fn the_proxy_serves_metrics_on_the_pod_ip_only_when_a_port_is_set_and_names_its_pod() {
    let field = |c: &Container, name: &str| -> Option<String> {
        c.env
            .as_ref()?
            .iter()
            .find(|e| e.name == name)?
            .value_from
            .as_ref()?
            .field_ref
            .as_ref()
            .map(|f| f.field_path.clone())
    };
    let value = |c: &Container, name: &str| -> Option<String> {
        c.env
            .as_ref()?
            .iter()
            .find(|e| e.name == name)?
            .value
            .clone()
    };
    let with = RenderSettings {
        sidecar_metrics_port: Some(9464),
        ..settings()
    };
    let proxy = proxy_container(&render(&task_1001(), &catalog(), &with).expect("renders"));
    assert_eq!(field(&proxy, "POD_IP").as_deref(), Some("status.podIP"));
    let args = proxy.args.clone().unwrap_or_default();
    assert!(
        args.contains(&"--metrics-listen=$(POD_IP):9464".to_string()),
        "{args:?}"
    );
    let ports = proxy.ports.clone().unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].container_port),
        (Some(job::METRICS_PORT_NAME), 9464)
    );

    // Without: no second listener, no port, the pod IP not even known.
    let proxy = proxy_container(&plan(&task_1001()));
    assert_eq!(field(&proxy, "POD_IP"), None);
    assert!(proxy.ports.is_none());
    assert!(
        !proxy
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|a| a.contains("metrics"))
    );

    // Always: the telemetry resource names the pod, its Job and the task.
    for (var, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_UID", "metadata.uid"),
    ] {
        assert_eq!(field(&proxy, var).as_deref(), Some(path));
    }
    assert_eq!(
        value(&proxy, "OTEL_SERVICE_NAME").as_deref(),
        Some("orchestrator-mcp-proxy")
    );
    assert_eq!(
        value(&proxy, "OTEL_RESOURCE_ATTRIBUTES").as_deref(),
        Some(
            "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME),k8s.pod.uid=$(POD_UID),\
             k8s.job.name=task-1001,orchestrator.taskrun.name=task-1001,orchestrator.task.id=1001"
        )
    );
    // Defined before the variable that refers to them (the kubelet expands only those).
    let names: Vec<String> = proxy
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    let at = |n: &str| names.iter().position(|x| x == n);
    assert!(at("POD_UID") < at("OTEL_RESOURCE_ATTRIBUTES"));
}

/// The proxy and every zone log in the operator's format: JSON when it logs JSON (the chart's
/// `logJson`, on by default), text otherwise.
#[test]
fn the_proxy_and_its_zones_log_in_the_operators_format() {
    for (json, want) in [(true, "--log-format=json"), (false, "--log-format=text")] {
        let settings = RenderSettings {
            sidecar_log_json: json,
            ..settings()
        };
        let plan = render(&task_1001(), &catalog(), &settings)
            .unwrap_or_else(|p| panic!("renders: {p:?}"));
        let pod = pod(&plan);
        let containers = pod.init_containers.clone().unwrap_or_default();
        let proxy = containers
            .iter()
            .find(|c| c.name == "mcp-proxy")
            .expect("proxy");
        assert_eq!(
            proxy
                .args
                .as_deref()
                .and_then(|a| a.first())
                .map(String::as_str),
            Some(want)
        );
        let zones: Vec<_> = containers
            .iter()
            .filter(|c| c.name.starts_with("zone-"))
            .collect();
        assert!(!zones.is_empty());
        for zone in zones {
            assert_eq!(
                zone.command.as_ref().map(|c| c[1].as_str()),
                Some(want),
                "{}",
                zone.name
            );
        }
    }
}

/// The chart's `otlp.auditEndpoint`: the proxy also exports its audit over OTLP, to that
/// endpoint only (not the traces'); without it, neither the flag nor the endpoint.
#[test]
fn the_audit_goes_over_otlp_only_where_the_install_says() {
    for endpoint in [Some("http://collector.obs:4318"), None] {
        let settings = RenderSettings {
            sidecar_audit_otlp_endpoint: endpoint.map(str::to_string),
            ..settings()
        };
        let plan = render(&task_1001(), &catalog(), &settings)
            .unwrap_or_else(|p| panic!("renders: {p:?}"));
        let proxy = proxy_container(&plan);
        let args = proxy.args.clone().unwrap_or_default();
        assert_eq!(
            args.contains(&"--audit-otlp".to_string()),
            endpoint.is_some(),
            "{args:?}"
        );
        let logs = proxy
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
            .and_then(|e| e.value.as_deref());
        assert_eq!(logs, endpoint);
    }
}
