//! Which revision of MCP a connection to an upstream speaks, and which one a client session
//! wants its upstreams spoken to in.

use rmcp::model::ProtocolVersion;

use crate::session::SessionRef;

/// The two generations of MCP a connection to an upstream speaks: the `initialize` lifecycle
/// (2024-11-05 to 2025-11-25) or 2026-07-28 (`server/discover`, stateless requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Revision {
    Legacy,
    Modern,
}

impl Revision {
    /// The revision a client session speaks (and so wants its upstreams spoken to in).
    pub fn of_session(session: &SessionRef) -> Self {
        if session.accepts_requests {
            Revision::Legacy
        } else {
            Revision::Modern
        }
    }

    pub(super) fn of(protocol: &ProtocolVersion) -> Self {
        if *protocol >= ProtocolVersion::V_2026_07_28 {
            Revision::Modern
        } else {
            Revision::Legacy
        }
    }

    /// For file names and logs.
    pub fn label(self) -> &'static str {
        match self {
            Revision::Legacy => "legacy",
            Revision::Modern => "modern",
        }
    }

    /// Its index in per-revision arrays.
    pub(crate) fn slot(self) -> usize {
        self as usize
    }

    pub fn other(self) -> Self {
        match self {
            Revision::Legacy => Revision::Modern,
            Revision::Modern => Revision::Legacy,
        }
    }
}
