//! The namespaces the operator watches: every one (one watch per kind across the cluster, which
//! needs cluster-wide `list` and `watch`), or a list (one watch per kind and namespace, which
//! needs only a Role in each: the chart's `watchNamespaces`). A list's watches are merged into
//! one stream with the meaning of one watch ([`Merge`]), so the controller and the caches (one
//! store per kind) work the same in both modes; a TaskRun elsewhere is never seen.

use std::collections::HashSet;
use std::fmt::Debug;

use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// Where the operator reconciles TaskRuns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Every namespace.
    All,
    /// These namespaces only (at least one, no duplicates).
    Only(Vec<String>),
}

impl Watched {
    /// From the `--namespace` values: none means every namespace; empty entries are dropped
    /// (an unset chart value renders as `""`) and duplicates kept once.
    pub fn new(namespaces: &[String]) -> Self {
        let mut seen = HashSet::new();
        let list: Vec<String> = namespaces
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty() && seen.insert(*n))
            .map(str::to_string)
            .collect();
        if list.is_empty() {
            Self::All
        } else {
            Self::Only(list)
        }
    }

    /// For logs: `every namespace` or `namespaces a, b`.
    pub fn describe(&self) -> String {
        match self {
            Self::All => "every namespace".into(),
            Self::Only(list) => format!("namespaces {}", list.join(", ")),
        }
    }
}

/// A watch of `K` where `watched` says, with [`crate::backoff::watch`]'s retries (each namespace's
/// own): one watch, or one per namespace merged by [`Merge`].
pub fn watch<K>(
    client: &Client,
    watched: &Watched,
    config: watcher::Config,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let one =
        |api: Api<K>, config| crate::backoff::watch(watcher::watcher(api, config).boxed()).boxed();
    match watched {
        Watched::All => one(Api::all(client.clone()), config),
        Watched::Only(list) if list.len() == 1 => {
            one(Api::namespaced(client.clone(), &list[0]), config)
        }
        Watched::Only(list) => {
            let watches = list.iter().enumerate().map(|(i, ns)| {
                one(Api::namespaced(client.clone(), ns), config.clone())
                    .map_ok(move |event| (i, event))
                    .boxed()
            });
            let mut merge = Merge::new(list);
            stream::select_all(watches)
                .flat_map(move |item| {
                    stream::iter(match item {
                        Ok((i, event)) => merge.on(i, event).into_iter().map(Ok).collect(),
                        Err(e) => vec![Err(e)],
                    })
                })
                .boxed()
        }
    }
}

/// Merges the events of one watch per namespace into the events of one watch over all of
/// them. A consumer (a reflector store, a `children::Index`) takes an `InitDone` to mean
/// "replace everything with what was listed": passed on as they come, one namespace's relist
/// would empty every other namespace's part. So:
///
/// - one `Init` goes out first, and one `InitDone` once every namespace has listed; until then
///   everything a namespace lists or changes goes into the consumer's list (`InitApply`), and
///   deletions wait until it is complete (then `Delete`);
/// - afterwards a namespace's relist (its watch expired or failed) becomes `Apply` for what it
///   lists and, when it is complete, `Delete` for what it no longer has. Such a deletion carries
///   only the object's name and namespace (the merge keeps names, not objects), as one watch's
///   relist drops a vanished object without any event.
///
/// It keeps each namespace's object names, and one object of the kind to make those deletions
/// from.
pub struct Merge<K> {
    namespaces: Vec<Namespace<K>>,
    started: bool,
    /// Every namespace has completed its first list.
    listed: bool,
    template: Option<K>,
}

struct Namespace<K> {
    name: String,
    /// The names the consumer has (or will have once the first list is complete).
    known: HashSet<Box<str>>,
    /// A list in progress: what it has listed so far.
    listing: Option<HashSet<Box<str>>>,
    /// Its first list is complete.
    listed: bool,
    /// Deleted before every namespace had listed: sent after the `InitDone`.
    deleted: Vec<K>,
}

impl<K: Resource + Clone> Merge<K> {
    /// A merge of the watches of `namespaces`, in this order (see [`Merge::on`]).
    pub fn new(namespaces: &[String]) -> Self {
        Self {
            namespaces: namespaces
                .iter()
                .map(|name| Namespace {
                    name: name.clone(),
                    known: HashSet::new(),
                    listing: None,
                    listed: false,
                    deleted: Vec::new(),
                })
                .collect(),
            started: false,
            listed: false,
            template: None,
        }
    }

    /// Takes in one event of namespace `i`'s watch; returns what the merged watch says.
    pub fn on(&mut self, i: usize, event: watcher::Event<K>) -> Vec<watcher::Event<K>> {
        use watcher::Event::*;
        let listed = self.listed;
        let ns = &mut self.namespaces[i];
        match event {
            Init => {
                ns.listing = Some(HashSet::new());
                if self.started {
                    return Vec::new();
                }
                self.started = true;
                vec![Init]
            }
            InitApply(obj) | Apply(obj) if !listed => {
                if let Some(listing) = ns.listing.as_mut() {
                    listing.insert(name(&obj));
                }
                ns.known.insert(name(&obj));
                self.template.get_or_insert_with(|| obj.clone());
                vec![InitApply(obj)]
            }
            InitApply(obj) | Apply(obj) => {
                if let Some(listing) = ns.listing.as_mut() {
                    listing.insert(name(&obj));
                }
                ns.known.insert(name(&obj));
                vec![Apply(obj)]
            }
            Delete(obj) => {
                ns.known.remove(&name(&obj));
                if listed {
                    vec![Delete(obj)]
                } else {
                    ns.deleted.push(obj);
                    Vec::new()
                }
            }
            InitDone => {
                let listing = ns.listing.take().unwrap_or_default();
                let gone: Vec<Box<str>> = ns.known.difference(&listing).cloned().collect();
                ns.known = listing;
                ns.listed = true;
                let gone: Vec<K> = match self.template.as_ref() {
                    Some(template) => gone
                        .iter()
                        .map(|n| tombstone(template, n, &ns.name))
                        .collect(),
                    None => Vec::new(), // nothing was ever seen, so nothing is gone
                };
                if listed {
                    return gone.into_iter().map(Delete).collect();
                }
                self.namespaces[i].deleted.extend(gone);
                if !self.namespaces.iter().all(|n| n.listed) {
                    return Vec::new();
                }
                self.listed = true;
                let mut out = vec![InitDone];
                for ns in &mut self.namespaces {
                    for obj in ns.deleted.drain(..) {
                        if !ns.known.contains(&name(&obj)) {
                            out.push(Delete(obj));
                        }
                    }
                }
                out
            }
        }
    }
}

fn name<K: Resource>(obj: &K) -> Box<str> {
    obj.meta().name.as_deref().unwrap_or_default().into()
}

/// An object of `template`'s kind named `name` in `namespace`, and nothing else: what a
/// deletion needs.
fn tombstone<K: Resource + Clone>(template: &K, name: &str, namespace: &str) -> K {
    let mut obj = template.clone();
    *obj.meta_mut() = ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        ..ObjectMeta::default()
    };
    obj
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use kube::runtime::reflector::ObjectRef;
    use watcher::Event::{self, *};

    fn cm(ns: &str, name: &str, v: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    /// What a reflector store holds after the merged events: `ns/name=v` (a tombstone has no
    /// data: `ns/name=-`).
    struct Consumer {
        store: reflector::Store<ConfigMap>,
        writer: reflector::store::Writer<ConfigMap>,
        merge: Merge<ConfigMap>,
    }

    impl Consumer {
        fn new() -> Self {
            let (store, writer) = reflector::store();
            Self {
                store,
                writer,
                merge: Merge::new(&["a".into(), "b".into()]),
            }
        }

        fn on(&mut self, i: usize, event: Event<ConfigMap>) -> Vec<String> {
            let out = self.merge.on(i, event);
            for e in &out {
                self.writer.apply_watcher_event(e);
            }
            out.iter()
                .map(|e| match e {
                    Init => "Init".into(),
                    InitDone => "InitDone".into(),
                    InitApply(o) => {
                        format!("InitApply {}", o.metadata.name.as_deref().unwrap_or(""))
                    }
                    Apply(o) => format!("Apply {}", o.metadata.name.as_deref().unwrap_or("")),
                    Delete(o) => format!(
                        "Delete {}/{}",
                        o.metadata.namespace.as_deref().unwrap_or(""),
                        o.metadata.name.as_deref().unwrap_or("")
                    ),
                })
                .collect()
        }

        fn held(&self) -> Vec<String> {
            let mut held: Vec<String> = self
                .store
                .state()
                .iter()
                .map(|o| {
                    let v = o.data.as_ref().and_then(|d| d.get("v")).map_or("-", |v| v);
                    format!("{}={v}", ObjectRef::from_obj(o.as_ref()))
                })
                .collect();
            held.sort();
            held
        }
    }

    #[test]
    fn watched_namespaces_from_the_flag() {
        assert_eq!(Watched::new(&[]), Watched::All);
        assert_eq!(
            Watched::new(&["".into()]),
            Watched::All,
            "the chart's unset value"
        );
        assert_eq!(
            Watched::new(&["a".into(), " b ".into(), "a".into(), "".into()]),
            Watched::Only(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            Watched::new(&["a".into(), "b".into()]).describe(),
            "namespaces a, b"
        );
    }

    #[test]
    fn one_list_of_every_namespace_then_changes_as_they_come() {
        let mut c = Consumer::new();
        assert_eq!(c.on(0, Init), ["Init"]);
        assert_eq!(c.on(0, InitApply(cm("a", "x", "1"))), ["InitApply x"]);
        assert_eq!(c.on(1, Init), Vec::<String>::new(), "one Init only");
        assert!(c.on(0, InitDone).is_empty(), "b has not listed yet");
        // a watches already while b lists: a's changes join the list, its deletions wait.
        assert_eq!(c.on(0, Apply(cm("a", "x", "2"))), ["InitApply x"]);
        assert_eq!(c.on(0, Apply(cm("a", "z", "1"))), ["InitApply z"]);
        assert!(c.on(0, Delete(cm("a", "z", "1"))).is_empty());
        assert_eq!(c.on(1, InitApply(cm("b", "y", "1"))), ["InitApply y"]);
        assert!(c.held().is_empty(), "nothing before every namespace listed");
        assert_eq!(c.on(1, InitDone), ["InitDone", "Delete a/z"]);
        assert_eq!(c.held(), ["ConfigMap.v1./x.a=2", "ConfigMap.v1./y.b=1"]);

        assert_eq!(c.on(1, Apply(cm("b", "y", "2"))), ["Apply y"]);
        assert_eq!(c.on(0, Delete(cm("a", "x", "2"))), ["Delete a/x"]);
        assert_eq!(c.held(), ["ConfigMap.v1./y.b=2"]);
    }

    #[test]
    fn a_relist_of_one_namespace_leaves_the_others_and_deletes_what_it_lost() {
        let mut c = Consumer::new();
        c.on(0, Init);
        c.on(0, InitApply(cm("a", "x", "1")));
        c.on(0, InitApply(cm("a", "w", "1")));
        c.on(0, InitDone);
        c.on(1, Init);
        c.on(1, InitApply(cm("b", "y", "1")));
        c.on(1, InitDone);
        assert_eq!(c.held().len(), 3);

        // a's watch expired; w went meanwhile, x changed, v is new.
        assert!(c.on(0, Init).is_empty());
        assert_eq!(c.on(0, InitApply(cm("a", "x", "2"))), ["Apply x"]);
        assert_eq!(c.on(0, InitApply(cm("a", "v", "1"))), ["Apply v"]);
        assert_eq!(
            c.on(1, Apply(cm("b", "y", "2"))),
            ["Apply y"],
            "b goes on meanwhile"
        );
        assert_eq!(c.on(0, InitDone), ["Delete a/w"]);
        assert_eq!(
            c.held(),
            [
                "ConfigMap.v1./v.a=1",
                "ConfigMap.v1./x.a=2",
                "ConfigMap.v1./y.b=2"
            ],
            "b's part is whole"
        );
    }

    #[test]
    fn a_namespace_that_lists_again_before_every_namespace_listed_loses_what_went() {
        let mut c = Consumer::new();
        c.on(0, Init);
        c.on(0, InitApply(cm("a", "x", "1")));
        c.on(0, InitApply(cm("a", "w", "1")));
        // a's first list failed half-way; its second has x only.
        c.on(0, Init);
        c.on(0, InitApply(cm("a", "x", "1")));
        assert!(c.on(0, InitDone).is_empty());
        c.on(1, Init);
        assert_eq!(c.on(1, InitDone), ["InitDone", "Delete a/w"]);
        assert_eq!(c.held(), ["ConfigMap.v1./x.a=1"]);
    }
}
