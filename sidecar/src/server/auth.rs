//! Who may use the HTTP front of a task's own proxy (sidecar mode): every container of a pod
//! shares its network namespace, so reaching 127.0.0.1 proves nothing. The agent proves a
//! bearer token that only its container and the proxy's can read ([`AgentToken`]: the proxy
//! writes it into a volume those two containers alone mount, `--client-token-file`); an auditor
//! proves a token of its own ([`AuditorToken`], `--auditor-token-file`: a Secret only auditors may
//! read) that reads (`GET /tools`, `GET /audit`, `GET /metrics`) and never calls (`/mcp`).
//! Without either flag (the proxy run by hand, or in tests) the front is open, as it says at
//! start; the operator always renders both.

use std::{
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::{
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

/// Bytes of randomness in the agent's token (written as twice as many hex digits).
pub const TOKEN_BYTES: usize = 32;
/// The longest auditor token file read (a Secret's value).
const MAX_AUDITOR_TOKEN: u64 = 4096;
/// The shortest auditor token accepted, so a guessable one is not taken for a credential.
const MIN_AUDITOR_TOKEN: usize = 32;

/// What a request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `/mcp`: the agent only.
    Call,
    /// `GET /tools`, `GET /audit`, `GET /metrics`: the agent or an auditor.
    Read,
    /// `/model` (the model gateway): the agent only, its token sent as the API key the way
    /// its runtime sends one: `Authorization: Bearer` (Codex), `x-api-key` (Claude Code's key
    /// helper, OpenCode) or `x-goog-api-key` (Gemini CLI). Only here: never for `/mcp`.
    Model,
}

/// The agent's token: random, created by the proxy when its file is missing or not one, and
/// kept across the proxy's restarts (the file is on a volume that outlives the container), so
/// the agent's client never holds a stale one.
#[derive(Clone)]
pub struct AgentToken(Arc<[u8]>);

impl std::fmt::Debug for AgentToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentToken(..)")
    }
}

impl AgentToken {
    /// The token in `path`, or a new one written there (mode 0640: the proxy's uid and the
    /// pod's group, which the agent's container has; no other container mounts the volume).
    pub fn load_or_create(path: &Path) -> anyhow::Result<Self> {
        if let Ok(text) = std::fs::read(path)
            && let Some(token) = Self::parse(&text)
        {
            return Ok(token);
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        aws_lc_rs::rand::fill(&mut bytes)
            .map_err(|_| anyhow::anyhow!("no randomness for the agent's token"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        write_atomically(path, hex.as_bytes()).map_err(|e| {
            anyhow::anyhow!(
                "cannot write the agent's token to {} (--client-token-file, MCP_PROXY_CLIENT_TOKEN_FILE): {e}",
                path.display()
            )
        })?;
        Ok(Self(hex.into_bytes().into()))
    }

    /// A token file's contents: exactly the hex digits of [`TOKEN_BYTES`] random bytes.
    fn parse(text: &[u8]) -> Option<Self> {
        let text = text.trim_ascii();
        (text.len() == TOKEN_BYTES * 2 && text.iter().all(u8::is_ascii_hexdigit))
            .then(|| Self(text.into()))
    }
}

/// The auditors' token: a file (a Secret's key, which the kubelet updates in place), read at
/// each request so a rotated Secret takes effect without a restart. Missing or too short: no
/// auditor is accepted.
#[derive(Clone, Debug)]
pub struct AuditorToken(PathBuf);

impl AuditorToken {
    pub fn new(path: PathBuf) -> Self {
        Self(path)
    }

    fn read(&self) -> Option<Vec<u8>> {
        use std::io::Read;
        let file = std::fs::File::open(&self.0).ok()?;
        let mut text = Vec::new();
        file.take(MAX_AUDITOR_TOKEN).read_to_end(&mut text).ok()?;
        let token = text.trim_ascii();
        (token.len() >= MIN_AUDITOR_TOKEN).then(|| token.to_vec())
    }
}

/// The credentials the front accepts; none configured: every request is served.
#[derive(Clone, Debug, Default)]
pub struct ClientAuth {
    pub agent: Option<AgentToken>,
    pub auditor: Option<AuditorToken>,
    refused: Arc<AtomicU64>,
}

impl ClientAuth {
    pub fn new(agent: Option<AgentToken>, auditor: Option<AuditorToken>) -> Self {
        Self {
            agent,
            auditor,
            refused: Arc::default(),
        }
    }

    pub fn is_open(&self) -> bool {
        self.agent.is_none() && self.auditor.is_none()
    }

    /// Whether `presented` (the bearer token of a request) grants `access`.
    pub fn allows(&self, presented: Option<&[u8]>, access: Access) -> bool {
        if self.is_open() {
            return true;
        }
        let Some(presented) = presented else {
            return false;
        };
        if self.agent.as_ref().is_some_and(|a| same(&a.0, presented)) {
            return true;
        }
        access == Access::Read
            && self
                .auditor
                .as_ref()
                .and_then(AuditorToken::read)
                .is_some_and(|t| same(&t, presented))
    }

    /// Requests refused so far (the metric reads it).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Compares in time independent of where the two differ.
fn same(expected: &[u8], presented: &[u8]) -> bool {
    aws_lc_rs::constant_time::verify_slices_are_equal(expected, presented).is_ok()
}

/// The bearer token of a request (`Authorization: Bearer <token>`; one such header only).
fn bearer(request: &Request) -> Option<&[u8]> {
    let bytes = only_header(request, header::AUTHORIZATION.as_str())?;
    let scheme = bytes.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| bytes[7..].trim_ascii())
}

/// The API key of a request as the model APIs send it (`x-api-key`, or Gemini's
/// `x-goog-api-key`; one such header only).
fn api_key(request: &Request) -> Option<&[u8]> {
    only_header(request, crate::gateway::anthropic::KEY_HEADER)
        .or_else(|| only_header(request, crate::gateway::gemini::KEY_HEADER))
        .map(<[u8]>::trim_ascii)
}

/// The credential a request presents for `access`.
fn presented(request: &Request, access: Access) -> Option<&[u8]> {
    match access {
        Access::Model => bearer(request).or_else(|| api_key(request)),
        Access::Call | Access::Read => bearer(request),
    }
}

/// The value of header `name` when the request has exactly one.
fn only_header<'r>(request: &'r Request, name: &str) -> Option<&'r [u8]> {
    let mut values = request.headers().get_all(name).iter();
    let (value, more) = (values.next()?, values.next());
    more.is_none().then(|| value.as_bytes())
}

/// The middleware: a request without a credential for `access` gets 401 before anything reads
/// its body or opens a session.
pub async fn require(
    State((auth, access)): State<(ClientAuth, Access)>,
    request: Request,
    next: Next,
) -> Response {
    if auth.allows(presented(&request, access), access) {
        if access == Access::Model {
            // A refusal inside (the body's size) in the shape of the API the request is for.
            let path = request.uri().path().to_string();
            return crate::gateway::reshape(&path, next.run(request).await);
        }
        return next.run(request).await;
    }
    let n = auth.refused.fetch_add(1, Ordering::Relaxed) + 1;
    // A process that knocks in a loop must not flood the log: the 1st, 2nd, 4th, 8th, ... refusal.
    if n.is_power_of_two() {
        tracing::warn!(
            path = %crate::names::clip(request.uri().path()),
            refused = n,
            "refused a request without the agent's credential (another process of the pod, or a \
             client not given the token file); {n} refused so far"
        );
    }
    if access == Access::Model {
        let refused = crate::gateway::refuse(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "the model gateway serves only the task's agent: send the token in the file \
             ORCHESTRATOR_MCP_TOKEN_FILE names as the API key (no model key is needed: the \
             proxy holds it)",
        );
        return crate::gateway::reshape(request.uri().path(), refused);
    }
    let why = match access {
        Access::Model => "",
        Access::Call => {
            "Unauthorized: the proxy serves only the task's agent: send Authorization: Bearer \
             <the token in the file ORCHESTRATOR_MCP_TOKEN_FILE names>\n"
        }
        Access::Read => {
            "Unauthorized: send Authorization: Bearer <the agent's token, or the auditors' token \
             from the namespace's Secret orchestrator-task-auditor>\n"
        }
    };
    let mut response = (StatusCode::UNAUTHORIZED, why).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"orchestrator-mcp-proxy\""),
    );
    response
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// reader sees the old contents or the new, never a part; mode 0640.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    // The umask may have taken bits away from the mode asked for at creation.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o640))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(auth: Option<&str>) -> Request {
        let mut builder = Request::builder().uri("/mcp");
        if let Some(a) = auth {
            builder = builder.header(header::AUTHORIZATION, a);
        }
        builder.body(axum::body::Body::empty()).expect("a request")
    }

    #[test]
    fn the_agents_token_is_created_once_kept_across_restarts_and_readable_by_the_group_only() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("token");
        let first = AgentToken::load_or_create(&path).expect("created");
        let text = std::fs::read_to_string(&path).expect("written");
        assert_eq!(text.len(), 64);
        assert!(text.bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        // A restarted proxy reads the same token.
        let again = AgentToken::load_or_create(&path).expect("read");
        assert_eq!(first.0, again.0);
        // A file that is not a token is replaced by a new one.
        std::fs::write(&path, "guessable").expect("write");
        let new = AgentToken::load_or_create(&path).expect("replaced");
        assert_ne!(&*new.0, b"guessable");
        assert_ne!(first.0, new.0);
    }

    #[test]
    fn only_the_agents_token_calls_and_the_auditors_only_reads() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let agent = AgentToken::load_or_create(&dir.path().join("agent")).expect("agent");
        let agent_text = String::from_utf8(agent.0.to_vec()).expect("hex");
        let auditor_path = dir.path().join("auditor");
        let auditor_text = "a".repeat(40);
        std::fs::write(&auditor_path, format!("{auditor_text}\n")).expect("write");
        let auth = ClientAuth::new(Some(agent), Some(AuditorToken::new(auditor_path.clone())));
        let bearer_of = |t: &str| format!("Bearer {t}");
        let allows = |header: Option<String>, access| {
            let r = request(header.as_deref());
            auth.allows(bearer(&r), access)
        };
        assert!(allows(Some(bearer_of(&agent_text)), Access::Call));
        assert!(allows(Some(bearer_of(&agent_text)), Access::Read));
        assert!(allows(Some(format!("bearer  {agent_text}")), Access::Call));
        assert!(allows(Some(bearer_of(&auditor_text)), Access::Read));
        assert!(!allows(Some(bearer_of(&auditor_text)), Access::Call));
        for refused in [
            None,
            Some(String::new()),
            Some("Bearer".into()),
            Some(bearer_of("")),
            Some(bearer_of(&agent_text[..63])),
            Some(format!("Basic {agent_text}")),
            Some(agent_text.clone()),
        ] {
            assert!(!allows(refused.clone(), Access::Read), "{refused:?}");
            assert!(!allows(refused.clone(), Access::Call), "{refused:?}");
        }
        // Two Authorization headers are refused, whichever holds the token.
        let two = Request::builder()
            .uri("/mcp")
            .header(header::AUTHORIZATION, bearer_of("nope"))
            .header(header::AUTHORIZATION, bearer_of(&agent_text))
            .body(axum::body::Body::empty())
            .expect("request");
        assert!(!auth.allows(bearer(&two), Access::Call));
        // A rotated auditor Secret is taken at once; a short one is no credential.
        std::fs::write(&auditor_path, "b".repeat(40)).expect("rotate");
        assert!(!allows(Some(bearer_of(&auditor_text)), Access::Read));
        assert!(allows(Some(bearer_of(&"b".repeat(40))), Access::Read));
        std::fs::write(&auditor_path, "short").expect("short");
        assert!(!allows(Some(bearer_of("short")), Access::Read));
        std::fs::remove_file(&auditor_path).expect("rm");
        assert!(!allows(Some(bearer_of(&"b".repeat(40))), Access::Read));
    }

    #[test]
    fn without_credentials_configured_the_front_is_open() {
        let auth = ClientAuth::default();
        assert!(auth.is_open());
        assert!(auth.allows(None, Access::Call));
    }

    #[test]
    fn the_model_takes_the_token_as_any_runtime_sends_its_key_and_mcp_only_as_a_bearer() {
        let with = |name: &str, value: &str| {
            Request::builder()
                .uri("/model/v1beta/models/gemini-2.5-pro:streamGenerateContent")
                .header(name, value)
                .body(axum::body::Body::empty())
                .expect("request")
        };
        for (name, value) in [
            ("authorization", "Bearer agent-token"),
            ("x-api-key", "agent-token"),
            ("x-goog-api-key", "agent-token"),
        ] {
            let r = with(name, value);
            assert_eq!(
                presented(&r, Access::Model),
                Some(&b"agent-token"[..]),
                "{name}"
            );
        }
        // The API-key headers open the model only: /mcp and the reading endpoints want a bearer.
        for name in ["x-api-key", "x-goog-api-key"] {
            let r = with(name, "agent-token");
            assert_eq!(presented(&r, Access::Call), None, "{name}");
            assert_eq!(presented(&r, Access::Read), None, "{name}");
        }
        // Two keys of one kind: neither is taken.
        let two = Request::builder()
            .uri("/model/v1/x")
            .header("x-goog-api-key", "nope")
            .header("x-goog-api-key", "agent-token")
            .body(axum::body::Body::empty())
            .expect("request");
        assert_eq!(presented(&two, Access::Model), None);
    }
}
