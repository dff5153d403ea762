//! The proxy's end of a zone over TCP (shared mode; the protocol is `zone::frames`): connects,
//! proves it holds the zone's key, checks the zone's proof, and turns the frames back into the
//! byte streams `stdio` speaks: the process's stdin, stdout and stderr as in-memory pipes of
//! [`MAX_FRAME`] bytes, the signals it asks for and the exit status on the control channel.
//! Each received channel holds at most the window unconsumed; a consumer that stops reading
//! stops the zone's sender, not the control channel.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream},
    net::TcpStream,
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use crate::zone::{
    auth::{self, NONCE_LEN, PROXY_LABEL, ZONE_LABEL, ZoneKey},
    frames::{self, Budget, Chan, Credit, Event, MAX_FRAME, Request, VERSION, read_frame},
    protocol::{Lines, SignalName, line_of},
    pumps::{Frame, pump_in, pump_out, write_frames},
};

/// Frames queued for the connection.
const QUEUE: usize = 16;

/// A process the zone started for us over TCP.
pub struct Started {
    pub pid: u32,
    /// Write its stdin here (dropping it closes the process's stdin).
    pub stdin: DuplexStream,
    pub stdout: DuplexStream,
    pub stderr: DuplexStream,
    pub control: Control,
}

/// The connection a process was started on; dropping it closes the connection, and the zone
/// ends the process group.
pub struct Control {
    pid: u32,
    out: mpsc::Sender<Frame>,
    exit: oneshot::Receiver<String>,
    connection: Connection,
}

/// The tasks that own the connection; aborted (the connection closed) when dropped.
struct Connection(Vec<JoinHandle<()>>);

impl Drop for Connection {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Connects to the zone at `addr`, proves `key` for `server` and has it start the process.
/// `Err` says what happened, for `zoned` to put in the error: `Unreachable` before the zone
/// answered at all.
pub async fn start(
    server: &str,
    addr: SocketAddr,
    key: &ZoneKey,
    connect_timeout: Duration,
) -> Result<Started, Failure> {
    let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(Failure::Unreachable(e.to_string())),
        Err(_) => {
            return Err(Failure::Unreachable(format!(
                "no answer within {}s",
                connect_timeout.as_secs()
            )));
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let mut lines = Lines::default();
    let mut next = async |lines: &mut Lines| -> Result<Event, String> {
        match lines.next_from(&mut reader).await {
            Ok(Some(line)) => {
                frames::parse::<Event>(&line).map_err(|e| format!("answered unreadably ({e})"))
            }
            Ok(None) => Err("closed the connection".into()),
            Err(e) => Err(format!("answered unreadably ({e})")),
        }
    };
    let theirs = match next(&mut lines).await.map_err(Failure::Refused)? {
        Event::Hello { server: s, .. } if s != server => {
            return Err(Failure::Refused(format!(
                "at {addr} serves server {s}, not {server} (the address is another zone's)"
            )));
        }
        Event::Hello { nonce, .. } => auth::decode_hex(nonce.as_bytes())
            .filter(|n| n.len() == NONCE_LEN)
            .ok_or_else(|| Failure::Refused("sent a hello without a usable nonce".into()))?,
        Event::Error { message } => {
            return Err(Failure::Refused(format!(
                "did not start the process: {message}"
            )));
        }
        other => return Err(Failure::Refused(format!("said {other:?} instead of hello"))),
    };
    let ours = auth::nonce().map_err(|e| Failure::Refused(e.to_string()))?;
    let start = Request::Start {
        v: VERSION,
        nonce: auth::hex(&ours),
        proof: auth::hex(&key.proof(&theirs, PROXY_LABEL, server)),
    };
    let sent = match line_of(&start) {
        Ok(line) => writer.write_all(&line).await,
        Err(e) => Err(e),
    };
    let pid = match next(&mut lines).await {
        Ok(Event::Started { pid, proof, .. }) => {
            let proof = auth::decode_hex(proof.as_bytes()).unwrap_or_default();
            if !key.verify(&ours, ZONE_LABEL, server, &proof) {
                return Err(Failure::Refused(format!(
                    "at {addr} did not prove it holds server {server}'s key (is something \
                     else listening on that port?)"
                )));
            }
            pid
        }
        Ok(Event::Error { message }) => {
            return Err(Failure::Refused(format!(
                "did not start the process: {message}"
            )));
        }
        Ok(other) => {
            return Err(Failure::Refused(format!(
                "answered the start request with {other:?}"
            )));
        }
        Err(why) => {
            return Err(Failure::Refused(match sent {
                Err(e) => format!("{why} ({e})"),
                Ok(()) => format!("{why} without starting the process"),
            }));
        }
    };
    let reader = std::io::Cursor::new(lines.into_rest()).chain(reader);
    Ok(relay(pid, reader, writer))
}

/// Why a start failed.
#[derive(Debug)]
pub enum Failure {
    /// Nothing answered at the address.
    Unreachable(String),
    /// The zone answered, and then this (completing "server X's container ...").
    Refused(String),
}

/// The frames of a started process, turned back into streams.
fn relay(
    pid: u32,
    mut reader: impl AsyncRead + Unpin + Send + 'static,
    writer: tokio::net::tcp::OwnedWriteHalf,
) -> Started {
    let (out, queued) = mpsc::channel::<Frame>(QUEUE);
    let writing = tokio::spawn(write_frames(writer, queued));
    let (stdin, stdin_ours) = tokio::io::duplex(MAX_FRAME);
    let (stdout, stdout_ours) = tokio::io::duplex(MAX_FRAME);
    let (stderr, stderr_ours) = tokio::io::duplex(MAX_FRAME);
    let stdin_credit = Arc::new(Credit::default());
    tokio::spawn(pump_out(
        stdin_ours,
        Chan::Stdin,
        stdin_credit.clone(),
        out.clone(),
    ));
    let (stdout_q, stdout_budget) = data_channel(stdout_ours, Chan::Stdout, &out);
    let (stderr_q, stderr_budget) = data_channel(stderr_ours, Chan::Stderr, &out);
    let (exit_tx, exit) = oneshot::channel();
    let demux = tokio::spawn(async move {
        let mut buf = Vec::with_capacity(MAX_FRAME);
        let mut exit_tx = Some(exit_tx);
        let why = loop {
            let chan = match read_frame(&mut reader, &mut buf).await {
                Ok(Some(chan)) => chan,
                Ok(None) => break "its container closed the connection".to_string(),
                Err(e) => break format!("the connection to its container failed: {e}"),
            };
            let (queue, budget) = match chan {
                Chan::Stdout => (&stdout_q, &stdout_budget),
                Chan::Stderr => (&stderr_q, &stderr_budget),
                Chan::Stdin => break "its container sent a stdin frame".to_string(),
                Chan::Control => match frames::parse::<Event>(&buf) {
                    Ok(Event::Window {
                        chan: Chan::Stdin,
                        bytes,
                    }) => match stdin_credit.grant(bytes as usize) {
                        Ok(()) => continue,
                        Err(e) => break format!("its container broke the protocol: {e}"),
                    },
                    Ok(Event::Exit { status }) => {
                        if let Some(tx) = exit_tx.take() {
                            let _ = tx.send(status);
                        }
                        continue;
                    }
                    Ok(other) => break format!("its container said {other:?}"),
                    Err(e) => break format!("its container broke the protocol: {e}"),
                },
            };
            if !buf.is_empty()
                && let Err(e) = budget.received(buf.len())
            {
                break format!("its container broke the protocol: {e}");
            }
            let _ = queue.send(std::mem::take(&mut buf));
        };
        stdin_credit.close();
        if let Some(tx) = exit_tx {
            let _ = tx.send(format!("unknown status ({why})"));
        }
    });
    Started {
        pid,
        stdin,
        stdout,
        stderr,
        control: Control {
            pid,
            out,
            exit,
            connection: Connection(vec![demux, writing]),
        },
    }
}

/// A received channel: its queue (bounded by the window) and a pump into `to`.
fn data_channel(
    to: DuplexStream,
    chan: Chan,
    out: &mpsc::Sender<Frame>,
) -> (mpsc::UnboundedSender<Vec<u8>>, Arc<Budget>) {
    let (queue, chunks) = mpsc::unbounded_channel();
    let budget = Arc::new(Budget::default());
    let grant = move |bytes| Request::Window { chan, bytes };
    tokio::spawn(pump_in(
        Some(to),
        chunks,
        budget.clone(),
        out.clone(),
        grant,
    ));
    (queue, budget)
}

impl Control {
    /// Relays `signals` to the zone and hands the exit status to `exited`, until the process
    /// exits or `signals` is closed (the `Child` is gone): the connection then closes, and the
    /// zone ends the process group.
    pub fn supervise(
        self,
        server: String,
        mut signals: mpsc::UnboundedReceiver<SignalName>,
        exited: impl FnOnce(String) + Send + 'static,
    ) {
        let Control {
            pid,
            out,
            mut exit,
            connection,
        } = self;
        tokio::spawn(async move {
            let _connection = connection;
            let status = loop {
                tokio::select! {
                    status = &mut exit => break status.unwrap_or_else(|_| "unknown status (the connection to its container ended)".into()),
                    signal = signals.recv() => match signal {
                        Some(signal) => {
                            let Ok(frame) = frames::control_of(&Request::Signal { signal }) else { continue };
                            if out.send((Chan::Control, frame)).await.is_err() {
                                tracing::debug!(%server, pid, "cannot pass a signal to the zone: the connection is gone");
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
