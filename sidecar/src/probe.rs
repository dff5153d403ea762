//! A minimal HTTP GET for exec probes (`orchestrator-mcp-proxy probe URL`): blocking, no runtime,
//! so it starts in a millisecond or two.

use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

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
        let url = format!("http://{addr}/readyz");
        assert_eq!(get(&url, Duration::from_secs(2)), Ok(200));
        assert_eq!(get(&url, Duration::from_secs(2)), Ok(503));
        assert!(get("http://127.0.0.1:1/readyz", Duration::from_secs(2)).is_err());
    }
}
