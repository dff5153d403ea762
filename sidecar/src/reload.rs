//! Hot reload of the config file, the way Kubernetes updates a mounted ConfigMap: the kubelet
//! writes a new timestamped directory and atomically swaps the `..data` symlink, so the file's
//! own inode never changes. We therefore watch the *directory*, debounce, re-read through the
//! symlinks and act only when the content changed; [`crate::apply`] decides whether it is served
//! (an invalid file keeps the last good config, problems logged,
//! `mcp_proxy_config_reloads_total{result="failed",source="file"}` counted).
//! A slow periodic re-read backs up the watcher (inotify can miss events on some mounts).
//!
//! The ConfigMap's other key the proxy reads, `approvals.json` (the operator's verdicts on calls
//! held for approval), sits beside the config file; each new content goes to `crate::approval`
//! and never reloads the config.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use notify::{RecursiveMode, Watcher};
use orchestrator_crds::approval::VERDICTS_KEY;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::apply::{Applier, Source};

/// How often the file is re-read even without a watch event.
const POLL_EVERY: Duration = Duration::from_secs(30);

/// Content fingerprint of a config file.
pub fn fingerprint(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Keeps the file watcher alive; dropping it stops watching.
pub struct WatchGuard {
    _watcher: Option<notify::RecommendedWatcher>,
}

/// Starts watching `path`'s directory. `current` is the fingerprint of the content in use (or
/// last rejected), so an unchanged file is not reloaded.
pub fn watch(
    path: PathBuf,
    debounce: Duration,
    current: Option<[u8; 32]>,
    applier: Arc<Applier>,
) -> anyhow::Result<WatchGuard> {
    let (tx, rx) = mpsc::unbounded_channel::<()>();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let watcher = {
        let tx = tx.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    let _ = tx.send(());
                }
            })?;
        match watcher.watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(watcher),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config directory; falling back to polling every {}s", POLL_EVERY.as_secs());
                None
            }
        }
    };
    tokio::spawn(reload_loop(path, debounce, current, applier, rx));
    Ok(WatchGuard { _watcher: watcher })
}

async fn reload_loop(
    path: PathBuf,
    debounce: Duration,
    mut current: Option<[u8; 32]>,
    applier: Arc<Applier>,
    mut events: mpsc::UnboundedReceiver<()>,
) {
    let mut verdicts = Verdicts {
        path: path.with_file_name(VERDICTS_KEY),
        last: None,
    };
    verdicts.check(&applier).await;
    let mut poll = tokio::time::interval(POLL_EVERY);
    poll.tick().await;
    loop {
        tokio::select! {
            event = events.recv() => {
                if event.is_none() {
                    return;
                }
                // Debounce: wait for a quiet period so a file written in several steps is read whole.
                while let Ok(Some(())) = tokio::time::timeout(debounce, events.recv()).await {}
            }
            _ = poll.tick() => {}
        }
        verdicts.check(&applier).await;
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) => {
                // Mid-swap the file can be briefly absent; the next event brings it back.
                tracing::debug!(file = %path.display(), error = %e, "config file not readable right now");
                continue;
            }
        };
        let print = fingerprint(&bytes);
        if current == Some(print) {
            continue;
        }
        current = Some(print);
        applier
            .offer(Source::File, &path.display().to_string(), &bytes)
            .await;
    }
}

/// The verdicts file beside the config file, and the fingerprint of its last content handed on.
struct Verdicts {
    path: PathBuf,
    last: Option<[u8; 32]>,
}

impl Verdicts {
    async fn check(&mut self, applier: &Applier) {
        let bytes = match tokio::fs::read(&self.path).await {
            Ok(bytes) => bytes,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::NotFound {
                    self.last = None;
                } else {
                    tracing::debug!(file = %self.path.display(), error = %e, "verdicts file not readable right now");
                }
                return;
            }
        };
        let print = fingerprint(&bytes);
        if self.last == Some(print) {
            return;
        }
        self.last = Some(print);
        applier
            .proxy()
            .approvals
            .verdicts(&self.path.display().to_string(), &bytes);
    }
}
