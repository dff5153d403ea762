//! The agent's credential in sidecar mode (issue 41, docs/proxy.md "Who may call"): the volume
//! only the proxy's and the agent's containers mount, the env that names it on both sides, the
//! auditors' Secret in the proxy's container only, and the headersHelper that sends the token
//! only to the proxy's uid.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use k8s_openapi::api::core::v1::Container;
use orchestrator_crds::shared::{AUDITOR_SECRET, TOKEN_DIR};

use super::files::headers_script;
use super::tests::{containers, plan, pod, task_1001};
use super::*;

fn env(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[test]
fn only_the_proxy_and_the_agent_mount_the_agents_credential_and_only_the_proxy_the_auditors() {
    let pod = pod(&plan(&task_1001()));
    let credential = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "agent-credential")
        .expect("the credential volume");
    let empty = credential.empty_dir.as_ref().expect("an emptyDir");
    assert_eq!(
        empty.medium.as_deref(),
        Some("Memory"),
        "never on the node's disk"
    );
    let auditor = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "auditor-token")
        .and_then(|v| v.secret.clone())
        .expect("the auditors' Secret");
    assert_eq!(auditor.secret_name.as_deref(), Some(AUDITOR_SECRET));
    assert_eq!(auditor.optional, Some(true));
    let mut mounted = Vec::new();
    for c in containers(&pod) {
        for m in c.volume_mounts.iter().flatten() {
            if m.name == "agent-credential" || m.name == "auditor-token" {
                mounted.push((
                    c.name.clone(),
                    m.name.clone(),
                    m.mount_path.clone(),
                    m.read_only,
                ));
            }
        }
    }
    mounted.sort();
    assert_eq!(
        mounted,
        vec![
            (
                "agent".into(),
                "agent-credential".into(),
                TOKEN_DIR.into(),
                Some(true)
            ),
            (
                "mcp-proxy".into(),
                "agent-credential".into(),
                TOKEN_DIR.into(),
                None
            ),
            (
                "mcp-proxy".into(),
                "auditor-token".into(),
                job::AUDITOR_DIR.into(),
                Some(true)
            ),
        ],
        "no server's zone mounts either"
    );
    let all = containers(&pod);
    let proxy = all.iter().find(|c| c.name == "mcp-proxy").expect("proxy");
    let agent = all.iter().find(|c| c.name == "agent").expect("agent");
    let token = format!("{TOKEN_DIR}/token");
    assert_eq!(
        env(proxy, "MCP_PROXY_CLIENT_TOKEN_FILE").as_deref(),
        Some(token.as_str())
    );
    assert_eq!(
        env(proxy, "MCP_PROXY_AUDITOR_TOKEN_FILE").as_deref(),
        Some("/etc/orchestrator/auditor/token")
    );
    assert_eq!(
        env(agent, "ORCHESTRATOR_MCP_TOKEN_FILE").as_deref(),
        Some(token.as_str())
    );
    assert_eq!(env(agent, "ORCHESTRATOR_PROXY_MODE"), None);
}

#[test]
fn claude_codes_mcp_config_gets_the_token_through_the_rendered_helper() {
    let data = plan(&task_1001()).config_map(1).data.expect("data");
    let mcp: serde_json::Value = serde_json::from_str(&data["mcp-config.json"]).expect("json");
    assert_eq!(
        mcp["mcpServers"]["orchestrator"]["headersHelper"],
        "sh /etc/orchestrator/tools/mcp-headers.sh"
    );
    assert_eq!(data["mcp-headers.sh"], headers_script("127.0.0.1:8080"));
}

/// The rendered helper, run by `sh` on this machine against the kernel's real socket table: it
/// prints the header only while the port is held by the uid it names.
#[test]
fn the_helper_sends_the_token_only_to_a_listener_of_the_proxys_uid() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let own = std::fs::metadata("/proc/self").expect("proc").uid();
    let dir = std::env::temp_dir().join(format!(
        "orchestrator-headers-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let token = dir.join("token");
    std::fs::File::create(&token)
        .and_then(|mut f| f.write_all(b"0123abcd\n"))
        .expect("token");
    let run = |script: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("ORCHESTRATOR_MCP_TOKEN_FILE", &token)
            .output()
            .expect("sh runs")
    };
    let rendered = headers_script(&format!("127.0.0.1:{port}"));
    // As rendered (the proxy's uid, 65533): this process holds the port, so nothing is sent.
    let refused = run(&rendered);
    assert!(!refused.status.success());
    assert!(refused.stdout.is_empty(), "{:?}", refused.stdout);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains(&format!(
            "127.0.0.1:{port} is held by uid {own}, not the MCP proxy's (65533)"
        )),
        "{why}"
    );
    // Held by the uid it names: the header.
    let ours = rendered.replacen("uid=65533", &format!("uid={own}"), 1);
    let sent = run(&ours);
    assert!(sent.status.success(), "{:?}", sent);
    assert_eq!(
        String::from_utf8_lossy(&sent.stdout),
        r#"{"Authorization":"Bearer 0123abcd"}"#
    );
    // Nobody listening: nothing sent.
    drop(listener);
    let gone = run(&ours);
    assert!(!gone.status.success() && gone.stdout.is_empty());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("held by uid nobody"));
    let _ = std::fs::remove_dir_all(dir);
}
