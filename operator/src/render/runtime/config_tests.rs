//! Each runtime's rendered files and env, in both proxy modes: parsed as the runtime parses them
//! (JSON, TOML, env), every URL and host they name must be the task's proxy (`/mcp`, `/model`),
//! and each names it; what each renders from the permission rules and the model; and what each
//! refuses. Snapshots of the samples' ConfigMaps and Jobs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use orchestrator_crds::proxy::{PROXY_CONFIG_FILE, ProxyConfig};
use orchestrator_crds::shared::ProxyMode;
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::model::ModelSpec;
use serde_json::{Value, json};

use crate::render::{
    DEFAULT_SIDECAR_PORT, Plan, Problem, RenderSettings, SharedProxy, render_mode,
};

fn settings(default_model: bool) -> RenderSettings {
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
        shared_proxy: Some(SharedProxy {
            url: "http://orchestrator-mcp-proxy.orchestrator-system.svc:8080/mcp".into(),
            namespace: "orchestrator-system".into(),
            service_account: "orchestrator-mcp-proxy".into(),
            audience: "orchestrator.io/mcp-proxy".into(),
        }),
        default_model: default_model.then(|| ModelSpec {
            secret_key_ref: orchestrator_crds::taskrun::KeyRef {
                name: "orchestrator-model".into(),
                key: "api-key".into(),
            },
            ..ModelSpec::default()
        }),
        decision_point: None,
    }
}

fn catalog() -> orchestrator_crds::catalog::Catalog {
    orchestrator_crds::catalog::Catalog::parse(include_str!("../../../../config/catalog.yaml"))
        .expect("shipped catalog is valid")
}

/// A TaskRun with `spec` over a small default (one server, a model credential).
fn taskrun(spec: Value) -> TaskRun {
    let mut base = json!({
        "taskId": 3001, "serviceName": "todo-api", "task": {"prompt": "Add 2 and 3."},
        "model": {"secretKeyRef": {"name": "llm", "key": "api-key"}},
        "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]}
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        if v.is_null() {
            base.as_object_mut().map(|b| b.remove(k));
        } else {
            base[k] = v.clone();
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": "task-3001", "namespace": "team-a",
                     "uid": "0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c3001"},
        "spec": base,
    }))
    .expect("a TaskRun")
}

fn runtime(name: &str) -> TaskRun {
    taskrun(json!({"agent": {"runtime": name}}))
}

fn try_plan(tr: &TaskRun, mode: ProxyMode) -> Result<Plan, Vec<Problem>> {
    render_mode(tr, &catalog(), &settings(true), mode)
}

fn plan(tr: &TaskRun, mode: ProxyMode) -> Plan {
    try_plan(tr, mode).unwrap_or_else(|p| panic!("renders: {p:?}"))
}

fn problems(tr: &TaskRun) -> Vec<Problem> {
    try_plan(tr, ProxyMode::Sidecar).err().unwrap_or_default()
}

fn agent(plan: &Plan) -> Container {
    plan.job()
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].clone())
        .expect("the agent container")
}

fn env(plan: &Plan) -> BTreeMap<String, String> {
    agent(plan)
        .env
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

/// The task's ConfigMap data (the agent's files; in sidecar mode the proxy's too).
fn data(plan: &Plan) -> BTreeMap<String, String> {
    plan.config_map(1).data.unwrap_or_default()
}

/// A rendered file parsed as its runtime parses it; `None` for what no runtime parses as config
/// (the task text, the helper scripts) and the proxy's own config (its upstreams are its
/// business).
fn parsed(name: &str, text: &str) -> Option<Value> {
    if name.ends_with(".json") {
        Some(serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}")))
    } else if name.ends_with(".toml") {
        let doc: toml::Table = toml::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        Some(serde_json::to_value(doc).expect("TOML as JSON"))
    } else {
        assert!(
            name == "task.md" || name.ends_with(".sh") || name == PROXY_CONFIG_FILE,
            "{name}: a file the test does not know how to read"
        );
        None
    }
}

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            out.push(k.clone());
            strings(v, out)
        }),
        _ => {}
    }
}

/// Whether `s` names a place: a URL, or a host name (dotted, ending in a name like `com`).
fn names_a_place(s: &str) -> bool {
    if s.contains("://") || s.contains("localhost") {
        return true;
    }
    let host = s.split(['/', ':', '?']).next().unwrap_or_default();
    let labels: Vec<&str> = host.split('.').collect();
    !s.contains(char::is_whitespace)
        && labels.len() >= 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        && labels
            .last()
            .is_some_and(|l| l.len() >= 2 && l.chars().all(|c| c.is_ascii_alphabetic()))
}

/// `s` with each `${NAME}` replaced by the env's value, as Gemini CLI reads its settings.
fn expanded(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = s.to_string();
    for (name, value) in env {
        out = out.replace(&format!("${{{name}}}"), value);
    }
    out
}

/// The strings of the agent's files, the env they name expanded.
fn file_strings(files: &BTreeMap<String, String>, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    for (name, text) in files {
        if let Some(v) = parsed(name, text) {
            strings(&v, &mut found);
        }
    }
    found.iter().map(|s| expanded(s, env)).collect()
}

/// The places the agent's files and env name that are not its proxy's `/mcp` or `/model`.
fn elsewhere(
    files: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
    mcp: &str,
    model: &str,
) -> Vec<String> {
    let mut found = file_strings(files, env);
    found.extend(env.values().cloned());
    found
        .into_iter()
        .filter(|s| names_a_place(s))
        .filter(|s| {
            let at_model = s
                .strip_prefix(model)
                .is_some_and(|rest| rest.is_empty() || rest == "/v1");
            !(s == mcp || at_model)
        })
        .collect()
}

const RUNTIMES: [&str; 5] = ["claude-code", "codex", "gemini-cli", "opencode", "custom"];

fn for_runtime(name: &str) -> TaskRun {
    if name == "custom" {
        taskrun(json!({"agent": {"runtime": "custom", "command": ["my-agent"]}}))
    } else {
        runtime(name)
    }
}

/// Issue 43: a test fails when a rendered config names anything but the proxy.
#[test]
fn every_runtime_config_names_the_tasks_proxy_and_nothing_else_in_either_mode() {
    for name in RUNTIMES {
        for mode in [ProxyMode::Sidecar, ProxyMode::Shared] {
            let tr = for_runtime(name);
            let plan = plan(&tr, mode);
            let (mcp, model) = match mode {
                ProxyMode::Sidecar => (
                    "http://127.0.0.1:8080/mcp".to_string(),
                    "http://127.0.0.1:8080/model".to_string(),
                ),
                ProxyMode::Shared => (
                    "http://orchestrator-mcp-proxy.orchestrator-system.svc:8080/mcp".to_string(),
                    "http://orchestrator-mcp-proxy.orchestrator-system.svc:8080/model".to_string(),
                ),
            };
            let (files, env) = (data(&plan), env(&plan));
            let bad = elsewhere(&files, &env, &mcp, &model);
            assert!(bad.is_empty(), "{name} {mode:?} names {bad:?}");
            // And it does name the proxy: its MCP URL in a file (Gemini CLI's: through the env
            // it expands), its model URL in a file or env.
            let mut all = file_strings(&files, &env);
            assert!(
                all.contains(&mcp),
                "{name} {mode:?}: no MCP URL in {files:?}"
            );
            all.extend(env.values().cloned());
            assert!(
                all.iter().any(|s| s.starts_with(&model)),
                "{name} {mode:?}: no model URL"
            );
        }
    }
}

#[test]
fn the_check_catches_a_config_that_names_another_place() {
    let plan = plan(&runtime("codex"), ProxyMode::Sidecar);
    let (mcp, model) = ("http://127.0.0.1:8080/mcp", "http://127.0.0.1:8080/model");
    let mut files = data(&plan);
    let env = env(&plan);
    assert!(elsewhere(&files, &env, mcp, model).is_empty());
    for (from, to) in [
        (mcp, "https://mcp.example.com/mcp"),
        (
            "http://127.0.0.1:8080/model/v1",
            "http://127.0.0.1:8080/model.evil.example/v1",
        ),
        (
            "http://127.0.0.1:8080/model/v1",
            "https://api.openai.com/v1",
        ),
        ("\"never\"", "\"api.openai.com\""),
        (mcp, "http://localhost:9/mcp"),
    ] {
        let text = files["codex-config.toml"].replace(from, to);
        assert_ne!(text, files["codex-config.toml"], "{from}");
        let mut changed = files.clone();
        changed.insert("codex-config.toml".into(), text);
        assert!(
            !elsewhere(&changed, &env, mcp, model).is_empty(),
            "{to} not caught"
        );
    }
    let mut env = env;
    env.insert("OPENAI_BASE_URL".into(), "https://api.openai.com/v1".into());
    assert!(!elsewhere(&files, &env, mcp, model).is_empty());
    files.insert("notes.txt".into(), String::new());
    assert!(std::panic::catch_unwind(|| elsewhere(&files, &BTreeMap::new(), mcp, model)).is_err());
    // Gemini CLI's settings name the MCP URL through the env they expand: read expanded, they
    // name the proxy, or the other place a variable holds.
    let gemini = self::plan(&runtime("gemini-cli"), ProxyMode::Sidecar);
    let mut files = data(&gemini);
    let mut vars = self::env(&gemini);
    assert!(file_strings(&files, &vars).contains(&mcp.to_string()));
    let settings = files["gemini-settings.json"].replace("ORCHESTRATOR_MCP_URL", "ELSEWHERE");
    files.insert("gemini-settings.json".into(), settings);
    vars.insert("ELSEWHERE".into(), "https://mcp.example.com/mcp".into());
    assert!(file_strings(&files, &vars).contains(&vars["ELSEWHERE"]));
}

#[test]
fn the_gateway_speaks_the_runtimes_api_at_its_default_endpoint() {
    for (name, provider, endpoint) in [
        ("claude-code", "anthropic", "https://api.anthropic.com"),
        ("codex", "openai", "https://api.openai.com"),
        (
            "gemini-cli",
            "gemini",
            "https://generativelanguage.googleapis.com",
        ),
        ("opencode", "anthropic", "https://api.anthropic.com"),
    ] {
        let plan = plan(&runtime(name), ProxyMode::Sidecar);
        let proxy: ProxyConfig =
            serde_saphyr::from_str(&data(&plan)[PROXY_CONFIG_FILE]).expect("proxy.yaml");
        let gateway = proxy.gateway.expect("a gateway");
        assert_eq!(
            (gateway.provider.as_str(), gateway.endpoint.as_str()),
            (provider, endpoint),
            "{name}"
        );
    }
    let tr = taskrun(json!({"agent": {"runtime": "codex"},
        "model": {"secretKeyRef": {"name": "llm", "key": "k"}, "endpoint": "https://llm.example.com"}}));
    let proxy: ProxyConfig =
        serde_saphyr::from_str(&data(&plan(&tr, ProxyMode::Sidecar))[PROXY_CONFIG_FILE])
            .expect("proxy.yaml");
    assert_eq!(
        proxy.gateway.map(|g| g.endpoint).as_deref(),
        Some("https://llm.example.com")
    );
}

#[test]
fn each_runtime_runs_its_default_image_and_script_and_custom_runs_its_command() {
    for (name, image, binary) in [
        ("claude-code", "ghcr.io/example/claude-code:1", "claude -p"),
        ("codex", "orchestrator-agent-codex:latest", "codex exec"),
        (
            "gemini-cli",
            "orchestrator-agent-gemini-cli:latest",
            "gemini -p",
        ),
        (
            "opencode",
            "orchestrator-agent-opencode:latest",
            "opencode run",
        ),
    ] {
        let c = agent(&plan(&runtime(name), ProxyMode::Sidecar));
        assert_eq!(c.image.as_deref(), Some(image), "{name}");
        let command = c.command.unwrap_or_default();
        assert_eq!(&command[..2], ["sh", "-c"], "{name}");
        assert!(command[2].contains(binary), "{name}");
    }
    // A command of its own, runtime unset: custom, as before runtimes existed.
    let tr = taskrun(json!({"agent": {"command": ["python3", "agent.py"], "args": ["x"]}}));
    let plan = plan(&tr, ProxyMode::Sidecar);
    let c = agent(&plan);
    assert_eq!(
        c.command,
        Some(vec!["python3".to_string(), "agent.py".to_string()])
    );
    assert_eq!(c.args, Some(vec!["x".to_string()]));
    assert_eq!(c.image.as_deref(), Some("ghcr.io/example/claude-code:1"));
    let env = env(&plan);
    assert_eq!(env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:8080/model");
    assert!(data(&plan).contains_key("mcp-config.json"));
}

#[test]
fn the_model_reaches_each_runtime_and_claude_code_only_when_given() {
    let model = |tr: &TaskRun| {
        let plan = plan(tr, ProxyMode::Sidecar);
        (env(&plan), data(&plan))
    };
    let (env, _) = model(&runtime("claude-code"));
    assert!(
        !env.contains_key("ANTHROPIC_MODEL"),
        "Claude Code picks its own"
    );
    let (env, _) = model(&taskrun(json!({"agent": {"model": "claude-opus-4-1"}})));
    assert_eq!(env["ANTHROPIC_MODEL"], "claude-opus-4-1");
    let (env, files) = model(&runtime("codex"));
    assert_eq!(env["ORCHESTRATOR_MODEL"], "gpt-5.5");
    let config: toml::Table = toml::from_str(&files["codex-config.toml"]).expect("TOML");
    assert_eq!(config["model"].as_str(), Some("gpt-5.5"));
    let (env, _) = model(&runtime("gemini-cli"));
    assert_eq!(env["ORCHESTRATOR_MODEL"], "gemini-2.5-pro");
    let (_, files) = model(&taskrun(
        json!({"agent": {"runtime": "opencode", "model": "claude-opus-4-1"}}),
    ));
    let config: Value = serde_json::from_str(&files["opencode.json"]).expect("JSON");
    assert_eq!(config["model"], "anthropic/claude-opus-4-1");
    assert_eq!(
        config["small_model"], config["model"],
        "the title request uses the same model"
    );
}

#[test]
fn codex_turns_off_what_is_denied_and_reaches_the_proxy_with_its_token_and_key_helper() {
    let tr = taskrun(json!({"agent": {"runtime": "codex"}, "toolConfig": {
        "internalTools": {"permissions": {"allow": ["*"], "deny": ["Bash", "WebSearch", "Task", "TodoWrite", "Read", "WebFetch", "Grep"]}},
        "mcpServers": [{"name": "everything"}]}}));
    for (mode, command, args) in [
        (
            ProxyMode::Sidecar,
            "sh",
            "/etc/orchestrator/tools/model-key.sh",
        ),
        (
            ProxyMode::Shared,
            "cat",
            "/var/run/secrets/orchestrator.io/mcp/token",
        ),
    ] {
        let plan = plan(&tr, mode);
        let config: Value = serde_json::to_value(
            toml::from_str::<toml::Table>(&data(&plan)["codex-config.toml"]).expect("TOML"),
        )
        .expect("JSON");
        assert_eq!(
            config["features"],
            json!({
                "apps": false, "plugins": false, "in_app_updates": false, "shell_tool": false,
                "unified_exec": false, "view_image": false, "multi_agent": false, "goals": false
            })
        );
        assert_eq!(config["web_search"], "disabled");
        assert_eq!(
            (&config["approval_policy"], &config["sandbox_mode"]),
            (&json!("never"), &json!("danger-full-access"))
        );
        assert_eq!(config["model_provider"], "orchestrator");
        let provider = &config["model_providers"]["orchestrator"];
        assert_eq!(provider["wire_api"], "responses");
        assert_eq!(
            provider["auth"],
            json!({"command": command, "args": [args]}),
            "{mode:?}"
        );
        assert_eq!(
            config["mcp_servers"]["orchestrator"]["bearer_token_env_var"],
            "ORCHESTRATOR_MCP_TOKEN"
        );
        assert_eq!(config["mcp_servers"].as_object().map(|m| m.len()), Some(1));
        let env = env(&plan);
        assert_eq!(
            env.get("ORCHESTRATOR_CREDENTIAL_HELPER")
                .map(String::as_str),
            (mode == ProxyMode::Sidecar).then_some("/etc/orchestrator/tools/model-key.sh")
        );
    }
}

#[test]
fn gemini_gets_an_admin_policy_from_the_rules_and_settings_that_pin_the_proxy() {
    let tr = taskrun(json!({"agent": {"runtime": "gemini-cli"}, "toolConfig": {
        "internalTools": {"permissions": {
            "allow": ["Read", "Bash(git status:*)", "Bash(npm test)"],
            "deny": ["WebFetch", "Bash(git status --ignored:*)"]}},
        "mcpServers": [{"name": "everything"}]}}));
    let files = data(&plan(&tr, ProxyMode::Sidecar));
    let settings: Value = serde_json::from_str(&files["gemini-settings.json"]).expect("JSON");
    assert_eq!(settings["mcp"]["allowed"], json!(["orchestrator"]));
    assert_eq!(settings["mcpServers"].as_object().map(|m| m.len()), Some(1));
    assert_eq!(
        settings["mcpServers"]["orchestrator"]["headers"]["Authorization"],
        "Bearer ${ORCHESTRATOR_MCP_TOKEN}"
    );
    assert_eq!(settings["advanced"]["ignoreLocalEnv"], true);
    for var in ["GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GOOGLE_API_KEY"] {
        assert!(
            settings["advanced"]["excludedEnvVars"]
                .as_array()
                .is_some_and(|a| a.contains(&json!(var))),
            "{var}"
        );
    }
    let policy: Value = serde_json::to_value(
        toml::from_str::<toml::Table>(&files["gemini-policy.toml"]).expect("TOML"),
    )
    .expect("JSON");
    let rules = policy["rule"].as_array().cloned().unwrap_or_default();
    let find = |decision: &str, key: &str, value: Value| {
        rules
            .iter()
            .find(|r| r["decision"] == decision && r[key] == value)
            .map(|r| r["priority"].as_i64().unwrap_or_default())
    };
    let allow_mcp = find("allow", "mcpName", json!("orchestrator")).expect("the proxy allowed");
    // Without `*`: the tools that ask are denied (not offered), the read-only ones allowed.
    let denied = rules
        .iter()
        .find(|r| r["decision"] == "deny" && r["toolName"].is_array())
        .expect("a deny rule");
    for tool in ["replace", "write_file", "web_fetch", "google_web_search"] {
        assert!(
            denied["toolName"]
                .as_array()
                .is_some_and(|a| a.contains(&json!(tool))),
            "{tool}"
        );
    }
    assert!(
        !denied["toolName"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("run_shell_command")))
    );
    let allowed = rules
        .iter()
        .find(|r| r["decision"] == "allow" && r["toolName"].is_array())
        .expect("an allow rule");
    assert!(
        allowed["toolName"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("read_file")))
    );
    // The shell: offered, refused unless the command is allowed and not denied.
    let other = find("deny", "commandRegex", json!(".*")).expect("other commands refused");
    let git = find("allow", "commandPrefix", json!("git status")).expect("git status allowed");
    let ignored = find("deny", "commandPrefix", json!("git status --ignored")).expect("denied");
    let npm = find("allow", "commandRegex", json!("npm test\"")).expect("npm test exactly");
    assert!(
        ignored > git
            && git > other
            && npm > other
            && allow_mcp < denied["priority"].as_i64().unwrap_or_default()
    );
    assert!(
        rules
            .iter()
            .all(|r| r["toolName"] != "*" || r["mcpName"] == "orchestrator"),
        "no allow-all without *"
    );
}

/// What Gemini CLI 0.61.0 checks before it loads a policy file (`PolicyRuleSchema` and
/// `validateShellCommandSyntax` in its bundle): a file with one bad rule is skipped whole, and
/// every tool is then left to the defaults.
fn gemini_policy_problems(text: &str) -> Vec<String> {
    let policy: Value =
        serde_json::to_value(toml::from_str::<toml::Table>(text).expect("TOML")).expect("JSON");
    let known = [
        "toolName",
        "subagent",
        "mcpName",
        "argsPattern",
        "commandPrefix",
        "commandRegex",
        "decision",
        "priority",
        "modes",
        "interactive",
        "toolAnnotations",
        "allowRedirection",
        "denyMessage",
    ];
    let mut problems = Vec::new();
    for (i, rule) in policy["rule"].as_array().into_iter().flatten().enumerate() {
        let names: Vec<&str> = match &rule["toolName"] {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if names.is_empty() || names.iter().any(|n| n.is_empty() || n.contains("__")) {
            problems.push(format!("rule {i}: toolName"));
        }
        if !["allow", "deny", "ask_user"].contains(&rule["decision"].as_str().unwrap_or_default()) {
            problems.push(format!("rule {i}: decision"));
        }
        if !rule["priority"]
            .as_i64()
            .is_some_and(|p| (0..=999).contains(&p))
        {
            problems.push(format!("rule {i}: priority"));
        }
        let command = rule.get("commandPrefix").is_some() || rule.get("commandRegex").is_some();
        if command
            && (rule["toolName"] != "run_shell_command"
                || rule.get("argsPattern").is_some()
                || (rule.get("commandPrefix").is_some() && rule.get("commandRegex").is_some()))
        {
            problems.push(format!("rule {i}: command"));
        }
        for key in rule.as_object().into_iter().flatten().map(|(k, _)| k) {
            if !known.contains(&key.as_str()) {
                problems.push(format!("rule {i}: {key}"));
            }
        }
    }
    problems
}

#[test]
fn every_gemini_policy_passes_gemini_clis_own_checks() {
    for (allow, deny) in [
        (json!(["*"]), json!([])),
        (
            json!(["*"]),
            json!(["Bash", "WebFetch", "Edit", "Write", "Task"]),
        ),
        (json!(["*"]), json!(["Bash(rm:*)", "Bash(git push)"])),
        (json!(["Read"]), json!([])),
        (
            json!(["Bash(git status:*)", "Bash(npm test)"]),
            json!(["Bash(git status -u:*)"]),
        ),
        (json!([]), json!([])),
    ] {
        let tr = taskrun(json!({"agent": {"runtime": "gemini-cli"}, "toolConfig": {
            "internalTools": {"permissions": {"allow": allow, "deny": deny}},
            "mcpServers": [{"name": "everything"}]}}));
        let files = data(&plan(&tr, ProxyMode::Sidecar));
        let problems = gemini_policy_problems(&files["gemini-policy.toml"]);
        assert!(
            problems.is_empty(),
            "{allow} {deny}: {problems:?}\n{}",
            files["gemini-policy.toml"]
        );
    }
    // The check itself: the rule Gemini CLI refused in a run (no toolName).
    let refused = "[[rule]]\nmcpName = \"orchestrator\"\ndecision = \"allow\"\npriority = 500\n";
    assert_eq!(gemini_policy_problems(refused), ["rule 0: toolName"]);
}

#[test]
fn opencode_permissions_are_written_in_the_order_it_reads_them() {
    let tr = taskrun(json!({"agent": {"runtime": "opencode"}, "toolConfig": {
        "internalTools": {"permissions": {"allow": ["*"], "deny": ["WebFetch", "Bash(git push:*)", "Bash(rm *)"]}},
        "mcpServers": [{"name": "everything"}]}}));
    let text = data(&plan(&tr, ProxyMode::Sidecar))["opencode.json"].clone();
    let config: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        config["permission"],
        json!({"*": "allow", "webfetch": "deny", "orchestrator_*": "allow",
               "bash": {"*": "allow", "git push": "deny", "git push *": "deny", "rm": "deny", "rm *": "deny"}})
    );
    // OpenCode takes the last matching rule: `*` comes first, the proxy's tools last, and a
    // command's denies after its allows.
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle} in {text}"))
    };
    assert!(at("\"*\": \"allow\"") < at("\"webfetch\""));
    assert!(at("\"webfetch\"") < at("\"orchestrator_*\""));
    assert!(at("\"bash\"") < at("\"orchestrator_*\""));
    assert_eq!(
        config["mcp"]["orchestrator"]["headers"]["Authorization"],
        "Bearer {env:ORCHESTRATOR_MCP_TOKEN}"
    );
    assert_eq!(
        config["provider"]["anthropic"]["options"]["apiKey"],
        "{env:ORCHESTRATOR_MCP_TOKEN}"
    );
    assert_eq!(
        (&config["autoupdate"], &config["share"]),
        (&json!(false), &json!("disabled"))
    );
    // Without `*`: everything denied but what the rules allow, and the proxy's tools.
    let tr = taskrun(json!({"agent": {"runtime": "opencode"}, "toolConfig": {
        "internalTools": {"permissions": {"allow": ["Bash(git status:*)", "Edit", "Write"]}},
        "mcpServers": [{"name": "everything"}]}}));
    let config: Value =
        serde_json::from_str(&data(&plan(&tr, ProxyMode::Sidecar))["opencode.json"]).expect("JSON");
    let p = &config["permission"];
    assert_eq!(
        (&p["*"], &p["edit"], &p["read"], &p["webfetch"]),
        (
            &json!("deny"),
            &json!("allow"),
            &json!("allow"),
            &json!("deny")
        )
    );
    assert_eq!(
        p["bash"],
        json!({"*": "deny", "git status": "allow", "git status *": "allow"})
    );
}

fn reasons(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.reason).collect()
}

#[test]
fn rules_a_runtime_cannot_honour_are_refused_naming_the_rule_and_the_runtime() {
    for (name, allow, deny, rule, says) in [
        (
            "codex",
            json!(["*", "Bash(git status:*)"]),
            json!([]),
            "Bash(git status:*)",
            "Codex CLI",
        ),
        (
            "codex",
            json!(["*"]),
            json!(["Edit"]),
            "Edit",
            "apply_patch",
        ),
        ("codex", json!(["Read"]), json!([]), "Read", "apply_patch"),
        (
            "gemini-cli",
            json!(["*"]),
            json!(["Bash(git * main)"]),
            "Bash(git * main)",
            "by prefix only",
        ),
        (
            "gemini-cli",
            json!(["*"]),
            json!(["Read(~/.ssh/**)"]),
            "Read(~/.ssh/**)",
            "Gemini CLI",
        ),
        (
            "opencode",
            json!(["*"]),
            json!(["Write"]),
            "edit tool",
            "Edit and Write",
        ),
        (
            "opencode",
            json!(["*"]),
            json!(["mcp__orchestrator__everything__echo"]),
            "mcp__orchestrator__everything__echo",
            "tools.deny",
        ),
    ] {
        let tr = taskrun(json!({"agent": {"runtime": name}, "toolConfig": {
            "internalTools": {"permissions": {"allow": allow, "deny": deny}},
            "mcpServers": [{"name": "everything"}]}}));
        let problems = problems(&tr);
        assert_eq!(
            reasons(&problems),
            ["PermissionRuleNotSupported"],
            "{name} {rule}: {problems:?}"
        );
        let message = &problems[0].message;
        assert!(
            message.contains(rule) && message.contains(says),
            "{name}: {message}"
        );
    }
    // Claude Code reads the rules itself.
    let tr = taskrun(
        json!({"toolConfig": {"internalTools": {"permissions": {"allow": ["*"], "deny": ["Bash(git * main)", "Edit"]}},
        "mcpServers": [{"name": "everything"}]}}),
    );
    assert!(problems(&tr).is_empty());
}

#[test]
fn a_runtime_without_a_credential_for_its_api_is_refused() {
    // The operator's default credential is for the Anthropic API.
    for (name, api) in [("codex", "OpenAI"), ("gemini-cli", "Gemini")] {
        let tr = taskrun(json!({"agent": {"runtime": name}, "model": null}));
        let problems = problems(&tr);
        assert_eq!(reasons(&problems), ["NoModelCredential"], "{name}");
        assert!(
            problems[0].message.contains("spec.model.secretKeyRef")
                && problems[0].message.contains(api),
            "{}",
            problems[0].message
        );
    }
    let tr = taskrun(json!({"agent": {"runtime": "opencode"}, "model": null}));
    assert!(
        problems(&tr).is_empty(),
        "OpenCode speaks the Anthropic API"
    );
    // No credential at all.
    let tr = taskrun(json!({"agent": {"runtime": "opencode"}, "model": null}));
    let problems = render_mode(&tr, &catalog(), &settings(false), ProxyMode::Sidecar)
        .err()
        .unwrap_or_default();
    assert_eq!(reasons(&problems), ["NoModelCredential"]);
    // A key in the agent's env: only Claude Code (and a custom command) may keep one there.
    let tr = taskrun(
        json!({"agent": {"runtime": "codex", "env": [{"name": "OPENAI_API_KEY", "value": "sk-x"}]}, "model": null}),
    );
    let problems = self::problems(&tr);
    assert_eq!(reasons(&problems), ["ModelKeyInAgent"]);
    assert!(
        problems[0].message.contains("OPENAI_API_KEY"),
        "{}",
        problems[0].message
    );
    // Claude Code keeps the default credential beside another API's key in its env (a tool of
    // its own may use it).
    let tr = taskrun(
        json!({"agent": {"env": [{"name": "OPENAI_API_KEY", "value": "sk-x"}]}, "model": null}),
    );
    let plan = plan(&tr, ProxyMode::Sidecar);
    assert!(
        env(&plan).contains_key("ANTHROPIC_BASE_URL"),
        "the gateway serves it"
    );
}

#[test]
fn a_model_the_credential_does_not_allow_is_refused_naming_both_fields() {
    let tr = taskrun(
        json!({"agent": {"runtime": "gemini-cli", "model": "gemini-3-pro"},
        "model": {"secretKeyRef": {"name": "llm", "key": "k"}, "models": ["gemini-2.5-*"]}}),
    );
    let problems = problems(&tr);
    assert_eq!(reasons(&problems), ["ModelNotAllowed"]);
    let m = &problems[0].message;
    assert!(
        m.contains("spec.agent.model \"gemini-3-pro\"")
            && m.contains("spec.model.models (gemini-2.5-*)"),
        "{m}"
    );
    // The default model is checked too.
    let tr = taskrun(json!({"agent": {"runtime": "codex"},
        "model": {"secretKeyRef": {"name": "llm", "key": "k"}, "models": ["o3*"]}}));
    let problems = self::problems(&tr);
    assert_eq!(reasons(&problems), ["ModelNotAllowed"]);
    assert!(
        problems[0].message.contains("default model"),
        "{}",
        problems[0].message
    );
    let tr = taskrun(json!({"agent": {"runtime": "codex", "model": "o3-pro"},
        "model": {"secretKeyRef": {"name": "llm", "key": "k"}, "models": ["o3*"]}}));
    assert!(self::problems(&tr).is_empty());
}

#[test]
fn a_runtime_and_a_command_of_its_own_do_not_go_together() {
    let tr = taskrun(json!({"agent": {"runtime": "codex", "command": ["codex"]}}));
    let problems = problems(&tr);
    assert_eq!(reasons(&problems), ["InvalidAgentRuntime"]);
    assert!(
        problems[0].message.contains("runtime: custom"),
        "{}",
        problems[0].message
    );
    let tr = taskrun(json!({"agent": {"runtime": "custom"}}));
    let problems = self::problems(&tr);
    assert_eq!(reasons(&problems), ["InvalidAgentRuntime"]);
    assert!(
        problems[0].message.contains("spec.agent.command"),
        "{}",
        problems[0].message
    );
    let tr = taskrun(json!({"agent": {"runtime": "custom", "args": ["--flag"]}}));
    assert_eq!(reasons(&self::problems(&tr)), ["InvalidAgentRuntime"]);
    let tr = taskrun(json!({"agent": {"runtime": "codex", "model": "gpt 5; rm -rf /"}}));
    assert_eq!(reasons(&self::problems(&tr)), ["InvalidAgentRuntime"]);
    // Unset with args alone: the image's entrypoint with them, as before runtimes existed.
    let tr = taskrun(json!({"agent": {"args": ["--flag"]}}));
    let plan = plan(&tr, ProxyMode::Sidecar);
    let c = agent(&plan);
    assert_eq!(
        (c.command, c.args),
        (None, Some(vec!["--flag".to_string()]))
    );
}

fn sample(yaml: &str) -> TaskRun {
    let mut tr: TaskRun = serde_saphyr::from_str(yaml).expect("sample parses");
    tr.metadata.namespace = Some("team-a".into());
    tr.metadata.uid = Some("0b6a3c9e-1b1e-4c57-9a43-5f1d2d6c1101".into());
    tr
}

/// The sample's ConfigMap: the agent's files, and of `proxy.yaml` only its `gateway` (the
/// servers' part is the Claude Code sample's).
fn config_map_snapshot(yaml: &str) -> BTreeMap<String, String> {
    let plan = plan(&sample(yaml), ProxyMode::Sidecar);
    let mut data = data(&plan);
    let proxy: ProxyConfig = serde_saphyr::from_str(&data[PROXY_CONFIG_FILE]).expect("proxy.yaml");
    data.insert(
        PROXY_CONFIG_FILE.into(),
        serde_saphyr::to_string(&proxy.gateway).unwrap_or_default(),
    );
    data
}

#[test]
fn codex_sample_snapshot() {
    let yaml = include_str!("../../../../config/samples/taskrun-codex.yaml");
    insta::assert_yaml_snapshot!(config_map_snapshot(yaml));
    insta::assert_yaml_snapshot!(plan(&sample(yaml), ProxyMode::Sidecar).job());
}

#[test]
fn gemini_sample_snapshot() {
    let yaml = include_str!("../../../../config/samples/taskrun-gemini.yaml");
    insta::assert_yaml_snapshot!(config_map_snapshot(yaml));
    insta::assert_yaml_snapshot!(plan(&sample(yaml), ProxyMode::Sidecar).job());
}

#[test]
fn opencode_sample_snapshot() {
    let yaml = include_str!("../../../../config/samples/taskrun-opencode.yaml");
    insta::assert_yaml_snapshot!(config_map_snapshot(yaml));
    insta::assert_yaml_snapshot!(plan(&sample(yaml), ProxyMode::Sidecar).job());
}
