//! The model gateway in a task's proxy: which credential the task uses (`spec.model`, else the
//! operator's default), the proxy config's `gateway`, the Secret volume only the proxy's
//! container mounts (sidecar mode; a shared proxy reads the Secret through the API), and what
//! points the agent's runtime at the proxy (its base URL, and an API key helper that prints the
//! pod's agent credential: in sidecar mode only to the proxy's uid).

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, KeyToPath, SecretVolumeSource, Volume, VolumeMount,
};
use orchestrator_crds::gateway::{GatewaySpec, ObjectKey, PATH_PREFIX};
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::model::ModelSpec;
use orchestrator_crds::taskrun::runtime::{AgentRuntime, default_endpoint};

use super::pod::mount;
use super::settings::RenderSettings;
use orchestrator_crds::resolve::Problem;

/// The model key's volume: the Secret's one key, in the proxy's container only.
pub const MODEL_KEY_VOLUME: &str = "model-key";
/// Where the proxy reads it (`gateway.keyFile`).
pub const MODEL_KEY_DIR: &str = "/etc/orchestrator/model";
pub const MODEL_KEY_FILE: &str = "api-key";
/// The endpoint's CAs (`spec.model.caConfigMapKeyRef`), in the proxy's container only.
pub const MODEL_CA_VOLUME: &str = "model-ca";
pub const MODEL_CA_DIR: &str = "/etc/orchestrator/model-ca";
pub const MODEL_CA_FILE: &str = "ca.pem";
/// The agent's API key helper (Claude Code's `apiKeyHelper`), in the task's ConfigMap.
pub const MODEL_KEY_HELPER_FILE: &str = "model-key.sh";

/// Agent env that brings a model key (or another endpoint) into the agent's container: the
/// older way, before the gateway (Claude Code's variables).
const AGENT_MODEL_ENV: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
];
/// The same for the other runtimes, which reach their model only through the gateway.
const RUNTIME_MODEL_ENV: &[&str] = &[
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
];

/// The task's model credential: its own `spec.model`; else the operator's default, unless the
/// agent's env brings a key of its own (a TaskRun written before the gateway keeps working, and
/// keeps its key in the agent's env: Claude Code and a custom command only). `spec.model` with
/// such env is refused: the key would be in the agent's container after all; so is such env for
/// a runtime that reaches its model only through the proxy.
pub fn choose<'a>(
    tr: &'a TaskRun,
    settings: &'a RenderSettings,
) -> Result<Option<&'a ModelSpec>, Problem> {
    let runtime = tr.spec.runtime();
    let legacy = matches!(runtime, AgentRuntime::ClaudeCode | AgentRuntime::Custom);
    let agent_env: Vec<&str> = tr
        .spec
        .agent
        .iter()
        .flat_map(|a| a.env.iter())
        .map(|e| e.name.as_str())
        .filter(|name| {
            AGENT_MODEL_ENV.contains(name) || (!legacy && RUNTIME_MODEL_ENV.contains(name))
        })
        .collect();
    match (&tr.spec.model, agent_env.first()) {
        (Some(_), Some(name)) => Err(Problem {
            reason: "ModelKeyInAgent",
            message: format!(
                "spec.agent.env names {name}, and spec.model gives the task's proxy the model \
                 key: remove {name} from spec.agent.env (the agent reaches the model through \
                 the proxy, which holds the key; docs/api.md, \"The model\")"
            ),
        }),
        (None, Some(name)) if !legacy => Err(Problem {
            reason: "ModelKeyInAgent",
            message: format!(
                "spec.agent.env names {name}, and runtime {} reaches its model only through the \
                 task's proxy: remove {name} from spec.agent.env and name the Secret key in \
                 spec.model.secretKeyRef instead (only the proxy reads it; docs/api.md, \"The \
                 model\")",
                runtime.as_str()
            ),
        }),
        (Some(model), None) => Ok(Some(model)),
        (None, Some(_)) => Ok(None),
        (None, None) => Ok(settings.default_model.as_ref()),
    }
}

/// `proxy.yaml`'s `gateway` for `model`, with the TaskRun's budget: the API its runtime speaks,
/// at `model.endpoint` or that API's default endpoint.
pub fn gateway_spec(tr: &TaskRun, model: &ModelSpec) -> GatewaySpec {
    let provider = tr.spec.runtime().provider();
    GatewaySpec {
        provider,
        endpoint: model
            .endpoint
            .clone()
            .unwrap_or_else(|| default_endpoint(provider).into()),
        key_file: format!("{MODEL_KEY_DIR}/{MODEL_KEY_FILE}"),
        ca_file: model
            .ca_config_map_key_ref
            .as_ref()
            .map(|_| format!("{MODEL_CA_DIR}/{MODEL_CA_FILE}")),
        models: model.models.clone(),
        budget: tr.spec.budget.clone().unwrap_or_default(),
        ..GatewaySpec::default()
    }
}

/// `proxy.yaml`'s `gateway` for a shared proxy: the key and CAs named by their Secret and
/// ConfigMap keys, read through the API (the task's Role lets the shared proxy `get` them).
pub fn shared_gateway_spec(tr: &TaskRun, model: &ModelSpec) -> GatewaySpec {
    let at = |k: &orchestrator_crds::taskrun::KeyRef| ObjectKey {
        name: k.name.clone(),
        key: k.key.clone(),
    };
    GatewaySpec {
        key_file: String::new(),
        key_secret: Some(at(&model.secret_key_ref)),
        ca_file: None,
        ca_config_map: model.ca_config_map_key_ref.as_ref().map(at),
        ..gateway_spec(tr, model)
    }
}

/// The model API's base URL at the shared proxy whose MCP URL is `mcp_url`: its scheme and
/// authority, and `/model` (the shared proxy serves it next to `/mcp`).
pub fn shared_base_url(mcp_url: &str) -> String {
    let origin = match mcp_url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
            format!("{scheme}://{authority}")
        }
        None => mcp_url.trim_end_matches('/').to_string(),
    };
    format!("{origin}{PATH_PREFIX}")
}

/// The Secret's key as one file (0440: root and the pod's `fsGroup`; only the proxy's container
/// mounts it, so no other container has a path to it). The TaskRun's own Secret must exist
/// (the pod waits for it, as for env from a Secret); the operator's default may not exist in
/// every namespace (`optional`: the gateway then answers that it has no key).
pub fn key_volume(model: &ModelSpec, optional: bool) -> Volume {
    Volume {
        name: MODEL_KEY_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(model.secret_key_ref.name.clone()),
            items: Some(vec![KeyToPath {
                key: model.secret_key_ref.key.clone(),
                path: MODEL_KEY_FILE.into(),
                ..Default::default()
            }]),
            default_mode: Some(0o440),
            optional: optional.then_some(true),
        }),
        ..Default::default()
    }
}

/// The proxy container's mounts for `model`: its key, and its CAs when it names some.
pub fn mounts(model: &ModelSpec) -> Vec<VolumeMount> {
    let mut mounts = vec![mount(MODEL_KEY_VOLUME, MODEL_KEY_DIR, true)];
    if model.ca_config_map_key_ref.is_some() {
        mounts.push(mount(MODEL_CA_VOLUME, MODEL_CA_DIR, true));
    }
    mounts
}

/// The pod's volumes for `model`: [`key_volume`], and the ConfigMap key of its CAs (not
/// optional: a gateway that cannot verify its endpoint would only fail every request).
pub fn volumes(model: &ModelSpec, default_credential: bool) -> Vec<Volume> {
    let mut volumes = vec![key_volume(model, default_credential)];
    if let Some(ca) = &model.ca_config_map_key_ref {
        volumes.push(Volume {
            name: MODEL_CA_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: ca.name.clone(),
                items: Some(vec![KeyToPath {
                    key: ca.key.clone(),
                    path: MODEL_CA_FILE.into(),
                    ..Default::default()
                }]),
                default_mode: Some(0o444),
                optional: None,
            }),
            ..Default::default()
        });
    }
    volumes
}

/// The model key helper (run with `sh`; Claude Code's `apiKeyHelper`, Codex's model provider
/// `auth.command`, the token the other runtimes' scripts export): the agent's credential,
/// printed only when the proxy's port is held by the proxy's uid (the same check as the MCP headers helper: while
/// the proxy restarts another container could bind the port).
pub fn key_helper_script(headers_script: &str) -> String {
    let check = headers_script
        .rsplit_once("printf '{")
        .map_or(headers_script, |(check, _)| check);
    format!(
        "{}cat \"$token\"\n",
        check.replacen(
            "# Claude Code's headersHelper (sidecar mode):",
            "# The model key helper (sidecar mode; Claude Code's apiKeyHelper, Codex's auth command, the\n\
             # other runtimes' scripts):",
            1
        )
    )
}
