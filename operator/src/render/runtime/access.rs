//! How the agent reaches its proxy and proves itself to it, as every runtime's files name it:
//! the proxy's MCP URL and model base URL, and the command that prints the agent's credential
//! (sidecar mode: a script that hands it out only while the proxy's uid holds the proxy's port;
//! shared mode: the pod's projected token).

use orchestrator_crds::shared::{TOKEN_DIR, TOKEN_FILE};

use super::super::model::MODEL_KEY_HELPER_FILE;
use super::super::pod::{PROXY_UID, TOOLS_DIR};

/// Sidecar mode: Claude Code's `headersHelper` (see [`headers_script`]).
pub const HEADERS_HELPER_FILE: &str = "mcp-headers.sh";
/// The name of the proxy in every runtime's MCP config. Claude Code names its tools
/// `mcp__orchestrator__<tool>`, Codex `mcp__orchestrator` (a namespace), Gemini CLI
/// `mcp_orchestrator_<tool>`, OpenCode `orchestrator_<tool>`.
pub const PROXY_SERVER_NAME: &str = "orchestrator";

/// How the agent's files reach its proxy (chosen by `placement`).
#[derive(Clone, Debug)]
pub struct ProxyAccess {
    /// The proxy's MCP URL.
    pub mcp_url: String,
    /// The model API's base URL at the proxy (its `/model`).
    pub model_base_url: String,
    /// Shared mode: the credential is the pod's projected token, read as it is.
    shared: bool,
}

impl ProxyAccess {
    /// Sidecar mode: the pod's proxy at `proxy_addr` (loopback); the credential is printed by
    /// the ConfigMap's scripts, which send it only to the proxy's uid ([`headers_script`]).
    pub fn sidecar(proxy_addr: &str) -> Self {
        Self {
            mcp_url: format!("http://{proxy_addr}/mcp"),
            model_base_url: format!(
                "http://{proxy_addr}{}",
                orchestrator_crds::gateway::PATH_PREFIX
            ),
            shared: false,
        }
    }

    /// Shared mode: the shared proxy at `mcp_url` and `model_base_url`, reached with the pod's
    /// projected token (audience the shared proxy's, not the API server's), which the shared
    /// proxy reviews.
    pub fn shared(mcp_url: &str, model_base_url: &str) -> Self {
        Self {
            mcp_url: mcp_url.to_string(),
            model_base_url: model_base_url.to_string(),
            shared: true,
        }
    }

    /// Claude Code's `headersHelper`: a shell command printing `{"Authorization":"Bearer ..."}`.
    /// Claude Code runs it when it connects and reconnects, so a token the kubelet renewed in
    /// the file is the one sent after a reconnect.
    pub fn headers_helper(&self) -> String {
        if self.shared {
            headers_helper()
        } else {
            format!("sh {TOOLS_DIR}/{HEADERS_HELPER_FILE}")
        }
    }

    /// The command (program and arguments) that prints the agent's credential alone: the model
    /// key helper (sidecar mode, [`MODEL_KEY_HELPER_FILE`]: the same port check) or the token
    /// file (shared mode). Claude Code's `apiKeyHelper`, Codex's model provider `auth.command`.
    pub fn credential_command(&self) -> (&'static str, String) {
        if self.shared {
            ("cat", format!("{TOKEN_DIR}/{TOKEN_FILE}"))
        } else {
            ("sh", format!("{TOOLS_DIR}/{MODEL_KEY_HELPER_FILE}"))
        }
    }

    /// The agent scripts' `ORCHESTRATOR_CREDENTIAL_HELPER`: the script printing the agent's
    /// credential after the port check (sidecar mode); none in shared mode (the token file is
    /// read as it is).
    pub fn credential_helper(&self) -> Option<String> {
        (!self.shared).then(|| format!("{TOOLS_DIR}/{MODEL_KEY_HELPER_FILE}"))
    }
}

/// Sidecar mode: a shell script printing `{"Authorization":"Bearer <the agent's token>"}`, but
/// only when the proxy's port on the pod's loopback is held by the proxy's uid (the kernel's
/// socket table, `/proc/net/tcp`, which shows the pod's network namespace): while the proxy
/// restarts, any other container of the pod could bind the port, and must not be sent the
/// token. The address is printed as the kernel holds it (little-endian on amd64 and arm64; the
/// big-endian form is accepted too).
pub fn headers_script(proxy_addr: &str) -> String {
    let port = proxy_addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .unwrap_or(8080);
    format!(
        r#"# Claude Code's headersHelper (sidecar mode): the agent's credential for its proxy, sent only
# when 127.0.0.1:{port} is held by the proxy's uid ({PROXY_UID}), never to another process of the pod.
port={port} uid={PROXY_UID} token=${{ORCHESTRATOR_MCP_TOKEN_FILE:-{TOKEN_DIR}/{TOKEN_FILE}}}
held=$(awk -v want="$(printf '%04X' "$port")" '$4 == "0A" {{ split($2, a, ":"); if (a[2] == want && (a[1] == "0100007F" || a[1] == "7F000001" || a[1] == "00000000")) {{ print $8; exit }} }}' /proc/net/tcp)
if [ "$held" != "$uid" ]; then
  echo "127.0.0.1:$port is held by uid ${{held:-nobody}}, not the MCP proxy's ($uid): the agent's token is not sent" >&2
  exit 1
fi
printf '{{"Authorization":"Bearer %s"}}' "$(cat "$token")"
"#
    )
}

/// Shared mode: the shell command printing `{"Authorization":"Bearer <token>"}` from the
/// projected token file (a JWT: base64url and dots, nothing to escape in JSON).
pub fn headers_helper() -> String {
    format!("printf '{{\"Authorization\":\"Bearer %s\"}}' \"$(cat {TOKEN_DIR}/{TOKEN_FILE})\"")
}
