//! What the operator keeps of a shared task's ConfigMap in the shared proxy's namespace
//! ([`SharedFacts`]; the ConfigMap itself: `placement/shared.rs`), from a watch of the labelled
//! ConfigMaps there (`lib.rs`), which also reconciles a task whose ConfigMap was changed or
//! deleted by someone else ([`task_of`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use orchestrator_crds::approval::VERDICTS_KEY;
use orchestrator_crds::shared::{
    TASK_ANNOTATION, TASK_POD_IP_ANNOTATION, TASK_POD_UID_ANNOTATION, TASK_UID_ANNOTATION,
};

use crate::render;
use crate::render::shared::TaskPod;

/// What reconcile reads of a shared task's ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedFacts {
    /// The task's TaskRun uid (what the sweep matches).
    pub task_uid: Option<Box<str>>,
    /// The pod the task is bound to, as written.
    pub pod: Option<TaskPod>,
    /// The verdicts as written (see `approvals.rs`).
    pub verdicts: Option<Box<str>>,
    /// A digest of what the operator renders into it (data without the verdicts, its labels and
    /// annotations).
    rendered: Box<str>,
    /// Its version, for a deletion that must not delete a newer one.
    pub resource_version: Option<Box<str>>,
}

impl SharedFacts {
    pub fn of(cm: &ConfigMap) -> Self {
        let annotations = cm.annotations();
        let mut rendered: BTreeMap<String, String> = cm.data.clone().unwrap_or_default();
        rendered.remove(VERDICTS_KEY);
        for (k, v) in annotations
            .iter()
            .filter(|(k, _)| k.starts_with("orchestrator.io/"))
        {
            rendered.insert(format!("@annotation {k}"), v.clone());
        }
        for (k, v) in cm.labels() {
            rendered.insert(format!("@label {k}"), v.clone());
        }
        if cm.binary_data.is_some() {
            rendered.insert("@binaryData".into(), String::new());
        }
        let pod = annotations.get(TASK_POD_UID_ANNOTATION).map(|uid| TaskPod {
            uid: uid.clone(),
            ip: annotations.get(TASK_POD_IP_ANNOTATION).cloned(),
        });
        Self {
            task_uid: annotations
                .get(TASK_UID_ANNOTATION)
                .map(|u| u.as_str().into()),
            pod,
            verdicts: cm
                .data
                .as_ref()
                .and_then(|d| d.get(VERDICTS_KEY))
                .map(|v| v.as_str().into()),
            rendered: render::digest(&rendered).into(),
            resource_version: cm.resource_version().map(Into::into),
        }
    }

    /// Whether the ConfigMap is `desired` (the verdicts aside).
    pub fn is(&self, desired: &ConfigMap) -> bool {
        self.rendered == Self::of(desired).rendered
    }
}

/// The facts of a shared task's ConfigMap.
pub fn facts(cm: &ConfigMap) -> Option<SharedFacts> {
    Some(SharedFacts::of(cm))
}

/// The task a shared ConfigMap names (`<namespace>/<name>`), for the controller to reconcile.
pub fn task_of(cm: &ConfigMap) -> Option<(String, String)> {
    let (ns, name) = cm.annotations().get(TASK_ANNOTATION)?.split_once('/')?;
    Some((ns.to_string(), name.to_string()))
}
