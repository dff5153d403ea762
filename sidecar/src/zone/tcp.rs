//! The zone on TCP (shared mode: the proxy runs in another pod). Each connection: the zone's
//! hello with a fresh nonce, the proxy's start with its proof of the key (`auth`), and once the
//! process runs, frames (`frames`) that carry its stdin, stdout, stderr, the proxy's signals and
//! its exit status. What a peer that has not proved the key can make the zone hold is bounded:
//! at most [`MAX_PENDING`] connections authenticating, each for [`AUTH_WAIT`], each with one
//! line of at most `MAX_LINE` bytes.

use std::{io::Cursor, net::SocketAddr, sync::Arc, time::Duration};

use rustix::process::Signal;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp::OwnedWriteHalf},
    process::Child,
    sync::{Semaphore, mpsc},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

use super::{
    ZoneOptions,
    auth::{self, NONCE_LEN, PROXY_LABEL, ZONE_LABEL, ZoneKey},
    connection::{LAST_WORD_WAIT, signal_group, signal_of, spawn, status_text, stop},
    frames::{self, Budget, Chan, Credit, Event, MAX_FRAME, Request, VERSION, read_frame},
    protocol::{Lines, line_of},
    pumps::{Frame, pump_in, pump_out, write_frames},
};

/// How long a peer has, from its connection, to prove it holds the key and ask for a start.
pub const AUTH_WAIT: Duration = Duration::from_secs(5);
/// Connections authenticating at once; more are closed on arrival.
pub const MAX_PENDING: usize = 32;
/// Frames queued for the connection (each at most `MAX_FRAME`).
const QUEUE: usize = 16;

/// Who may start the process: a peer that proves it holds `key` for `server`.
pub struct TcpAuth {
    pub key: ZoneKey,
    pub server: String,
}

/// Serves connections on `listener` until `stop` completes, then ends every process and
/// returns once all have exited (as `zone::serve` does for the socket).
pub async fn serve(
    listener: TcpListener,
    options: Arc<ZoneOptions>,
    auth: Arc<TcpAuth>,
    stop: impl Future<Output = ()>,
) {
    let shutdown = CancellationToken::new();
    let (alive, mut ended) = mpsc::channel::<()>(1);
    let pending = Arc::new(Semaphore::new(MAX_PENDING));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match pending.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let (options, auth, shutdown, alive) =
                            (options.clone(), auth.clone(), shutdown.clone(), alive.clone());
                        tokio::spawn(async move {
                            let _alive = alive;
                            serve_one(stream, peer, &options, &auth, &shutdown, permit).await;
                        });
                    }
                    Err(_) => tracing::warn!(%peer, "refused a connection: {MAX_PENDING} connections are authenticating already"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = &mut stop => break,
        }
    }
    tracing::info!("zone stopping: ending its server processes");
    drop(listener);
    shutdown.cancel();
    drop(alive);
    let _ = ended.recv().await;
}

/// Why a peer was refused: what the log says, and what the peer is told.
struct Refusal {
    log: String,
    tell: String,
}

impl Refusal {
    fn both(why: String) -> Self {
        Self {
            tell: why.clone(),
            log: why,
        }
    }
}

/// Reads the peer's start and checks its proof; its nonce (for the zone's own proof).
async fn authenticate(
    reader: &mut (impl AsyncRead + Unpin),
    lines: &mut Lines,
    auth: &TcpAuth,
    nonce: &[u8; NONCE_LEN],
) -> Result<Option<Vec<u8>>, Refusal> {
    let line = match lines.next_from(reader).await {
        Ok(Some(line)) => line,
        Ok(None) => return Ok(None),
        Err(e) => return Err(Refusal::both(e.to_string())),
    };
    let (theirs, proof) = match frames::parse::<Request>(&line) {
        Ok(Request::Start { nonce, proof, .. }) => (nonce, proof),
        Ok(other) => {
            return Err(Refusal::both(format!(
                "expected a start request, got {other:?}"
            )));
        }
        Err(e) => return Err(Refusal::both(e.to_string())),
    };
    let theirs = auth::decode_hex(theirs.as_bytes())
        .filter(|n| n.len() == NONCE_LEN)
        .ok_or_else(|| Refusal::both(format!("the nonce is not {NONCE_LEN} bytes of hex")))?;
    let proof = auth::decode_hex(proof.as_bytes()).unwrap_or_default();
    if !auth.key.verify(nonce, PROXY_LABEL, &auth.server, &proof) {
        return Err(Refusal {
            log: "its proof does not match this zone's key (a wrong key, another zone's key, \
                  or an answer to another connection's nonce)"
                .into(),
            tell: "refused: authentication failed".into(),
        });
    }
    Ok(Some(theirs))
}

async fn serve_one(
    stream: TcpStream,
    peer: SocketAddr,
    options: &ZoneOptions,
    auth: &TcpAuth,
    shutdown: &CancellationToken,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let Ok(nonce) = auth::nonce() else {
        tracing::error!(%peer, "no nonce: the system's random source failed; closing the connection");
        return;
    };
    let hello = Event::Hello {
        v: VERSION,
        server: auth.server.clone(),
        nonce: auth::hex(&nonce),
    };
    let mut lines = Lines::default();
    let handshake = async {
        send_line(&mut writer, &hello)
            .await
            .map_err(|e| Refusal::both(format!("cannot send the hello: {e}")))?;
        authenticate(&mut reader, &mut lines, auth, &nonce).await
    };
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(AUTH_WAIT, handshake) => outcome,
        () = shutdown.cancelled() => return,
    };
    let theirs = match outcome {
        Ok(Ok(Some(theirs))) => theirs,
        Ok(Ok(None)) => return,
        Ok(Err(refusal)) => {
            tracing::warn!(%peer, "refused a connection: {}", refusal.log);
            tell(
                &mut writer,
                Event::Error {
                    message: refusal.tell,
                },
            )
            .await;
            return;
        }
        Err(_) => {
            let why = format!("no start request within {}s", AUTH_WAIT.as_secs());
            tracing::warn!(%peer, "refused a connection: {why}");
            tell(&mut writer, Event::Error { message: why }).await;
            return;
        }
    };
    drop(permit);
    let (mut child, pid) = match spawn(options) {
        Ok(spawned) => spawned,
        Err(e) => {
            let why = format!("cannot run {:?}: {e}", options.command);
            tracing::warn!(%peer, "{why}");
            tell(&mut writer, Event::Error { message: why }).await;
            return;
        }
    };
    tracing::info!(pid, %peer, "started the server");
    let started = Event::Started {
        v: VERSION,
        pid,
        proof: auth::hex(&auth.key.proof(&theirs, ZONE_LABEL, &auth.server)),
    };
    let status = match tokio::time::timeout(LAST_WORD_WAIT, send_line(&mut writer, &started)).await
    {
        Ok(Ok(())) => {
            let reader = Cursor::new(lines.into_rest()).chain(reader);
            relay(reader, writer, &mut child, pid, options, shutdown).await
        }
        _ => {
            tracing::warn!(
                pid,
                "cannot tell the proxy the process started; stopping it"
            );
            stop(&mut child, pid, options.grace).await
        }
    };
    signal_group(pid, Signal::KILL);
    crate::reaper::untrack(pid);
    tracing::info!(pid, %status, "server process exited");
}

async fn send_line(writer: &mut OwnedWriteHalf, event: &Event) -> std::io::Result<()> {
    writer.write_all(&line_of(event)?).await
}

async fn tell(writer: &mut OwnedWriteHalf, event: Event) {
    let _ = tokio::time::timeout(LAST_WORD_WAIT, send_line(writer, &event)).await;
}

/// What ended the wait.
enum Outcome {
    Exited(String),
    Ended(String),
    Shutdown,
}

/// Relays the process's pipes as frames until it exits, the proxy goes away or breaks the
/// protocol, or the zone stops; then sends the exit status. Returns the status.
async fn relay(
    mut reader: impl AsyncRead + Unpin,
    writer: OwnedWriteHalf,
    child: &mut Child,
    pid: u32,
    options: &ZoneOptions,
    shutdown: &CancellationToken,
) -> String {
    let (out, queued) = mpsc::channel::<Frame>(QUEUE);
    let writing = tokio::spawn(write_frames(writer, queued));
    let (stdout_credit, stderr_credit) = (Arc::new(Credit::default()), Arc::new(Credit::default()));
    let mut pumps: Vec<JoinHandle<()>> = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        pumps.push(tokio::spawn(pump_out(
            stdout,
            Chan::Stdout,
            stdout_credit.clone(),
            out.clone(),
        )));
    }
    if let Some(stderr) = child.stderr.take() {
        pumps.push(tokio::spawn(pump_out(
            stderr,
            Chan::Stderr,
            stderr_credit.clone(),
            out.clone(),
        )));
    }
    let budget = Arc::new(Budget::default());
    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
    let grant = |bytes| Event::Window {
        chan: Chan::Stdin,
        bytes,
    };
    let stdin = tokio::spawn(pump_in(
        child.stdin.take(),
        stdin_rx,
        budget.clone(),
        out.clone(),
        grant,
    ));
    let demux = async {
        let mut buf = Vec::with_capacity(MAX_FRAME);
        loop {
            let chan = match read_frame(&mut reader, &mut buf).await {
                Ok(Some(chan)) => chan,
                Ok(None) => return "the proxy closed the connection".to_string(),
                Err(e) => return format!("the connection failed: {e}"),
            };
            let handled = match chan {
                // A closed queue: the process's stdin is gone; the rest is dropped.
                Chan::Stdin if buf.is_empty() => {
                    let _ = stdin_tx.send(Vec::new());
                    Ok(())
                }
                Chan::Stdin => budget.received(buf.len()).map(|()| {
                    let _ = stdin_tx.send(std::mem::take(&mut buf));
                }),
                Chan::Control => match frames::parse::<Request>(&buf) {
                    Ok(Request::Signal { signal }) => {
                        signal_group(pid, signal_of(signal));
                        Ok(())
                    }
                    Ok(Request::Window {
                        chan: Chan::Stdout,
                        bytes,
                    }) => stdout_credit.grant(bytes as usize),
                    Ok(Request::Window {
                        chan: Chan::Stderr,
                        bytes,
                    }) => stderr_credit.grant(bytes as usize),
                    Ok(other) => Err(frames::invalid(format!("unexpected {other:?}"))),
                    Err(e) => Err(e),
                },
                Chan::Stdout | Chan::Stderr => {
                    Err(frames::invalid(format!("a {chan:?} frame from the proxy")))
                }
            };
            if let Err(e) = handled {
                return format!("the proxy broke the protocol: {e}");
            }
        }
    };
    let outcome = tokio::select! {
        status = child.wait() => Outcome::Exited(status_text(status)),
        why = demux => Outcome::Ended(why),
        () = shutdown.cancelled() => Outcome::Shutdown,
    };
    let status = match outcome {
        Outcome::Exited(status) => status,
        Outcome::Ended(why) => {
            tracing::info!(pid, "{why}; stopping the server");
            stop(child, pid, options.grace).await
        }
        Outcome::Shutdown => {
            tracing::info!(pid, "the zone is stopping; stopping the server");
            stop(child, pid, options.grace).await
        }
    };
    // The rest of its output, then the status (each for a few seconds at most).
    signal_group(pid, Signal::KILL);
    let _ = tokio::time::timeout(LAST_WORD_WAIT, futures::future::join_all(&mut pumps)).await;
    let exit = frames::control_of(&Event::Exit {
        status: status.clone(),
    });
    if let Ok(exit) = exit {
        let _ = tokio::time::timeout(LAST_WORD_WAIT, out.send((Chan::Control, exit))).await;
    }
    drop(out);
    stdout_credit.close();
    stderr_credit.close();
    for pump in pumps.iter().chain([&stdin]) {
        pump.abort();
    }
    let _ = tokio::time::timeout(LAST_WORD_WAIT, writing).await;
    status
}

/// Binds the TCP address; the error names the flag.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {addr}: cannot listen there: {e}"))
}
