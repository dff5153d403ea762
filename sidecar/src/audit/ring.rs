//! The recent audit records, in memory, for `GET /audit`: bounded by count and by bytes, the
//! oldest dropped first (and counted). Each entry is the line already written for the audit log
//! (shared, not copied) plus the few fields the query filters on.

use std::{collections::VecDeque, sync::Arc, sync::Mutex};

use super::Record;
use crate::sync::lock;

/// Records kept by default.
pub const DEFAULT_MAX_RECORDS: usize = 10_000;
/// Bytes kept by default: the lines plus the filter fields (an estimate of the heap used).
pub const DEFAULT_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Bookkeeping bytes counted per entry beyond its line and strings.
const ENTRY_OVERHEAD: usize = std::mem::size_of::<Entry>() + 16;

/// One record as kept: its JSON line and what the filters compare.
#[derive(Debug)]
pub struct Entry {
    /// The record as one JSON object (the audit line without its newline).
    pub line: Arc<[u8]>,
    /// The record's `ts`, parsed once here so `since` compares instants, not strings.
    pub ts: Option<jiff::Timestamp>,
    pub decision: Box<str>,
    pub risk: Option<Box<str>>,
    pub server: Option<Box<str>>,
    pub tool: Box<str>,
    pub upstream_tool: Option<Box<str>>,
}

impl Entry {
    /// The entry for `record`, whose serialized line (with or without its newline) is `line`.
    pub fn new(record: &Record<'_>, line: Arc<[u8]>) -> Self {
        let boxed = |s: &str| Box::<str>::from(s);
        Self {
            line,
            ts: record.ts.parse().ok(),
            decision: boxed(record.decision),
            risk: record.risk.map(boxed),
            server: record.server.map(boxed),
            tool: boxed(record.tool),
            upstream_tool: record.upstream_tool.map(boxed),
        }
    }

    fn bytes(&self) -> usize {
        let opt = |s: &Option<Box<str>>| s.as_deref().map_or(0, str::len);
        ENTRY_OVERHEAD
            + self.line.len()
            + self.decision.len()
            + self.tool.len()
            + opt(&self.risk)
            + opt(&self.server)
            + opt(&self.upstream_tool)
    }

    /// The record as JSON, without the audit line's trailing newline.
    pub fn json(&self) -> &[u8] {
        self.line.strip_suffix(b"\n").unwrap_or(&self.line)
    }
}

/// What a query found: the newest `limit` matches, oldest first.
#[derive(Debug)]
pub struct Found {
    pub records: Vec<Arc<Entry>>,
    /// Records that matched, `limit` or not.
    pub matched: usize,
    /// Records dropped from the ring (oldest first) since the proxy started.
    pub dropped: u64,
}

/// The ring: a deque under a mutex held for a push (O(1), plus evictions) or one query's scan.
#[derive(Debug)]
pub struct Ring {
    max_records: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: VecDeque<Arc<Entry>>,
    bytes: usize,
    dropped: u64,
}

impl Default for Ring {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RECORDS, DEFAULT_MAX_BYTES)
    }
}

impl Ring {
    pub fn new(max_records: usize, max_bytes: usize) -> Self {
        Self {
            max_records,
            max_bytes,
            inner: Mutex::default(),
        }
    }

    /// Keeps `entry`, dropping the oldest records until both bounds hold. An entry larger than
    /// the byte bound on its own is not kept (and counts as dropped).
    pub fn push(&self, entry: Entry) {
        let size = entry.bytes();
        let mut inner = lock(&self.inner);
        if size > self.max_bytes || self.max_records == 0 {
            inner.dropped += 1;
            return;
        }
        while inner.entries.len() >= self.max_records || inner.bytes + size > self.max_bytes {
            let Some(old) = inner.entries.pop_front() else {
                break;
            };
            inner.bytes -= old.bytes();
            inner.dropped += 1;
        }
        inner.bytes += size;
        inner.entries.push_back(Arc::new(entry));
    }

    /// The newest `limit` records that pass `matches`, oldest first.
    pub fn find(&self, limit: usize, matches: impl Fn(&Entry) -> bool) -> Found {
        let inner = lock(&self.inner);
        let mut records = Vec::with_capacity(limit.min(inner.entries.len()).min(1024));
        let mut matched = 0;
        for entry in inner.entries.iter().rev() {
            if matches(entry) {
                matched += 1;
                if records.len() < limit {
                    records.push(entry.clone());
                }
            }
        }
        let dropped = inner.dropped;
        drop(inner);
        records.reverse();
        Found {
            records,
            matched,
            dropped,
        }
    }

    /// Records and bytes held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::audit::{Outcome, RecordType};

    pub(crate) fn record<'a>(
        ts: &str,
        tool: &'a str,
        server: Option<&'a str>,
        upstream: Option<&'a str>,
        decision: &'static str,
        risk: Option<&'static str>,
    ) -> Record<'a> {
        Record {
            record_type: RecordType::ToolCall,
            ts: ts.into(),
            task: "t",
            namespace: "",
            created_by: None,
            context_version: 1,
            session: "s1".into(),
            client: "c".into(),
            protocol: None,
            request_id: "1".into(),
            tool,
            server,
            upstream_tool: upstream,
            risk,
            decision,
            approval_id: None,
            approval_digest: None,
            decided_by: None,
            rule: None,
            outcome: Outcome::Ok,
            error: None,
            duration_ms: 1.0,
            argument_bytes: 0,
            arguments: None,
            intent: None,
            model: None,
        }
    }

    pub(crate) fn entry(record: &Record<'_>) -> Entry {
        let mut line = serde_json::to_vec(record).expect("json");
        line.push(b'\n');
        Entry::new(record, line.into())
    }

    pub(crate) fn ids(found: &Found) -> Vec<String> {
        found
            .records
            .iter()
            .map(|e| {
                let v: serde_json::Value = serde_json::from_slice(e.json()).expect("json");
                v["requestId"].as_str().unwrap_or_default().to_string()
            })
            .collect()
    }

    fn numbered(ring: &Ring, n: usize) {
        for i in 0..n {
            let mut r = record("2026-01-01T00:00:00Z", "x", None, None, "allowed", None);
            r.request_id = i.to_string();
            ring.push(entry(&r));
        }
    }

    #[test]
    fn keeps_at_most_max_records_dropping_the_oldest_and_counting_them() {
        let ring = Ring::new(3, usize::MAX);
        numbered(&ring, 5);
        let found = ring.find(usize::MAX, |_| true);
        assert_eq!(ids(&found), ["2", "3", "4"]);
        assert_eq!(found.dropped, 2);
        assert_eq!(found.matched, 3);
        assert_eq!(ring.usage().0, 3);
    }

    #[test]
    fn keeps_at_most_max_bytes_and_refuses_a_record_larger_than_the_bound() {
        let one = entry(&record(
            "2026-01-01T00:00:00Z",
            "x",
            None,
            None,
            "allowed",
            None,
        ))
        .bytes();
        let ring = Ring::new(100, one * 2 + one / 2);
        numbered(&ring, 4);
        let found = ring.find(usize::MAX, |_| true);
        assert_eq!(ids(&found), ["2", "3"]);
        assert_eq!(found.dropped, 2);
        assert!(ring.usage().1 <= one * 2 + one / 2);

        let big = "y".repeat(one * 3);
        ring.push(entry(&record(
            "2026-01-01T00:00:00Z",
            &big,
            None,
            None,
            "allowed",
            None,
        )));
        let found = ring.find(usize::MAX, |_| true);
        assert_eq!(ids(&found), ["2", "3"], "the oversized record is not kept");
        assert_eq!(found.dropped, 3, "and counts as dropped");
    }

    #[test]
    fn limit_keeps_the_newest_matches_oldest_first() {
        let ring = Ring::default();
        numbered(&ring, 10);
        let found = ring.find(3, |_| true);
        assert_eq!(ids(&found), ["7", "8", "9"]);
        assert_eq!(found.matched, 10);
        assert_eq!(found.dropped, 0);
    }
}
