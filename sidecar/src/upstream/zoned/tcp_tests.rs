//! Zones over TCP, both ends in this process: a zone (`zone::tcp::serve`) on 127.0.0.1 and the
//! proxy's client (`zoned::connect` with a [`ZoneTarget::Tcp`]), or a hostile peer by hand.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

use super::{Streams, ZoneTarget, connect};
use crate::{
    error::Error,
    names::ServerName,
    zone::{
        self, Listen, ZoneOptions,
        auth::{self, PROXY_LABEL, ZoneKey},
        frames::{self, Chan, Event, Request, VERSION, WINDOW, read_frame, write_frame},
        protocol::{Lines, SignalName, line_of},
        tcp::{TcpAuth, serve},
    },
};

struct TcpZone {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// A zone for `server` with `key`, serving `sh -c SCRIPT ARG0`.
async fn tcp_zone(server: &str, key: &ZoneKey, script: &str, arg0: &Path) -> TcpZone {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    let options = ZoneOptions {
        listen: Listen::Tcp {
            addr,
            key_file: PathBuf::from("unused"),
        },
        server: server.into(),
        peer_uid: None,
        grace: Duration::from_secs(1),
        command: "sh".into(),
        args: vec!["-c".into(), script.into(), arg0.into()],
    };
    let auth = TcpAuth {
        key: key.clone(),
        server: server.into(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, Arc::new(options), Arc::new(auth), async {
        let _ = stopped.await;
    }));
    TcpZone { addr, stop, task }
}

fn key(byte: u8) -> ZoneKey {
    ZoneKey::from_bytes(&[byte; 32]).expect("a key")
}

fn target(zone: &TcpZone, key: &ZoneKey) -> ZoneTarget {
    ZoneTarget::Tcp {
        addr: zone.addr,
        key: key.clone(),
    }
}

/// Supervises `streams`' process; its exit status arrives on the watch.
fn supervise(
    streams: Streams,
    server: &str,
) -> (
    mpsc::UnboundedSender<SignalName>,
    watch::Receiver<Option<String>>,
    Streams2,
) {
    let (signals, signals_rx) = mpsc::unbounded_channel();
    let (exit, exit_rx) = watch::channel(None);
    let Streams {
        stdin,
        stdout,
        stderr,
        control,
        ..
    } = streams;
    control.supervise(ServerName::new(server), signals_rx, move |status| {
        let _ = exit.send(Some(status));
    });
    (
        signals,
        exit_rx,
        Streams2 {
            stdin,
            stdout,
            stderr,
        },
    )
}

struct Streams2 {
    stdin: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    stdout: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    stderr: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
}

async fn exit_of(mut exit: watch::Receiver<Option<String>>) -> String {
    tokio::time::timeout(Duration::from_secs(10), exit.wait_for(Option::is_some))
        .await
        .expect("the exit arrives")
        .expect("the watch stays")
        .clone()
        .expect("an exit")
}

/// Whether no process of group `pgid` is left (zombies aside).
fn group_gone(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    !entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.first() != Some(&"Z") && fields.get(2) == Some(&pgid.to_string().as_str())
    })
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn reason(result: crate::error::Result<Streams>) -> String {
    match result {
        Err(Error::StartFailed { reason, .. }) => reason,
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("started"),
    }
}

fn started_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[tokio::test]
async fn over_tcp_the_process_streams_exit_and_signals_are_those_of_the_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"read line; echo "got $line"; echo "a complaint" >&2; read again; exit 3"#;
    let k = key(1);
    let zone = tcp_zone("git", &k, script, dir.path()).await;
    let server = ServerName::new("git");

    let (_signals, exit, mut s) = supervise(
        connect(&server, &target(&zone, &k), None)
            .await
            .expect("started"),
        "git",
    );
    s.stdin.write_all(b"hello\n").await.expect("written");
    let mut line = String::new();
    BufReader::new(&mut s.stdout)
        .read_line(&mut line)
        .await
        .expect("read");
    assert_eq!(line, "got hello\n");
    let mut complaint = String::new();
    BufReader::new(&mut s.stderr)
        .read_line(&mut complaint)
        .await
        .expect("read");
    assert_eq!(complaint, "a complaint\n");
    // Closing stdin is the process's EOF: `read again` fails and it exits.
    drop(s.stdin);
    assert_eq!(exit_of(exit).await, "exit status: 3");
    let mut rest = Vec::new();
    s.stdout.read_to_end(&mut rest).await.expect("stdout ends");
    assert!(rest.is_empty());

    // A signal reaches the group; a dropped connection ends the process; a stopping zone ends
    // what runs.
    let (signals, exit, _first) = supervise(
        connect(&server, &target(&zone, &k), None)
            .await
            .expect("started"),
        "git",
    );
    signals.send(SignalName::Kill).expect("supervised");
    assert!(exit_of(exit).await.starts_with("signal: 9"));
    let second = connect(&server, &target(&zone, &k), None)
        .await
        .expect("started");
    let pid = second.pid;
    assert!(!group_gone(pid));
    drop(second);
    wait_until("the dropped connection's process to end", || {
        group_gone(pid)
    })
    .await;
    let (_signals, exit, _running) = supervise(
        connect(&server, &target(&zone, &k), None)
            .await
            .expect("started"),
        "git",
    );
    let _ = zone.stop.send(());
    tokio::time::timeout(Duration::from_secs(5), zone.task)
        .await
        .expect("the zone stops within its grace")
        .expect("the zone task");
    assert!(exit_of(exit).await.starts_with("signal: 15"));
}

/// Reads the zone's hello: its nonce.
async fn hello(stream: &mut TcpStream, lines: &mut Lines) -> Vec<u8> {
    let line = lines
        .next_from(stream)
        .await
        .expect("read")
        .expect("a hello");
    match frames::parse::<Event>(&line).expect("parses") {
        Event::Hello { v, server, nonce } => {
            assert_eq!((v, server.as_str()), (VERSION, "git"));
            auth::decode_hex(nonce.as_bytes()).expect("hex")
        }
        other => panic!("not a hello: {other:?}"),
    }
}

/// A start line that answers `nonce` with `key`.
fn answer(key: &ZoneKey, nonce: &[u8]) -> Vec<u8> {
    line_of(&Request::Start {
        v: VERSION,
        nonce: auth::hex(&[9u8; 32]),
        proof: auth::hex(&key.proof(nonce, PROXY_LABEL, "git")),
    })
    .expect("a line")
}

/// Everything the zone sends until it closes (bounded by a timeout).
async fn rest_of(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut received))
        .await
        .expect("the zone closes the connection");
    received
}

#[tokio::test]
async fn a_wrong_key_a_replayed_answer_and_another_zones_key_start_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marks = dir.path();
    let script = r#"touch "$0/$$"; exec cat"#;
    let (git_key, memory_key) = (key(1), key(2));
    let git = tcp_zone("git", &git_key, script, marks).await;
    let memory = tcp_zone("memory", &memory_key, script, marks).await;
    let name = |s: &str| ServerName::new(s);

    let wrong = reason(connect(&name("git"), &target(&git, &key(3)), None).await);
    assert_eq!(
        wrong,
        "server git's container did not start the process: refused: authentication failed; \
         its log: kubectl logs <this pod> -c zone-git"
    );
    // A hostile server in zone git holds git's key: it does not open zone memory.
    let across = reason(connect(&name("memory"), &target(&memory, &git_key), None).await);
    assert!(
        across.contains("refused: authentication failed"),
        "{across}"
    );
    // The right key at the wrong address is named before any proof is sent.
    let misaddressed = reason(connect(&name("git"), &target(&memory, &memory_key), None).await);
    assert!(
        misaddressed.contains(&format!("at {} serves server memory, not git", memory.addr)),
        "{misaddressed}"
    );
    assert_eq!(started_count(marks), 0);

    // A captured answer does not open a second connection: its nonce is new.
    let mut first = TcpStream::connect(git.addr).await.expect("connects");
    let mut lines = Lines::default();
    let nonce = hello(&mut first, &mut lines).await;
    let captured = answer(&git_key, &nonce);
    first.write_all(&captured).await.expect("sent");
    let started = lines
        .next_from(&mut first)
        .await
        .expect("read")
        .expect("a line");
    assert!(matches!(
        frames::parse::<Event>(&started),
        Ok(Event::Started { .. })
    ));
    wait_until("the first start", || started_count(marks) == 1).await;
    let mut replay = TcpStream::connect(git.addr).await.expect("connects");
    let mut lines = Lines::default();
    assert_ne!(hello(&mut replay, &mut lines).await, nonce, "a fresh nonce");
    replay.write_all(&captured).await.expect("sent");
    let refused = String::from_utf8(rest_of(&mut replay).await).expect("utf-8");
    assert_eq!(
        refused,
        "{\"event\":\"error\",\"message\":\"refused: authentication failed\"}\n"
    );
    assert_eq!(started_count(marks), 1, "the replay started nothing");
    drop(first);
}

#[tokio::test]
async fn a_listener_without_the_key_is_not_taken_for_the_zone() {
    // Something else on the zone's port (the agent, after the zone died) answers the hello
    // and the start, but cannot prove it holds the key.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accepts");
        let hello = Event::Hello {
            v: VERSION,
            server: "git".into(),
            nonce: auth::hex(&[5u8; 32]),
        };
        stream
            .write_all(&line_of(&hello).expect("line"))
            .await
            .expect("w");
        let mut lines = Lines::default();
        let _ = lines.next_from(&mut stream).await;
        let started = Event::Started {
            v: VERSION,
            pid: 1,
            proof: auth::hex(&[0u8; 32]),
        };
        stream
            .write_all(&line_of(&started).expect("line"))
            .await
            .expect("w");
        let _ = stream.read_to_end(&mut Vec::new()).await;
    });
    let target = ZoneTarget::Tcp { addr, key: key(1) };
    let why = reason(connect(&ServerName::new("git"), &target, Some("pod-x")).await);
    assert_eq!(
        why,
        format!(
            "server git's container at {addr} did not prove it holds server git's key (is \
             something else listening on that port?); its log: kubectl logs pod-x -c zone-git"
        )
    );
}

/// Connects and authenticates by hand; the connection after `started`.
async fn authenticated(addr: SocketAddr, key: &ZoneKey) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let mut lines = Lines::default();
    let nonce = hello(&mut stream, &mut lines).await;
    stream.write_all(&answer(key, &nonce)).await.expect("sent");
    let line = lines
        .next_from(&mut stream)
        .await
        .expect("read")
        .expect("a line");
    assert!(matches!(
        frames::parse::<Event>(&line),
        Ok(Event::Started { .. })
    ));
    assert!(lines.into_rest().is_empty());
    stream
}

/// The exit status among the frames the zone sends until it closes.
async fn exit_frame(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut status = None;
    while let Ok(Ok(Some(chan))) =
        tokio::time::timeout(Duration::from_secs(10), read_frame(stream, &mut buf)).await
    {
        if chan == Chan::Control
            && let Ok(Event::Exit { status: s }) = frames::parse::<Event>(&buf)
        {
            status = Some(s);
        }
    }
    status
}

#[tokio::test]
async fn hostile_peers_are_cut_off_with_bounded_memory_and_the_zone_serves_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key(1);
    let zone = tcp_zone("git", &k, r#"touch "$0/$$"; exec sleep 60"#, dir.path()).await;

    // An endless line before authentication: cut at 4096 bytes.
    let mut endless = TcpStream::connect(zone.addr).await.expect("connects");
    let _ = hello(&mut endless, &mut Lines::default()).await;
    let _ = endless.write_all(&vec![b'x'; 1 << 20]).await;
    let said = String::from_utf8_lossy(&rest_of(&mut endless).await).to_string();
    assert!(said.contains("a line longer than 4096 bytes"), "{said}");
    // Another protocol version, or bytes that are not JSON.
    let mut old = TcpStream::connect(zone.addr).await.expect("connects");
    let _ = hello(&mut old, &mut Lines::default()).await;
    old.write_all(b"{\"op\":\"start\",\"v\":1}\n")
        .await
        .expect("w");
    let said = String::from_utf8_lossy(&rest_of(&mut old).await).to_string();
    assert!(
        said.contains("protocol version 1 is not spoken here (this end speaks 2)"),
        "{said}"
    );
    assert_eq!(started_count(dir.path()), 0);

    // An authenticated peer that sends a 4 GiB frame header: the connection and the process
    // end; nothing is allocated for it. (The exit status is sent, but a peer that broke the
    // protocol may not get it: the zone closes with the peer's bytes unread, and the reset that
    // makes can discard it. What must hold is that its process ended.)
    let mut huge = authenticated(zone.addr, &k).await;
    huge.write_all(&[0, 0xff, 0xff, 0xff, 0xff])
        .await
        .expect("w");
    if let Some(status) = exit_frame(&mut huge).await {
        assert!(status.starts_with("signal: 15"), "{status}");
    }
    all_ended(dir.path(), 1).await;
    // One that sends beyond its stdin window to a process that does not read: twice the window,
    // since what the process's pipe takes (64 KiB, sooner or later as the zone gets to it) is
    // consumed and granted back; the window plus one frame was a cut only when the process had
    // not started yet, and under load it had (the process then ran on for its 60 s).
    let mut flood = authenticated(zone.addr, &k).await;
    let chunk = vec![b'y'; frames::MAX_FRAME];
    for _ in 0..(2 * WINDOW / frames::MAX_FRAME + 1) {
        if write_frame(&mut flood, Chan::Stdin, &chunk).await.is_err() {
            break;
        }
    }
    if let Some(status) = exit_frame(&mut flood).await {
        assert!(status.starts_with("signal: 15"), "{status}");
    }
    all_ended(dir.path(), 2).await;

    // The zone serves on.
    let server = ServerName::new("git");
    let (signals, exit, _s) = supervise(
        connect(&server, &target(&zone, &k), None)
            .await
            .expect("started"),
        "git",
    );
    signals.send(SignalName::Term).expect("supervised");
    assert!(exit_of(exit).await.starts_with("signal: 15"));
}

/// Waits (10 s at most) until none of the processes that recorded their pid in `dir` (the
/// script's first command, `touch "$0/$$"`, before `exec sleep`) is running; at most `started`
/// did (one killed before it got there never ran the sleep, so it is not left running either).
async fn all_ended(dir: &Path, started: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let running: Vec<&String> = pids
            .iter()
            .filter(|pid| Path::new("/proc").join(pid).exists())
            .collect();
        assert!(
            pids.len() <= started,
            "{} processes for {started} starts",
            pids.len()
        );
        if running.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {started} processes started, still running: {running:?}",
            pids.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `value` until it stops changing for a while: a pipeline that is full.
async fn settled(value: impl Fn() -> usize) -> usize {
    let mut last = value();
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = value();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > Duration::from_millis(300) {
            return now;
        }
        assert!(Instant::now() < deadline, "never settled");
    }
}

fn progress(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

const TEN_MB: usize = 160 * 65536;
/// What may be in flight between the process and a reader that stopped: the window, the
/// pipes and buffers at either end, the sockets' buffers.
const IN_FLIGHT: usize = 1 << 20;

#[tokio::test]
async fn ten_megabytes_each_way_under_backpressure_and_control_is_never_stuck_behind_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key(1);
    // Writes 10 MB to stdout, counting what the pipe took; then reads 1 MiB of stdin, counting,
    // and stops reading.
    let script = r#"exec python3 -c '
import os, sys
d = sys.argv[1]
def note(name, n):
    open(d + "/" + name + ".tmp", "w").write(str(n)); os.replace(d + "/" + name + ".tmp", d + "/" + name)
for i in range(160):
    sys.stdout.buffer.write(b"x" * 65536); sys.stdout.buffer.flush(); note("written", (i + 1) * 65536)
total = 0
while True:
    if total >= 1 << 20:
        import time; time.sleep(3600)
    chunk = sys.stdin.buffer.read1(65536)
    if not chunk: break
    total += len(chunk); note("read", total)
print(total, flush=True)
' "$0""#;
    let zone = tcp_zone("git", &k, script, dir.path()).await;
    let server = ServerName::new("git");
    let (signals, exit, mut s) = supervise(
        connect(&server, &target(&zone, &k), None)
            .await
            .expect("started"),
        "git",
    );
    let written = dir.path().join("written");

    // A reader that stops after 1 MiB: the process stops too, a bounded distance ahead.
    let mut buf = vec![0u8; 65536];
    let mut read = 0;
    while read < 1 << 20 {
        read += s.stdout.read(&mut buf).await.expect("read");
    }
    let ahead = settled(|| progress(&written)).await - read;
    eprintln!("stdout: {ahead} bytes ahead of a stopped reader");
    assert!(
        ahead <= IN_FLIGHT,
        "{ahead} bytes buffered for a stopped reader"
    );
    // A slow reader gets everything.
    while read < TEN_MB {
        let n = s.stdout.read(&mut buf).await.expect("read");
        assert!(n > 0, "stdout ended at {read}");
        assert!(buf[..n].iter().all(|b| *b == b'x'));
        read += n;
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    assert_eq!(read, TEN_MB);

    // The other way: a process that stops reading stops the proxy's writer.
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let mut stdin = s.stdin;
    let writer = tokio::spawn(async move {
        let chunk = vec![b'z'; 65536];
        for _ in 0..160 {
            if stdin.write_all(&chunk).await.is_err() {
                return;
            }
            counter.fetch_add(chunk.len(), Ordering::SeqCst);
        }
        drop(stdin);
    });
    let taken = settled(|| accepted.load(Ordering::SeqCst)).await;
    let consumed = progress(&dir.path().join("read"));
    assert!(consumed >= 1 << 20, "{consumed}");
    eprintln!(
        "stdin: {} bytes ahead of a stopped process",
        taken - consumed
    );
    assert!(
        taken - consumed <= IN_FLIGHT,
        "{} bytes buffered for a stopped process",
        taken - consumed
    );
    assert!(taken < TEN_MB, "the writer was not held back");

    // Control is not stuck behind the full stdin: a signal gets through now.
    signals.send(SignalName::Kill).expect("supervised");
    assert!(exit_of(exit).await.starts_with("signal: 9"));
    writer.abort();
}

/// `@modelcontextprotocol/server-everything` (e2e/setup installs it), as `sh -c` runs it.
fn everything() -> (String, PathBuf) {
    let root = std::env::var_os("ORCH_TOOLS").map_or_else(
        || {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/orchestrator/tools")
        },
        PathBuf::from,
    );
    let node = root.join("node/node_modules/.bin/node");
    let server =
        root.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        node.exists() && server.exists(),
        "run e2e/setup to install the MCP test tools"
    );
    (format!(r#"exec "{}" "$0" stdio"#, node.display()), server)
}

#[tokio::test]
async fn mcp_through_a_tcp_zone_and_nothing_outlives_the_connection() {
    use rmcp::{ServiceExt, model::CallToolRequestParams};
    let (script, server_js) = everything();
    let k = key(1);
    let zone = tcp_zone("git", &k, &script, &server_js).await;
    let streams = connect(&ServerName::new("git"), &target(&zone, &k), None)
        .await
        .expect("started");
    let pid = streams.pid;
    let (_signals, _exit, s) = supervise(streams, "git");
    let client = ().serve((s.stdout, s.stdin)).await.expect("initialize");
    let tools = client.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "echo"), "{tools:?}");
    let mut args = rmcp::model::JsonObject::new();
    args.insert("message".into(), "through a zone".into());
    let result = client
        .call_tool(CallToolRequestParams::new("echo").with_arguments(args))
        .await
        .expect("tools/call");
    let text = serde_json::to_string(&result.content).expect("json");
    assert!(text.contains("Echo: through a zone"), "{text}");
    assert!(!group_gone(pid));
    drop(client);
    drop(_signals);
    wait_until(
        "the server's process group to end with the connection",
        || group_gone(pid),
    )
    .await;
}

/// Per-call latency, the socket's pipes against TCP frames: `cargo test --release -p
/// orchestrator-mcp-proxy --lib zone_latency -- --ignored --nocapture`, with `ZONE_BIN=<the
/// release binary>` to run the zones as processes of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; prints figures"]
async fn zone_latency() {
    use rmcp::{ServiceExt, model::CallToolRequestParams};
    const CALLS: usize = 1000;
    const ROUNDS: usize = 7;
    let (script, server_js) = everything();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("mcp.sock");
    let k = key(1);
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, auth::hex(&[1u8; 32])).expect("written");
    // ZONE_BIN: the zones as their own processes (the release binary), as in a pod.
    let mut zones = Vec::new();
    let tcp_addr = match std::env::var_os("ZONE_BIN") {
        Some(bin) => {
            let port = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("binds")
                .local_addr()
                .expect("addr")
                .port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            for listen in [
                vec!["--socket".into(), socket.clone().into_os_string()],
                vec![
                    "--listen".into(),
                    addr.to_string().into(),
                    "--key-file".into(),
                    key_file.clone().into_os_string(),
                ],
            ] {
                let mut cmd = tokio::process::Command::new(&bin);
                cmd.arg("zone")
                    .args(listen)
                    .args(["--server", "git"])
                    .arg("--")
                    .arg("sh")
                    .arg("-c")
                    .arg(&script)
                    .arg(&server_js);
                cmd.kill_on_drop(true).stderr(std::process::Stdio::null());
                zones.push(cmd.spawn().expect("the zone runs"));
            }
            wait_until("the zones to listen", || {
                socket.exists() && std::net::TcpStream::connect(addr).is_ok()
            })
            .await;
            addr
        }
        None => {
            let listener = zone::bind(&socket).expect("binds");
            let options = ZoneOptions {
                listen: Listen::Socket(socket.clone()),
                server: "git".into(),
                peer_uid: None,
                grace: Duration::from_secs(1),
                command: "sh".into(),
                args: vec!["-c".into(), script.clone().into(), server_js.clone().into()],
            };
            tokio::spawn(zone::serve(
                listener,
                Arc::new(options),
                std::future::pending(),
            ));
            let zone = tcp_zone("git", &k, &script, &server_js).await;
            std::mem::forget(zone.stop);
            zone.addr
        }
    };
    let targets = [
        (
            "unix socket (pipes)",
            ZoneTarget::Unix {
                socket,
                uid: rustix::process::getuid().as_raw(),
            },
        ),
        (
            "tcp (frames)",
            ZoneTarget::Tcp {
                addr: tcp_addr,
                key: k.clone(),
            },
        ),
    ];
    let server = ServerName::new("git");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Interleaved: round r's client of target i is clients[r * 2 + i].
    let mut clients = Vec::new();
    let mut connects: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    let mut starts: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for _ in 0..ROUNDS {
        for (i, (_, target)) in targets.iter().enumerate() {
            let began = Instant::now();
            let streams = connect(&server, target, None).await.expect("started");
            connects[i].push(began.elapsed().as_secs_f64() * 1e3);
            let (signals, _exit, s) = supervise(streams, "git");
            let client = ().serve((s.stdout, s.stdin)).await.expect("initialize");
            starts[i].push(began.elapsed().as_secs_f64() * 1e3);
            clients.push((client, signals));
        }
    }
    for (i, (name, _)) in targets.iter().enumerate() {
        println!(
            "{name}: connect until started {:.2} ms; + initialize {:.1} ms (medians of {ROUNDS})",
            median(connects[i].clone()),
            median(starts[i].clone())
        );
    }
    let echo = || {
        let mut args = rmcp::model::JsonObject::new();
        args.insert("message".into(), "ping".into());
        CallToolRequestParams::new("echo").with_arguments(args)
    };
    let mut per_call: Vec<(&str, Vec<f64>)> =
        targets.iter().map(|(n, _)| (*n, Vec::new())).collect();
    for round in 0..ROUNDS {
        for (i, _) in targets.iter().enumerate() {
            let (client, _) = &clients[round * targets.len() + i];
            let began = Instant::now();
            for _ in 0..CALLS {
                client.call_tool(echo()).await.expect("tools/call");
            }
            let us = began.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
            per_call[i].1.push(us);
        }
    }
    let medians: Vec<f64> = per_call.iter().map(|(_, v)| median(v.clone())).collect();
    for ((name, runs), m) in per_call.iter().zip(&medians) {
        println!(
            "{name}: tools/call round trip, median of {ROUNDS} runs of {CALLS}: {m:.1} us (runs: {runs:.1?})"
        );
    }
    println!("tcp / unix: {:.3}", medians[1] / medians[0]);
    drop(zones);
}
