//! Reaps orphaned grandchildren. When the proxy is PID 1 of its container, processes whose parent
//! died (e.g. a server's own helpers after it is killed) are re-parented to it and would stay
//! zombies. Direct children are left alone: their monitor task waits for them.

use crate::sync::lock;
use std::{
    collections::HashSet,
    sync::{Mutex, OnceLock},
};

fn tracked() -> &'static Mutex<HashSet<u32>> {
    static TRACKED: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    TRACKED.get_or_init(Default::default)
}

/// A direct child the proxy waits for itself.
pub fn track(pid: u32) {
    lock(tracked()).insert(pid);
}

pub fn untrack(pid: u32) {
    lock(tracked()).remove(&pid);
}

/// Reaps untracked zombie children whenever a child changes state.
#[cfg(target_os = "linux")]
pub fn start() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        tracing::warn!("cannot watch SIGCHLD; orphaned processes are not reaped");
        return;
    };
    tokio::spawn(async move {
        while sigchld.recv().await.is_some() {
            reap_orphans();
        }
    });
}

#[cfg(not(target_os = "linux"))]
pub fn start() {}

#[cfg(target_os = "linux")]
fn reap_orphans() {
    use rustix::process::{Pid, WaitOptions, waitpid};
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            children.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    let tracked = lock(tracked()).clone();
    for pid in children.into_iter().filter(|p| !tracked.contains(p)) {
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(false);
        if !zombie {
            continue;
        }
        if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw)
            && let Ok(Some(_)) = waitpid(Some(pid), WaitOptions::NOHANG)
        {
            tracing::debug!(
                pid = pid.as_raw_nonzero().get(),
                "reaped an orphaned process"
            );
        }
    }
}
