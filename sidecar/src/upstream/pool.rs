//! All upstreams of the current config, and the tool lists known so far (in memory, and on disk
//! keyed by the server's spec hash), one per revision: a server may offer different tools to
//! initialize-era and 2026-07-28 clients, and each client sees what its revision's connection
//! lists. Reconciling with a new config stops servers that were removed, disabled or changed,
//! and keeps the rest running.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use rmcp::model::Tool;

use super::{Connection, Deps, Revision, StartReason, Upstream, cache::DiskCache};
use crate::{
    config::{Config, Server, SpecHash},
    error::{Error, Result},
    names::ServerName,
    policy::definitions::{FirstSeen, KnownList},
    session::SessionRef,
    sync::lock,
};

struct ListEntry {
    hash: SpecHash,
    list: KnownList,
    /// The list's serialized bytes (counted once, when it is stored).
    bytes: usize,
}

/// The tool lists a session of one revision is served.
#[derive(Default)]
pub struct KnownLists {
    pub lists: HashMap<ServerName, KnownList>,
    /// Servers whose list in that revision is not known yet, served meanwhile the list of the
    /// other revision (most servers offer the same tools in both).
    pub borrowed: Vec<Arc<Server>>,
}

pub struct Pool {
    deps: Deps,
    upstreams: Mutex<HashMap<ServerName, Arc<Upstream>>>,
    lists: Mutex<HashMap<(ServerName, Revision), ListEntry>>,
    /// Per server and revision (and its spec: a new spec starts afresh), the tool definitions
    /// first seen.
    first_seen: Mutex<HashMap<(ServerName, Revision), (SpecHash, FirstSeen)>>,
    /// The serialized bytes of the lists held, as counted in `memory::Pool::Lists` (which every
    /// task's pool adds to in shared mode).
    held: std::sync::atomic::AtomicUsize,
    /// One list fetched at a time per server: clients that list at once wait for the first
    /// fetch and take its list, instead of each holding a copy of it while it is read.
    turns: Mutex<HashMap<ServerName, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pool {
    pub fn new(deps: Deps) -> Self {
        Self {
            deps,
            upstreams: Default::default(),
            lists: Default::default(),
            first_seen: Default::default(),
            held: Default::default(),
            turns: Default::default(),
        }
    }

    fn cache(&self) -> Option<&DiskCache> {
        self.deps.shared.cache()
    }

    /// What a server offered when it last ran (live connection first).
    pub fn capabilities(&self, server: &Server) -> Option<rmcp::model::ServerCapabilities> {
        let live = self.existing(&server.name).and_then(|u| u.current());
        if let Some(info) = live.and_then(|c| c.peer.peer_info()) {
            return Some(info.capabilities.clone());
        }
        self.deps.shared.capabilities(&server.spec_hash)
    }

    /// Every live connection (a server may have one per revision).
    pub fn live(&self) -> Vec<(ServerName, Arc<Connection>)> {
        lock(&self.upstreams)
            .iter()
            .flat_map(|(n, u)| u.connections().into_iter().map(|c| (n.clone(), c)))
            .collect()
    }

    pub fn deps(&self) -> &Deps {
        &self.deps
    }

    /// The upstream for `server`, created (not started) on first use.
    pub fn upstream(&self, server: &Arc<Server>) -> Arc<Upstream> {
        let mut upstreams = lock(&self.upstreams);
        match upstreams.get(&server.name) {
            Some(u) if u.server.spec_hash == server.spec_hash => u.clone(),
            _ => {
                let u = Arc::new(Upstream::new(server.clone(), self.deps.clone()));
                // A request that saw the new config before `reconcile` ran: stop the old process
                // here, or nobody would.
                if let Some(old) = upstreams.insert(server.name.clone(), u.clone()) {
                    tokio::spawn(async move { old.stop().await });
                }
                u
            }
        }
    }

    /// The upstream for a server name, if it exists (never creates one).
    pub fn existing(&self, name: &ServerName) -> Option<Arc<Upstream>> {
        lock(&self.upstreams).get(name).cloned()
    }

    /// Tool lists known for the startable servers of `config` in `revision`: from memory, else
    /// from the disk cache (which is how a restarted proxy answers without starting anything),
    /// else the definitions pinned in the catalog (how a pod's first proxy does), else the
    /// other revision's, borrowed until this revision's is known.
    pub fn known_lists(&self, config: &Config, revision: Revision) -> KnownLists {
        let mut out = KnownLists::default();
        let mut lists = lock(&self.lists);
        for server in config.servers.iter().filter(|s| s.is_startable()) {
            if let Some(list) = self.known(&mut lists, server, revision) {
                out.lists.insert(server.name.clone(), list);
            } else if let Some(list) = self.known(&mut lists, server, revision.other()) {
                out.lists.insert(server.name.clone(), list);
                out.borrowed.push(server.clone());
            }
        }
        out
    }

    fn known(
        &self,
        lists: &mut HashMap<(ServerName, Revision), ListEntry>,
        server: &Server,
        revision: Revision,
    ) -> Option<KnownList> {
        let key = (server.name.clone(), revision);
        if let Some(entry) = lists.get(&key).filter(|e| e.hash == server.spec_hash) {
            return Some(entry.list.clone());
        }
        let cached = self
            .cache()
            .and_then(|c| c.load(&server.spec_hash, revision));
        let tools = match (cached, &server.definitions) {
            (Some(tools), _) => {
                tracing::info!(server = %server.name, revision = revision.label(), tools = tools.len(), "tool list loaded from the cache directory");
                tools
            }
            (None, Some(pinned)) => {
                tracing::info!(server = %server.name, revision = revision.label(), tools = pinned.len(), "tool list taken from the catalog's pinned definitions");
                pinned.clone()
            }
            (None, None) => return None,
        };
        let list = self.observe(server, revision, tools);
        lists.insert(
            key,
            ListEntry {
                hash: server.spec_hash.clone(),
                bytes: super::listing::size_of(&list.tools),
                list: list.clone(),
            },
        );
        Some(list)
    }

    /// Hashes a list's tool definitions and compares them with the first seen for the server
    /// in that revision: for the task, as recorded outside the pod when an earlier proxy of the
    /// task saw them (the [`Baseline`](crate::policy::definitions::Baseline)), so a restart
    /// does not make a changed definition the new first one.
    fn observe(&self, server: &Server, revision: Revision, tools: Arc<Vec<Tool>>) -> KnownList {
        let baseline = self.deps.shared.baseline();
        let key = format!("{}@{}", server.name, revision.label());
        let spec = server.spec_hash.0.as_str();
        let mut first_seen = lock(&self.first_seen);
        let entry = first_seen
            .entry((server.name.clone(), revision))
            .or_insert_with(|| (server.spec_hash.clone(), baseline.first_seen(&key, spec)));
        if entry.0 != server.spec_hash {
            *entry = (server.spec_hash.clone(), baseline.first_seen(&key, spec));
        }
        let list = entry.1.observe(tools);
        baseline.record(&key, spec, &mut entry.1);
        list
    }

    /// Starts the server if needed (not inside its restart backoff) and fetches its tool list
    /// in `session`'s revision.
    pub async fn fetch_list(
        &self,
        server: &Arc<Server>,
        session: Option<&SessionRef>,
    ) -> Result<Arc<Vec<Tool>>> {
        let upstream = self.upstream(server);
        let conn = upstream.connect(&StartReason::ListTools, session).await?;
        let turn = lock(&self.turns)
            .entry(server.name.clone())
            .or_default()
            .clone();
        let _turn = turn.lock().await;
        // Fetched by another client while this one waited for its turn.
        let revision = Revision::of(&conn.protocol);
        let known = lock(&self.lists)
            .get(&(server.name.clone(), revision))
            .filter(|e| e.hash == server.spec_hash)
            .map(|e| e.list.tools.clone());
        if let Some(tools) = known {
            return Ok(tools);
        }
        self.list_from(server, &conn).await
    }

    /// Lists the tools of a running connection and stores the result for every revision it
    /// serves. Returns the list.
    pub async fn list_from(
        &self,
        server: &Arc<Server>,
        conn: &Connection,
    ) -> Result<Arc<Vec<Tool>>> {
        conn.listed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let timeout = self.deps.start_timeout;
        let listed = super::listing::list_all(&conn.peer, &server.name);
        let tools = match tokio::time::timeout(timeout, listed).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(Error::Timeout {
                    server: server.name.clone(),
                    timeout,
                });
            }
        };
        let revision = Revision::of(&conn.protocol);
        let serves = self
            .existing(&server.name)
            .map_or_else(|| vec![revision], |u| u.revisions_served_by(revision));
        Ok(self.store_list(server, &serves, tools))
    }

    /// Re-lists every running connection of a server; `true` when a list differs from the one
    /// known for its revision.
    pub async fn relist(&self, server: &Arc<Server>) -> Result<bool> {
        let conns = self
            .existing(&server.name)
            .map(|u| u.connections())
            .unwrap_or_default();
        let mut changed = false;
        for conn in conns {
            let revision = Revision::of(&conn.protocol);
            let before = lock(&self.lists)
                .get(&(server.name.clone(), revision))
                .filter(|e| e.hash == server.spec_hash)
                .map(|e| e.list.tools.clone());
            let after = self.list_from(server, &conn).await?;
            // No list before means none was served yet: nobody has anything to re-list.
            changed |= before.is_some_and(|b| b != after);
        }
        Ok(changed)
    }

    fn store_list(
        &self,
        server: &Arc<Server>,
        revisions: &[Revision],
        tools: Vec<Tool>,
    ) -> Arc<Vec<Tool>> {
        let tools = Arc::new(tools);
        let bytes = super::listing::size_of(&tools);
        for &revision in revisions {
            if let Some(cache) = self.cache() {
                cache.store(server.name.as_str(), &server.spec_hash, revision, &tools);
            }
            let list = self.observe(server, revision, tools.clone());
            lock(&self.lists).insert(
                (server.name.clone(), revision),
                ListEntry {
                    hash: server.spec_hash.clone(),
                    list,
                    bytes,
                },
            );
        }
        let lists = lock(&self.lists);
        let held = lists.values().map(|e| e.bytes).sum();
        // Under the lock, so two lists stored at once count in the order they were stored.
        let before = self.held.swap(held, std::sync::atomic::Ordering::Relaxed);
        drop(lists);
        crate::memory::Pool::Lists.add(held);
        crate::memory::Pool::Lists.sub(before);
        tools
    }

    /// Stops upstreams that `config` removed, disabled (or fully denied) or changed; keeps the
    /// others (their filter may have changed, which needs no restart). Starts nothing.
    pub async fn reconcile(&self, config: &Config) {
        let to_stop: Vec<Arc<Upstream>> = {
            let mut upstreams = lock(&self.upstreams);
            let stale: Vec<ServerName> = upstreams
                .iter()
                .filter(|(name, u)| match config.server(name.as_str()) {
                    Some(s) => !s.is_startable() || s.spec_hash != u.server.spec_hash,
                    None => true,
                })
                .map(|(name, _)| name.clone())
                .collect();
            stale
                .iter()
                .filter_map(|name| upstreams.remove(name))
                .collect()
        };
        {
            let mut lists = lock(&self.lists);
            lists.retain(|(name, _), entry| {
                config
                    .server(name.as_str())
                    .is_some_and(|s| s.is_startable() && s.spec_hash == entry.hash)
            });
        }
        let stops = to_stop.into_iter().map(|u| async move {
            tracing::info!(server = %u.server.name, "config no longer needs this upstream (removed, disabled or changed)");
            u.stop().await;
        });
        futures::future::join_all(stops).await;
    }

    /// Stops every upstream (TERM, KILL after the grace time), in parallel.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Upstream>> = lock(&self.upstreams).drain().map(|(_, u)| u).collect();
        futures::future::join_all(all.iter().map(|u| u.stop())).await;
    }

    /// Per server: its state (running, stopped, failed) and calls in flight.
    pub fn states(&self) -> HashMap<ServerName, (&'static str, usize)> {
        lock(&self.upstreams)
            .iter()
            .map(|(name, u)| {
                let in_flight = u.connections().iter().map(|c| c.routes.in_flight()).sum();
                (name.clone(), (u.state_label(), in_flight))
            })
            .collect()
    }

    /// Running children (pid per server), for tests and `GET /tools`: only processes that have
    /// not exited, of connections in use.
    pub fn pids(&self) -> HashMap<ServerName, u32> {
        lock(&self.upstreams)
            .iter()
            .filter_map(|(name, u)| {
                let conn = u.current()?;
                let child = conn.child.as_ref().filter(|c| c.is_running())?;
                Some((name.clone(), child.pid))
            })
            .collect()
    }

    pub fn kill_grace(&self) -> Duration {
        self.deps.kill_grace
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        crate::memory::Pool::Lists.sub(*self.held.get_mut());
    }
}
