//! A server's tool list, read page by page within the memory budget's bounds on one list
//! ([`memory::Bounds::list_tools`] tools, [`memory::Bounds::list_bytes`] serialized bytes): the
//! list is refused whole ([`Error::ListTooLarge`]) as soon as it is beyond either, so the pages
//! after are never asked for. (Each page is one message, bounded by `framing` for stdio and by
//! the SSE event size for HTTP.)

use rmcp::{
    model::{PaginatedRequestParams, Tool},
    service::{Peer, RoleClient},
};

use crate::{
    error::{Error, Result},
    memory,
    names::ServerName,
};

/// Every page of `peer`'s tool list, or the bound it went beyond.
pub async fn list_all(peer: &Peer<RoleClient>, server: &ServerName) -> Result<Vec<Tool>> {
    let bounds = memory::bounds();
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    loop {
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|source| Error::Upstream {
                server: server.clone(),
                source,
            })?;
        bytes += size_of(&page.tools);
        tools.extend(page.tools);
        within(server, tools.len(), bytes, bounds)?;
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
}

/// A tool's serialized size.
pub fn size(tool: &Tool) -> usize {
    serde_json::to_vec(tool).map_or(0, |b| b.len())
}

/// Whether a list of `count` tools and `bytes` is within `bounds`.
fn within(server: &ServerName, count: usize, bytes: usize, bounds: &memory::Bounds) -> Result<()> {
    if count > bounds.list_tools {
        return Err(Error::ListTooLarge {
            server: server.clone(),
            what: "tools",
            seen: format!("at least {count}"),
            max: bounds.list_tools.to_string(),
            setting: "--max-list-tools",
        });
    }
    if bytes > bounds.list_bytes {
        return Err(Error::ListTooLarge {
            server: server.clone(),
            what: "bytes of tool definitions",
            seen: format!("at least {}", memory::human(bytes)),
            max: memory::human(bounds.list_bytes),
            setting: "--max-list-bytes",
        });
    }
    Ok(())
}

/// The serialized bytes of a list.
pub fn size_of(tools: &[Tool]) -> usize {
    tools.iter().map(size).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_beyond_either_bound_is_refused_naming_the_server_and_the_setting() {
        let bounds = memory::Bounds::default();
        let server = ServerName::new("many");
        assert!(within(&server, 4096, 1024, &bounds).is_ok());
        let e = within(&server, 4097, 1024, &bounds).expect_err("too many");
        assert_eq!(e.code(), "PROXY.LIST_TOO_LARGE");
        let text = e.to_string();
        assert!(
            text.contains("\"many\"") && text.contains("--max-list-tools") && text.contains("4096"),
            "{text}"
        );
        let e = within(&server, 1, 7 * 1024 * 1024, &bounds).expect_err("too large");
        let text = e.to_string();
        assert!(
            text.contains("7.0 MiB") && text.contains("--max-list-bytes"),
            "{text}"
        );
        assert_eq!(
            e.to_mcp().data.expect("data")["setting"],
            "--max-list-bytes"
        );
    }
}
