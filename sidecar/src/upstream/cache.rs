//! The on-disk tool-list cache: one JSON file per server spec hash, so a restarted proxy can answer
//! `tools/list` without starting anything. Files are written atomically (temp file + rename).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rmcp::model::{ServerCapabilities, Tool};

use crate::config::SpecHash;

#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    server: String,
    tools: Vec<Tool>,
}

impl DiskCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, hash: &SpecHash) -> PathBuf {
        self.dir.join(format!("tools-{hash}.json"))
    }

    /// The cached list for this spec, if any. A corrupt file counts as absent.
    pub fn load(&self, hash: &SpecHash) -> Option<Arc<Vec<Tool>>> {
        let bytes = std::fs::read(self.path(hash)).ok()?;
        match serde_json::from_slice::<Entry>(&bytes) {
            Ok(entry) => Some(Arc::new(entry.tools)),
            Err(e) => {
                tracing::warn!(file = %self.path(hash).display(), error = %e, "ignoring a corrupt tool-list cache file");
                None
            }
        }
    }

    fn capabilities_path(&self, hash: &SpecHash) -> PathBuf {
        self.dir.join(format!("capabilities-{hash}.json"))
    }

    /// What the server offered when it last ran (decides whether it must start for prompts or
    /// resources).
    pub fn load_capabilities(&self, hash: &SpecHash) -> Option<ServerCapabilities> {
        let bytes = std::fs::read(self.capabilities_path(hash)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn store_capabilities(&self, hash: &SpecHash, capabilities: &ServerCapabilities) {
        let result = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self
                .dir
                .join(format!(".capabilities-{hash}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, serde_json::to_vec(capabilities)?)?;
            std::fs::rename(&tmp, self.capabilities_path(hash))
        })();
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not write the capabilities cache");
        }
    }

    /// Stores a list. Failures are logged, never fatal: the cache is an optimization.
    pub fn store(&self, server: &str, hash: &SpecHash, tools: &[Tool]) {
        let result = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let entry = serde_json::json!({ "server": server, "tools": tools });
            let tmp = self
                .dir
                .join(format!(".tools-{hash}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, serde_json::to_vec(&entry)?)?;
            std::fs::rename(&tmp, self.path(hash))
        })();
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not write the tool-list cache");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_and_loads_by_spec_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = DiskCache::new(dir.path().join("nested"));
        let hash = SpecHash("abc".into());
        assert!(cache.load(&hash).is_none());
        let mut tool = Tool::default();
        tool.name = "echo".into();
        tool.title = Some("Echo".into());
        cache.store("srv", &hash, std::slice::from_ref(&tool));
        let loaded = cache.load(&hash).expect("cached");
        assert_eq!(loaded.as_slice(), &[tool]);
        assert!(cache.load(&SpecHash("other".into())).is_none());
        std::fs::write(dir.path().join("nested/tools-abc.json"), b"{not json").expect("write");
        assert!(cache.load(&hash).is_none(), "corrupt files are ignored");
    }
}
