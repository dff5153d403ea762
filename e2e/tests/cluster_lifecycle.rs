//! `e2e/cluster up` is idempotent and `e2e/cluster down` leaves no listening port and no process
//! behind. Runs a second, private cluster (own state dir and ports) so it never disturbs the one
//! the other tests use.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use orchestrator_e2e::repo_root;

const PORT_BASE: u16 = 27000;
const PORT_OFFSETS: [u16; 6] = [379, 380, 443, 257, 259, 247];

fn cluster(state: &Path, verb: &str) -> Result<()> {
    let status = Command::new(repo_root().join("e2e/cluster"))
        .arg(verb)
        .env("ORCH_E2E_STATE", state)
        .env("ORCH_E2E_PORT_BASE", PORT_BASE.to_string())
        .status()
        .with_context(|| format!("running e2e/cluster {verb}"))?;
    ensure!(status.success(), "e2e/cluster {verb} failed: {status}");
    Ok(())
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Processes whose command line mentions `needle` (our state dir is on every component's).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

#[test]
#[ignore = "needs the control-plane binaries (run ./test)"]
fn up_is_idempotent_and_down_leaves_nothing() -> Result<()> {
    let parent = std::env::temp_dir().join(format!("orch-e2e-lifecycle-{}", std::process::id()));
    let state = parent.join("cluster");
    let needle = format!("{}/", state.display());

    cluster(&state, "up")?;
    let kubeconfig = state.join("kubeconfig");
    ensure!(kubeconfig.is_file(), "up writes {}", kubeconfig.display());
    let running = processes_mentioning(&needle);
    ensure!(running.len() >= 5, "all five components run: {running:#?}");
    ensure!(listening(PORT_BASE + 443), "the API server listens");

    // A second `up` finds the cluster up and changes nothing.
    let token_before = std::fs::read_to_string(state.join("admin.token"))?;
    cluster(&state, "up")?;
    ensure!(
        std::fs::read_to_string(state.join("admin.token"))? == token_before,
        "a second up reuses the running cluster"
    );

    cluster(&state, "down")?;
    let left = processes_mentioning(&needle);
    ensure!(left.is_empty(), "processes left after down: {left:#?}");
    for offset in PORT_OFFSETS {
        ensure!(
            !listening(PORT_BASE + offset),
            "port {} still listens",
            PORT_BASE + offset
        );
    }
    ensure!(!state.exists(), "down removes the state dir");
    // And `down` on nothing is fine.
    cluster(&state, "down")?;
    let _ = std::fs::remove_dir_all(&parent);
    Ok(())
}
