//! Keeps upstream processes from outliving the proxy, however the proxy ends (SIGKILL and the
//! OOM killer included, where no cleanup code runs).
//!
//! Two mechanisms, both in the proxy's own binary:
//! - **Parent-death signal.** Each stdio server is started through
//!   `orchestrator-mcp-proxy exec-upstream`, which arms `PR_SET_PDEATHSIG` (SIGKILL) on itself
//!   and then `exec`s the server, so the server is killed when the proxy dies. (The setting must
//!   be made in the child; re-executing the binary does that without an `unsafe` pre-exec hook.)
//! - **A guardian for process groups.** A server's helpers (what `npx` or a shell starts) do not
//!   get that signal. `orchestrator-mcp-proxy guard` runs beside the proxy, reads the process
//!   groups of running servers from a pipe whose write end only the proxy holds, and when the
//!   pipe reports end of file — the proxy is gone — kills every group it still knows.

use std::{
    collections::HashSet,
    ffi::OsString,
    io::{BufRead, Write},
    os::unix::process::CommandExt,
    process::{ChildStdin, ExitCode, Stdio},
    sync::Mutex,
};

use rustix::process::{Pid, Signal, kill_process_group};

use crate::sync::lock;

/// The hidden subcommand that starts a server with a parent-death signal.
pub const EXEC_UPSTREAM: &str = "exec-upstream";
/// The hidden subcommand of the guardian.
pub const GUARD: &str = "guard";

/// The proxy's end of the guardian: registers and forgets process groups. The guardian starts
/// with the first stdio server (a proxy that starts none runs none).
#[derive(Default)]
pub struct Guard {
    state: Mutex<State>,
}

#[derive(Default)]
enum State {
    #[default]
    NotStarted,
    Running {
        pipe: ChildStdin,
        guardian: std::process::Child,
    },
    /// It could not be started, or the proxy is shutting down.
    Off,
}

impl Guard {
    /// The group of a server just started: killed if the proxy dies.
    pub fn watch(&self, pgid: u32) {
        let mut state = lock(&self.state);
        if matches!(*state, State::NotStarted) {
            *state = start();
        }
        send(&mut state, &format!("+{pgid}\n"));
    }

    /// The group is gone (killed by the proxy): nothing to do for it any more.
    pub fn forget(&self, pgid: u32) {
        send(&mut lock(&self.state), &format!("-{pgid}\n"));
    }

    /// At the end of a normal shutdown (every group already stopped): closes the pipe and waits
    /// for the guardian to exit.
    pub fn finish(&self) {
        let state = std::mem::replace(&mut *lock(&self.state), State::Off);
        if let State::Running { pipe, mut guardian } = state {
            drop(pipe);
            let _ = guardian.wait();
            crate::reaper::untrack(guardian.id());
        }
    }
}

fn start() -> State {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::warn!(error = %e, "cannot find the proxy's own binary; upstream helpers may outlive a killed proxy");
            return State::Off;
        }
    };
    let spawned = std::process::Command::new(exe)
        .arg(GUARD)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own group: a signal for the proxy's group (Ctrl-C in a terminal) spares it.
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut guardian) => {
            crate::reaper::track(guardian.id());
            match guardian.stdin.take() {
                Some(pipe) => State::Running { pipe, guardian },
                None => State::Off,
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the process-group guardian; upstream helpers may outlive a killed proxy");
            State::Off
        }
    }
}

fn send(state: &mut State, line: &str) {
    // A line is far below the pipe's capacity and the guardian reads all the time: the write
    // does not block in practice.
    if let State::Running { pipe, .. } = state
        && let Err(e) = pipe.write_all(line.as_bytes())
    {
        tracing::warn!(error = %e, "the process-group guardian is gone");
        *state = State::Off;
    }
}

/// `exec-upstream PARENT COMMAND ARGS...`: arms the parent-death signal, checks the parent is
/// still the proxy that started it, then becomes the server. Returns only on failure.
pub fn exec_upstream(parent: u32, argv: &[OsString]) -> ExitCode {
    let Some((command, args)) = argv.split_first() else {
        eprintln!("{EXEC_UPSTREAM}: no command");
        return ExitCode::from(2);
    };
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        eprintln!("{EXEC_UPSTREAM}: cannot set the parent-death signal: {e}");
    }
    // The proxy may have died before the signal was armed: then nobody wants this server.
    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    if ppid.and_then(|p| u32::try_from(p).ok()) != Some(parent) {
        return ExitCode::from(1);
    }
    let error = std::process::Command::new(command).args(args).exec();
    eprintln!("cannot run {command:?}: {error}");
    ExitCode::from(127)
}

/// `guard`: keeps the set of process groups the proxy announces on stdin; at end of file kills
/// them all.
pub fn guard_main() -> ExitCode {
    let mut groups = HashSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (op, pgid) = line.split_at(line.len().min(1));
        match (op, pgid.parse::<i32>().ok().and_then(Pid::from_raw)) {
            ("+", Some(pgid)) => {
                groups.insert(pgid);
            }
            ("-", Some(pgid)) => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in &groups {
        // ESRCH: the group ended on its own meanwhile.
        let _ = kill_process_group(*pgid, Signal::KILL);
    }
    if !groups.is_empty() {
        eprintln!(
            "orchestrator-mcp-proxy guard: the proxy is gone; killed {} upstream process group(s)",
            groups.len()
        );
    }
    ExitCode::SUCCESS
}
