//! Sidecar mode: the task's proxy is a container of its pod (a native sidecar: an init
//! container with `restartPolicy: Always`). What that puts in the pod: the proxy's container
//! ([`proxy_container`]: the API token, the HTTP servers' Secrets, the mask volume, the model
//! key, each zone's socket) and the volumes of a sidecar-mode pod ([`pod_volumes`]).

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ExecAction, Probe, ResourceRequirements, Volume,
};
use kube::ResourceExt;
use orchestrator_crds::proxy::PROXY_CONFIG_FILE;
use orchestrator_crds::shared::{AUDITOR_TOKEN_KEY, TOKEN_DIR, TOKEN_FILE};
use orchestrator_crds::taskrun::TaskRun;

use super::names::config_map_name;
use super::pod::{
    AGENT_TMP_VOLUME, PROXY_BINARY, PROXY_UID, PodInput, TOOLS_DIR, TOOLS_VOLUME, empty_dir, env,
    field_env, mount, quantities, resource_env, restricted_as, secret_env,
};
use super::proxy_volumes::{
    AGENT_CREDENTIAL_VOLUME, API_ACCESS_VOLUME, AUDITOR_DIR, AUDITOR_VOLUME, MASK_DIR, MASK_VOLUME,
    SERVICE_ACCOUNT_DIR, agent_credential_volume, api_access_volume, auditor_volume, mask_volume,
};
use super::zone::{ZONES_DIR, log_format, zones};
use orchestrator_crds::resolve::{MaskKey, mask_keys};

/// Name of the proxy container (the e2e kubelet stand-in looks it up by this name).
pub const PROXY_CONTAINER: &str = "mcp-proxy";
/// The proxy container's port serving `/metrics` (`--sidecar-metrics-port`), by this name.
pub const METRICS_PORT_NAME: &str = "metrics";
/// The proxy's `service.name` in its telemetry.
pub const PROXY_SERVICE_NAME: &str = "orchestrator-mcp-proxy";
/// The proxy's `/tmp`.
const PROXY_TMP_VOLUME: &str = "proxy-tmp";

/// The pod's volumes after the task's ConfigMap, the task and the workspace: the proxy's
/// `/tmp`, the agent's, the agent's credential, the auditors' token, the model key, each zone's
/// socket and `/tmp`, the proxy's API access (with the API watch on) and the mask volume.
pub fn pod_volumes(input: &PodInput<'_>) -> Vec<Volume> {
    let mut volumes = vec![
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

/// The proxy's container: its config from the task's ConfigMap, the agent's credential it
/// writes, the auditors' token, the model key, each zone's socket, the API token (with the API
/// watch on), the mask volume and the HTTP servers' Secret env.
pub fn proxy_container(input: &PodInput<'_>) -> Container {
    // The proxy derives its memory budget from its own limit (without one: the node's memory).
    let mut vars = vec![
        env("HOME", "/tmp"),
        resource_env("MCP_PROXY_MEMORY_LIMIT", "limits.memory"),
    ];
    if let Some(endpoint) = &input.settings.sidecar_otlp_endpoint {
        vars.push(env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
    }
    vars.extend(telemetry_env(input.taskrun));
    let mut args = vec![
        log_format(input.settings),
        "--config".into(),
        format!("{TOOLS_DIR}/{PROXY_CONFIG_FILE}"),
    ];
    if let Some(endpoint) = &input.settings.sidecar_audit_otlp_endpoint {
        vars.push(env("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", endpoint));
        args.push("--audit-otlp".into());
    }
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

/// The Secret keys the proxy masks: every one the pod gets (see [`mask_keys`]).
fn masked(input: &PodInput<'_>) -> Vec<MaskKey> {
    let agent_env = input
        .taskrun
        .spec
        .agent
        .as_ref()
        .map(|a| a.env.as_slice())
        .unwrap_or_default();
    mask_keys(&input.resolved.secrets, agent_env)
}
