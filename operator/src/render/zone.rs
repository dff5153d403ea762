//! A stdio server's container in the task pod (its zone, docs/architecture.md "Trust zones"):
//! its name, its socket (as the Job and the proxy config, `files`, both name them), and the
//! container itself: the proxy's image running `orchestrator-mcp-proxy zone`, which starts the
//! server's command when the proxy asks, as the server's own uid, with only its own env.
//! How the proxy reaches it is the placement's choice ([`ZoneLink`]): its socket
//! ([`socket_link`]), or in shared mode the pod's IP ([`Zone::port`]) and the key the task's
//! Secret `<taskrun>-zone-keys` holds for it ([`tcp_link`], [`zone_key_volume`]), which only
//! this container mounts.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, KeyToPath, ResourceRequirements, SecretVolumeSource, Volume, VolumeMount,
};
use orchestrator_crds::catalog::{CatalogStdio, WorkspaceAccess};
use sha2::{Digest, Sha256};

use super::pod::{
    PROXY_BINARY, PROXY_UID, WORKSPACE_DIR, WORKSPACE_VOLUME, ZONE_UID_BASE, env, field_env, mount,
    quantities, restricted_as, secret_env,
};
use super::settings::RenderSettings;
use orchestrator_crds::resolve::{Resolved, ResolvedServer};

/// Prefix of a server's container name (`zone-git`).
pub const ZONE_CONTAINER_PREFIX: &str = "zone-";
/// Where a server's container has its socket directory.
pub const ZONE_SOCKET_DIR: &str = "/run/orchestrator/zone";
/// Where the proxy has each server's socket directory (`<this>/<server>`).
pub const ZONES_DIR: &str = "/run/orchestrator/zones";
/// The socket's file name in a socket directory.
pub const ZONE_SOCKET: &str = "mcp.sock";
/// Shared mode: the first zone's port on the pod's IP (the next ones follow, by position).
pub const ZONE_PORT_BASE: u16 = 9100;
/// Shared mode: where a zone's container has its key (`<this>/key`).
pub const ZONE_KEY_DIR: &str = "/etc/orchestrator/zone-key";
/// The key's file name in [`ZONE_KEY_DIR`].
pub const ZONE_KEY_FILE: &str = "key";

/// Shared mode: the task's Secret holding each zone's key (item: the server's name), made by
/// `reconcile` before the Job.
pub fn zone_keys_secret_name(taskrun: &str) -> String {
    format!("{taskrun}-zone-keys")
}

/// The container of a server named `server`: `zone-<server>`, shortened with a digest when that
/// is longer than a container name may be.
pub fn zone_container_name(server: &str) -> String {
    let name = format!("{ZONE_CONTAINER_PREFIX}{server}");
    if name.len() <= 63 {
        return name;
    }
    let digest = super::names::short_hex(&Sha256::digest(server.as_bytes()));
    let keep = 63 - digest.len() - 1;
    format!("{}-{digest}", name[..keep].trim_end_matches('-'))
}

/// The proxy config's socket for a server (see [`ZONES_DIR`]).
pub fn zone_socket(server: &str) -> String {
    format!("{ZONES_DIR}/{server}/{ZONE_SOCKET}")
}

/// A stdio server of the task and its place in the pod.
pub struct Zone<'a> {
    pub server: &'a ResolvedServer<'a>,
    stdio: &'a CatalogStdio,
    /// Its position among the task's stdio servers (its uid and volume names).
    index: usize,
}

impl Zone<'_> {
    pub fn socket_volume(&self) -> String {
        format!("zone-{}-socket", self.index)
    }

    pub fn tmp_volume(&self) -> String {
        format!("zone-{}-tmp", self.index)
    }

    /// Shared mode: the volume of its key.
    pub fn key_volume(&self) -> String {
        format!("zone-{}-key", self.index)
    }

    /// Shared mode: its port on the pod's IP.
    pub fn port(&self) -> u16 {
        // At most a few dozen servers: a catalog's stdio servers fit below 65535 many times.
        ZONE_PORT_BASE.saturating_add(u16::try_from(self.index).unwrap_or(u16::MAX))
    }

    fn uid(&self) -> i64 {
        ZONE_UID_BASE + self.index as i64
    }
}

/// Sidecar mode: the uid the zone of `server` (a stdio server the TaskRun lists) runs as, which
/// the proxy config names (`stdio.zoneUid`): the proxy starts the server only in a zone of that
/// uid. By position, as the pod's containers are (the positions are the pod's as long as the
/// TaskRun lists its stdio servers in the order its pod was created with).
pub fn zone_uid(resolved: &Resolved<'_>, server: &str) -> Option<u32> {
    zones(resolved)
        .find(|zone| zone.server.spec.name == server)
        .and_then(|zone| u32::try_from(zone.uid()).ok())
}

/// Every stdio server the TaskRun lists, enabled or not: a container is created with the pod
/// and cannot be added later, so a server a running task is to get must be listed from the start.
pub fn zones<'a>(resolved: &'a Resolved<'a>) -> impl Iterator<Item = Zone<'a>> + 'a {
    resolved
        .servers
        .iter()
        .filter_map(|server| Some((server, server.entry.stdio.as_ref()?)))
        .enumerate()
        .map(|(index, (server, stdio))| Zone {
            server,
            stdio,
            index,
        })
}

/// Shared mode: the volume of a zone's key, only its own item of the task's zone-keys Secret.
pub fn zone_key_volume(taskrun: &str, zone: &Zone<'_>) -> Volume {
    Volume {
        name: zone.key_volume(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(zone_keys_secret_name(taskrun)),
            items: Some(vec![KeyToPath {
                key: zone.server.spec.name.clone(),
                path: ZONE_KEY_FILE.into(),
                mode: None,
            }]),
            // Read by the zone's uid alone (the pod's fsGroup makes it the group's).
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How a zone's container is reached by the task's proxy (chosen by `placement`): what it
/// adds to the container's env, mounts and `zone` arguments.
pub struct ZoneLink {
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    args: Vec<String>,
}

/// Sidecar mode: the pod's proxy connects to the zone's socket, in a directory the two share;
/// the zone accepts only the proxy's uid.
pub fn socket_link(zone: &Zone<'_>) -> ZoneLink {
    ZoneLink {
        env: Vec::new(),
        mounts: vec![mount(&zone.socket_volume(), ZONE_SOCKET_DIR, false)],
        args: vec![
            "--socket".into(),
            format!("{ZONE_SOCKET_DIR}/{ZONE_SOCKET}"),
            "--peer-uid".into(),
            PROXY_UID.to_string(),
        ],
    }
}

/// Shared mode: the zone listens on the pod's IP ([`Zone::port`]) and the shared proxy proves
/// the key only this container mounts ([`zone_key_volume`]).
pub fn tcp_link(zone: &Zone<'_>) -> ZoneLink {
    ZoneLink {
        // Set by the kubelet; `$(POD_IP)` in the command expands to it.
        env: vec![field_env("POD_IP", "status.podIP")],
        mounts: vec![mount(&zone.key_volume(), ZONE_KEY_DIR, true)],
        args: vec![
            "--listen".into(),
            format!("$(POD_IP):{}", zone.port()),
            "--key-file".into(),
            format!("{ZONE_KEY_DIR}/{ZONE_KEY_FILE}"),
        ],
    }
}

/// The proxy binary's log format flag (before any subcommand): JSON when the operator logs JSON.
pub fn log_format(settings: &RenderSettings) -> String {
    let format = if settings.sidecar_log_json {
        "json"
    } else {
        "text"
    };
    format!("--log-format={format}")
}

/// The server's container: the proxy's image running `zone`, as the server's own uid, with the
/// catalog entry's env and the server's Secret env only, how the proxy reaches it (`link`: its
/// socket directory, or its key and the pod's IP), its own `/tmp`, and the workspace as the
/// entry says.
pub fn zone_container(
    settings: &RenderSettings,
    resolved: &Resolved<'_>,
    zone: &Zone<'_>,
    link: ZoneLink,
) -> Container {
    let (name, stdio) = (&zone.server.spec.name, zone.stdio);
    let access = stdio.workspace;
    let mut vars = Vec::new();
    if !stdio.env.contains_key("HOME") {
        vars.push(env("HOME", "/tmp"));
    }
    vars.extend(stdio.env.iter().map(|(k, v)| env(k, v)));
    vars.extend(
        resolved
            .secrets
            .iter()
            .filter(|b| b.servers.contains(name))
            .map(secret_env),
    );
    vars.extend(link.env);
    let mut mounts = link.mounts;
    mounts.push(mount(&zone.tmp_volume(), "/tmp", false));
    if access != WorkspaceAccess::None {
        mounts.push(mount(
            WORKSPACE_VOLUME,
            WORKSPACE_DIR,
            access == WorkspaceAccess::ReadOnly,
        ));
    }
    let mut command = vec![
        PROXY_BINARY.to_string(),
        log_format(settings),
        "zone".into(),
    ];
    command.extend(link.args);
    // The zone names its server to whoever connects, and starts it for no other name.
    command.extend(["--server".into(), name.clone()]);
    command.extend(["--".into(), stdio.command.clone()]);
    command.extend(stdio.args.iter().cloned());
    let working_dir = stdio.cwd.clone().unwrap_or_else(|| {
        if access == WorkspaceAccess::None {
            "/tmp".into()
        } else {
            WORKSPACE_DIR.into()
        }
    });
    Container {
        name: zone_container_name(name),
        image: Some(settings.sidecar_image.clone()),
        restart_policy: Some("Always".into()),
        command: Some(command),
        working_dir: Some(working_dir),
        env: Some(vars),
        volume_mounts: Some(mounts),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "10m"), ("memory", "32Mi")])),
            limits: Some(quantities(&[("memory", "512Mi")])),
            ..Default::default()
        }),
        security_context: Some(restricted_as(zone.uid())),
        ..Default::default()
    }
}
