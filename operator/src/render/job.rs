//! The Job: the agent container, the MCP proxy and one container per stdio server (its zone),
//! the last two as native sidecars (init containers with `restartPolicy: Always`), so the Job
//! completes when the agent exits. Restricted pod security everywhere. What differs by where the
//! task's proxy runs (the native sidecars, the pod's volumes after the agent's, the agent's MCP
//! URL, credential and model base URL) is the placement's answer ([`Wiring`]); the proxy's
//! container is [`super::sidecar`]'s.
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
    ConfigMapVolumeSource, Container, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec,
    SeccompProfile, SecretVolumeSource, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use orchestrator_crds::shared::{TOKEN_DIR, TOKEN_FILE};
use orchestrator_crds::taskrun::TaskRun;

use super::files::TASK_FILE;
use super::names::config_map_name;
use super::placement::Wiring;
use super::pod::{
    AGENT_TMP_VOLUME, PodInput, RUN_AS, TOOLS_VOLUME, WORKSPACE_DIR, WORKSPACE_VOLUME, empty_dir,
    env, mount, restricted,
};
pub use super::proxy_volumes::{AUDITOR_DIR, MASK_DIR};
use super::runtime::Launch;
use super::settings::RenderSettings;
pub use super::sidecar::{METRICS_PORT_NAME, PROXY_CONTAINER, PROXY_SERVICE_NAME};
use orchestrator_crds::resolve::Resolved;

/// Name of the agent container.
pub const AGENT_CONTAINER: &str = "agent";
pub use super::pod::TOOLS_DIR;
/// Where the task text is mounted for the agent.
pub const TASK_DIR: &str = "/etc/orchestrator/task";

const TASK_VOLUME: &str = "task";

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
    /// Where the task's proxy runs (see [`super::placement`]).
    pub wiring: &'a Wiring<'a>,
    /// The model credential the task's proxy holds (see [`super::model`]).
    pub model: Option<&'a orchestrator_crds::taskrun::model::ModelSpec>,
    /// What the agent's runtime gives its container: env and script (see [`super::runtime`]).
    pub launch: &'a Launch,
}

impl JobInput<'_> {
    /// What the pod's containers and volumes are rendered from.
    fn pod(&self) -> PodInput<'_> {
        PodInput {
            taskrun: self.taskrun,
            settings: self.settings,
            resolved: self.resolved,
            model: self.model,
        }
    }
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
                    init_containers: input.wiring.init_containers(&input.pod()),
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

fn agent_container(input: &JobInput<'_>) -> Container {
    let tr = input.taskrun;
    let agent = tr.spec.agent.clone().unwrap_or_default();
    let mut vars = vec![
        env("HOME", "/tmp"),
        env("ORCHESTRATOR_TASK_ID", &tr.spec.task_id.to_string()),
        env("ORCHESTRATOR_SERVICE", &tr.spec.service_name),
        env("ORCHESTRATOR_TASK_FILE", &format!("{TASK_DIR}/{TASK_FILE}")),
        env("ORCHESTRATOR_MCP_URL", &input.wiring.mcp_url()),
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
    let (credential_env, credential_mount) = input.wiring.agent_credential();
    vars.extend(credential_env);
    mounts.push(credential_mount);
    // The runtime's: its files' paths, its model endpoint, its model.
    vars.extend(input.launch.env.iter().cloned());
    // The user's env comes last and replaces ours of the same name.
    vars.retain(|e| !agent.env.iter().any(|u| u.name == e.name));
    vars.extend(agent.env.iter().cloned());
    let (command, args) = match &input.launch.script {
        Some(script) => (Some(vec!["sh".into(), "-c".into(), script.clone()]), None),
        None => (agent.command.clone(), agent.args.clone()),
    };
    Container {
        name: AGENT_CONTAINER.into(),
        image: Some(agent.image.unwrap_or_else(|| {
            input
                .settings
                .agent_image_for(tr.spec.runtime())
                .to_string()
        })),
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
    let mut volumes = vec![tools_volume, task_volume, empty_dir(WORKSPACE_VOLUME)];
    volumes.extend(input.wiring.pod_volumes(&input.pod()));
    volumes
}
