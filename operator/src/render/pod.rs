//! The building blocks of the task pod's containers: who runs as whom, the restricted security
//! context, mounts, env, Secret env, quantities, and what they are rendered from
//! ([`PodInput`]). Used by `job` (the agent), `sidecar` (the proxy) and `zone` (each server's
//! container).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    ResourceFieldSelector, SeccompProfile, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::model::ModelSpec;

use super::settings::RenderSettings;
use orchestrator_crds::resolve::{Resolved, SecretBinding};

/// Where the task's ConfigMap is mounted (a directory, in the agent's and the proxy's containers).
pub const TOOLS_DIR: &str = "/etc/orchestrator/tools";
/// The agent's working directory, and the servers' whose catalog entry gives them `workspace`.
pub const WORKSPACE_DIR: &str = "/workspace";
/// The workspace's volume (an emptyDir).
pub const WORKSPACE_VOLUME: &str = "workspace";
/// The task's ConfigMap's volume (mounted at [`TOOLS_DIR`]).
pub const TOOLS_VOLUME: &str = "tools";
/// The agent's `/tmp` (an emptyDir).
pub const AGENT_TMP_VOLUME: &str = "agent-tmp";
/// The proxy binary inside the sidecar image (also each server's launcher: `zone`).
pub const PROXY_BINARY: &str = "orchestrator-mcp-proxy";
/// The agent's uid and gid (the images' user), and the pod's `fsGroup`: every container has
/// it as a supplementary group, which owns the workspace (group-writable, setgid).
pub const RUN_AS: i64 = 65532;
/// The proxy's uid and gid: no other container runs as it.
pub const PROXY_UID: i64 = 65533;
/// The first server's uid and gid; the n-th stdio server of the task gets this + n.
pub const ZONE_UID_BASE: i64 = 65600;

/// What the pod's containers and volumes are rendered from.
#[derive(Clone, Copy)]
pub struct PodInput<'a> {
    pub taskrun: &'a TaskRun,
    pub settings: &'a RenderSettings,
    /// The task's servers (with their catalog entries) and the Secret env they need.
    pub resolved: &'a Resolved<'a>,
    /// The model credential the task's proxy holds (see [`super::model`]).
    pub model: Option<&'a ModelSpec>,
}

/// [`restricted`], as its own uid and gid (the pod's `fsGroup` stays a supplementary group).
pub fn restricted_as(uid: i64) -> SecurityContext {
    SecurityContext {
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        ..restricted()
    }
}

pub fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

pub fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

pub fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An env var set from one of the container's own resources (`limits.memory`), in bytes.
pub fn resource_env(name: &str, resource: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            resource_field_ref: Some(ResourceFieldSelector {
                resource: resource.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

pub fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

pub fn secret_env(b: &SecretBinding) -> EnvVar {
    EnvVar {
        name: b.env.clone(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: b.secret.clone(),
                key: b.key.clone(),
                optional: b.optional.then_some(true),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
