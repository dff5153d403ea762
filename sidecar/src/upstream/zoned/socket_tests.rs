//! Zones over their unix socket, both ends in this process: a zone (`zone::serve`) and the
//! proxy's end (`zoned::start`), or a hostile hand on the socket's path. Who starts a process is
//! checked both ways: the zone serves only the proxy's uid, and the proxy starts a server only in
//! that server's zone (the socket itself, owned by the zone's uid, a peer of that uid, a hello
//! naming the server). The tests run as root (here and in CI): one hands a socket to another uid.

use std::{path::PathBuf, sync::Arc};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::unix::pipe,
    sync::oneshot,
    task::JoinHandle,
};

use super::*;
use crate::zone::{self, ZoneOptions};

/// This process's uid: the zones here run as it.
fn me() -> u32 {
    rustix::process::getuid().as_raw()
}

/// A zone of server `git` serving `sh -c SCRIPT` on a socket in `dir`; send on the sender to
/// stop it.
fn zone_with(
    dir: &Path,
    peer_uid: Option<u32>,
    script: &str,
) -> (PathBuf, oneshot::Sender<()>, JoinHandle<()>) {
    zone_of("git", dir, peer_uid, script)
}

/// A zone of `server` serving `sh -c SCRIPT` on `dir/mcp.sock`.
fn zone_of(
    server: &str,
    dir: &Path,
    peer_uid: Option<u32>,
    script: &str,
) -> (PathBuf, oneshot::Sender<()>, JoinHandle<()>) {
    std::fs::create_dir_all(dir).expect("the socket's directory");
    let socket = dir.join("mcp.sock");
    let listener = zone::bind(&socket).expect("the socket binds");
    let options = ZoneOptions {
        listen: zone::Listen::Socket(socket.clone()),
        server: server.into(),
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
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
}

#[tokio::test]
async fn the_zone_hands_over_the_pipes_and_reports_the_exit_and_signals_the_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"read line; echo "got $line"; echo "a complaint" >&2; read again; exit 3"#;
    let (socket, stop, zone) = zone_with(dir.path(), None, script);
    let server = ServerName::new("git");

    let started = start(&server, &socket, me(), Some("pod-x"))
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
    let first = start(&server, &socket, me(), None).await.expect("started");
    let second = start(&server, &socket, me(), None).await.expect("started");
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
    let running = start(&server, &socket, me(), None).await.expect("started");
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
    let Err(Error::StartFailed { reason, .. }) = start(&server, &socket, me(), Some("pod-x")).await
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
    let Err(Error::StartFailed { reason, .. }) = start(&server, &missing, me(), None).await else {
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

/// A zone whose process adds a line to `marker` when it starts, says `ready`, and then echoes
/// its input.
fn marking(marker: &Path) -> String {
    format!("echo started >> {}; echo ready; exec cat", marker.display())
}

/// The reason of a start that failed.
async fn refusal(server: &str, socket: &Path, uid: u32) -> String {
    match start(&ServerName::new(server), socket, uid, Some("pod-x")).await {
        Err(Error::StartFailed { reason, .. }) => reason,
        Err(other) => panic!("expected a failed start, got {other}"),
        Ok(started) => panic!("server {server} started process {}", started.pid),
    }
}

/// Starts `server` in its zone as the proxy does, waits until its process has said `ready`,
/// and returns how many processes the zone has started in all (the marker's lines): a start
/// refused before this one shows as one too many.
async fn starts_with_one_more(server: &str, socket: &Path, marker: &Path) -> usize {
    let started = start(&ServerName::new(server), socket, me(), None)
        .await
        .expect("the zone's own server starts");
    let stdout = pipe::Receiver::from_owned_fd(started.stdout).expect("stdout is a pipe");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .expect("read");
    assert_eq!(line, "ready\n");
    std::fs::read_to_string(marker)
        .expect("the marker")
        .lines()
        .count()
}

/// What a hostile server does with the directory of its socket, which its process can write:
/// its socket replaced by a link to another zone's socket (a server listed `enabled: false`,
/// say, or one with other Secrets). The proxy does not follow it: it does not even connect to
/// the other zone, which starts nothing.
#[tokio::test]
async fn a_link_to_another_zones_socket_is_refused_and_the_other_zone_starts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (hostile, _stop_h, _h) = zone_of("hostile", &dir.path().join("hostile"), None, "exec cat");
    let marker = dir.path().join("github-started");
    let (github, _stop_g, _g) = zone_of(
        "github",
        &dir.path().join("github"),
        Some(me()),
        &marking(&marker),
    );
    std::fs::remove_file(&hostile).expect("the hostile server removes its socket");
    std::os::unix::fs::symlink(&github, &hostile).expect("and links another zone's there");

    for _ in 0..3 {
        assert_eq!(
            refusal("hostile", &hostile, me()).await,
            format!(
                "refused to start server hostile: {} is a symbolic link to {}, not the zone's \
                 socket (a zone binds its socket itself; a link there was made by a process of \
                 its container); nothing was started; its log: kubectl logs pod-x -c \
                 zone-hostile",
                hostile.display(),
                github.display()
            )
        );
    }
    // The zone behind the link serves its own server to the proxy as ever: one start, its own.
    assert_eq!(starts_with_one_more("github", &github, &marker).await, 1);
}

/// A socket of another owner than the zone's uid is not that zone's: refused before connecting.
#[tokio::test]
async fn a_socket_owned_by_another_uid_is_refused_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("started");
    let (socket, _stop, _zone) = zone_of("git", &dir.path().join("git"), None, &marking(&marker));
    let zone_uid = me() + 1;
    assert_eq!(
        refusal("git", &socket, zone_uid).await,
        format!(
            "refused to start server git: {} is owned by uid {}, not by the zone's uid \
             {zone_uid}; nothing was started; its log: kubectl logs pod-x -c zone-git",
            socket.display(),
            me()
        )
    );
    // Not a socket at all (a file the server wrote there) is refused as well.
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"").expect("written");
    let reason = refusal("git", &file, me()).await;
    assert!(
        reason.contains(&format!(
            "{} is not a socket (a regular file)",
            file.display()
        )),
        "{reason}"
    );
    assert_eq!(starts_with_one_more("git", &socket, &marker).await, 1);
}

/// The peer that accepts is what counts: a socket that looks right (the zone's uid owns it) but
/// is answered by a process of another uid (another zone's launcher, reached through a link
/// swapped in after the path was checked) is refused before anything is asked of it.
#[tokio::test]
async fn a_peer_of_another_uid_is_refused_and_starts_nothing() {
    assert_eq!(
        me(),
        0,
        "this test hands a socket to another uid: it runs as root"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("started");
    let (socket, _stop, _zone) = zone_of("git", &dir.path().join("git"), None, &marking(&marker));
    let zone_uid = 65600;
    std::os::unix::fs::chown(&socket, Some(zone_uid), None).expect("chown");
    assert_eq!(
        refusal("git", &socket, zone_uid).await,
        format!(
            "refused to start server git: the peer on {} is uid 0, not server git's zone (uid \
             {zone_uid}); nothing was started; its log: kubectl logs pod-x -c zone-git",
            socket.display()
        )
    );
    std::os::unix::fs::chown(&socket, Some(me()), None).expect("chown");
    assert_eq!(starts_with_one_more("git", &socket, &marker).await, 1);
}

/// A zone that says it is another server's (the right uid, the wrong server) is asked for
/// nothing.
#[tokio::test]
async fn a_zone_that_names_another_server_is_refused_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("started");
    let (socket, _stop, _zone) =
        zone_of("github", &dir.path().join("git"), None, &marking(&marker));
    assert_eq!(
        refusal("git", &socket, me()).await,
        format!(
            "refused to start server git: the zone on {} is server \"github\"'s, not server \
             git's; nothing was started; its log: kubectl logs pod-x -c zone-git",
            socket.display()
        )
    );
    assert_eq!(starts_with_one_more("github", &socket, &marker).await, 1);
}

/// The other way: a zone starts nothing for a start request that names another server.
#[tokio::test]
async fn a_zone_refuses_a_start_for_another_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("started");
    let (socket, _stop, _zone) = zone_of("git", &dir.path().join("git"), None, &marking(&marker));
    let stream = UnixStream::connect(&socket).await.expect("connects");
    let mut lines = Lines::default();
    let hello = lines.next(&stream).await.expect("reads").expect("a hello");
    assert_eq!(
        protocol::parse::<Event>(&hello).expect("the hello"),
        Event::Hello {
            v: VERSION,
            server: "git".into()
        }
    );
    let start = Request::Start {
        v: VERSION,
        server: "github".into(),
    };
    protocol::send(&stream, &start).await.expect("sent");
    let answer = lines
        .next(&stream)
        .await
        .expect("reads")
        .expect("an answer");
    assert_eq!(
        protocol::parse::<Event>(&answer).expect("an event"),
        Event::Error {
            message: "refused: this is the zone of server git, not of \"github\"".into()
        }
    );
    assert_eq!(
        lines.next(&stream).await.expect("reads"),
        None,
        "then it closes"
    );
    assert_eq!(starts_with_one_more("git", &socket, &marker).await, 1);
}
