//! `e2e/cluster up` is idempotent and `e2e/cluster down` leaves no listening port and no process
//! behind; with the real node, `down` leaves the machine as it was (processes, mounts, cgroups,
//! host paths, sysctls, network interfaces), and its pod network (a bridge and kube-proxy in the
//! node's own network namespace) changes nothing in the host's network namespace while it runs. Each test runs a private cluster (own state dir and
//! ports) so it never disturbs the one the other tests use. The real node needs the machine's one
//! node slot, so `./test` runs `real_node_lifecycle` before it brings its own cluster up (and
//! skips it in the bulk run).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use orchestrator_e2e::repo_root;

const PORT_BASE: u16 = 27000;
const PORT_OFFSETS: [u16; 6] = [379, 380, 443, 257, 259, 247];

fn cluster(state: &Path, verb: &str) -> Result<()> {
    cluster_at(state, PORT_BASE, false, verb)
}

fn cluster_at(state: &Path, base: u16, real_node: bool, verb: &str) -> Result<()> {
    let status = Command::new(repo_root().join("e2e/cluster"))
        .arg(verb)
        .env("ORCH_E2E_STATE", state)
        .env("ORCH_E2E_PORT_BASE", base.to_string())
        .env("ORCH_E2E_REAL_NODE", if real_node { "1" } else { "0" })
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

/// Port base of the real-node lifecycle cluster (apart from PORT_BASE: the two tests run at once).
const NODE_PORT_BASE: u16 = 24000;

/// What a real node changes on the machine, as `down` must restore it. Only what the node stack
/// touches is read, so other work on the machine (builds, other clusters' kwok) does not count.
#[derive(Debug, PartialEq, Eq)]
struct Machine {
    /// Mount points with their filesystem type.
    mounts: Vec<String>,
    /// cgroup directories of pods and of the node (kubelet's `kubepods`, our cgroup root).
    cgroups: Vec<String>,
    /// Host paths the kubelet, containerd and libcni write whatever their configuration says.
    host_paths: Vec<String>,
    /// The sysctls the kubelet sets at start.
    sysctls: Vec<String>,
    /// The host's network interfaces.
    links: Vec<String>,
    /// The host's network namespace as its tools print it (links with details, routes, the
    /// iptables rules of both backends, nftables when installed), counters left out.
    network: Vec<String>,
    /// Processes of the node stack (containerd, kubelet, shims, pause, portals) and of pods.
    processes: Vec<String>,
}

const NODE_HOST_PATHS: [&str; 9] = [
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/var/lib/containerd",
    "/run/netns",
    "/etc/cni",
    "/run/orchestrator-e2e-node.owner",
];
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
const NODE_PROCESSES: [&str; 7] = [
    "containerd",
    "containerd-shim",
    "kubelet",
    "kube-proxy",
    "pause",
    "netns-portal",
    "runc",
];
/// What prints the host's network namespace; a tool that is not installed prints nothing.
const NETWORK_VIEWS: [&[&str]; 8] = [
    &["ip", "-d", "link"],
    &["ip", "-4", "route", "show", "table", "all"],
    &["ip", "-6", "route", "show", "table", "all"],
    &["iptables-nft-save"],
    &["iptables-legacy-save"],
    &["ip6tables-nft-save"],
    &["ip6tables-legacy-save"],
    &["nft", "list", "ruleset"],
];

/// The host's network namespace as NETWORK_VIEWS print it, without what changes on its own:
/// comments (iptables-save's timestamps) and packet/byte counters.
fn host_network() -> Vec<String> {
    NETWORK_VIEWS
        .iter()
        .map(|argv| {
            let out = Command::new(argv[0]).args(&argv[1..]).output();
            let text = match out {
                Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
                Ok(o) => format!(
                    "(exit {}: {})",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => format!("(not run: {})", e.kind()),
            };
            let lines: Vec<String> = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(without_counters)
                .collect();
            format!("$ {}\n{}", argv.join(" "), lines.join("\n"))
        })
        .collect()
}

/// An iptables-save line without its `[packets:bytes]` counters.
fn without_counters(line: &str) -> String {
    match (line.find('['), line.rfind(']')) {
        (Some(open), Some(close))
            if open < close
                && line[open + 1..close]
                    .split(':')
                    .all(|n| n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            format!("{}{}", &line[..open], &line[close + 1..])
        }
        _ => line.to_string(),
    }
}

fn snapshot() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mut mounts: Vec<String> = read("/proc/self/mountinfo")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(format!("{} {}", f.get(4)?, f.get(sep + 1)?))
        })
        .collect();
    mounts.sort();
    let mut cgroups = Vec::new();
    for controller in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for child in std::fs::read_dir(controller.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = child.file_name().to_string_lossy().into_owned();
            if child.path().is_dir()
                && (name.contains("kubepods") || name.contains("orchestrator-e2e"))
            {
                cgroups.push(child.path().display().to_string());
            }
        }
    }
    cgroups.sort();
    let host_paths = NODE_HOST_PATHS
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| p.to_string())
        .collect();
    let sysctls = KUBELET_SYSCTLS
        .iter()
        .map(|k| format!("{k}={}", read(&format!("/proc/sys/{k}")).trim()))
        .collect();
    let mut links: Vec<String> = std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    links.sort();
    let mut processes = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let comm = read(&format!("{}/comm", entry.path().display()));
        let comm = comm.trim();
        if NODE_PROCESSES.iter().any(|p| comm.starts_with(p)) {
            processes.push(format!("{}: {comm}", entry.file_name().to_string_lossy()));
        }
    }
    processes.sort();
    Machine {
        mounts,
        cgroups,
        host_paths,
        sysctls,
        links,
        network: host_network(),
        processes,
    }
}

fn kubectl_at(state: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(orchestrator_e2e::bin_dir()?.join("kubectl"))
        .arg("--kubeconfig")
        .arg(state.join("kubeconfig"))
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The pause image the node imported (e2e/images), to run a pod without any other image.
fn pause_image() -> Result<String> {
    let out = Command::new(repo_root().join("e2e/images/build"))
        .arg("pause")
        .output()
        .context("running e2e/images/build pause")?;
    ensure!(out.status.success(), "e2e/images/build pause failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some("pause")).then(|| f.next().map(str::to_string))?
        })
        .context("e2e/images/build printed no pause image")
}

/// Whether the kubelet of the real node under cluster state dir `state` is running (the rule of
/// `e2e/node`'s `claim_slot`: its pid file names a live process).
fn kubelet_alive(state: &Path) -> bool {
    std::fs::read_to_string(state.join("node/pids/kubelet"))
        .ok()
        .and_then(|pid| pid.trim().parse::<u32>().ok())
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

#[test]
#[ignore = "needs root and the machine's real-node slot (./test runs it before its own cluster)"]
fn real_node_lifecycle_down_leaves_the_machine_as_it_was() -> Result<()> {
    let owner_file = "/run/orchestrator-e2e-node.owner";
    if let Ok(owner) = std::fs::read_to_string(owner_file) {
        let owner = owner.trim();
        anyhow::ensure!(
            !kubelet_alive(Path::new(owner)),
            "a real e2e node of {owner} is up: this test needs the machine's one node slot (run it \
             with the cluster down, as ./test does)"
        );
        // Left by a node whose processes are gone (a crash, a machine restored from a snapshot):
        // the slot is free, as `e2e/node up` would decide too, and the file is not ours to
        // compare against.
        std::fs::remove_file(owner_file).with_context(|| format!("removing stale {owner_file}"))?;
    }
    let parent = std::env::temp_dir().join(format!("orch-e2e-node-{}", std::process::id()));
    let state = parent.join("cluster");
    let before = snapshot();

    cluster_at(&state, NODE_PORT_BASE, true, "up")?;
    // A pod on the real node, so down has a sandbox, a container, its shim, mounts, a network
    // namespace and a portal to clean up.
    let pod = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "idle", "namespace": "default"}},
        "spec": {{"nodeSelector": {{"e2e.orchestrator.io/node": "real"}},
          "tolerations": [{{"key": "e2e.orchestrator.io/node", "operator": "Exists"}}],
          "automountServiceAccountToken": false,
          "containers": [{{"name": "idle", "image": "{}", "imagePullPolicy": "Never"}}]}}}}"#,
        pause_image()?
    );
    let file = parent.join("pod.json");
    std::fs::write(&file, pod)?;
    kubectl_at(&state, &["apply", "-f", &file.display().to_string()])?;
    kubectl_at(
        &state,
        &["wait", "--for=condition=Ready", "pod/idle", "--timeout=60s"],
    )?;
    let during = snapshot();
    // The snapshot sees the node: otherwise the comparison below would prove nothing.
    ensure!(
        during
            .cgroups
            .iter()
            .any(|c| c.contains("orchestrator-e2e")),
        "the node's cgroups are seen: {during:#?}"
    );
    ensure!(
        during.mounts.len() > before.mounts.len(),
        "the pod's mounts are seen"
    );
    // The node's network namespace is a bind mount under the state dir while the node is up, and
    // the pod got its address on the node's bridge; the host's own namespace did not change.
    let node_netns = format!("{}/node/netns/node nsfs", state.display());
    ensure!(
        during.mounts.contains(&node_netns),
        "the node's network namespace ({node_netns}) is seen: {:#?}",
        during.mounts
    );
    let pod_ip = kubectl_at(
        &state,
        &["get", "pod", "idle", "-o", "jsonpath={.status.podIP}"],
    )?;
    ensure!(
        pod_ip.starts_with("10.244.0."),
        "the pod's address is on the node's bridge (10.244.0.0/24): {pod_ip:?}"
    );
    ensure!(
        during.network == before.network,
        "the real node changed the host's network namespace:\nbefore: {:#?}\nduring: {:#?}",
        before.network,
        during.network
    );
    ensure!(
        during.processes.iter().any(|p| p.ends_with("kube-proxy")),
        "kube-proxy is seen: {:#?}",
        during.processes
    );
    ensure!(
        during.processes.iter().any(|p| p.ends_with("kubelet"))
            && during
                .processes
                .iter()
                .any(|p| p.contains("containerd-shim"))
            && during.processes.iter().any(|p| p.ends_with("netns-portal")),
        "the node's processes are seen: {:#?}",
        during.processes
    );
    ensure!(
        during.sysctls != before.sysctls
            || before.sysctls.iter().any(|s| s == "vm/overcommit_memory=1"),
        "the kubelet's sysctls are seen"
    );

    cluster_at(&state, NODE_PORT_BASE, true, "down")?;
    let after = snapshot();
    ensure!(
        after == before,
        "down left the machine changed:\nbefore: {before:#?}\nafter: {after:#?}"
    );
    ensure!(!state.exists(), "down removes the state dir");
    let _ = std::fs::remove_dir_all(&parent);
    Ok(())
}

/// Runs `e2e/node/node up` in a throwaway network namespace (`unshare -n`) set up by `setup`
/// (shell), with a state dir that has no control plane: the machine's own namespace is never
/// touched, and an `up` that got past its range check stops at the missing control plane.
fn node_up_in_scratch_netns(setup: &str) -> Result<(bool, String)> {
    let state = std::env::temp_dir().join(format!("orch-e2e-ranges-{}", std::process::id()));
    let script = format!(
        "ip link add name va type veth peer name vb && ip link set dev va up && \
         ip link set dev vb up && {setup} && exec {} up",
        repo_root().join("e2e/node/node").display()
    );
    let out = Command::new("unshare")
        .args(["-n", "sh", "-ec", &script])
        .env("ORCH_E2E_STATE", &state)
        .env("ORCH_E2E_PORT_BASE", "28000")
        .output()
        .context("running unshare -n e2e/node/node up")?;
    ensure!(
        !state.exists(),
        "up made {} before refusing",
        state.display()
    );
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
#[ignore = "needs root (unshare -n)"]
fn real_node_up_refuses_a_range_the_machine_uses() -> Result<()> {
    // An address in the Service range on one of the machine's interfaces.
    let (ok, stderr) = node_up_in_scratch_netns("ip addr add 10.96.7.1/24 dev va")?;
    ensure!(
        !ok && stderr.contains("10.96.0.0/16")
            && stderr.contains("10.96.7.0/24 dev va")
            && stderr.contains("ORCH_E2E_REAL_NODE=0"),
        "up must refuse the Service range the machine uses, naming it, the route and the way out:\n{stderr}"
    );
    // A route that covers the pod network.
    let (ok, stderr) = node_up_in_scratch_netns(
        "ip addr add 192.0.2.9/24 dev va && ip route add 10.0.0.0/8 via 192.0.2.1",
    )?;
    ensure!(
        !ok && stderr.contains("10.244.0.0/16") && stderr.contains("10.0.0.0/8 via 192.0.2.1"),
        "up must refuse a route over the pod network:\n{stderr}"
    );
    // A default route alone is fine: up goes on (and stops at the missing control plane).
    let (ok, stderr) = node_up_in_scratch_netns(
        "ip addr add 192.0.2.9/24 dev va && ip route add default via 192.0.2.1",
    )?;
    ensure!(
        !ok && stderr.contains("no control plane") && !stderr.contains("is used by this machine"),
        "a default route must pass the range check:\n{stderr}"
    );
    Ok(())
}
