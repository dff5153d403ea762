//! The children as the operator caches them: trimmed to what reconcile reads, which keeps the
//! operator small with thousands of tasks. Pure.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, PodSpec};

use crate::render::job;

/// Keeps of a Job what reconcile reads: identity, owners, status and the proxy container's env
/// names (to know which Secrets the running pod has).
pub fn trim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    job.metadata.annotations = None;
    job.metadata.labels = None;
    if let Some(spec) = job.spec.as_mut() {
        spec.selector = None;
        spec.template.metadata = None;
        if let Some(pod) = spec.template.spec.as_mut() {
            let proxy_env = pod
                .init_containers
                .iter()
                .flatten()
                .find(|c| c.name == job::PROXY_CONTAINER)
                .map(|c| {
                    c.env
                        .iter()
                        .flatten()
                        .map(|e| EnvVar {
                            name: e.name.clone(),
                            ..Default::default()
                        })
                        .collect()
                });
            *pod = PodSpec {
                init_containers: Some(vec![Container {
                    name: job::PROXY_CONTAINER.into(),
                    env: proxy_env,
                    ..Default::default()
                }]),
                ..Default::default()
            };
        }
    }
    if let Some(status) = job.status.as_mut() {
        status.uncounted_terminated_pods = None;
    }
}

/// Keeps of a ConfigMap what reconcile reads (data, annotations, owners).
pub fn trim_config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
    cm.metadata.labels = None;
}
