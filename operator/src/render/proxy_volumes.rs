//! The volumes only the proxy's container mounts (and, for the agent's credential, the agent's):
//! the task identity's API access, the mask volume, the agent's credential and the auditors'
//! token (docs/operator.md, the pod table).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource,
    KeyToPath, ObjectFieldSelector, ProjectedVolumeSource, SecretProjection, SecretVolumeSource,
    ServiceAccountTokenProjection, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use orchestrator_crds::shared::{AUDITOR_SECRET, AUDITOR_TOKEN_KEY};

use orchestrator_crds::resolve::MaskKey;

/// The proxy's API access (token, CA, namespace), at the path in-cluster clients read.
pub const API_ACCESS_VOLUME: &str = "proxy-api-access";
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// A bound token's lifetime; the kubelet renews it at 80 %, the proxy re-reads the file.
const TOKEN_SECONDS: i64 = 3607;
/// The task's Secret keys, as `<secret>/<key>` files, for the proxy's masking only.
pub const MASK_VOLUME: &str = "mask-secrets";

/// Where the proxy reads them (`--mask-secrets-dir`).
pub const MASK_DIR: &str = "/etc/orchestrator/mask";

/// Sidecar mode: the agent's credential, written by the proxy at [`orchestrator_crds::shared::TOKEN_DIR`] (a memory-backed
/// emptyDir mounted read-write in the proxy's container and read-only in the agent's; no other
/// container mounts it).
pub const AGENT_CREDENTIAL_VOLUME: &str = "agent-credential";
/// The auditors' token (the namespace's Secret [`AUDITOR_SECRET`]), in the proxy's container.
pub const AUDITOR_VOLUME: &str = "auditor-token";
/// Where the proxy reads it (`--auditor-token-file`).
pub const AUDITOR_DIR: &str = "/etc/orchestrator/auditor";

/// The agent's credential: in memory (never on the node's disk), a few bytes.
pub fn agent_credential_volume() -> Volume {
    Volume {
        name: AGENT_CREDENTIAL_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity("64Ki".into())),
        }),
        ..Default::default()
    }
}

/// The auditors' token, only its key (0440: root and the pod's `fsGroup`; only the proxy's
/// container mounts it). The Secret is optional: until it exists no auditor is accepted.
pub fn auditor_volume() -> Volume {
    Volume {
        name: AUDITOR_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(AUDITOR_SECRET.into()),
            items: Some(vec![KeyToPath {
                key: AUDITOR_TOKEN_KEY.into(),
                path: AUDITOR_TOKEN_KEY.into(),
                ..Default::default()
            }]),
            default_mode: Some(0o440),
            optional: Some(true),
        }),
        ..Default::default()
    }
}

/// The mask volume (none without keys): one `secret` source per Secret (two when some of its
/// keys are optional and some not), each key at `<secret>/<key>`, read-only for everyone in
/// the one container that mounts it (the proxy's).
pub fn mask_volume(keys: &[MaskKey]) -> Option<Volume> {
    let mut sources: BTreeMap<(&str, bool), Vec<KeyToPath>> = BTreeMap::new();
    for k in keys {
        sources
            .entry((k.secret.as_str(), k.optional))
            .or_default()
            .push(KeyToPath {
                key: k.key.clone(),
                path: format!("{}/{}", k.secret, k.key),
                ..Default::default()
            });
    }
    (!sources.is_empty()).then(|| Volume {
        name: MASK_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(
                sources
                    .into_iter()
                    .map(|((secret, optional), items)| VolumeProjection {
                        secret: Some(SecretProjection {
                            name: secret.to_string(),
                            items: Some(items),
                            optional: optional.then_some(true),
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
        ..Default::default()
    })
}

/// What the standard automount gives, for the proxy container only: a bound token of the pod's
/// ServiceAccount (the task's identity), the cluster CA and the namespace.
pub fn api_access_volume() -> Volume {
    Volume {
        name: API_ACCESS_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(TOKEN_SECONDS),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    }
}
