//! A minimal HTTP GET for exec probes (`orchestrator-mcp-proxy probe URL`): blocking, no runtime,
//! so it starts in a millisecond or two. And who listens on a port of the pod ([`listeners`],
//! from the kernel's socket table): every container of a pod can bind its loopback, so an
//! answer on 127.0.0.1:8080 is the proxy's only if the listening socket is the proxy's uid's.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs},
    os::unix::fs::MetadataExt,
    time::Duration,
};

/// The uids owning the listening TCP sockets that take connections to `addr` in this network
/// namespace: bound to its port on its address or on the wildcard (`/proc/net/tcp`, `tcp6`).
pub fn listeners(addr: SocketAddr) -> Result<Vec<u32>, String> {
    let mut uids = Vec::new();
    let mut read_any = false;
    for (table, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        read_any = true;
        uids.extend(text.lines().skip(1).filter_map(|line| {
            let (local, uid) = listening(line, v6)?;
            let takes = local.port() == addr.port()
                && (local.ip() == addr.ip()
                    || local.ip().is_unspecified()
                    || local.ip().to_canonical() == addr.ip().to_canonical());
            takes.then_some(uid)
        }));
    }
    if !read_any {
        return Err("cannot read /proc/net/tcp to see who listens".into());
    }
    Ok(uids)
}

/// A socket table line's local address and uid, when the socket listens (state 0A).
fn listening(line: &str, v6: bool) -> Option<(SocketAddr, u32)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (local, state, uid) = (fields.get(1)?, fields.get(3)?, fields.get(7)?);
    if *state != "0A" {
        return None;
    }
    let (ip, port) = local.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // Each 32-bit word is printed as the kernel holds it, in this machine's byte order.
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = if v6 {
        let mut bytes = [0u8; 16];
        for i in 0..4 {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
        }
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::from(word(0)?))
    };
    Some((SocketAddr::new(ip, port), uid.parse().ok()?))
}

/// This process's effective uid (the owner of its own `/proc/self`).
pub fn own_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Whether `addr` (a loopback address) is served by this uid alone: the probe's check that the
/// proxy, not another process of the pod, holds the port.
pub fn served_by_own_uid(addr: SocketAddr) -> Result<(), String> {
    let uid = own_uid().ok_or("cannot tell this process's uid")?;
    let uids = listeners(addr)?;
    if uids.is_empty() {
        return Err(format!("nothing listens on {addr}"));
    }
    match uids.iter().find(|u| **u != uid) {
        Some(other) => Err(format!(
            "{addr} is held by uid {other}, not this container's uid {uid}: another process of \
             the pod took the proxy's port"
        )),
        None => Ok(()),
    }
}

/// GETs an `http://` URL and returns the status code.
pub fn get(url: &str, timeout: Duration) -> Result<u16, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs can be probed".into());
    }
    let authority = uri.authority().ok_or("the URL has no host")?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let addr = (authority.host().trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {authority}"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("cannot connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    // One write: a request split over several segments is still valid HTTP, but needless.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("cannot send: {e}"))?;
    // The status line may arrive in pieces; read until its end.
    let mut head = Vec::with_capacity(64);
    let mut chunk = [0u8; 64];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 512 {
        let n = stream
            .read(&mut chunk)
            .map_err(|e| format!("no answer: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = std::str::from_utf8(&head).unwrap_or_default();
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {line:?}"))
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn reads_the_status_of_a_real_http_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut conn, _) = listener.accept().expect("accept");
                let mut buf = Vec::new();
                let mut chunk = [0u8; 256];
                while !buf.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let n = buf.len();
                // A malformed request gets a 400, which the probe would report as a failure.
                let well_formed = buf[..n].starts_with(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1:")
                    && buf[..n].ends_with(b"\r\n\r\n");
                let status = if well_formed {
                    status
                } else {
                    "400 Bad Request"
                };
                let _ = write!(conn, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
            }
        });
        // The listener is this process's: its uid is ours.
        assert_eq!(served_by_own_uid(addr), Ok(()));
        let url = format!("http://{addr}/readyz");
        assert_eq!(get(&url, Duration::from_secs(2)), Ok(200));
        assert_eq!(get(&url, Duration::from_secs(2)), Ok(503));
        assert!(get("http://127.0.0.1:1/readyz", Duration::from_secs(2)).is_err());
    }

    #[test]
    fn reads_listening_sockets_and_their_uids_from_the_socket_table() {
        // 127.0.0.1:8080 listening, uid 65533, as this machine's kernel prints it.
        let v4 = format!(
            "   0: {:08X}:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65533 0 4242 1",
            u32::from_ne_bytes([127, 0, 0, 1])
        );
        assert_eq!(
            listening(&v4, false),
            Some(("127.0.0.1:8080".parse().expect("addr"), 65533))
        );
        // An established connection is not a listener.
        assert_eq!(listening(&v4.replace(" 0A ", " 01 "), false), None);
        let v6 = format!(
            "   1: {:08X}{:08X}{:08X}{:08X}:1F90 00000000000000000000000000000000:0000 0A 0 0 0 65600 0 1 1",
            u32::from_ne_bytes([0, 0, 0, 0]),
            u32::from_ne_bytes([0, 0, 0, 0]),
            u32::from_ne_bytes([0, 0, 0, 0]),
            u32::from_ne_bytes([0, 0, 0, 1])
        );
        assert_eq!(
            listening(&v6, true),
            Some(("[::1]:8080".parse().expect("addr"), 65600))
        );
        assert_eq!(listening("garbage", false), None);
        assert_eq!(listening("  0: zz:1F90 0:0 0A x x x x x", false), None);
    }
}
