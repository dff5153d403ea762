//! The proxy's memory budget: the bounds on what an agent or an upstream can make the process
//! hold, each derived from the container's memory limit (the operator passes it through the
//! Downward API as `MCP_PROXY_MEMORY_LIMIT`) unless a flag sets it, and what each pool holds now
//! (the `mcp_proxy_memory_budget_bytes` gauges). A proxy run without a limit takes the bounds
//! of the sidecar's default, 256 MiB.
//!
//! Sizes of JSON are counted as its [`weight`]: its bytes plus a node's worth for every value
//! and member in it and more for every object, since a parsed `[0,0,0]` costs far more than its
//! text.

use std::sync::{
    Arc, LazyLock, OnceLock,
    atomic::{AtomicUsize, Ordering},
};

use tokio::sync::Semaphore;

const MIB: u64 = 1024 * 1024;
/// The sidecar container's memory limit the operator renders by default.
pub const DEFAULT_LIMIT: u64 = 256 * MIB;
/// Bytes a parsed JSON node (a value in an array, a member of an object) costs beyond its text,
/// about: a `serde_json::Value`, a key and the map's share.
pub const NODE_BYTES: usize = 48;
/// Bytes an object costs beyond its members, about: a map's table and entries allocated, with
/// the allocator's share, and the more copies a call's arguments make of objects than of other
/// values (measured, release build: a call with 40,000 `{"a": n, "b": "xx"}`, 0.9 MiB of JSON,
/// grew the proxy by 117 MiB; 400,000 numbers, 2.9 MiB, by 43 MiB).
pub const OBJECT_BYTES: usize = 512;

/// Every bound, in bytes of [`weight`] unless named otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The memory limit the others are derived from.
    pub limit: u64,
    /// Request bodies larger than the small ones held at once, by the whole process
    /// (`--max-bodies-bytes`): each is held several times while it is parsed, checked and sent.
    pub bodies: usize,
    /// One message from an upstream: a result, a page of a tool list (`--max-result-bytes`).
    pub result: usize,
    /// Tools one server may list (`--max-list-tools`).
    pub list_tools: usize,
    /// The serialized bytes of one server's tool list (`--max-list-bytes`).
    pub list_bytes: usize,
    /// The largest `inputSchema` compiled into a validator (`--max-schema-bytes`).
    pub schema: usize,
    /// Schema bytes compiled into validators at once (`--max-validators-bytes`).
    pub validators: usize,
}

impl Bounds {
    /// The bounds for a container limited to `limit` bytes: at 256 MiB, 32 MiB of bodies, an
    /// 8 MiB message, 4 MiB and 4096 tools per server's list, a 256 KiB schema, 16 MiB of
    /// schemas compiled. A smaller limit shrinks each (not below a floor an ordinary task
    /// needs); a larger one grows them.
    pub fn for_limit(limit: u64) -> Self {
        let share = |divisor: u64, floor: u64| -> usize {
            usize::try_from((limit / divisor).max(floor)).unwrap_or(usize::MAX)
        };
        Self {
            limit,
            bodies: share(8, 8 * MIB),
            result: share(32, 2 * MIB),
            list_tools: share(64 * 1024, 256),
            list_bytes: share(64, MIB),
            schema: share(1024, 64 * 1024),
            validators: share(16, 4 * MIB),
        }
    }
}

impl Default for Bounds {
    fn default() -> Self {
        Self::for_limit(DEFAULT_LIMIT)
    }
}

static BOUNDS: OnceLock<Bounds> = OnceLock::new();

/// Sets the bounds for the process, once, at start (before anything reads them); `false` when
/// they were already read or set.
pub fn install(bounds: Bounds) -> bool {
    BOUNDS.set(bounds).is_ok()
}

/// The bounds in force (the default ones when none were installed).
pub fn bounds() -> &'static Bounds {
    BOUNDS.get_or_init(Bounds::default)
}

/// The unit of [`bodies`]: a permit is one KiB.
pub const BODY_UNIT: usize = 1024;

/// The budget of large request bodies: [`Bounds::bodies`] in permits of [`BODY_UNIT`].
pub fn bodies() -> &'static Arc<Semaphore> {
    static BODIES: LazyLock<Arc<Semaphore>> =
        LazyLock::new(|| Arc::new(Semaphore::new(bounds().bodies / BODY_UNIT)));
    &BODIES
}

/// The pools whose use is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// Large request bodies in flight.
    Bodies,
    /// Tool lists held (their serialized bytes).
    Lists,
    /// Input schemas compiled into validators.
    Validators,
}

impl Pool {
    pub const ALL: [Pool; 3] = [Pool::Bodies, Pool::Lists, Pool::Validators];

    /// Its label (`pool`).
    pub fn label(self) -> &'static str {
        match self {
            Pool::Bodies => "bodies",
            Pool::Lists => "tool_lists",
            Pool::Validators => "validators",
        }
    }

    /// Its bound (for the tool lists: every server's list at its bound would be unbounded in
    /// the number of servers, so the gauge shows one list's bound).
    pub fn limit(self) -> usize {
        let b = bounds();
        match self {
            Pool::Bodies => b.bodies,
            Pool::Lists => b.list_bytes,
            Pool::Validators => b.validators,
        }
    }

    fn counter(self) -> &'static AtomicUsize {
        static IN_USE: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
        &IN_USE[self as usize]
    }

    /// Bytes it holds now.
    pub fn in_use(self) -> usize {
        match self {
            Pool::Bodies => (bounds().bodies / BODY_UNIT)
                .saturating_sub(bodies().available_permits())
                .saturating_mul(BODY_UNIT),
            _ => self.counter().load(Ordering::Relaxed),
        }
    }

    /// Counts `bytes` more.
    pub fn add(self, bytes: usize) {
        self.counter().fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` less.
    pub fn sub(self, bytes: usize) {
        let _ = self
            .counter()
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(bytes))
            });
    }
}

/// What JSON text costs once parsed, about: its bytes, [`NODE_BYTES`] for each value in an
/// array and each member of an object (each `[`, `,` and `:` outside a string) and
/// [`OBJECT_BYTES`] for each object (`{`). One pass, no allocation; text that is not JSON gets a
/// weight all the same.
pub fn weight(text: &[u8]) -> usize {
    let mut nodes = 0usize;
    let mut objects = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b',' | b':' => nodes += 1,
                b'{' => objects += 1,
                _ => {}
            }
        }
    }
    text.len()
        .saturating_add(nodes.saturating_mul(NODE_BYTES))
        .saturating_add(objects.saturating_mul(OBJECT_BYTES))
}

/// `bytes` as a person reads it (`7.0 MiB`, `512 KiB`, `300 B`).
pub fn human(bytes: usize) -> String {
    const KIB: usize = 1024;
    if bytes >= 1024 * KIB {
        format!("{:.1} MiB", bytes as f64 / (1024 * KIB) as f64)
    } else if bytes >= KIB {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limit_gives_the_documented_bounds() {
        let b = Bounds::default();
        assert_eq!(b.bodies, 32 * 1024 * 1024);
        assert_eq!(b.result, 8 * 1024 * 1024);
        assert_eq!(b.list_tools, 4096);
        assert_eq!(b.list_bytes, 4 * 1024 * 1024);
        assert_eq!(b.schema, 256 * 1024);
        assert_eq!(b.validators, 16 * 1024 * 1024);
        // A small limit keeps the floors; a large one grows each.
        assert_eq!(Bounds::for_limit(16 * MIB).list_tools, 256);
        assert_eq!(Bounds::for_limit(1024 * MIB).bodies, 128 * 1024 * 1024);
    }

    #[test]
    fn weight_counts_nodes_outside_strings_only() {
        assert_eq!(weight(b"\"a,b:[c]{\""), 10);
        assert_eq!(weight(b"[0,0,0]"), 7 + 3 * NODE_BYTES);
        assert_eq!(
            weight(br#"{"a":"\",",  "b":1}"#),
            19 + 3 * NODE_BYTES + OBJECT_BYTES
        );
        assert_eq!(weight(b""), 0);
    }

    #[test]
    fn sizes_read_as_a_person_reads_them() {
        assert_eq!(human(7 * 1024 * 1024 + 1024 * 100), "7.1 MiB");
        assert_eq!(human(2048), "2 KiB");
    }
}
