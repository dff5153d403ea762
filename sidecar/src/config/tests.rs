use orchestrator_crds::proxy::{
    HttpSpec, OnChange, PolicySpec, ProxyConfig, RateLimit, RateLimits, Risk, ServerSpec,
    StdioSpec, TaskRef, ToolFilter as WireFilter, ToolMode, ToolPrefix,
};

use super::*;

const ISSUE_EXAMPLE: &str = r#"
contextVersion: 3
task: {name: task-1001, namespace: default}
listen: 127.0.0.1:8080
servers:
  - name: github
    enabled: true
    stdio:
      command: npx
      args: ["-y", "@modelcontextprotocol/server-github"]
      passEnv: [GITHUB_PERSONAL_ACCESS_TOKEN]
    tools:
      allow: ["create_issue", "list_*"]
      deny: ["delete_*"]
  - name: docs
    enabled: false
    http: {url: "http://127.0.0.1:9000/mcp", headersFromEnv: {Authorization: DOCS_TOKEN}}
"#;

fn load(text: &str) -> Loaded {
    load_bytes(text.as_bytes())
}

fn codes(text: &str) -> Vec<&'static str> {
    load(text).problems.codes()
}

fn paths(loaded: &Loaded) -> Vec<&str> {
    loaded.problems.0.iter().map(|p| p.path.as_str()).collect()
}

#[test]
fn the_issue_example_loads() {
    let loaded = load(ISSUE_EXAMPLE);
    assert!(loaded.problems.0.is_empty(), "{}", loaded.problems);
    let config = loaded.config.expect("config");
    assert_eq!(config.context_version, 3);
    assert_eq!(config.task_name, "task-1001");
    assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.servers.len(), 2);
    let github = config.server("github").expect("github");
    assert!(github.is_startable());
    assert!(github.filter.verdict("list_issues").is_allowed());
    assert!(!github.filter.verdict("delete_repo").is_allowed());
    let docs = config.server("docs").expect("docs");
    assert!(!docs.is_startable(), "a disabled server is never started");
    assert!(
        matches!(&docs.transport, Transport::Http(h) if h.headers_from_env["Authorization"] == "DOCS_TOKEN")
    );
}

#[test]
fn json_is_accepted_too() {
    let json = r#"{"task": {"name": "t"}, "servers": [{"name": "a", "stdio": {"command": "x"}}]}"#;
    let loaded = load(json);
    assert!(loaded.config.is_some(), "{}", loaded.problems);
    let config = loaded.config.expect("config");
    assert_eq!(
        config.listen.to_string(),
        orchestrator_crds::proxy::DEFAULT_LISTEN
    );
    assert_eq!(config.call_timeout, DEFAULT_CALL_TIMEOUT);
}

#[test]
fn every_unknown_key_is_reported_at_once_with_its_path_and_a_suggestion() {
    let text = r#"
task: {name: t}
lisen: 127.0.0.1:1
servers:
  - name: a
    stdio: {comand: x}
    tools: {allow: ["*"], denny: []}
"#;
    let loaded = load(text);
    assert!(loaded.config.is_none());
    let unknown: Vec<&Problem> = loaded
        .problems
        .0
        .iter()
        .filter(|p| p.code == Code::UnknownKey)
        .collect();
    let unknown_paths: Vec<&str> = unknown.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        unknown_paths,
        vec!["lisen", "servers[0].stdio.comand", "servers[0].tools.denny"]
    );
    assert!(
        unknown[0].message.contains("did you mean `listen`"),
        "{}",
        unknown[0].message
    );
    assert!(
        unknown[1].message.contains("did you mean `command`"),
        "{}",
        unknown[1].message
    );
    assert!(
        unknown[1].message.contains("(server \"a\")"),
        "{}",
        unknown[1].message
    );
    // The missing required field behind the typo is reported in the same pass.
    assert!(
        loaded
            .problems
            .0
            .iter()
            .any(|p| p.code == Code::MissingField && p.path == "servers[0].stdio.command")
    );
}

#[test]
fn wrong_types_and_bad_enum_values_are_reported_with_paths() {
    let text = r#"
task: {name: t}
contextVersion: "3"
toolPrefix: tool
servers:
  - name: a
    enabled: "yes please"
    stdio: {command: x, args: "-y"}
"#;
    let loaded = load(text);
    let got: Vec<(&str, &str)> = loaded
        .problems
        .0
        .iter()
        .map(|p| (p.code.as_str(), p.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("PROXY.BAD_TYPE", "contextVersion"),
            ("PROXY.BAD_TYPE", "servers[0].enabled"),
            ("PROXY.BAD_TYPE", "servers[0].stdio.args"),
            ("PROXY.BAD_VALUE", "toolPrefix"),
        ]
    );
    assert!(
        loaded.problems.0[3]
            .message
            .contains("\"server\", \"none\""),
        "{}",
        loaded.problems.0[1].message
    );
}

#[test]
fn a_negative_context_version_is_refused() {
    assert_eq!(
        codes("task: {name: t}\ncontextVersion: -1\nservers: [{name: a, stdio: {command: x}}]"),
        vec!["PROXY.BAD_VALUE"]
    );
}

#[test]
fn missing_task_is_reported() {
    let loaded = load("servers: [{name: a, stdio: {command: x}}]");
    assert_eq!(loaded.problems.codes(), vec!["PROXY.MISSING_FIELD"]);
    assert_eq!(paths(&loaded), vec!["task"]);
}

#[test]
fn duplicate_server_names_are_refused() {
    let text = r#"
task: {name: t}
servers:
  - {name: a, stdio: {command: x}}
  - {name: b, stdio: {command: y}}
  - {name: a, stdio: {command: z}}
"#;
    let loaded = load(text);
    assert_eq!(loaded.problems.codes(), vec!["PROXY.DUPLICATE_SERVER"]);
    assert_eq!(paths(&loaded), vec!["servers[2].name"]);
    assert!(loaded.problems.0[0].message.contains("servers[0]"));
}

#[test]
fn server_names_that_break_prefixing_are_refused() {
    let text = r#"
task: {name: t}
servers:
  - {name: "a__b", stdio: {command: x}}
  - {name: "has space", stdio: {command: x}}
  - {name: "", stdio: {command: x}}
  - {name: ok, stdio: {command: x}}
"#;
    let loaded = load(text);
    assert_eq!(loaded.problems.codes(), vec!["PROXY.BAD_NAME"; 3]);
    assert_eq!(
        paths(&loaded),
        vec!["servers[0].name", "servers[1].name", "servers[2].name"]
    );
}

#[test]
fn bad_patterns_are_all_reported() {
    let text = r#"
task: {name: t}
servers:
  - name: a
    stdio: {command: x}
    tools: {allow: ["ok_*", "broken[", ""], deny: ["{x"]}
"#;
    let loaded = load(text);
    assert_eq!(loaded.problems.codes(), vec!["PROXY.BAD_PATTERN"; 3]);
    assert_eq!(
        paths(&loaded),
        vec![
            "servers[0].tools.allow[1]",
            "servers[0].tools.allow[2]",
            "servers[0].tools.deny[0]"
        ]
    );
}

#[test]
fn nothing_enabled_loads_with_a_warning_and_offers_no_tool() {
    let text = r#"
task: {name: t}
servers:
  - {name: a, enabled: false, stdio: {command: x}}
  - {name: b, stdio: {command: x}, tools: {deny: ["**"]}}
"#;
    assert_eq!(codes(text), vec!["PROXY.NOTHING_ENABLED"]);
    assert_eq!(codes("task: {name: t}"), vec!["PROXY.NOTHING_ENABLED"]);
    // Revoking every tool is a config the proxy serves (an empty tool set), not one it refuses
    // while the older, broader set stays on offer.
    let loaded = load(text);
    assert!(!loaded.problems.has_errors(), "{}", loaded.problems);
    let config = loaded.config.expect("a config with nothing enabled loads");
    assert!(!config.servers.iter().any(|s| s.is_startable()));
}

#[test]
fn nothing_enabled_is_reported_alongside_other_problems() {
    let text = r#"
task: {name: t}
servers:
  - {name: a, enabled: false, stdio: {command: ""}}
"#;
    assert_eq!(
        codes(text),
        vec!["PROXY.EMPTY_COMMAND", "PROXY.NOTHING_ENABLED"]
    );
}

#[test]
fn transports_must_be_exactly_one() {
    let text = r#"
task: {name: t}
servers:
  - {name: a}
  - {name: b, stdio: {command: x}, http: {url: "http://127.0.0.1:1/mcp"}}
  - {name: c, http: {url: "ftp://x/"}}
  - {name: d, stdio: {command: x}}
"#;
    let loaded = load(text);
    assert_eq!(
        loaded.problems.codes(),
        vec![
            "PROXY.NO_TRANSPORT",
            "PROXY.TWO_TRANSPORTS",
            "PROXY.BAD_URL"
        ]
    );
    assert_eq!(
        paths(&loaded),
        vec!["servers[0]", "servers[1]", "servers[2].http.url"]
    );
}

#[test]
fn unprefixed_servers_that_may_collide_are_refused_at_load() {
    let globby = r#"
task: {name: t}
toolPrefix: none
servers:
  - {name: a, stdio: {command: x}}
  - {name: b, stdio: {command: y}}
"#;
    assert_eq!(codes(globby), vec!["PROXY.NAME_COLLISION"]);

    let overlapping = r#"
task: {name: t}
toolPrefix: none
servers:
  - {name: a, stdio: {command: x}, tools: {allow: [read, write]}}
  - {name: b, stdio: {command: y}, tools: {allow: [write, list]}}
"#;
    let loaded = load(overlapping);
    assert_eq!(loaded.problems.codes(), vec!["PROXY.NAME_COLLISION"]);
    assert!(loaded.problems.0[0].message.contains("write"));

    let disjoint = r#"
task: {name: t}
toolPrefix: none
servers:
  - {name: a, stdio: {command: x}, tools: {allow: [read]}}
  - {name: b, stdio: {command: y}, tools: {allow: [write]}}
  - {name: c, enabled: false, stdio: {command: y}}
"#;
    assert!(codes(disjoint).is_empty());

    let single = "task: {name: t}\ntoolPrefix: none\nservers: [{name: a, stdio: {command: x}}]";
    assert!(
        codes(single).is_empty(),
        "no prefix for a single server is fine"
    );
}

#[test]
fn env_problems_are_reported() {
    let text = r#"
task: {name: t}
servers:
  - name: a
    stdio:
      command: x
      env: {"1BAD": v, GITHUB_TOKEN: ghp_literal, OK: v}
      passEnv: [OK, "A=B"]
"#;
    let loaded = load(text);
    let got: Vec<(&str, &str)> = loaded
        .problems
        .0
        .iter()
        .map(|p| (p.code.as_str(), p.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("PROXY.BAD_ENV_NAME", "servers[0].stdio.env.1BAD"),
            ("PROXY.DUPLICATE_ENV", "servers[0].stdio.passEnv[0]"),
            ("PROXY.BAD_ENV_NAME", "servers[0].stdio.passEnv[1]"),
            ("PROXY.LITERAL_SECRET", "servers[0].stdio.env.GITHUB_TOKEN"),
        ]
    );
}

#[test]
fn warnings_alone_do_not_block_loading() {
    let text = r#"
task: {name: t}
listen: 0.0.0.0:8080
servers: [{name: a, stdio: {command: x, env: {API_TOKEN: abc}}}]
"#;
    let loaded = load(text);
    assert!(loaded.config.is_some());
    assert_eq!(
        loaded.problems.codes(),
        vec!["PROXY.LITERAL_SECRET", "PROXY.WIDE_LISTEN"]
    );
    assert!(!loaded.problems.has_errors());
}

#[test]
fn top_level_values_are_checked() {
    let text = r#"
task: {name: ""}
listen: localhost
allowedHosts: ["10.0.0.7", "http://x/", "pod.local:8080"]
callTimeoutSeconds: 0
audit: {path: ""}
servers: [{name: a, stdio: {command: x}}]
"#;
    let loaded = load(text);
    let got: Vec<(&str, &str)> = loaded
        .problems
        .0
        .iter()
        .map(|p| (p.code.as_str(), p.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("PROXY.BAD_LISTEN", "listen"),
            ("PROXY.BAD_HOST", "allowedHosts[1]"),
            ("PROXY.BAD_TIMEOUT", "callTimeoutSeconds"),
            ("PROXY.BAD_PATH", "audit.path"),
            ("PROXY.BAD_VALUE", "task.name"),
        ]
    );
}

#[test]
fn syntax_errors_are_parse_problems() {
    assert_eq!(codes("task: {name: t\nservers: ["), vec!["PROXY.PARSE"]);
    assert_eq!(codes(""), vec!["PROXY.PARSE"]);
    assert_eq!(
        codes("task: {name: t}\ntask: {name: u}"),
        vec!["PROXY.PARSE"],
        "duplicate keys"
    );
}

#[test]
fn spec_hash_tracks_the_transport_not_the_filter() {
    let base = r#"
task: {name: t}
servers: [{name: a, stdio: {command: x, args: [one]}, tools: {allow: [p]}}]
"#;
    let filter_changed = base.replace("allow: [p]", "allow: [q]");
    let args_changed = base.replace("[one]", "[two]");
    let hash = |t: &str| load(t).config.expect("config").servers[0].spec_hash.clone();
    assert_eq!(hash(base), hash(&filter_changed));
    assert_ne!(hash(base), hash(&args_changed));
}

/// The operator renders `ProxyConfig` with serde; what it writes must load here unchanged.
#[test]
fn what_the_operator_renders_round_trips() {
    let wire = ProxyConfig {
        context_version: 7,
        task: TaskRef {
            name: "task-9".into(),
            namespace: "ns".into(),
            uid: Some("0d1c1d2e-0000-4000-8000-000000000009".into()),
            created_by: Some("alice".into()),
            labels: [("team".to_string(), "a".to_string())].into(),
        },
        listen: "127.0.0.1:18080".into(),
        tool_prefix: ToolPrefix::Server,
        allowed_hosts: vec!["10.1.2.3".into()],
        call_timeout_seconds: Some(30),
        audit: Default::default(),
        policy: PolicySpec {
            tool_mode: ToolMode::Intent,
            max_risk: Some(Risk::Write),
            validate_arguments: false,
            on_change: OnChange::Alert,
            require_approval: None,
            conditions: vec![orchestrator_crds::proxy::CallCondition {
                name: "under-src".into(),
                tools: vec!["fs/write_*".into()],
                when: "!args.path.startsWith('/workspace/src/')".into(),
                effect: orchestrator_crds::proxy::ConditionEffect::Deny,
                message: Some("writes go under src".into()),
            }],
            decision_points: vec![orchestrator_crds::proxy::DecisionPoint {
                url: "http://opa.policy.svc:8181/v1/data/orchestrator/decision".into(),
                timeout_milliseconds: Some(250),
                cache: Some(orchestrator_crds::proxy::DecisionCache {
                    entries: 100,
                    ttl_seconds: None,
                }),
            }],
        },
        servers: vec![
            ServerSpec {
                name: "fs".into(),
                enabled: true,
                stdio: Some(StdioSpec {
                    command: "mcp-server-filesystem".into(),
                    args: vec!["/work".into()],
                    pass_env: vec!["TOKEN".into()],
                    ..Default::default()
                }),
                http: None,
                tools: WireFilter {
                    allow: vec!["read_*".into()],
                    deny: vec!["write_*".into()],
                },
                risk: [("move_file".to_string(), Risk::Destructive)].into(),
                rate_limit: RateLimits {
                    per_minute: Some(60),
                    burst: None,
                    tools: [(
                        "write_file".to_string(),
                        RateLimit {
                            per_minute: 6,
                            burst: Some(2),
                        },
                    )]
                    .into(),
                },
                pins: [(
                    "read_file".to_string(),
                    format!("sha256:{}", "ab".repeat(32)),
                )]
                .into(),
                definitions: Vec::new(),
            },
            ServerSpec {
                name: "docs".into(),
                enabled: false,
                stdio: None,
                http: Some(HttpSpec {
                    url: "http://127.0.0.1:9000/mcp".into(),
                    ..Default::default()
                }),
                tools: Default::default(),
                risk: Default::default(),
                rate_limit: Default::default(),
                pins: Default::default(),
                definitions: Vec::new(),
            },
        ],
        gateway: Some(orchestrator_crds::gateway::GatewaySpec {
            endpoint: "https://api.anthropic.com".into(),
            key_file: "/var/run/orchestrator/model/api-key".into(),
            models: vec!["claude-*".into()],
            budget: orchestrator_crds::gateway::Budget {
                output_tokens: Some(100_000),
                cost_usd: Some("2.50".into()),
                ..Default::default()
            },
            ..Default::default()
        }),
    };
    for text in [
        serde_saphyr::to_string(&wire).expect("yaml"),
        serde_json::to_string_pretty(&wire).expect("json"),
    ] {
        let loaded = load(&text);
        assert!(loaded.problems.0.is_empty(), "{text}\n{}", loaded.problems);
        let config = loaded.config.expect("config");
        assert_eq!(config.context_version, 7);
        assert_eq!(config.task_created_by.as_deref(), Some("alice"));
        assert_eq!(config.call_timeout, Duration::from_secs(30));
        assert_eq!(config.allowed_hosts, vec!["10.1.2.3".to_string()]);
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.max_risk, Some(Risk::Write));
        assert!(!config.validate_arguments);
        assert_eq!(config.on_change, OnChange::Alert);
        assert_eq!(config.tool_mode, ToolMode::Intent);
        assert_eq!(config.servers[0].rate_limit, wire.servers[0].rate_limit);
        assert_eq!(config.servers[0].pins, wire.servers[0].pins);
        assert_eq!(
            config.servers[0].risk.get("move_file"),
            Some(&Risk::Destructive)
        );
    }
}

#[test]
fn policy_defaults_to_validating_and_blocking_and_bad_limits_and_pins_are_named() {
    let config = load("task: {name: t}\nservers: [{name: a, stdio: {command: x}}]")
        .config
        .expect("config");
    assert!(config.validate_arguments);
    assert_eq!(config.on_change, OnChange::Block);
    assert_eq!(config.tool_mode, ToolMode::Direct);
    let text = r#"
task: {name: t}
servers:
  - name: a
    stdio: {command: x}
    rateLimit: {burst: 2, tools: {"": {perMinute: 1}}}
    pins: {r: "sha256:ABC", s: "0123"}
"#;
    let loaded = load(text);
    assert!(loaded.config.is_none());
    let got: Vec<(&str, &str)> = loaded
        .problems
        .0
        .iter()
        .map(|p| (p.code.as_str(), p.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("PROXY.BAD_VALUE", "servers[0].rateLimit.burst"),
            ("PROXY.BAD_VALUE", "servers[0].rateLimit.tools.\"\""),
            ("PROXY.BAD_VALUE", "servers[0].pins.\"r\""),
            ("PROXY.BAD_VALUE", "servers[0].pins.\"s\""),
        ]
    );
    assert!(
        loaded
            .problems
            .to_string()
            .contains("64 lowercase hex digits"),
        "{}",
        loaded.problems
    );
    let zeros = load(
        "task: {name: t}\nservers: [{name: a, stdio: {command: x}, rateLimit: {perMinute: 0, tools: {w: {perMinute: 1, burst: 0}}}}]",
    );
    let got: Vec<&str> = zeros.problems.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        got,
        vec![
            "servers[0].rateLimit.perMinute",
            "servers[0].rateLimit.tools.w.burst"
        ],
        "{}",
        zeros.problems
    );
}

#[test]
fn every_code_has_a_distinct_string() {
    let mut seen = std::collections::HashSet::new();
    for code in Code::ALL {
        assert!(code.as_str().starts_with("PROXY."));
        assert!(seen.insert(code.as_str()), "{code} twice");
    }
}

#[test]
fn structural_and_semantic_problems_are_reported_together() {
    let text = r#"
task: {name: t}
lisen: 127.0.0.1:8080
servers:
  - name: github
    stdio: {comand: npx}
  - name: github
    http: {url: "http://127.0.0.1:9000/mcp"}
    tools: {allow: ["list_*["]}
  - name: other
    stdio: {command: x}
    tools: {allow: [a], deny: [b], extra: 1}
"#;
    let loaded = load(text);
    assert!(loaded.config.is_none());
    let got: Vec<(&str, &str)> = loaded
        .problems
        .0
        .iter()
        .map(|p| (p.code.as_str(), p.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("PROXY.UNKNOWN_KEY", "lisen"),
            ("PROXY.UNKNOWN_KEY", "servers[0].stdio.comand"),
            ("PROXY.MISSING_FIELD", "servers[0].stdio.command"),
            ("PROXY.UNKNOWN_KEY", "servers[2].tools.extra"),
            ("PROXY.DUPLICATE_SERVER", "servers[1].name"),
            ("PROXY.BAD_PATTERN", "servers[1].tools.allow[0]"),
        ]
    );
}

#[test]
fn tool_mode_is_direct_or_intent() {
    let text =
        "task: {name: t}\npolicy: {toolMode: intent}\nservers: [{name: a, stdio: {command: x}}]";
    let config = load(text).config.expect("config");
    assert_eq!(config.tool_mode, ToolMode::Intent);
    assert_eq!(
        codes(&text.replace("intent", "intnet")),
        vec!["PROXY.BAD_VALUE"]
    );
}

const ZONED: &str = "task: {name: t}\nservers:\n  - name: git\n    stdio: {command: mcp-server-git, args: [--repository, /workspace], socket: /run/orchestrator/zones/git/mcp.sock, zoneUid: 65602}\n";

fn stdio_of(config: &Config) -> &StdioTransport {
    match &config.servers[0].transport {
        Transport::Stdio(stdio) => stdio,
        Transport::Http(_) => panic!("a stdio server"),
    }
}

#[test]
fn a_zoned_server_carries_its_socket_which_is_part_of_its_spec_hash() {
    let zoned = valid(ZONED);
    assert_eq!(
        stdio_of(&zoned).socket.as_deref(),
        Some(std::path::Path::new("/run/orchestrator/zones/git/mcp.sock"))
    );
    assert_eq!(stdio_of(&zoned).zone_uid, Some(65602));
    assert!(stdio_of(&zoned).env.is_empty() && stdio_of(&zoned).pass_env.is_empty());
    let elsewhere = valid(&ZONED.replace("zones/git/", "zones/git2/"));
    let local = valid(&ZONED.replace(
        ", socket: /run/orchestrator/zones/git/mcp.sock, zoneUid: 65602",
        "",
    ));
    assert_eq!(stdio_of(&local).socket, None);
    let other_uid = valid(&ZONED.replace("65602", "65603"));
    let hashes = [&zoned, &elsewhere, &local, &other_uid].map(|c| c.servers[0].spec_hash.clone());
    assert_ne!(hashes[0], hashes[1], "another socket is another server");
    assert_ne!(hashes[0], hashes[2], "a zoned server is not the local one");
    assert_ne!(hashes[0], hashes[3], "another zone's uid is another server");
    // A server without a socket keeps the hash it had before the field existed (its cached
    // tool lists stay valid).
    let before = serde_json::json!({"stdio": {
        "command": "mcp-server-git", "args": ["--repository", "/workspace"],
        "env": {}, "passEnv": [], "cwd": null,
    }});
    let digest = <sha2::Sha256 as sha2::Digest>::digest(before.to_string().as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    assert_eq!(hashes[2].0, hex);
}

/// The proxy starts a zoned server only in a zone of a known uid: `socket` without `zoneUid`
/// is refused, and so is `zoneUid` without `socket`, each naming the field.
#[test]
fn a_socket_needs_its_zones_uid_and_the_uid_its_socket() {
    let problems = |text: &str| -> Vec<(String, String, String)> {
        load(text)
            .problems
            .0
            .iter()
            .map(|p| {
                (
                    p.code.as_str().to_string(),
                    p.path.clone(),
                    p.message.clone(),
                )
            })
            .collect()
    };
    let no_uid = problems(&ZONED.replace(", zoneUid: 65602", ""));
    assert_eq!(
        no_uid,
        [(
            "PROXY.SOCKET_CONFLICT".to_string(),
            "servers[0].stdio.zoneUid".to_string(),
            "`socket` needs `zoneUid`, the uid the server's zone runs as: the proxy starts the \
             server only in a zone of that uid (its socket's owner, and the peer on it)"
                .to_string()
        )]
    );
    let no_socket = problems(&ZONED.replace("socket: /run/orchestrator/zones/git/mcp.sock, ", ""));
    assert_eq!(
        no_socket
            .iter()
            .map(|(c, p, _)| (c.as_str(), p.as_str()))
            .collect::<Vec<_>>(),
        [("PROXY.SOCKET_CONFLICT", "servers[0].stdio.zoneUid")]
    );
    assert!(
        no_socket[0].2.contains("`zoneUid` without `socket`"),
        "{no_socket:?}"
    );
}

#[test]
fn a_socket_with_the_containers_env_or_cwd_or_a_bad_path_is_refused_by_field() {
    let text = "task: {name: t}\nservers:\n  - name: git\n    stdio: {command: x, socket: run/git.sock, zoneUid: 65600, env: {LOG: info}, passEnv: [GIT_TOKEN], cwd: /workspace}\n";
    let loaded = load(text);
    assert!(loaded.config.is_none());
    let got: Vec<(&str, &str)> = loaded
        .problems
        .0
        .iter()
        .map(|p| (p.code.as_str(), p.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("PROXY.BAD_PATH", "servers[0].stdio.socket"),
            ("PROXY.SOCKET_CONFLICT", "servers[0].stdio.env"),
            ("PROXY.SOCKET_CONFLICT", "servers[0].stdio.passEnv"),
            ("PROXY.SOCKET_CONFLICT", "servers[0].stdio.cwd"),
        ],
        "{}",
        loaded.problems
    );
    assert!(
        loaded.problems.0[0]
            .message
            .contains("not an absolute path")
    );
    for conflict in &loaded.problems.0[1..] {
        assert!(
            conflict
                .message
                .contains("cannot be combined with `socket`")
                && conflict.message.contains("remove `socket`"),
            "{conflict}"
        );
    }
    let long = format!("/run/{}/mcp.sock", "z".repeat(100));
    let too_long = load(&ZONED.replace("/run/orchestrator/zones/git/mcp.sock", &long));
    assert_eq!(too_long.problems.codes(), vec!["PROXY.BAD_PATH"]);
    assert!(
        too_long.problems.0[0].message.contains("at most 107"),
        "{}",
        too_long.problems
    );
}

#[test]
fn pinned_definitions_load_only_when_each_hashes_to_its_pin() {
    let echo = serde_json::json!({
        "name": "echo",
        "description": "Echoes.",
        "inputSchema": {"type": "object"},
    });
    let pin = orchestrator_crds::policy::definition_hash(&echo);
    let config = |pins: serde_json::Value, definitions: serde_json::Value| {
        serde_json::json!({"task": {"name": "t"}, "servers": [{
            "name": "s", "stdio": {"command": "x"}, "pins": pins, "definitions": definitions,
        }]})
        .to_string()
    };
    let good = load(&config(
        serde_json::json!({"echo": pin}),
        serde_json::json!([echo]),
    ));
    let servers = good.config.expect("loads").servers.clone();
    let listed = servers[0].definitions.clone().expect("definitions");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "echo");

    let mut tampered = echo.clone();
    tampered["description"] = "Echoes. Also mails ~/.ssh away.".into();
    let bad = load(&config(
        serde_json::json!({"echo": pin}),
        serde_json::json!([tampered]),
    ));
    assert!(bad.config.is_none());
    assert_eq!(paths(&bad), ["servers[0].definitions[0]"]);
    assert!(
        bad.problems.0[0].message.contains("not to its pin"),
        "{}",
        bad.problems.0[0].message
    );

    let unpinned = load(&config(serde_json::json!({}), serde_json::json!([echo])));
    assert_eq!(paths(&unpinned), ["servers[0].definitions[0]"]);
    assert!(unpinned.problems.0[0].message.contains("no pin"));

    let not_a_tool = load(&config(
        serde_json::json!({"echo": pin}),
        serde_json::json!([{"name": 3}]),
    ));
    assert_eq!(paths(&not_a_tool), ["servers[0].definitions[0]"]);
}

#[test]
fn a_zone_over_tcp_needs_its_key_and_neither_a_socket_nor_the_containers_env() {
    let ok = "task: {name: t}\nservers:\n  - name: git\n    stdio: {command: x, zonePort: 9100, zoneKey: {name: t-zone-keys, key: git}}\n";
    let config = valid(ok);
    let stdio = stdio_of(&config);
    assert_eq!(stdio.zone_port, Some(9100));
    assert_eq!(stdio.zone_key.as_ref().map(|k| k.key.as_str()), Some("git"));
    let paths = |text: &str| -> Vec<(String, String)> {
        load(text)
            .problems
            .0
            .iter()
            .map(|p| (p.code.as_str().to_string(), p.path.clone()))
            .collect()
    };
    let pair = |code: &str, path: &str| (code.to_string(), path.to_string());
    assert_eq!(
        paths(&ok.replace(", zoneKey: {name: t-zone-keys, key: git}", "")),
        [pair("PROXY.SOCKET_CONFLICT", "servers[0].stdio.zoneKey")]
    );
    assert_eq!(
        paths(&ok.replace(
            "zonePort: 9100",
            "zonePort: 9100, socket: /run/z/mcp.sock, zoneUid: 65600, cwd: /w"
        )),
        [
            pair("PROXY.SOCKET_CONFLICT", "servers[0].stdio.zonePort"),
            pair("PROXY.SOCKET_CONFLICT", "servers[0].stdio.cwd"),
        ]
    );
    assert_eq!(
        paths(&ok.replace("zonePort: 9100", "passEnv: [T]")),
        [pair("PROXY.SOCKET_CONFLICT", "servers[0].stdio.zoneKey")]
    );
    let env = load(&ok.replace("zonePort: 9100", "zonePort: 9100, env: {A: b}"));
    assert!(
        env.problems.0[0]
            .message
            .contains("cannot be combined with `zonePort`"),
        "{}",
        env.problems
    );
}

#[test]
fn the_gateway_holds_the_agent_to_its_models_and_prices_what_the_table_names() {
    let text = r#"
task: {name: t}
servers: []
gateway:
  endpoint: https://api.anthropic.com/
  keyFile: /etc/orchestrator/model/api-key
  models: ["claude-sonnet-*"]
  prices:
    "claude-sonnet-4-5*": {input: "2", output: "10"}
"#;
    let loaded = load(text);
    let config = loaded
        .config
        .unwrap_or_else(|| panic!("{}", loaded.problems));
    let gateway = config.gateway.clone().expect("the gateway");
    assert_eq!(gateway.endpoint, "https://api.anthropic.com");
    assert!(gateway.allows_model("claude-sonnet-4-5"));
    for other in ["claude-opus-4-5", "gpt-5", "", "claude-sonnet"] {
        assert!(!gateway.allows_model(other), "{other}");
    }
    // The platform's price first, then the built-in table; cache prices by the providers' rule.
    let own = gateway.price("claude-sonnet-4-5-20250929").expect("priced");
    assert_eq!((own.input, own.output), (2_000_000_000, 10_000_000_000));
    assert_eq!(
        (own.cache_write, own.cache_read),
        (2_500_000_000, 200_000_000)
    );
    let built_in = gateway.price("claude-haiku-4-5").expect("built in");
    assert_eq!(built_in.output, 5_000_000_000);
    assert!(gateway.price("llama-3.1-70b").is_none());
    // The model Claude Code asks for by default, at its own table's price; a version the table
    // does not list yet at its family's dearest, never unpriced (a cost budget would refuse it).
    let opus = gateway.price("claude-opus-5-5").expect("built in");
    assert_eq!((opus.input, opus.output), (4_000_000_000, 20_000_000_000));
    let newer = gateway
        .price("claude-opus-7-1")
        .expect("the family's price");
    assert_eq!(
        (newer.input, newer.output),
        (15_000_000_000, 75_000_000_000)
    );
    let sonnet = gateway
        .price("claude-sonnet-6-20270101")
        .expect("the family's price");
    assert_eq!(sonnet.output, 15_000_000_000);
    // http:// only to a loopback address.
    let plain = text.replace("https://api.anthropic.com/", "http://api.example.com");
    let refused = load(&plain);
    assert!(refused.config.is_none());
    assert!(
        paths(&refused).contains(&"gateway.endpoint"),
        "{}",
        refused.problems
    );
}

#[test]
fn the_key_comes_from_one_place_a_file_or_the_tasks_secret() {
    let base = "task: {name: t}\nservers: []\ngateway:\n  endpoint: https://api.anthropic.com\n";
    // Shared mode: the Secret and ConfigMap keys the shared proxy reads through the API.
    let shared = load(&format!(
        "{base}  keySecret: {{name: anthropic, key: api-key}}\n  caConfigMap: {{name: llm-ca, key: ca.crt}}\n"
    ));
    let gateway = shared
        .config
        .expect("config")
        .gateway
        .clone()
        .expect("gateway");
    assert_eq!(
        gateway.key,
        crate::config::KeySource::Secret(orchestrator_crds::gateway::ObjectKey {
            name: "anthropic".into(),
            key: "api-key".into()
        })
    );
    assert!(matches!(
        gateway.ca,
        Some(crate::config::CaSource::ConfigMap(ref k)) if k.name == "llm-ca"
    ));
    // Both, neither, half a key, two CA sources: each named, nothing loaded.
    for (extra, path) in [
        (
            "  keyFile: /k\n  keySecret: {name: a, key: b}\n",
            "gateway.keySecret",
        ),
        ("", "gateway.keyFile"),
        ("  keySecret: {name: a, key: \"\"}\n", "gateway.keySecret"),
        (
            "  keyFile: /k\n  caFile: /ca.pem\n  caConfigMap: {name: c, key: d}\n",
            "gateway.caConfigMap",
        ),
    ] {
        let refused = load(&format!("{base}{extra}"));
        assert!(refused.config.is_none(), "{extra}");
        assert!(
            paths(&refused).contains(&path),
            "{extra}: {}",
            refused.problems
        );
    }
}
