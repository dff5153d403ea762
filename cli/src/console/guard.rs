//! The console's door, pure: who may talk to it (the session cookie, set from the token it
//! printed, or handed once to its user's browser: `handoff`), from where (a loopback `Host`, or one named with `--allow-host`: a DNS-rebinding page
//! cannot reach it), and how (a `POST` needs the console's own header and a same-origin `Origin`:
//! a cross-site form or fetch cannot act in the caller's name).

use std::fmt::Write as _;

/// The header every state-changing request must carry (a cross-site form cannot set it, and a
/// cross-site fetch would need a CORS preflight the console never answers).
pub const CSRF_HEADER: &str = "x-orchestrator-console";

/// Host names that always reach the console: it listens on 127.0.0.1 only.
const LOOPBACK: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

/// One console's secret and the names it answers to.
#[derive(Clone)]
pub struct Session {
    token: String,
    cookie: String,
    allowed_hosts: Vec<String>,
}

/// Why a request is turned away, with what to tell the person.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 403: the `Host` is not a loopback name nor one given with `--allow-host`.
    Host,
    /// 401: no session cookie (or a wrong one); open the URL the console printed.
    NoSession,
    /// 401: `?token=` is not this console's token.
    BadToken,
    /// 403: a `POST` without the console's header, or from another origin.
    CrossSite,
    /// 403: the one-time link (`/open`) opened by a process of another user (or one the console
    /// cannot tell).
    OtherUser,
    /// 410: the one-time link was used already.
    HandedOver,
}

impl Refusal {
    pub fn status(self) -> u16 {
        match self {
            Refusal::Host | Refusal::CrossSite | Refusal::OtherUser => 403,
            Refusal::NoSession | Refusal::BadToken => 401,
            Refusal::HandedOver => 410,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Host => {
                "this console answers only to 127.0.0.1, localhost and [::1] (and the names given with --allow-host)"
            }
            Refusal::NoSession => {
                "no console session: open the URL `orchestrator-cli console` printed (it carries the session token)"
            }
            Refusal::BadToken => {
                "wrong token: open the URL this `orchestrator-cli console` printed, not an older one"
            }
            Refusal::CrossSite => {
                "refused: a change must come from the console's own page (the X-Orchestrator-Console header and a same-origin Origin)"
            }
            Refusal::OtherUser => {
                "this link opens a session only for a browser of the user running `orchestrator-cli console`: open the URL it printed (it carries the session token)"
            }
            Refusal::HandedOver => {
                "this link opened a session once already: open the URL `orchestrator-cli console` printed (it carries the session token)"
            }
        }
    }
}

/// What the guard reads of a request.
#[derive(Default)]
pub struct Seen<'a> {
    pub post: bool,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub csrf_header: bool,
    /// `Sec-Fetch-Site`, which browsers send (`same-origin`, `cross-site`, `none`, …).
    pub fetch_site: Option<&'a str>,
    /// Every `Cookie` header's value.
    pub cookies: Vec<&'a str>,
    /// Whether the path is open without a session (the page's assets; `/` checks its own token,
    /// `/open` its caller).
    pub open_path: bool,
}

impl Session {
    /// A session for a console listening on `port`, with a fresh random token.
    pub fn new(port: u16, allowed_hosts: &[String]) -> std::io::Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut token = String::with_capacity(64);
        for b in bytes {
            let _ = write!(token, "{b:02x}");
        }
        Ok(Self::with_token(token, port, allowed_hosts))
    }

    pub fn with_token(token: String, port: u16, allowed_hosts: &[String]) -> Self {
        Self {
            token,
            // Cookies are not kept apart by port: two consoles on one machine need two names.
            cookie: format!("orchestrator_console_{port}"),
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        }
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The `Set-Cookie` value that opens the session.
    pub fn set_cookie(&self) -> String {
        format!(
            "{}={}; HttpOnly; SameSite=Strict; Path=/",
            self.cookie, self.token
        )
    }

    /// Whether `given` is this console's token (compared in constant time).
    pub fn token_ok(&self, given: &str) -> bool {
        let (a, b) = (given.as_bytes(), self.token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Whether the `Cookie` headers carry this console's session.
    pub fn has_session(&self, cookies: &[&str]) -> bool {
        cookies
            .iter()
            .flat_map(|h| h.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .any(|(name, value)| name == self.cookie && self.token_ok(value))
    }

    /// Whether `host` (a `Host` header: name and optional port) names this console.
    pub fn host_ok(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        LOOPBACK.contains(&name.as_str()) || self.allowed_hosts.contains(&name)
    }

    /// The guard's verdict on a request.
    pub fn check(&self, seen: &Seen) -> Result<(), Refusal> {
        let host = seen.host.filter(|h| self.host_ok(h)).ok_or(Refusal::Host)?;
        if seen.post {
            let same_origin = match seen.origin {
                Some(origin) => origin.eq_ignore_ascii_case(&format!("http://{host}")),
                None => true,
            };
            let site_ok = matches!(seen.fetch_site, None | Some("same-origin") | Some("none"));
            if !seen.csrf_header || !same_origin || !site_ok {
                return Err(Refusal::CrossSite);
            }
        }
        if seen.open_path || self.has_session(&seen.cookies) {
            Ok(())
        } else {
            Err(Refusal::NoSession)
        }
    }
}

/// The name part of a `Host` header: `[::1]:8080` → `[::1]`, `localhost:80` → `localhost`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session::with_token("ab".repeat(32), 8123, &["console.corp.example".into()])
    }

    fn cookie() -> String {
        format!("theme=dark; orchestrator_console_8123={}", "ab".repeat(32))
    }

    fn get<'a>(host: &'a str, cookie: &'a str) -> Seen<'a> {
        Seen {
            host: Some(host),
            cookies: vec![cookie],
            ..Default::default()
        }
    }

    #[test]
    fn loopback_names_on_any_port_and_allowed_hosts_pass_others_do_not() {
        let s = session();
        for ok in [
            "127.0.0.1:8123",
            "localhost:9999",
            "LOCALHOST",
            "[::1]:8123",
            "console.corp.example:443",
        ] {
            assert!(s.host_ok(ok), "{ok}");
        }
        for bad in [
            "evil.example:8123",
            "127.0.0.1.evil.example",
            "localhost.evil.example:8123",
            "[::2]:8123",
            "",
        ] {
            assert!(!s.host_ok(bad), "{bad}");
        }
        let c = cookie();
        assert_eq!(
            s.check(&get("evil.example:8123", &c)),
            Err(Refusal::Host),
            "a DNS-rebinding page carries its own name in Host"
        );
        let mut no_host = get("x", &c);
        no_host.host = None;
        assert_eq!(s.check(&no_host), Err(Refusal::Host));
        assert_eq!(s.check(&get("127.0.0.1:8123", &c)), Ok(()));
    }

    #[test]
    fn the_session_cookie_must_carry_this_consoles_token() {
        let s = session();
        assert_eq!(s.check(&get("localhost:8123", "")), Err(Refusal::NoSession));
        let other_port = format!("orchestrator_console_8124={}", "ab".repeat(32));
        assert_eq!(
            s.check(&get("localhost:8123", &other_port)),
            Err(Refusal::NoSession)
        );
        let wrong = format!("orchestrator_console_8123={}", "cd".repeat(32));
        assert_eq!(
            s.check(&get("localhost:8123", &wrong)),
            Err(Refusal::NoSession)
        );
        let mut open = get("localhost:8123", "");
        open.open_path = true;
        assert_eq!(s.check(&open), Ok(()), "assets need no session");
        assert!(s.token_ok(&"ab".repeat(32)));
        assert!(!s.token_ok("ab"));
        assert!(s.set_cookie().contains("HttpOnly; SameSite=Strict; Path=/"));
    }

    #[test]
    fn a_post_needs_the_header_and_the_same_origin() {
        let s = session();
        let c = cookie();
        let post = |origin: Option<&'static str>, header: bool, site: Option<&'static str>| {
            let mut seen = get("127.0.0.1:8123", &c);
            seen.post = true;
            seen.origin = origin;
            seen.csrf_header = header;
            seen.fetch_site = site;
            s.check(&seen)
        };
        assert_eq!(
            post(Some("http://127.0.0.1:8123"), true, Some("same-origin")),
            Ok(())
        );
        assert_eq!(post(None, true, None), Ok(()), "a non-browser client");
        assert_eq!(
            post(Some("http://127.0.0.1:8123"), false, Some("same-origin")),
            Err(Refusal::CrossSite),
            "a form post cannot set the header"
        );
        assert_eq!(
            post(Some("http://evil.example"), true, Some("cross-site")),
            Err(Refusal::CrossSite)
        );
        assert_eq!(
            post(Some("http://localhost:8123"), true, None),
            Err(Refusal::CrossSite),
            "another origin, though loopback"
        );
        assert_eq!(
            post(Some("http://127.0.0.1:8123"), true, Some("cross-site")),
            Err(Refusal::CrossSite)
        );
    }

    #[test]
    fn two_sessions_have_different_tokens() {
        let a = Session::new(1, &[]).expect("random");
        let b = Session::new(1, &[]).expect("random");
        assert_eq!(a.token().len(), 64);
        assert_ne!(a.token(), b.token());
    }
}
