//! Handing the session to the person's browser without putting the token on a command line
//! (every local user reads `/proc/*/cmdline`). The console opens `http://127.0.0.1:PORT/open`,
//! which carries no secret; that link opens a session once ([`Handoff::take`]), and only for a
//! browser of the user running the console: the kernel's socket tables (`/proc/net/tcp`,
//! `/proc/net/tcp6`) name the uid owning the connecting socket, which must be the uid owning
//! the console's own end of that connection ([`same_user`]). Another local user who reads the
//! link and opens it first is refused and does not use it up; a second open (the same user's,
//! later) is refused too: the URL the console printed (with the token) still works.
//!
//! Linux only: elsewhere the socket's owner cannot be told, and the console opens no browser.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

/// The path of the link the opener gets.
pub const PATH: &str = "/open";

/// The link the opener gets: no secret in it.
pub fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}{PATH}")
}

/// Whether the link can hand the session over on this system.
pub const SUPPORTED: bool = cfg!(target_os = "linux");

/// The one-time link's state.
#[derive(Debug, Default)]
pub struct Handoff {
    used: AtomicBool,
}

impl Handoff {
    /// `true` the first time only.
    pub fn take(&self) -> bool {
        !self.used.swap(true, Ordering::SeqCst)
    }
}

/// Whether the client at `peer`, connected to the console at `server`, runs as the console's
/// user. `Err` says why not (or why it cannot be told).
pub fn same_user(peer: SocketAddr, server: SocketAddr) -> Result<(), String> {
    if !SUPPORTED {
        return Err(
            "on this system the console cannot tell which user a connection comes from".into(),
        );
    }
    let mut tables = String::new();
    for path in ["/proc/net/tcp", "/proc/net/tcp6"] {
        // A system without IPv6 has no tcp6: what is there is enough.
        if let Ok(text) = std::fs::read_to_string(path) {
            tables.push_str(&text);
        }
    }
    check(&tables, peer, server)
}

/// [`same_user`] over the text of the socket tables.
pub fn check(tables: &str, peer: SocketAddr, server: SocketAddr) -> Result<(), String> {
    let client = owner(tables, peer, server);
    let console = owner(tables, server, peer);
    match (client, console) {
        (Some(c), Some(o)) if c == o => Ok(()),
        (Some(c), Some(o)) => Err(format!(
            "the connection comes from a process of uid {c}, not of the user running the console (uid {o})"
        )),
        _ => Err(format!(
            "the connection from {peer} is not one between two sockets of this machine"
        )),
    }
}

/// The uid owning the established TCP socket at `local` connected to `remote`.
fn owner(tables: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    tables.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...; 01: ESTABLISHED.
        let [_, l, r, state, _, _, _, uid, ..] = fields.as_slice() else {
            return None;
        };
        (*state == "01" && parse(l) == Some(local) && parse(r) == Some(remote))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// `0100007F:1F90` (an IPv4 address as the kernel prints it: its 32-bit word in host order)
/// or 32 hex digits (IPv6: four such words), then the port. IPv4-mapped IPv6 becomes IPv4.
fn parse(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        addr.get(i * 8..i * 8 + 8)
            .and_then(|w| u32::from_str_radix(w, 16).ok())
            .map(u32::to_ne_bytes)
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(octets);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `addr` as the kernel prints it on this machine.
    fn hex(addr: SocketAddr) -> String {
        let ip = match addr.ip() {
            IpAddr::V4(v4) => format!("{:08X}", u32::from_ne_bytes(v4.octets())),
            IpAddr::V6(v6) => v6
                .octets()
                .chunks(4)
                .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        };
        format!("{ip}:{:04X}", addr.port())
    }

    fn line(local: SocketAddr, remote: SocketAddr, state: &str, uid: u32) -> String {
        format!(
            "   3: {} {} {state} 00000000:00000000 00:00000000 00000000  {uid:>5}        0 4711 1 0000000000000000 20 4 30 10 -1\n",
            hex(local),
            hex(remote)
        )
    }

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    #[test]
    fn the_client_must_run_as_the_consoles_user() {
        let server: SocketAddr = "127.0.0.1:8123".parse().expect("an address");
        let browser: SocketAddr = "127.0.0.1:51000".parse().expect("an address");
        let listening: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let mine = format!(
            "{HEADER}{}{}{}",
            line(server, listening, "0A", 1000),
            line(server, browser, "01", 1000),
            line(browser, server, "01", 1000),
        );
        assert_eq!(check(&mine, browser, server), Ok(()));
        // Another local user's process on the other end.
        let theirs = format!(
            "{HEADER}{}{}",
            line(server, browser, "01", 1000),
            line(browser, server, "01", 1001),
        );
        let refused = check(&theirs, browser, server).expect_err("another user");
        assert!(
            refused.contains("uid 1001") && refused.contains("uid 1000"),
            "{refused}"
        );
        // A closed (TIME_WAIT) socket of the same port counts for nothing; nor does a peer
        // that is not in the tables (another machine, through a tunnel).
        let closed = format!(
            "{HEADER}{}{}",
            line(server, browser, "01", 1000),
            line(browser, server, "06", 1000),
        );
        assert!(check(&closed, browser, server).is_err());
        assert!(check(HEADER, browser, server).is_err());
    }

    #[test]
    fn an_ipv4_client_on_a_dual_stack_socket_is_found_in_tcp6() {
        let server: SocketAddr = "127.0.0.1:8123".parse().expect("an address");
        let browser: SocketAddr = "127.0.0.1:51000".parse().expect("an address");
        let mapped = |a: SocketAddr| match a.ip() {
            IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
            IpAddr::V6(_) => a,
        };
        let tables = format!(
            "{HEADER}{}{HEADER}{}",
            line(server, browser, "01", 1000),
            line(mapped(browser), mapped(server), "01", 1000),
        );
        assert_eq!(check(&tables, browser, server), Ok(()));
    }

    #[test]
    fn the_link_carries_no_secret_and_opens_once() {
        assert_eq!(url(8123), "http://127.0.0.1:8123/open");
        let handoff = Handoff::default();
        assert!(handoff.take());
        assert!(!handoff.take());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_real_loopback_connection_of_this_process_is_its_own_user() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let server = listener.local_addr().expect("its address");
        let client = std::net::TcpStream::connect(server).expect("connected");
        let (_accepted, peer) = listener.accept().expect("accepted");
        assert_eq!(client.local_addr().ok(), Some(peer));
        assert_eq!(same_user(peer, server), Ok(()));
    }
}
