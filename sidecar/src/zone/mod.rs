//! `orchestrator-mcp-proxy zone`: one stdio MCP server's own container (its zone). The zone
//! holds the server's environment (its literal env and its Secrets, nothing else), its mounts
//! and its uid; the proxy's container holds none of them. The zone listens on a unix socket on
//! a volume only the proxy's container shares, and starts the server's command once per
//! connection, when the proxy asks (the proxy starts servers lazily, one process per protocol
//! revision): in its own process group, with the zone's environment and working directory as
//! they are, umask 0o002 (files it writes in a shared workspace stay group-writable), and its
//! stdin, stdout and stderr handed to the proxy over the socket (`protocol`).
//!
//! Containers of a pod do not share a PID namespace, so only the zone can signal and wait for
//! the process; the connection is how the proxy does both. When the connection ends (the proxy
//! stopped the server, or died) the zone ends the process group: SIGTERM, SIGKILL after the
//! grace. On SIGTERM or SIGINT it does that to every group and exits 0. It is PID 1 of its
//! container: it reaps its children and every orphan (`reaper`), and when it dies the kernel
//! kills whatever is left in the container.
//!
//! With `--peer-uid`, only a peer of that uid (the proxy's) may start the process: what the
//! server itself runs (a planted hook, say) shares the zone's uid, not the proxy's. `--server`
//! names the zone's server: its hello says it, and a start for another server is refused. The
//! proxy checks the other way (`upstream::zoned`): the socket's path is the socket itself, owned
//! by the zone's uid, the peer is of that uid, and the hello names the server it means to start.
//!
//! With `--listen IP:PORT --key-file FILE` instead of `--socket`, the zone listens on TCP for a
//! proxy in another pod (shared mode): the peer proves it holds the zone's key for the server
//! instead of showing its uid, and the pipes travel as frames instead of descriptors (`tcp`).
//!
//! Submodules: `protocol` (the socket's lines, `v: 3`), `connection` (one socket connection),
//! `auth` (the key and its proofs), `frames` (the TCP protocol, `v: 2`), `pumps` (the tasks
//! that move frames), `tcp` (one TCP connection).

pub mod auth;
mod connection;
pub mod frames;
pub mod protocol;
pub mod pumps;
pub mod tcp;

use std::{
    ffi::OsString,
    net::SocketAddr,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

use crate::telemetry::LogFormat;

/// Where the zone listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A unix socket (its directory exists: an emptyDir shared with the proxy).
    Socket(PathBuf),
    /// A TCP address, for a proxy in another pod: peers must prove they hold the key in
    /// `key_file` for this zone's server.
    Tcp { addr: SocketAddr, key_file: PathBuf },
}

/// What `zone` is told on its command line.
#[derive(Clone, Debug)]
pub struct ZoneOptions {
    /// Where to listen.
    pub listen: Listen,
    /// The zone's server (`--server`): its hello names it, and only a start for it is served.
    pub server: String,
    /// The only peer uid allowed to start the process (none: any peer that can connect).
    pub peer_uid: Option<u32>,
    /// SIGTERM to SIGKILL for the process group.
    pub grace: Duration,
    /// The server's command and its arguments.
    pub command: OsString,
    pub args: Vec<OsString>,
}

/// The subcommand: a small current-thread runtime (it idles in every server's container).
pub fn main(options: ZoneOptions, format: LogFormat) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("zone: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        init_logs(format);
        match run(options).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Logs on stderr (the container's log), in the proxy's format; no exporter.
fn init_logs(format: LogFormat) {
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if result.is_err() {
        eprintln!("zone: a logger was already installed");
    }
}

/// Serves the socket until SIGTERM or SIGINT, then ends every process and returns.
pub async fn run(options: ZoneOptions) -> anyhow::Result<()> {
    use anyhow::Context;
    // Inherited by every process the zone starts.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o002));
    crate::reaper::start();
    let mut term = signal(SignalKind::terminate()).context("watching SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("watching SIGINT")?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    if options.server.is_empty() {
        anyhow::bail!("--server: the zone's server name is empty");
    }
    let server = options.server.clone();
    match options.listen.clone() {
        Listen::Socket(socket) => {
            let listener = bind(&socket)?;
            tracing::info!(
                socket = %socket.display(),
                %server,
                peer_uid = ?options.peer_uid,
                command = ?options.command,
                args = ?options.args,
                "zone listening"
            );
            serve(listener, Arc::new(options), stop).await;
            let _ = std::fs::remove_file(&socket);
        }
        Listen::Tcp { addr, key_file } => {
            let key = auth::ZoneKey::from_file("--key-file", &key_file)?;
            let listener = tcp::bind(addr).await?;
            tracing::info!(
                listen = %listener.local_addr().unwrap_or(addr),
                %server,
                command = ?options.command,
                args = ?options.args,
                "zone listening"
            );
            let auth = Arc::new(tcp::TcpAuth { key, server });
            tcp::serve(listener, Arc::new(options), auth, stop).await;
        }
    }
    tracing::info!("zone stopped");
    Ok(())
}

/// Serves connections on `listener` until `stop` completes, then ends every process (SIGTERM,
/// SIGKILL after the grace) and returns once all have exited.
pub async fn serve(
    listener: UnixListener,
    options: Arc<ZoneOptions>,
    stop: impl Future<Output = ()>,
) {
    let shutdown = CancellationToken::new();
    // Each connection holds a sender; all of them dropped means every process has ended.
    let (alive, mut ended) = mpsc::channel::<()>(1);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(connection::serve(
                        stream,
                        options.clone(),
                        shutdown.clone(),
                        alive.clone(),
                    ));
                }
                Err(e) => {
                    // Out of descriptors, say: do not spin.
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

/// Binds the socket, replacing a stale one, readable and writable by owner and group only (the
/// proxy reaches it through the pod's fsGroup).
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?,
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; the zone does not replace it",
            path.display()
        ),
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(listener)
}
