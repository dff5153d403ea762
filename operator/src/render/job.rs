//! The Job: the agent container, the MCP proxy and one container per stdio server (its zone),
//! the last two as native sidecars (init containers with `restartPolicy: Always`), so the Job
//! completes when the agent exits. Restricted pod security everywhere.
//!
//! Trust zones (docs/architecture.md, "Trust zones in the task pod"): each container has its own
//! uid, env, `/tmp` and process namespace view (containers of a pod share no PID namespace):
//! - the agent: the workspace, the task, its MCP config; no Secret but its own env, no token;
//! - the proxy: the API token (the only container with one), the Secrets of HTTP servers, the
//!   tool cache; not the workspace; every Secret key of the task as a file, read-only, only to
//!   mask their values in the calls it shows for approval (the mask volume);
//! - each stdio server: only its own Secrets and literal env, the workspace only as its catalog
//!   entry says (`workspace`), a socket directory shared with the proxy alone, through which
//!   the proxy has `orchestrator-mcp-proxy zone` start the server's process on first use (shared
//!   mode: no socket; the zone listens on the pod's IP and the shared proxy proves the key only
//!   this container mounts, from the task's Secret `<taskrun>-zone-keys`).
//!
//! The task's ConfigMap is mounted as a directory (never `subPath`: those mounts are never
//! updated) so a new tool config reaches the running proxy. Secrets arrive as env through
//! `secretKeyRef`, and, for the proxy's masking only, as files in the mask volume.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EnvVar, ExecAction, KeyToPath,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use orchestrator_crds::proxy::PROXY_CONFIG_FILE;
use orchestrator_crds::shared::{AUDITOR_TOKEN_KEY, TOKEN_DIR, TOKEN_FILE};
use orchestrator_crds::taskrun::TaskRun;

use super::agent::DEFAULT_AGENT_SCRIPT;
use super::files::{MCP_CONFIG_FILE, SETTINGS_FILE, TASK_FILE};
use super::pod::{
    PROXY_BINARY, PROXY_UID, RUN_AS, WORKSPACE_DIR, WORKSPACE_VOLUME, empty_dir, env, field_env,
    mount, quantities, restricted, restricted_as, secret_env,
};
use super::proxy_volumes::{
    AGENT_CREDENTIAL_VOLUME, API_ACCESS_VOLUME, AUDITOR_VOLUME, MASK_VOLUME, SERVICE_ACCOUNT_DIR,
    agent_credential_volume, api_access_volume, auditor_volume, mask_volume,
};
pub use super::proxy_volumes::{AUDITOR_DIR, MASK_DIR};
use super::resolve::{MaskKey, Resolved, mask_keys};
use super::shared::{TOKEN_VOLUME, token_volume};
use super::zone::{ZONES_DIR, zone_container, zone_key_volume, zones};
use super::{RenderSettings, SharedProxy, config_map_name};

/// Name of the proxy container (the e2e kubelet stand-in looks it up by this name).
pub const PROXY_CONTAINER: &str = "mcp-proxy";
/// Name of the agent container.
pub const AGENT_CONTAINER: &str = "agent";
pub use super::pod::TOOLS_DIR;
/// Where the task text is mounted for the agent.
pub const TASK_DIR: &str = "/etc/orchestrator/task";

const TOOLS_VOLUME: &str = "tools";
const TASK_VOLUME: &str = "task";
const PROXY_TMP_VOLUME: &str = "proxy-tmp";
const AGENT_TMP_VOLUME: &str = "agent-tmp";
/// The proxy container's port serving `/metrics` (`--sidecar-metrics-port`), by this name.
pub const METRICS_PORT_NAME: &str = "metrics";
/// The proxy's `service.name` in its telemetry.
pub const PROXY_SERVICE_NAME: &str = "orchestrator-mcp-proxy";
pub struct JobInput<'a> {
    pub taskrun: &'a TaskRun,
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub owner: &'a OwnerReference,
    pub settings: &'a RenderSettings,
    /// The task's servers (with their catalog entries) and the Secret env they need.
    pub resolved: &'a Resolved<'a>,
    /// The pod's ServiceAccount (see [`super::identity`]).
    pub service_account_name: &'a str,
    /// Shared mode: the proxy is the shared one, not a container of the pod (see
    /// [`super::shared`]); each stdio server keeps its container, listening on the pod's IP.
    pub shared: Option<&'a SharedProxy>,
    /// The model credential the task's proxy holds (see [`super::model`]).
    pub model: Option<&'a orchestrator_crds::taskrun::model::ModelSpec>,
}

pub fn render(input: JobInput<'_>) -> Job {
    let tr = input.taskrun;
    let name = tr.name_any();
    let placement = tr.spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = input.labels.clone();
    pod_labels.insert("app.kubernetes.io/component".into(), "agent".into());
    Job {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(input.namespace.to_string()),
            labels: Some(input.labels.clone()),
            owner_references: Some(vec![input.owner.clone()]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            // An agent run has side effects (commits, issues); never run it twice on its own.
            backoff_limit: Some(0),
            active_deadline_seconds: tr.spec.active_deadline_seconds,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    // The task's own identity (it can read only the task's ConfigMap); no
                    // token is mounted: neither container talks to the Kubernetes API.
                    service_account_name: Some(input.service_account_name.to_string()),
                    automount_service_account_token: Some(false),
                    node_selector: (!placement.node_selector.is_empty())
                        .then_some(placement.node_selector),
                    tolerations: (!placement.tolerations.is_empty())
                        .then_some(placement.tolerations),
                    affinity: placement.affinity,
                    image_pull_secrets: (!placement.image_pull_secrets.is_empty())
                        .then_some(placement.image_pull_secrets),
                    priority_class_name: placement.priority_class_name,
                    runtime_class_name: placement.runtime_class_name,
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        fs_group: Some(RUN_AS),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    // The proxy first: it is ready before the servers' containers start, and
                    // the agent starts after all of them (native sidecars start in order).
                    init_containers: init_containers(&input),
                    containers: vec![agent_container(&input)],
                    volumes: Some(volumes(&input)),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The native sidecars: the proxy (sidecar mode only), then each stdio server's zone; none in
/// shared mode without stdio servers.
fn init_containers(input: &JobInput<'_>) -> Option<Vec<Container>> {
    let shared = input.shared.is_some();
    let zoned =
        zones(input.resolved).map(|z| zone_container(input.settings, input.resolved, &z, shared));
    if shared {
        let zoned: Vec<Container> = zoned.collect();
        return (!zoned.is_empty()).then_some(zoned);
    }
    Some(
        std::iter::once(proxy_container(input))
            .chain(zoned)
            .collect(),
    )
}

fn proxy_container(input: &JobInput<'_>) -> Container {
    let mut vars = vec![env("HOME", "/tmp")];
    if let Some(endpoint) = &input.settings.sidecar_otlp_endpoint {
        vars.push(env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
    }
    vars.extend(telemetry_env(input.taskrun));
    let mut args = vec![
        "--config".into(),
        format!("{TOOLS_DIR}/{PROXY_CONFIG_FILE}"),
    ];
    let mut ports = None;
    if let Some(port) = input.settings.sidecar_metrics_port {
        // A second listener on the pod IP serving only GET /metrics (the MCP listener stays on
        // loopback); the chart's PodMonitor scrapes the port named `metrics`.
        vars.push(field_env("POD_IP", "status.podIP"));
        args.push(format!("--metrics-listen=$(POD_IP):{port}"));
        ports = Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]);
    }
    let mut mounts = vec![
        mount(TOOLS_VOLUME, TOOLS_DIR, true),
        mount(PROXY_TMP_VOLUME, "/tmp", false),
        // The agent's credential: the proxy writes it once it holds its port.
        mount(AGENT_CREDENTIAL_VOLUME, TOKEN_DIR, false),
        mount(AUDITOR_VOLUME, AUDITOR_DIR, true),
    ];
    if let Some(model) = input.model {
        mounts.extend(super::model::mounts(model));
    }
    vars.extend([
        env(
            "MCP_PROXY_CLIENT_TOKEN_FILE",
            &format!("{TOKEN_DIR}/{TOKEN_FILE}"),
        ),
        env(
            "MCP_PROXY_AUDITOR_TOKEN_FILE",
            &format!("{AUDITOR_DIR}/{AUDITOR_TOKEN_KEY}"),
        ),
    ]);
    mounts.extend(zones(input.resolved).map(|z| {
        mount(
            &z.socket_volume(),
            &format!("{ZONES_DIR}/{}", z.server.spec.name),
            false,
        )
    }));
    if input.settings.sidecar_api_watch {
        let name = input.taskrun.name_any();
        vars.extend([
            env("MCP_PROXY_WATCH_CONFIG_MAP", &config_map_name(&name)),
            env("MCP_PROXY_SERVED_LEASE", &name),
            field_env("MCP_PROXY_NAMESPACE", "metadata.namespace"),
            field_env("MCP_PROXY_POD_NAME", "metadata.name"),
        ]);
        if let Some(uid) = &input.taskrun.metadata.uid {
            vars.push(env("MCP_PROXY_TASK_UID", uid));
        }
        if let Some((host, port)) = input
            .settings
            .sidecar_kubernetes_service
            .as_deref()
            .and_then(|s| s.rsplit_once(':'))
        {
            vars.push(env("KUBERNETES_SERVICE_HOST", host));
            vars.push(env("KUBERNETES_SERVICE_PORT", port));
        }
        mounts.push(mount(API_ACCESS_VOLUME, SERVICE_ACCOUNT_DIR, true));
    }
    if !masked(input).is_empty() {
        vars.push(env("MCP_PROXY_MASK_SECRETS_DIR", MASK_DIR));
        mounts.push(mount(MASK_VOLUME, MASK_DIR, true));
    }
    // Only the Secrets of servers the proxy itself talks to (HTTP headers); a stdio server's
    // are its own container's.
    vars.extend(
        input
            .resolved
            .secrets
            .iter()
            .filter(|b| {
                input
                    .resolved
                    .servers
                    .iter()
                    .any(|s| s.entry.stdio.is_none() && b.servers.contains(&s.spec.name))
            })
            .map(secret_env),
    );
    // The proxy serves on loopback only; kubelet's HTTP probes would hit the pod IP, so the
    // probes run the proxy binary's own HTTP check inside the container.
    let probe = |period: i32, failures: i32| Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                PROXY_BINARY.into(),
                "probe".into(),
                format!("http://{}/readyz", input.settings.proxy_addr()),
            ]),
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    Container {
        name: PROXY_CONTAINER.into(),
        image: Some(input.settings.sidecar_image.clone()),
        // A native sidecar: starts before the agent, runs beside it, and does not keep the
        // Job from completing when the agent exits.
        restart_policy: Some("Always".into()),
        command: Some(vec![PROXY_BINARY.into()]),
        args: Some(args),
        env: Some(vars),
        ports,
        volume_mounts: Some(mounts),
        startup_probe: Some(probe(1, 60)),
        readiness_probe: Some(probe(5, 3)),
        resources: Some(
            input
                .taskrun
                .spec
                .proxy
                .as_ref()
                .and_then(|p| p.resources.clone())
                .unwrap_or_else(default_proxy_resources),
        ),
        security_context: Some(restricted_as(PROXY_UID)),
        ..Default::default()
    }
}

/// The proxy's OpenTelemetry resource (its spans, its OTLP audit records): the pod, its Job and
/// the task, from the downward API (`$(VAR)` refers to a variable defined before it).
fn telemetry_env(tr: &TaskRun) -> Vec<EnvVar> {
    let name = tr.name_any();
    vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_UID", "metadata.uid"),
        env("OTEL_SERVICE_NAME", PROXY_SERVICE_NAME),
        env(
            "OTEL_RESOURCE_ATTRIBUTES",
            &format!(
                "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME),\
k8s.pod.uid=$(POD_UID),k8s.job.name={name},orchestrator.taskrun.name={name},\
orchestrator.task.id={}",
                tr.spec.task_id
            ),
        ),
    ]
}

/// The proxy's resources unless the TaskRun sets `spec.proxy.resources` (its servers run in
/// their own containers).
fn default_proxy_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(quantities(&[("cpu", "50m"), ("memory", "64Mi")])),
        limits: Some(quantities(&[("memory", "256Mi")])),
        ..Default::default()
    }
}

fn agent_container(input: &JobInput<'_>) -> Container {
    let tr = input.taskrun;
    let agent = tr.spec.agent.clone().unwrap_or_default();
    let mut vars = vec![
        env("HOME", "/tmp"),
        env("ORCHESTRATOR_TASK_ID", &tr.spec.task_id.to_string()),
        env("ORCHESTRATOR_SERVICE", &tr.spec.service_name),
        env("ORCHESTRATOR_TASK_FILE", &format!("{TASK_DIR}/{TASK_FILE}")),
        env(
            "ORCHESTRATOR_MCP_URL",
            &input.shared.map_or_else(
                || format!("http://{}/mcp", input.settings.proxy_addr()),
                |p| p.url.clone(),
            ),
        ),
        env(
            "ORCHESTRATOR_MCP_CONFIG",
            &format!("{TOOLS_DIR}/{MCP_CONFIG_FILE}"),
        ),
        env(
            "ORCHESTRATOR_SETTINGS",
            &format!("{TOOLS_DIR}/{SETTINGS_FILE}"),
        ),
    ];
    let mut mounts = vec![
        mount(TOOLS_VOLUME, TOOLS_DIR, true),
        mount(TASK_VOLUME, TASK_DIR, true),
        mount(WORKSPACE_VOLUME, WORKSPACE_DIR, false),
        mount(AGENT_TMP_VOLUME, "/tmp", false),
    ];
    // The credential the agent presents to its proxy: in shared mode a token for the shared
    // proxy's audience, in sidecar mode the one the pod's proxy wrote; read-only here.
    vars.push(env(
        "ORCHESTRATOR_MCP_TOKEN_FILE",
        &format!("{TOKEN_DIR}/{TOKEN_FILE}"),
    ));
    if input.shared.is_some() {
        vars.push(env("ORCHESTRATOR_PROXY_MODE", "shared"));
        mounts.push(mount(TOKEN_VOLUME, TOKEN_DIR, true));
    } else {
        mounts.push(mount(AGENT_CREDENTIAL_VOLUME, TOKEN_DIR, true));
    }
    if input.model.is_some() {
        vars.extend(super::model::agent_env(
            &input.settings.proxy_addr(),
            input.shared.map(|s| s.url.as_str()),
        ));
    }
    // The user's env comes last and replaces ours of the same name.
    vars.retain(|e| !agent.env.iter().any(|u| u.name == e.name));
    vars.extend(agent.env.iter().cloned());
    let (command, args) = match (&agent.command, &agent.args) {
        (None, None) => (
            Some(vec!["sh".into(), "-c".into(), DEFAULT_AGENT_SCRIPT.into()]),
            None,
        ),
        (command, args) => (command.clone(), args.clone()),
    };
    Container {
        name: AGENT_CONTAINER.into(),
        image: Some(
            agent
                .image
                .unwrap_or_else(|| input.settings.agent_image.clone()),
        ),
        command,
        args,
        working_dir: Some(WORKSPACE_DIR.into()),
        env: Some(vars),
        volume_mounts: Some(mounts),
        resources: agent.resources,
        security_context: Some(restricted()),
        ..Default::default()
    }
}

fn volumes(input: &JobInput<'_>) -> Vec<Volume> {
    let tr = input.taskrun;
    let name = tr.name_any();
    let task_item = |key: &str| {
        Some(vec![KeyToPath {
            key: key.to_string(),
            path: TASK_FILE.into(),
            ..Default::default()
        }])
    };
    let task = &tr.spec.task;
    let task_volume = if let Some(r) = &task.secret_key_ref {
        Volume {
            name: TASK_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(r.name.clone()),
                items: task_item(&r.key),
                ..Default::default()
            }),
            ..Default::default()
        }
    } else {
        let (cm, key) = match &task.config_map_key_ref {
            Some(r) => (r.name.clone(), r.key.clone()),
            None => (config_map_name(&name), TASK_FILE.to_string()),
        };
        Volume {
            name: TASK_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm,
                items: task_item(&key),
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let tools_volume = Volume {
        name: TOOLS_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(&name),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(proxy) = input.shared {
        // The agent's, and each zone's `/tmp` and key: no proxy, no socket, no API token, no
        // mask volume.
        let mut volumes = vec![
            tools_volume,
            task_volume,
            empty_dir(WORKSPACE_VOLUME),
            empty_dir(AGENT_TMP_VOLUME),
            token_volume(proxy, tr.spec.active_deadline_seconds),
        ];
        for zone in zones(input.resolved) {
            volumes.push(empty_dir(&zone.tmp_volume()));
            volumes.push(zone_key_volume(&name, &zone));
        }
        return volumes;
    }
    let mut volumes = vec![
        tools_volume,
        task_volume,
        empty_dir(WORKSPACE_VOLUME),
        empty_dir(PROXY_TMP_VOLUME),
        empty_dir(AGENT_TMP_VOLUME),
        agent_credential_volume(),
        auditor_volume(),
    ];
    let default_model = input.taskrun.spec.model.is_none();
    volumes.extend(
        input
            .model
            .into_iter()
            .flat_map(|model| super::model::volumes(model, default_model)),
    );
    for zone in zones(input.resolved) {
        volumes.push(empty_dir(&zone.socket_volume()));
        volumes.push(empty_dir(&zone.tmp_volume()));
    }
    if input.settings.sidecar_api_watch {
        volumes.push(api_access_volume());
    }
    volumes.extend(mask_volume(&masked(input)));
    volumes
}

/// The Secret keys the proxy masks: every one the pod gets (see [`mask_keys`]).
fn masked(input: &JobInput<'_>) -> Vec<MaskKey> {
    let agent_env = input
        .taskrun
        .spec
        .agent
        .as_ref()
        .map(|a| a.env.as_slice())
        .unwrap_or_default();
    mask_keys(&input.resolved.secrets, agent_env)
}
