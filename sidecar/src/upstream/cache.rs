//! The on-disk tool-list cache: one JSON file per server spec hash, so a restarted proxy can answer
//! `tools/list` without starting anything. Files are written atomically (temp file + rename).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rmcp::model::{ServerCapabilities, Tool};

use super::Revision;
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

    fn path(&self, hash: &SpecHash, revision: Revision) -> PathBuf {
        self.dir
            .join(format!("tools-{hash}-{}.json", revision.label()))
    }

    /// The list cached for this spec in this revision, if any. A corrupt file counts as absent.
    pub fn load(&self, hash: &SpecHash, revision: Revision) -> Option<Arc<Vec<Tool>>> {
        let path = self.path(hash, revision);
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<Entry>(&bytes) {
            Ok(entry) => Some(Arc::new(entry.tools)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "ignoring a corrupt tool-list cache file");
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
    pub fn store(&self, server: &str, hash: &SpecHash, revision: Revision, tools: &[Tool]) {
        let result = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let entry = serde_json::json!({ "server": server, "tools": tools });
            let tmp = self.dir.join(format!(
                ".tools-{hash}-{}.{}.tmp",
                revision.label(),
                std::process::id()
            ));
            std::fs::write(&tmp, serde_json::to_vec(&entry)?)?;
            std::fs::rename(&tmp, self.path(hash, revision))
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
    fn stores_and_loads_by_spec_hash_and_revision() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = DiskCache::new(dir.path().join("nested"));
        let hash = SpecHash("abc".into());
        let legacy = Revision::Legacy;
        assert!(cache.load(&hash, legacy).is_none());
        let mut tool = Tool::default();
        tool.name = "echo".into();
        tool.title = Some("Echo".into());
        cache.store("srv", &hash, legacy, std::slice::from_ref(&tool));
        let loaded = cache.load(&hash, legacy).expect("cached");
        assert_eq!(loaded.as_slice(), &[tool]);
        assert!(cache.load(&SpecHash("other".into()), legacy).is_none());
        assert!(
            cache.load(&hash, Revision::Modern).is_none(),
            "each revision's list is its own"
        );
        std::fs::write(
            dir.path().join("nested/tools-abc-legacy.json"),
            b"{not json",
        )
        .expect("write");
        assert!(
            cache.load(&hash, legacy).is_none(),
            "corrupt files are ignored"
        );
    }
}
