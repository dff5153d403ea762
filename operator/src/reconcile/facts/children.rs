//! What the operator remembers of each task's children between reconciles: a few facts per Job,
//! ConfigMap and Lease ([`JobFacts`], [`ConfigMapFacts`], the served version), not the objects.
//! A Job, ConfigMap and Lease kept as objects in reflector stores cost about 5.6 KB per task
//! (their metadata, the store's keys); these facts about 0.5 KB (docs/benchmarks.md, "Operator
//! at scale").
//!
//! An [`Index`] is filled from its watch stream by [`reflect`], with the reflector's semantics:
//! an object's facts are replaced on every event, removed on its deletion, and a relist replaces
//! the whole index when it is complete; the objects go on to the controller (which maps them to
//! their owner) and are then dropped.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::runtime::watcher;
use orchestrator_crds::approval::VERDICTS_KEY;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::cached_job::CachedJob;
use super::job_state::{JobState, job_state};
use crate::render::{self, CONFIG_HASH_ANNOTATION, CONTEXT_VERSION_ANNOTATION};

/// What reconcile reads of a Job: the task's state, which sidecars (the proxy, each server's
/// zone) with which env the pod was created with, and whose Job it is.
#[derive(Clone, Debug, PartialEq)]
pub struct JobFacts {
    pub state: JobState,
    /// `<container>\t` and `<container>\t<env>` lines (one allocation, not one each).
    init_env: Box<str>,
    /// The uid of its controller (see [`controller_uid`]).
    controller: Option<Box<str>>,
    /// Its own uid: its pods' `batch.kubernetes.io/controller-uid` (see `binding.rs`).
    pub uid: Option<Box<str>>,
}

impl JobFacts {
    pub fn of(job: &CachedJob) -> Self {
        let mut init_env = String::new();
        for line in &job.init_env {
            init_env.push_str(line);
            init_env.push('\n');
        }
        Self {
            state: job_state(job),
            init_env: init_env.into(),
            controller: controller_uid(&job.metadata),
            uid: job.metadata.uid.as_deref().map(Into::into),
        }
    }

    /// Whether the Job is the child of the TaskRun with `uid`.
    pub fn controlled_by(&self, uid: &str) -> bool {
        self.controller.as_deref() == Some(uid)
    }

    /// Whether the pod has the sidecar `container`.
    pub fn has_container(&self, container: &str) -> bool {
        self.lines()
            .any(|(c, env)| c == container && env.is_empty())
    }

    /// Whether the pod's sidecar `container` has env `name`.
    pub fn has_env(&self, container: &str, name: &str) -> bool {
        !name.is_empty() && self.lines().any(|(c, env)| c == container && env == name)
    }

    /// The pod's sidecar containers, in the pod's order.
    pub fn containers(&self) -> impl Iterator<Item = &str> {
        self.lines()
            .filter(|(_, env)| env.is_empty())
            .map(|(c, _)| c)
    }

    fn lines(&self) -> impl Iterator<Item = (&str, &str)> {
        self.init_env.lines().filter_map(|l| l.split_once('\t'))
    }
}

/// What reconcile reads of a task's ConfigMap: the operator's two annotations, a digest of its
/// data and one of its owner references, and its controller.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigMapFacts {
    pub config_hash: Option<Box<str>>,
    pub context_version: Option<Box<str>>,
    data: Box<str>,
    /// The verdicts key as written (bounded: at most 20 short entries).
    pub verdicts: Option<Box<str>>,
    owners: Box<str>,
    /// The uid of its controller (see [`controller_uid`]).
    controller: Option<Box<str>>,
}

impl ConfigMapFacts {
    pub fn of(cm: &ConfigMap) -> Self {
        let annotation = |key: &str| {
            cm.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(|v| v.as_str().into())
        };
        // The verdicts are written on their own (see `approvals.rs`), not rendered.
        let verdicts = cm.data.as_ref().and_then(|d| d.get(VERDICTS_KEY));
        let data = match (&cm.data, &cm.binary_data) {
            (Some(data), None) if verdicts.is_some() => {
                let mut rendered = data.clone();
                rendered.remove(VERDICTS_KEY);
                render::digest(&rendered)
            }
            (Some(data), None) => render::digest(data),
            (None, None) => render::digest(&Default::default()),
            // The operator never writes binaryData: a ConfigMap with any differs from every render.
            (_, Some(_)) => "binaryData".to_string(),
        };
        Self {
            config_hash: annotation(CONFIG_HASH_ANNOTATION),
            context_version: annotation(CONTEXT_VERSION_ANNOTATION),
            data: data.into(),
            verdicts: verdicts.map(|v| v.as_str().into()),
            owners: owners_digest(cm.metadata.owner_references.as_deref()).into(),
            controller: controller_uid(&cm.metadata),
        }
    }

    /// Whether the ConfigMap is the child of the TaskRun with `uid`.
    pub fn controlled_by(&self, uid: &str) -> bool {
        self.controller.as_deref() == Some(uid)
    }

    /// Whether the ConfigMap is exactly `desired`: its data, both annotations and its owners
    /// (the verdicts aside).
    pub fn is(&self, desired: &ConfigMap) -> bool {
        Self {
            verdicts: None,
            ..self.clone()
        } == Self::of(desired)
    }
}

/// The uid of an object's controller (its owner reference with `controller: true`): a child of
/// a TaskRun is the TaskRun's only when this is the TaskRun's uid (see `taken.rs`).
pub fn controller_uid(meta: &ObjectMeta) -> Option<Box<str>> {
    controller(meta).map(|o| o.uid.as_str().into())
}

/// An object's controller: its owner reference with `controller: true` (there is at most one).
pub fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

fn owners_digest(owners: Option<&[OwnerReference]>) -> String {
    let json = serde_json::to_vec(&owners.unwrap_or_default()).unwrap_or_default();
    render::short_hex(&Sha256::digest(json))
}

/// Facts of one kind of child, by namespace and name.
pub struct Index<F> {
    state: Arc<RwLock<State<F>>>,
    ready: watch::Sender<bool>,
}

struct State<F> {
    by_name: HashMap<Box<str>, Arc<F>>,
    /// A relist in progress: replaces `by_name` when complete.
    relist: Option<HashMap<Box<str>, Arc<F>>>,
}

impl<F> Clone for Index<F> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<F> Default for Index<F> {
    fn default() -> Self {
        Self {
            state: Arc::new(RwLock::new(State {
                by_name: HashMap::new(),
                relist: None,
            })),
            ready: watch::Sender::new(false),
        }
    }
}

fn key(ns: &str, name: &str) -> Box<str> {
    format!("{ns}/{name}").into()
}

fn key_of<K: Resource>(obj: &K) -> Box<str> {
    let meta = obj.meta();
    key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl<F> Index<F> {
    /// The facts of child `name` in `ns`, if the watch has seen it.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<F>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.by_name.get(&key(ns, name)).cloned()
    }

    /// Every object's facts, with its `namespace/name`.
    pub fn entries(&self) -> Vec<(Box<str>, Arc<F>)> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state
            .by_name
            .iter()
            .map(|(k, f)| (k.clone(), f.clone()))
            .collect()
    }

    pub fn len(&self) -> usize {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Completes once the first list is in (a miss before that says nothing); errs when the
    /// watch is gone.
    pub async fn wait_until_ready(&self) -> Result<(), watch::error::RecvError> {
        self.ready
            .subscribe()
            .wait_for(|ready| *ready)
            .await
            .map(|_| ())
    }

    /// Takes in one watch event; `facts` of `None` means nothing to remember of that object.
    pub fn apply<K: Resource>(&self, event: &watcher::Event<K>, facts: impl Fn(&K) -> Option<F>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(obj) => match facts(obj) {
                Some(f) => {
                    state.by_name.insert(key_of(obj), Arc::new(f));
                }
                None => {
                    state.by_name.remove(&key_of(obj));
                }
            },
            watcher::Event::Delete(obj) => {
                state.by_name.remove(&key_of(obj));
            }
            watcher::Event::Init => state.relist = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                if let Some(f) = facts(obj) {
                    let relist = state.relist.get_or_insert_with(HashMap::new);
                    relist.insert(key_of(obj), Arc::new(f));
                }
            }
            watcher::Event::InitDone => {
                let relist = state.relist.take().unwrap_or_default();
                state.by_name = relist;
                drop(state);
                self.ready.send_replace(true);
            }
        }
    }
}

/// Keeps `index` up to date from a watch stream, passing the events on.
pub fn reflect<K, F, S>(
    stream: S,
    index: Index<F>,
    facts: fn(&K) -> Option<F>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    stream.inspect(move |event| {
        if let Ok(event) = event {
            index.apply(event, facts);
        }
    })
}

/// The facts of a Job.
pub fn job_facts(job: &CachedJob) -> Option<JobFacts> {
    Some(JobFacts::of(job))
}

/// The facts of a ConfigMap.
pub fn config_map_facts(cm: &ConfigMap) -> Option<ConfigMapFacts> {
    Some(ConfigMapFacts::of(cm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, data: serde_json::Value) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "n", "labels": {"a": "b"},
                "annotations": {CONTEXT_VERSION_ANNOTATION: "2", CONFIG_HASH_ANNOTATION: "h",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "ownerReferences": [{"apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
                    "name": "t", "uid": "u", "controller": true}]},
            "data": data
        }))
        .expect("a ConfigMap")
    }

    #[test]
    fn config_map_facts_tell_data_annotations_and_owners() {
        let data = json!({"proxy.yaml": "servers: []\n", "task.md": "# Task\n"});
        let desired = cm("t-tools", data.clone());
        let facts = ConfigMapFacts::of(&desired);
        assert!(facts.is(&desired));
        assert_eq!(facts.config_hash.as_deref(), Some("h"));
        assert_eq!(facts.context_version.as_deref(), Some("2"));

        // An edited value, an added or a removed key: not the rendered data.
        for other in [
            json!({"proxy.yaml": "servers: [x]\n", "task.md": "# Task\n"}),
            json!({"proxy.yaml": "servers: []\n", "task.md": "# Task\n", "x": ""}),
            json!({"proxy.yaml": "servers: []\n"}),
        ] {
            assert!(!ConfigMapFacts::of(&cm("t-tools", other)).is(&desired));
        }
        // Another version, another owner, binaryData.
        let mut v3 = desired.clone();
        v3.metadata
            .annotations
            .get_or_insert_default()
            .insert(CONTEXT_VERSION_ANNOTATION.into(), "3".into());
        assert!(!ConfigMapFacts::of(&v3).is(&desired));
        let mut orphan = desired.clone();
        orphan.metadata.owner_references = None;
        assert!(!ConfigMapFacts::of(&orphan).is(&desired));
        let mut binary = desired.clone();
        binary.binary_data = Some(Default::default());
        assert!(!ConfigMapFacts::of(&binary).is(&desired));
    }

    #[test]
    fn job_facts_keep_each_sidecars_env_names() {
        let job: CachedJob = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "n"},
            "spec": {"template": {"spec": {"initContainers": [
                {"name": crate::render::job::PROXY_CONTAINER,
                 "env": [{"name": "HOME"}, {"name": "API_TOKEN"}]},
                {"name": "zone-github", "env": [{"name": "GITHUB_TOKEN"}]},
                {"name": "zone-time"}]}}},
            "status": {"active": 1}
        }))
        .expect("a Job");
        let facts = JobFacts::of(&job);
        assert!(facts.has_env("mcp-proxy", "HOME") && facts.has_env("mcp-proxy", "API_TOKEN"));
        assert!(facts.has_env("zone-github", "GITHUB_TOKEN"));
        // Each container's own: the proxy does not have the github server's token.
        assert!(!facts.has_env("mcp-proxy", "GITHUB_TOKEN"));
        assert!(!facts.has_env("zone-time", "") && !facts.has_env("zone-github", "GITHUB"));
        assert!(facts.has_container("zone-time") && facts.has_container("mcp-proxy"));
        assert!(!facts.has_container("zone-git") && !facts.has_container("agent"));
        assert_eq!(
            facts.state.phase,
            orchestrator_crds::taskrun::Phase::Running
        );
    }

    #[tokio::test]
    async fn an_index_follows_the_watch_and_a_relist_replaces_it() {
        let index: Index<ConfigMapFacts> = Index::default();
        let a = cm("a", json!({"k": "1"}));
        let b = cm("b", json!({"k": "2"}));
        // Before the first list, nothing is ready.
        let ready = index.clone();
        let waiting = tokio::spawn(async move { ready.wait_until_ready().await });
        index.apply(&watcher::Event::Init, config_map_facts);
        index.apply(&watcher::Event::InitApply(a.clone()), config_map_facts);
        assert!(
            index.get("n", "a").is_none(),
            "not before the list is complete"
        );
        index.apply(&watcher::Event::InitDone, config_map_facts);
        waiting.await.expect("joined").expect("ready");
        assert!(index.get("n", "a").is_some_and(|f| f.is(&a)));

        index.apply(&watcher::Event::Apply(b.clone()), config_map_facts);
        assert_eq!(index.len(), 2);
        index.apply(&watcher::Event::Delete(a.clone()), config_map_facts);
        assert!(index.get("n", "a").is_none());

        // A relist that no longer has b (deleted while the watch was down), but has a again.
        index.apply(&watcher::Event::Init, config_map_facts);
        index.apply(&watcher::Event::InitApply(a.clone()), config_map_facts);
        assert!(
            index.get("n", "b").is_some(),
            "kept until the relist is complete"
        );
        index.apply(&watcher::Event::InitDone, config_map_facts);
        assert!(index.get("n", "b").is_none());
        assert!(index.get("n", "a").is_some());
        assert!(index.get("m", "a").is_none(), "by namespace too");
    }
}
