//! Stdio upstreams: the child process. Owns spawning with a controlled environment, watching
//! for exit (the one place that reaps it), keeping the tail of its stderr for error messages,
//! and terminating its whole process group (TERM, then KILL after a grace period).
//!
//! A server with `socket` (sidecar mode) or `zonePort` (shared mode, over TCP with the zone's
//! key) runs in its own container instead (its zone, see `zoned`): the zone starts the process
//! and hands over its streams, and signals and the exit status go over the connection. Everything else (the pipes rmcp speaks over, the stderr tail, the exit watch,
//! terminate) is the same for both.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    process::Command,
    sync::{mpsc, watch},
};

use super::{
    guard::{self, Guard},
    shared::Shared,
    stderr, zoned,
};
use crate::{
    config::StdioTransport,
    error::{Error, Result},
    names::ServerName,
    sync::lock,
    zone::{auth::ZoneKey, protocol::SignalName},
};

/// Variables every child gets from the proxy's environment (when set), so ordinary programs
/// work. Nothing else is inherited: secrets only arrive through `passEnv`.
pub const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

/// How long a zone may take to report the exit of a process it was told to kill.
const ZONE_EXIT_WAIT: Duration = Duration::from_secs(5);

/// How a child ended.
#[derive(Clone, Debug)]
pub struct ExitInfo {
    pub status: String,
}

/// A running (or exited) child process. Dropping it kills its process group (unless
/// [`Child::terminate`] already did): a start that is abandoned takes its processes with it.
pub struct Child {
    /// The pid (for a zoned server, in its zone's PID namespace).
    pub pid: u32,
    server: ServerName,
    exit: watch::Receiver<Option<ExitInfo>>,
    stderr_tail: stderr::Tail,
    control: Control,
    /// Set once the group got SIGKILL.
    killed: AtomicBool,
}

/// How a process is signalled.
enum Control {
    /// The proxy's own child: by process group, and announced to the guardian.
    Group(Option<Arc<Guard>>),
    /// A process in the server's zone: through its connection (dropping the sender closes it,
    /// and the zone ends the group).
    Zone(mpsc::UnboundedSender<SignalName>),
}

/// The process's stdout, which rmcp reads.
pub type Stdout = Box<dyn AsyncRead + Send + Unpin>;
/// The process's stdin, which rmcp writes.
pub type Stdin = Box<dyn AsyncWrite + Send + Unpin>;

/// A freshly spawned child and the pipes rmcp speaks MCP over.
pub struct Spawned {
    pub child: Child,
    pub stdout: Stdout,
    pub stdin: Stdin,
}

/// The environment a child gets: the base variables, then `passEnv` from the proxy's own
/// environment, then the literal `env` (which wins). Returns the names of `passEnv` variables
/// that are not set in the proxy's environment.
pub fn child_env(spec: &StdioTransport) -> (BTreeMap<String, String>, Vec<String>) {
    let mut env = BTreeMap::new();
    for name in BASE_ENV {
        if let Ok(value) = std::env::var(name) {
            env.insert((*name).to_string(), value);
        }
    }
    let mut missing = Vec::new();
    for name in &spec.pass_env {
        match std::env::var(name) {
            Ok(value) => {
                env.insert(name.clone(), value);
            }
            Err(_) => missing.push(name.clone()),
        }
    }
    for (name, value) in &spec.env {
        env.insert(name.clone(), value.clone());
    }
    (env, missing)
}

/// The command that starts `spec`: through the proxy's own binary (`exec-upstream`), which
/// arms a parent-death signal and then becomes the server (see `guard`); directly when the
/// binary cannot be found.
fn command(spec: &StdioTransport) -> Command {
    static SELF: OnceLock<Option<PathBuf>> = OnceLock::new();
    let launcher = SELF.get_or_init(|| match std::env::current_exe() {
        Ok(exe) => Some(exe),
        Err(e) => {
            tracing::warn!(error = %e, "cannot find the proxy's own binary; upstreams start without a parent-death signal");
            None
        }
    });
    match launcher {
        Some(exe) => {
            let mut cmd = Command::new(exe);
            cmd.arg(guard::EXEC_UPSTREAM)
                .arg(std::process::id().to_string())
                .arg("--")
                .arg(&spec.command)
                .args(&spec.args);
            cmd
        }
        None => {
            let mut cmd = Command::new(&spec.command);
            cmd.args(&spec.args);
            cmd
        }
    }
}

/// Starts the server's process: in its zone when it has a `socket` (sidecar mode; the zone
/// checked to be of `zoneUid` and to name this server, see `zoned::start`) or a
/// `zonePort` (shared mode: on the task pod's IP, `shared.zone_host`, with the key read from
/// the task's Secret), else as the proxy's child (`pod` names this pod in what a failure says).
pub async fn spawn(
    server: &ServerName,
    spec: &StdioTransport,
    guard: Option<&Arc<Guard>>,
    pod: Option<&str>,
    shared: &Shared,
) -> Result<Spawned> {
    if let Some(port) = spec.zone_port {
        let target = tcp_target(server, spec, port, shared)?;
        // The zone is in the task's pod, not this one (the shared proxy's): name that one.
        return spawn_in_zone(server, &target, Some("<the task's pod>")).await;
    }
    match (&spec.socket, spec.zone_uid) {
        (Some(socket), Some(uid)) => {
            let target = zoned::ZoneTarget::Unix {
                socket: socket.clone(),
                uid,
            };
            spawn_in_zone(server, &target, pod).await
        }
        // The config's check refuses a socket without its zone's uid: never started blind.
        (Some(_), None) => Err(Error::StartFailed {
            server: server.clone(),
            reason: format!(
                "server {server} has stdio.socket but no stdio.zoneUid: the proxy starts a \
                 zoned server only in a zone of a known uid"
            ),
        }),
        (None, _) => spawn_child(server, spec, guard),
    }
}

/// Where the zone of a server with `zonePort` listens, and its key.
fn tcp_target(
    server: &ServerName,
    spec: &StdioTransport,
    port: u16,
    shared: &Shared,
) -> Result<zoned::ZoneTarget> {
    let failed = |reason: String| Error::StartFailed {
        server: server.clone(),
        reason,
    };
    let host = shared.zone_host().ok_or_else(|| {
        failed(format!(
            "server {server}'s zone listens on the task pod's IP, which is not known yet (the \
             task's ConfigMap has no pod IP annotation); retry once the pod runs"
        ))
    })?;
    let at = spec.zone_key.as_ref().ok_or_else(|| {
        failed(format!(
            "server {server} has stdio.zonePort but no stdio.zoneKey: the zone's key is needed"
        ))
    })?;
    let text = shared.secrets().get(&at.name, &at.key).ok_or_else(|| {
        failed(format!(
            "server {server}'s zone key (key {} of the task's Secret {}) could not be read (does \
             it exist, and may the task's Role get it?)",
            at.key, at.name
        ))
    })?;
    let key = ZoneKey::from_hex(text.as_bytes()).map_err(|e| {
        failed(format!(
            "server {server}'s zone key (key {} of the task's Secret {}): {e}",
            at.key, at.name
        ))
    })?;
    Ok(zoned::ZoneTarget::Tcp {
        addr: SocketAddr::new(host, port),
        key,
    })
}

/// Has the zone at `target` start the process, and takes over its streams.
async fn spawn_in_zone(
    server: &ServerName,
    target: &zoned::ZoneTarget,
    pod: Option<&str>,
) -> Result<Spawned> {
    let zoned::Streams {
        pid,
        stdin,
        stdout,
        stderr,
        control,
    } = zoned::connect(server, target, pod).await?;
    let (signals_tx, signals_rx) = mpsc::unbounded_channel();
    let (exit_tx, exit_rx) = watch::channel(None);
    let child = Child {
        pid,
        server: server.clone(),
        exit: exit_rx,
        stderr_tail: Arc::default(),
        control: Control::Zone(signals_tx),
        killed: AtomicBool::new(false),
    };
    tokio::spawn(stderr::drain(
        stderr,
        server.clone(),
        child.stderr_tail.clone(),
    ));
    control.supervise(server.clone(), signals_rx, move |status| {
        let _ = exit_tx.send(Some(ExitInfo { status }));
    });
    Ok(Spawned {
        child,
        stdout,
        stdin,
    })
}

/// Spawns the server's command in its own process group with exactly [`child_env`]; the group
/// is announced to `guard`, if any.
fn spawn_child(
    server: &ServerName,
    spec: &StdioTransport,
    guard: Option<&Arc<Guard>>,
) -> Result<Spawned> {
    let (env, missing) = child_env(spec);
    if !missing.is_empty() {
        tracing::warn!(%server, missing = ?missing, "passEnv variables are not set in the proxy's environment; the server starts without them");
    }
    let mut cmd = command(spec);
    cmd.env_clear()
        .envs(&env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so TERM/KILL reach whatever the command spawns (npx -> node).
        .process_group(0)
        // Backstop if the monitor task is gone (runtime shutdown): never leave it running.
        .kill_on_drop(true);
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn().map_err(|e| Error::StartFailed {
        server: server.clone(),
        reason: format!("cannot run {:?}: {e}", spec.command),
    })?;
    let pid = child.id().ok_or_else(|| Error::StartFailed {
        server: server.clone(),
        reason: "the process exited immediately".into(),
    })?;
    crate::reaper::track(pid);
    // From here on the group is killed when `Child` is dropped (a start that is given up).
    if let Some(guard) = guard {
        guard.watch(pid);
    }
    let child_handle = Child {
        pid,
        server: server.clone(),
        exit: watch::channel(None).1,
        stderr_tail: Arc::default(),
        control: Control::Group(guard.cloned()),
        killed: AtomicBool::new(false),
    };
    let (Some(stdin), Some(stdout), stderr) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(Error::StartFailed {
            server: server.clone(),
            reason: "no stdio pipes".into(),
        });
    };

    let mut child_handle = child_handle;
    if let Some(stderr) = stderr {
        tokio::spawn(stderr::drain(
            stderr,
            server.clone(),
            child_handle.stderr_tail.clone(),
        ));
    }

    let (exit_tx, exit_rx) = watch::channel(None);
    child_handle.exit = exit_rx;
    {
        let server = server.clone();
        tokio::spawn(async move {
            // The only place the child is waited for: it is reaped exactly once, here.
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => format!("unknown status ({e})"),
            };
            crate::reaper::untrack(pid);
            tracing::info!(%server, pid, %status, "upstream process exited");
            let _ = exit_tx.send(Some(ExitInfo { status }));
        });
    }
    Ok(Spawned {
        child: child_handle,
        stdout: Box::new(stdout),
        stdin: Box::new(stdin),
    })
}

impl Child {
    /// How the process ended, once it has.
    pub fn exit_info(&self) -> Option<ExitInfo> {
        self.exit.borrow().clone()
    }

    /// Waits until the process has exited.
    pub async fn exited(&self) -> ExitInfo {
        let mut rx = self.exit.clone();
        loop {
            if let Some(info) = rx.borrow_and_update().clone() {
                return info;
            }
            if rx.changed().await.is_err() {
                return ExitInfo {
                    status: "unknown status (monitor gone)".into(),
                };
            }
        }
    }

    /// The last lines the process wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        lock(&self.stderr_tail).iter().cloned().collect()
    }

    /// Whether the process is still running (not yet exited and reaped).
    pub fn is_running(&self) -> bool {
        self.exit_info().is_none()
    }

    /// Ends the process group: TERM, and KILL if the process is still there after `grace`.
    pub async fn terminate(&self, grace: Duration) {
        if self.exit_info().is_none() {
            self.signal(Signal::TERM);
            if tokio::time::timeout(grace, self.exited()).await.is_err() {
                tracing::warn!(server = %self.server, pid = self.pid, "upstream ignored SIGTERM; killing it");
            }
        }
        // Always KILL the group: the leader may be gone while its children linger.
        self.kill_group();
        match &self.control {
            Control::Group(_) => {
                self.exited().await;
            }
            // The kernel does not guarantee this one: a zone that does not report the exit is
            // not waited for forever (dropping the connection still ends the group there).
            Control::Zone(_) => {
                if tokio::time::timeout(ZONE_EXIT_WAIT, self.exited())
                    .await
                    .is_err()
                {
                    tracing::warn!(server = %self.server, pid = self.pid, "the server's container did not report the exit of its process; giving up on it");
                }
            }
        }
    }

    fn kill_group(&self) {
        if self.killed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.signal(Signal::KILL);
        if let Control::Group(Some(guard)) = &self.control {
            guard.forget(self.pid);
        }
    }

    fn signal(&self, signal: Signal) {
        match &self.control {
            Control::Group(_) => {
                let Some(pgid) = i32::try_from(self.pid).ok().and_then(Pid::from_raw) else {
                    return;
                };
                // ESRCH (group already gone) is the normal case after exit.
                let _ = kill_process_group(pgid, signal);
            }
            Control::Zone(signals) => {
                let name = if signal == Signal::KILL {
                    SignalName::Kill
                } else {
                    SignalName::Term
                };
                // A closed channel: the process has exited and the connection is gone.
                let _ = signals.send(name);
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill_group();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_get_the_base_pass_env_and_literal_env_only() {
        // The passEnv names are not set in the test environment: they are reported missing.
        let spec = StdioTransport {
            command: "x".into(),
            args: vec![],
            env: BTreeMap::from([
                ("LITERAL".into(), "v".into()),
                ("HOME".into(), "/override".into()),
            ]),
            pass_env: vec![
                "ORCH_TEST_PASSED_SECRET".into(),
                "ORCH_TEST_NOT_SET_ANYWHERE".into(),
            ],
            cwd: None,
            socket: None,
            zone_uid: None,
            zone_port: None,
            zone_key: None,
        };
        let (env, missing) = child_env(&spec);
        assert_eq!(env.get("LITERAL").map(String::as_str), Some("v"));
        assert_eq!(
            env.get("HOME").map(String::as_str),
            Some("/override"),
            "literal env wins"
        );
        assert_eq!(
            missing,
            vec![
                "ORCH_TEST_PASSED_SECRET".to_string(),
                "ORCH_TEST_NOT_SET_ANYWHERE".to_string()
            ]
        );
        let allowed: Vec<&str> = BASE_ENV.iter().copied().chain(["LITERAL"]).collect();
        for name in env.keys() {
            assert!(
                allowed.contains(&name.as_str()),
                "{name} leaked into the child env"
            );
        }
    }

    /// Shared mode: the zone's address is the task pod's IP (the ConfigMap's annotation, kept
    /// in `Shared`) at `zonePort`, its key the task's Secret value; without either, the start
    /// fails naming what is missing.
    #[test]
    fn a_zone_over_tcp_is_the_pod_ip_at_its_port_with_the_key_from_the_tasks_secret() {
        let server = ServerName::new("memory");
        let hex = "ab".repeat(32);
        let spec = StdioTransport {
            command: "node".into(),
            args: vec![],
            env: BTreeMap::new(),
            pass_env: vec![],
            cwd: None,
            socket: None,
            zone_uid: None,
            zone_port: Some(9101),
            zone_key: Some(orchestrator_crds::proxy::SecretKey {
                name: "fix-1-zone-keys".into(),
                key: "memory".into(),
            }),
        };
        let shared = Shared::default();
        let failure = |shared: &Shared| match tcp_target(&server, &spec, 9101, shared) {
            Err(Error::StartFailed { reason, .. }) => reason,
            other => panic!(
                "expected a failed start, got {:?}",
                other.map(|t| t.to_string())
            ),
        };
        assert!(failure(&shared).contains("pod's IP, which is not known yet"));
        shared.set_zone_host(Some("10.244.0.17".parse().expect("an IP")));
        assert!(
            failure(&shared).contains("key memory of the task's Secret fix-1-zone-keys"),
            "{}",
            failure(&shared)
        );
        shared.secrets().replace(
            [(
                ("fix-1-zone-keys".to_string(), "memory".to_string()),
                "short".to_string(),
            )]
            .into(),
        );
        assert!(
            failure(&shared).contains("zone key"),
            "{}",
            failure(&shared)
        );
        shared.secrets().replace(
            [(
                ("fix-1-zone-keys".to_string(), "memory".to_string()),
                format!("{hex}\n"),
            )]
            .into(),
        );
        let Ok(zoned::ZoneTarget::Tcp { addr, key }) = tcp_target(&server, &spec, 9101, &shared)
        else {
            panic!("a TCP zone");
        };
        assert_eq!(addr.to_string(), "10.244.0.17:9101");
        let expected = ZoneKey::from_hex(hex.as_bytes()).expect("a key");
        assert_eq!(
            key.proof(b"nonce", b"label", "memory"),
            expected.proof(b"nonce", b"label", "memory")
        );
    }
}
