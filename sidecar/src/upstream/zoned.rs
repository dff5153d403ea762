//! The proxy's end of a zone: a stdio server whose process runs in its own container, started
//! there by `orchestrator-mcp-proxy zone` (see `crate::zone`). Connects to the zone (a
//! [`ZoneTarget`]), asks for a process, and gets its stdin, stdout and stderr; from then on the
//! connection carries the signals the proxy asks for one way and the exit status the other.
//! Over the unix socket the zone hands over the process's pipe ends themselves; over TCP
//! (`zone_tcp`, shared mode) the pipes travel as frames and come out as in-memory pipes.

use std::{
    fmt,
    net::SocketAddr,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{UnixStream, unix::pipe},
    sync::mpsc,
};

use super::zone_tcp;
use crate::{
    error::{Error, Result},
    names::ServerName,
    zone::{
        auth::ZoneKey,
        protocol::{self, Event, FDS, Lines, Request, SignalName, VERSION},
    },
};

/// How long the zone may take to accept the connection, and then to start the process.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a server's zone listens.
#[derive(Clone, Debug)]
pub enum ZoneTarget {
    /// The zone's unix socket, in a volume the proxy's container shares (sidecar mode).
    Unix(PathBuf),
    /// The zone's TCP address in the task's pod, and its key (shared mode).
    Tcp { addr: SocketAddr, key: ZoneKey },
}

impl fmt::Display for ZoneTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZoneTarget::Unix(path) => write!(f, "{}", path.display()),
            ZoneTarget::Tcp { addr, .. } => write!(f, "{addr}"),
        }
    }
}

/// A process the zone started for us, whatever the transport: the streams `stdio` speaks over
/// (as a child's pipes), and the connection that controls it.
pub struct Streams {
    /// Its pid in the zone's PID namespace (for logs and `/tools`).
    pub pid: u32,
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    pub control: Control,
}

/// A process the zone started for us over its socket: its pipes, and the connection that
/// controls it.
pub struct Started {
    /// Its pid in the zone's PID namespace (for logs and `/tools`).
    pub pid: u32,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub control: Control,
}

/// The connection a process was started on.
pub struct Control(Transport);

enum Transport {
    Socket {
        pid: u32,
        stream: UnixStream,
        lines: Lines,
    },
    Tcp(zone_tcp::Control),
}

/// Connects to the zone at `target` and has it start the server's process (`pod` names this
/// pod in what a failure says).
pub async fn connect(
    server: &ServerName,
    target: &ZoneTarget,
    pod: Option<&str>,
) -> Result<Streams> {
    let failed = |what: String| Error::StartFailed {
        server: server.clone(),
        reason: format!("{what}; {}", its_log(server, pod)),
    };
    match target {
        ZoneTarget::Unix(socket) => {
            let Started {
                pid,
                stdin,
                stdout,
                stderr,
                control,
            } = start(server, socket, pod).await?;
            let pipes = |e: std::io::Error| {
                failed(format!(
                    "server {server}'s container handed over unusable pipes: {e}"
                ))
            };
            Ok(Streams {
                pid,
                stdin: Box::new(pipe::Sender::from_owned_fd(stdin).map_err(pipes)?),
                stdout: Box::new(pipe::Receiver::from_owned_fd(stdout).map_err(pipes)?),
                stderr: Box::new(pipe::Receiver::from_owned_fd(stderr).map_err(pipes)?),
                control,
            })
        }
        ZoneTarget::Tcp { addr, key } => {
            let started = tokio::time::timeout(
                CONNECT_TIMEOUT + REPLY_TIMEOUT,
                zone_tcp::start(server.as_str(), *addr, key, CONNECT_TIMEOUT),
            )
            .await;
            match started {
                Ok(Ok(started)) => Ok(Streams {
                    pid: started.pid,
                    stdin: Box::new(started.stdin),
                    stdout: Box::new(started.stdout),
                    stderr: Box::new(started.stderr),
                    control: Control(Transport::Tcp(started.control)),
                }),
                Ok(Err(zone_tcp::Failure::Unreachable(why))) => Err(failed(format!(
                    "server {server}'s container is not accepting connections on {addr} ({})",
                    plain_text(&why)
                ))),
                Ok(Err(zone_tcp::Failure::Refused(why))) => {
                    Err(failed(format!("server {server}'s container {why}")))
                }
                Err(_) => Err(failed(format!(
                    "server {server}'s container at {addr} did not start the process within {}s",
                    (CONNECT_TIMEOUT + REPLY_TIMEOUT).as_secs()
                ))),
            }
        }
    }
}

/// Where the zone's own log is, for error messages.
fn its_log(server: &ServerName, pod: Option<&str>) -> String {
    let pod = pod.unwrap_or("<this pod>");
    format!("its log: kubectl logs {pod} -c zone-{server}")
}

/// An OS error without its "(os error N)" suffix.
fn plain(e: &std::io::Error) -> String {
    plain_text(&e.to_string())
}

fn plain_text(text: &str) -> String {
    match text.split_once(" (os error ") {
        Some((plain, _)) => plain.to_string(),
        None => text.to_string(),
    }
}

/// Connects to the zone at `socket` and has it start the server's process.
pub async fn start(server: &ServerName, socket: &Path, pod: Option<&str>) -> Result<Started> {
    let failed = |what: String| Error::StartFailed {
        server: server.clone(),
        reason: format!("{what}; {}", its_log(server, pod)),
    };
    let unreachable = |why: String| {
        failed(format!(
            "server {server}'s container is not accepting connections on {} ({why})",
            socket.display()
        ))
    };
    let control = match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(socket)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(unreachable(plain(&e))),
        Err(_) => {
            return Err(unreachable(format!(
                "no answer within {}s",
                CONNECT_TIMEOUT.as_secs()
            )));
        }
    };
    match tokio::time::timeout(REPLY_TIMEOUT, request(control)).await {
        Ok(Ok(started)) => Ok(started),
        Ok(Err(why)) => Err(failed(format!("server {server}'s container {why}"))),
        Err(_) => Err(failed(format!(
            "server {server}'s container did not start the process within {}s",
            REPLY_TIMEOUT.as_secs()
        ))),
    }
}

/// The start request and its answer; `Err` says what the zone did instead.
async fn request(control: UnixStream) -> std::result::Result<Started, String> {
    // A zone that refuses the peer says why and closes without reading: the request may then
    // fail to go out (EPIPE), and the answer is still there to read.
    let sent = protocol::send(&control, &Request::Start { v: VERSION }).await;
    let mut lines = Lines::default();
    let (line, fds) = lines
        .next_with_fds(&control)
        .await
        .map_err(|e| format!("answered the start request unreadably ({e})"))?;
    let Some(line) = line else {
        return Err(match sent {
            Err(e) => format!("closed the connection ({})", plain(&e)),
            Ok(()) => "closed the connection without starting the process".into(),
        });
    };
    match protocol::parse::<Event>(&line) {
        Ok(Event::Started { pid, .. }) => {
            let Ok([stdin, stdout, stderr]) = <[OwnedFd; FDS]>::try_from(fds) else {
                return Err(format!(
                    "started process {pid} but did not hand over its {FDS} pipes"
                ));
            };
            Ok(Started {
                pid,
                stdin,
                stdout,
                stderr,
                control: Control(Transport::Socket {
                    pid,
                    stream: control,
                    lines,
                }),
            })
        }
        Ok(Event::Error { message }) => Err(format!("did not start the process: {message}")),
        Ok(other) => Err(format!("answered the start request with {other:?}")),
        Err(e) => Err(format!("answered the start request unreadably ({e})")),
    }
}

impl Control {
    /// Relays `signals` to the zone and hands the exit status to `exited`, until the process
    /// exits or `signals` is closed (the `Child` is gone): closing the connection then makes the
    /// zone end the process group.
    pub fn supervise(
        self,
        server: ServerName,
        mut signals: mpsc::UnboundedReceiver<SignalName>,
        exited: impl FnOnce(String) + Send + 'static,
    ) {
        let (pid, stream, mut lines) = match self.0 {
            Transport::Socket { pid, stream, lines } => (pid, stream, lines),
            Transport::Tcp(control) => {
                return control.supervise(server.to_string(), signals, exited);
            }
        };
        tokio::spawn(async move {
            let status = loop {
                tokio::select! {
                    line = lines.next(&stream) => break match line {
                        Ok(Some(line)) => match protocol::parse::<Event>(&line) {
                            Ok(Event::Exit { status }) => status,
                            Ok(other) => format!("unknown status (its container said {other:?})"),
                            Err(e) => format!("unknown status (its container said something unreadable: {e})"),
                        },
                        Ok(None) => "unknown status (its container closed the connection)".into(),
                        Err(e) => format!("unknown status (the connection to its container failed: {e})"),
                    },
                    signal = signals.recv() => match signal {
                        Some(signal) => {
                            if let Err(e) = protocol::send(&stream, &Request::Signal { signal }).await {
                                tracing::debug!(%server, pid, error = %e, "cannot pass a signal to the zone");
                            }
                        }
                        None => return,
                    },
                }
            };
            tracing::info!(%server, pid, %status, "upstream process exited");
            exited(status);
        });
    }
}

#[cfg(test)]
mod tcp_tests;

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, sync::Arc};

    use tokio::{
        io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
        net::unix::pipe,
        sync::oneshot,
        task::JoinHandle,
    };

    use super::*;
    use crate::zone::{self, ZoneOptions};

    /// A zone serving `sh -c SCRIPT` on a socket in `dir`; send on the sender to stop it.
    fn zone_with(
        dir: &Path,
        peer_uid: Option<u32>,
        script: &str,
    ) -> (PathBuf, oneshot::Sender<()>, JoinHandle<()>) {
        let socket = dir.join("mcp.sock");
        let listener = zone::bind(&socket).expect("the socket binds");
        let options = ZoneOptions {
            listen: zone::Listen::Socket(socket.clone()),
            peer_uid,
            grace: Duration::from_secs(1),
            command: "sh".into(),
            args: vec!["-c".into(), script.into()],
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(zone::serve(listener, Arc::new(options), async move {
            let _ = stopped.await;
        }));
        (socket, stop, task)
    }

    async fn exit_of(started: Started, signal: Option<SignalName>) -> String {
        let (signals, signals_rx) = mpsc::unbounded_channel();
        let (exit, mut exit_rx) = tokio::sync::watch::channel(None);
        started
            .control
            .supervise(ServerName::new("git"), signals_rx, move |status| {
                let _ = exit.send(Some(status));
            });
        if let Some(signal) = signal {
            signals.send(signal).expect("supervised");
        }
        let info = tokio::time::timeout(Duration::from_secs(10), exit_rx.wait_for(|e| e.is_some()))
            .await
            .expect("the exit arrives")
            .expect("the watch stays")
            .clone();
        info.expect("an exit")
    }

    fn gone(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |stat| stat.contains(") Z "))
    }

    #[tokio::test]
    async fn the_zone_hands_over_the_pipes_and_reports_the_exit_and_signals_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = r#"read line; echo "got $line"; echo "a complaint" >&2; read again; exit 3"#;
        let (socket, stop, zone) = zone_with(dir.path(), None, script);
        let server = ServerName::new("git");

        let started = start(&server, &socket, Some("pod-x"))
            .await
            .expect("started");
        let mut stdin = pipe::Sender::from_owned_fd(started.stdin.try_clone().expect("dup"))
            .expect("stdin is a pipe");
        let stdout = pipe::Receiver::from_owned_fd(started.stdout.try_clone().expect("dup"))
            .expect("stdout is a pipe");
        let stderr = pipe::Receiver::from_owned_fd(started.stderr.try_clone().expect("dup"))
            .expect("stderr is a pipe");
        stdin.write_all(b"hello\n").await.expect("written");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("read");
        assert_eq!(line, "got hello\n");
        let mut complaint = String::new();
        BufReader::new(stderr)
            .read_line(&mut complaint)
            .await
            .expect("read");
        assert_eq!(complaint, "a complaint\n");
        stdin.write_all(b"done\n").await.expect("written");
        assert_eq!(exit_of(started, None).await, "exit status: 3");

        // Several processes at once, each its own; a signal reaches the group.
        let first = start(&server, &socket, None).await.expect("started");
        let second = start(&server, &socket, None).await.expect("started");
        assert_ne!(first.pid, second.pid);
        assert!(
            exit_of(first, Some(SignalName::Kill))
                .await
                .starts_with("signal: 9")
        );
        // A connection the proxy drops (its `Child` is gone) ends the process.
        let pid = second.pid;
        drop(second);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !gone(pid) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{pid} outlived its connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // The zone stops with a process running: it ends it and returns.
        let running = start(&server, &socket, None).await.expect("started");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), zone)
            .await
            .expect("the zone stops within its grace")
            .expect("the zone task");
        assert!(exit_of(running, None).await.starts_with("signal: 15"));
    }

    #[tokio::test]
    async fn a_refused_peer_and_a_missing_zone_say_what_happened_and_where_to_look() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other_uid = rustix::process::getuid().as_raw() + 1;
        let (socket, _stop, _zone) = zone_with(dir.path(), Some(other_uid), "exit 0");
        let server = ServerName::new("git");
        let Err(Error::StartFailed { reason, .. }) = start(&server, &socket, Some("pod-x")).await
        else {
            panic!("a peer of another uid is refused");
        };
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(
            reason,
            format!(
                "server git's container did not start the process: refused: peer uid {uid} may \
                 not start this server; its log: kubectl logs pod-x -c zone-git"
            )
        );

        let missing = dir.path().join("nobody/mcp.sock");
        let Err(Error::StartFailed { reason, .. }) = start(&server, &missing, None).await else {
            panic!("nothing listens there");
        };
        assert_eq!(
            reason,
            format!(
                "server git's container is not accepting connections on {} (No such file or \
                 directory); its log: kubectl logs <this pod> -c zone-git",
                missing.display()
            )
        );
    }
}
