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
    /// The zone's unix socket, in a volume the proxy's container shares (sidecar mode), and the
    /// uid the zone runs as: the socket's owner and the peer on it must be that uid.
    Unix { socket: PathBuf, uid: u32 },
    /// The zone's TCP address in the task's pod, and its key (shared mode).
    Tcp { addr: SocketAddr, key: ZoneKey },
}

impl fmt::Display for ZoneTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZoneTarget::Unix { socket, .. } => write!(f, "{}", socket.display()),
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
        ZoneTarget::Unix { socket, uid } => {
            let Started {
                pid,
                stdin,
                stdout,
                stderr,
                control,
            } = start(server, socket, *uid, pod).await?;
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

/// Connects to the zone at `socket`, which must be server `server`'s zone (uid `uid`), and has
/// it start the server's process. Before anything is asked of it: `socket` is the socket itself
/// (not a symbolic link) and owned by `uid`, the peer that accepts the connection is of `uid`
/// (`SO_PEERCRED`; a link put there after the first check leads to a peer of another uid), and
/// the zone's hello names `server`. A server's process can write its socket's directory; these
/// are what keep it from sending the proxy to another server's zone, which would start its own
/// server, with its own Secrets, under this server's name, patterns and rules.
pub async fn start(
    server: &ServerName,
    socket: &Path,
    uid: u32,
    pod: Option<&str>,
) -> Result<Started> {
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
    let refused = |why: String| {
        tracing::warn!(
            %server,
            socket = %socket.display(),
            zone_uid = uid,
            "refused to start the server: {why}; nothing was started"
        );
        failed(format!(
            "refused to start server {server}: {why}; nothing was started"
        ))
    };
    match is_the_zones_socket(socket, uid) {
        Ok(()) => {}
        Err(Check::Unreachable(e)) => return Err(unreachable(plain(&e))),
        Err(Check::Wrong(why)) => return Err(refused(why)),
    }
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
    // Who accepted: the zone's launcher runs as the zone's uid, any other zone's as its own.
    match control.peer_cred().map(|peer| peer.uid()) {
        Ok(peer) if peer == uid => {}
        Ok(peer) => {
            return Err(refused(format!(
                "the peer on {} is uid {peer}, not server {server}'s zone (uid {uid})",
                socket.display()
            )));
        }
        Err(e) => {
            return Err(refused(format!(
                "the peer on {} cannot be identified ({})",
                socket.display(),
                plain(&e)
            )));
        }
    }
    match tokio::time::timeout(REPLY_TIMEOUT, request(control, server, socket)).await {
        Ok(Ok(started)) => Ok(started),
        Ok(Err(Answer::Wrong(why))) => Err(refused(why)),
        Ok(Err(Answer::Said(why))) => Err(failed(format!("server {server}'s container {why}"))),
        Err(_) => Err(failed(format!(
            "server {server}'s container did not start the process within {}s",
            REPLY_TIMEOUT.as_secs()
        ))),
    }
}

/// Why a path is not a zone's socket.
enum Check {
    /// Nothing there, or nothing the proxy may look at: the zone is not (yet) listening.
    Unreachable(std::io::Error),
    /// Something there that is not the zone's socket.
    Wrong(String),
}

/// Whether `socket` is a socket owned by `uid` (by its own metadata: a symbolic link is not
/// followed).
fn is_the_zones_socket(socket: &Path, uid: u32) -> std::result::Result<(), Check> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::symlink_metadata(socket).map_err(Check::Unreachable)?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        let to = std::fs::read_link(socket)
            .map(|to| format!(" to {}", to.display()))
            .unwrap_or_default();
        return Err(Check::Wrong(format!(
            "{} is a symbolic link{to}, not the zone's socket (a zone binds its socket itself; \
             a link there was made by a process of its container)",
            socket.display()
        )));
    }
    if !kind.is_socket() {
        return Err(Check::Wrong(format!(
            "{} is not a socket (a {})",
            socket.display(),
            kind_name(&kind)
        )));
    }
    if meta.uid() != uid {
        return Err(Check::Wrong(format!(
            "{} is owned by uid {}, not by the zone's uid {uid}",
            socket.display(),
            meta.uid()
        )));
    }
    Ok(())
}

fn kind_name(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_file() {
        "regular file"
    } else if kind.is_fifo() {
        "fifo"
    } else {
        "device"
    }
}

/// What the zone did instead of starting the process.
enum Answer {
    /// It is not server's zone: refused by the proxy, nothing started.
    Wrong(String),
    /// What it said or did (its own refusal, a failure to run the command, a broken line).
    Said(String),
}

/// How long the zone may take to say hello once it accepted the connection.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The zone's hello, then (when it names `server`) the start request and its answer.
async fn request(
    control: UnixStream,
    server: &ServerName,
    socket: &Path,
) -> std::result::Result<Started, Answer> {
    let mut lines = Lines::default();
    let hello = tokio::time::timeout(HELLO_TIMEOUT, lines.next_with_fds(&control))
        .await
        .map_err(|_| {
            Answer::Said(format!(
                "sent no hello within {}s (a zone speaks first since protocol version \
                 {VERSION}: is the container running an older image than the proxy's?)",
                HELLO_TIMEOUT.as_secs()
            ))
        })?;
    let (line, fds) = hello.map_err(|e| Answer::Said(format!("greeted unreadably ({e})")))?;
    let Some(line) = line else {
        return Err(Answer::Said("closed the connection without a word".into()));
    };
    match protocol::parse::<Event>(&line) {
        Ok(Event::Hello { server: theirs, .. }) if theirs == server.as_str() && fds.is_empty() => {}
        Ok(Event::Hello { server: theirs, .. }) if theirs == server.as_str() => {
            return Err(Answer::Wrong(format!(
                "the zone on {} sent descriptors with its hello",
                socket.display()
            )));
        }
        Ok(Event::Hello { server: theirs, .. }) => {
            return Err(Answer::Wrong(format!(
                "the zone on {} is server {theirs:?}'s, not server {server}'s",
                socket.display()
            )));
        }
        // Its own refusal (a peer uid it does not serve, say).
        Ok(Event::Error { message }) => {
            return Err(Answer::Said(format!(
                "did not start the process: {message}"
            )));
        }
        Ok(other) => {
            return Err(Answer::Said(format!(
                "greeted with {other:?} instead of its hello"
            )));
        }
        Err(e) => return Err(Answer::Said(format!("greeted unreadably ({e})"))),
    }
    // A zone that refuses the start says why and closes without reading further: the request
    // may then fail to go out (EPIPE), and the answer is still there to read.
    let start = Request::Start {
        v: VERSION,
        server: server.to_string(),
    };
    let sent = protocol::send(&control, &start).await;
    let said = Answer::Said;
    let (line, fds) = lines
        .next_with_fds(&control)
        .await
        .map_err(|e| said(format!("answered the start request unreadably ({e})")))?;
    let Some(line) = line else {
        return Err(said(match sent {
            Err(e) => format!("closed the connection ({})", plain(&e)),
            Ok(()) => "closed the connection without starting the process".into(),
        }));
    };
    match protocol::parse::<Event>(&line) {
        Ok(Event::Started { pid, .. }) => {
            let Ok([stdin, stdout, stderr]) = <[OwnedFd; FDS]>::try_from(fds) else {
                return Err(said(format!(
                    "started process {pid} but did not hand over its {FDS} pipes"
                )));
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
        Ok(Event::Error { message }) => Err(said(format!("did not start the process: {message}"))),
        Ok(other) => Err(said(format!("answered the start request with {other:?}"))),
        Err(e) => Err(said(format!("answered the start request unreadably ({e})"))),
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
mod socket_tests;
