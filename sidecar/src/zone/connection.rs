//! One connection to the zone: who the peer is, the zone's hello (its server), the peer's start
//! request (for that server), the process it starts, the signals it asks for, and the end of the
//! process group when the process exits, the peer goes away or the zone stops.

use std::{os::fd::AsFd, process::Stdio, sync::Arc, time::Duration};

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::{net::UnixStream, process::Child, sync::mpsc};
use tokio_util::sync::CancellationToken;

use super::{
    ZoneOptions,
    protocol::{self, Event, Lines, Request, SignalName, VERSION},
};

/// How long a peer may take to send its start request.
const REQUEST_WAIT: Duration = Duration::from_secs(10);
/// How long a peer may leave the zone's answer unread.
pub(super) const LAST_WORD_WAIT: Duration = Duration::from_secs(5);

/// Serves one connection to its end. `_alive` is dropped when everything it started has ended.
pub async fn serve(
    stream: UnixStream,
    options: Arc<ZoneOptions>,
    shutdown: CancellationToken,
    _alive: mpsc::Sender<()>,
) {
    // SO_PEERCRED through tokio: across containers (PID namespaces) the peer's pid is 0, which
    // rustix's `UCred` cannot hold (its pid is non-zero by type).
    let peer = match stream.peer_cred() {
        Ok(peer) => peer,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peer's credentials; closing the connection");
            return;
        }
    };
    // 0: the peer is in another PID namespace (the proxy's container).
    let (peer_uid, peer_pid) = (peer.uid(), peer.pid().unwrap_or(0));
    if let Some(allowed) = options.peer_uid
        && peer_uid != allowed
    {
        tracing::warn!(
            peer_uid,
            peer_pid,
            allowed_uid = allowed,
            "refused a connection: only the proxy's uid may start the server"
        );
        let message = format!("refused: peer uid {peer_uid} may not start this server");
        tell(&stream, Event::Error { message }).await;
        return;
    }
    // Who this is, so the proxy can tell it reached the zone it meant (`upstream::zoned`).
    let hello = Event::Hello {
        v: VERSION,
        server: options.server.clone(),
    };
    if let Err(e) = tokio::time::timeout(LAST_WORD_WAIT, protocol::send(&stream, &hello))
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the peer did not read it")))
    {
        tracing::warn!(peer_uid, peer_pid, error = %e, "cannot send the hello; closing the connection");
        return;
    }
    let mut lines = Lines::default();
    let request = tokio::select! {
        read = tokio::time::timeout(REQUEST_WAIT, lines.next(&stream)) => read,
        () = shutdown.cancelled() => return,
    };
    let refused = match request {
        Ok(Ok(Some(line))) => match protocol::parse::<Request>(&line) {
            Ok(Request::Start { server, .. }) if server == options.server => None,
            Ok(Request::Start { server, .. }) => Some(format!(
                "refused: this is the zone of server {}, not of {server:?}",
                options.server
            )),
            Ok(other) => Some(format!("expected a start request, got {other:?}")),
            Err(e) => Some(e.to_string()),
        },
        Ok(Ok(None)) => return,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no start request within {}s",
            REQUEST_WAIT.as_secs()
        )),
    };
    if let Some(why) = refused {
        tracing::warn!(peer_uid, peer_pid, "closing a connection: {why}");
        tell(&stream, Event::Error { message: why }).await;
        return;
    }
    let (mut child, pid) = match spawn(&options) {
        Ok(spawned) => spawned,
        Err(e) => {
            let why = format!("cannot run {:?}: {e}", options.command);
            tracing::warn!(peer_uid, "{why}");
            tell(&stream, Event::Error { message: why }).await;
            return;
        }
    };
    tracing::info!(pid, peer_uid, peer_pid, "started the server");
    let handed = tokio::time::timeout(LAST_WORD_WAIT, hand_over(&stream, &mut child, pid))
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the peer did not take them")));
    let status = match handed {
        Ok(()) => supervise(&stream, &mut lines, &mut child, pid, &options, &shutdown).await,
        Err(e) => {
            tracing::warn!(pid, error = %e, "cannot hand the process's pipes to the proxy; stopping it");
            stop(&mut child, pid, options.grace).await
        }
    };
    // Helpers of a leader that exited are of no use to anyone.
    signal_group(pid, Signal::KILL);
    crate::reaper::untrack(pid);
    tracing::info!(pid, %status, "server process exited");
    tell(&stream, Event::Exit { status }).await;
}

/// Sends a last word, for a few seconds at most (a peer that does not read does not hold up the
/// zone's shutdown).
async fn tell(stream: &UnixStream, event: Event) {
    let _ = tokio::time::timeout(LAST_WORD_WAIT, protocol::send(stream, &event)).await;
}

/// Starts the command in its own process group, with the zone's environment and directory.
pub(super) fn spawn(options: &ZoneOptions) -> std::io::Result<(Child, u32)> {
    let child = tokio::process::Command::new(&options.command)
        .args(&options.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so signals reach what the command starts (npx -> node).
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let Some(pid) = child.id() else {
        return Err(std::io::Error::other("the process exited immediately"));
    };
    crate::reaper::track(pid);
    Ok((child, pid))
}

/// Sends `started` with the three pipe ends, then closes the zone's copies.
async fn hand_over(stream: &UnixStream, child: &mut Child, pid: u32) -> std::io::Result<()> {
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("no stdio pipes"));
    };
    let (stdin, stdout, stderr) = (
        stdin.into_owned_fd()?,
        stdout.into_owned_fd()?,
        stderr.into_owned_fd()?,
    );
    let started = Event::Started { v: VERSION, pid };
    protocol::send_with_fds(
        stream,
        &started,
        [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .await
}

/// What ended the wait.
enum Outcome {
    Exited(String),
    Line(std::io::Result<Option<Vec<u8>>>),
    Shutdown,
}

/// Waits for the process's exit, relaying the peer's signals; ends the group when the peer goes
/// away, breaks the protocol, or the zone stops. Returns the exit status.
async fn supervise(
    stream: &UnixStream,
    lines: &mut Lines,
    child: &mut Child,
    pid: u32,
    options: &ZoneOptions,
    shutdown: &CancellationToken,
) -> String {
    loop {
        let outcome = tokio::select! {
            status = child.wait() => Outcome::Exited(status_text(status)),
            line = lines.next(stream) => Outcome::Line(line),
            () = shutdown.cancelled() => Outcome::Shutdown,
        };
        let why = match outcome {
            Outcome::Exited(status) => return status,
            Outcome::Line(Ok(Some(line))) => match protocol::parse::<Request>(&line) {
                Ok(Request::Signal { signal }) => {
                    signal_group(pid, signal_of(signal));
                    continue;
                }
                Ok(Request::Start { .. }) => "a second start request on one connection".into(),
                Err(e) => e.to_string(),
            },
            Outcome::Line(Ok(None)) => "the proxy closed the connection".to_string(),
            Outcome::Line(Err(e)) => format!("the connection failed: {e}"),
            Outcome::Shutdown => "the zone is stopping".into(),
        };
        tracing::info!(pid, "{why}; stopping the server");
        return stop(child, pid, options.grace).await;
    }
}

/// SIGTERM to the group, SIGKILL after `grace`; the leader's exit status.
pub(super) async fn stop(child: &mut Child, pid: u32, grace: Duration) -> String {
    signal_group(pid, Signal::TERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status_text(status),
        Err(_) => {
            tracing::warn!(pid, "the server ignored SIGTERM; killing its process group");
            signal_group(pid, Signal::KILL);
            status_text(child.wait().await)
        }
    }
}

pub(super) fn status_text(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("unknown status ({e})"),
    }
}

pub(super) fn signal_of(signal: SignalName) -> Signal {
    match signal {
        SignalName::Term => Signal::TERM,
        SignalName::Kill => Signal::KILL,
    }
}

pub(super) fn signal_group(pid: u32, signal: Signal) {
    if let Some(pgid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        // ESRCH (the group is gone) is the normal case after an exit.
        let _ = kill_process_group(pgid, signal);
    }
}
