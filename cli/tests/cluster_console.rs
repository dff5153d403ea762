//! `orchestrator-cli console` opening the person's browser against the real control plane: the
//! opener's command line (which every local user can read in `/proc/*/cmdline`) carries no
//! token, another local user who reads the link and opens it first gets nothing, and the
//! user's own Chromium, started by the opener as `xdg-open` would, gets the session.
//!
//! The opener is a stand-in `xdg-open` first on PATH: it records its command line, lets
//! `nobody` (uid 65534, through setpriv: needs root, as the e2e environment runs) open the link
//! first, then runs headless Chromium on it and keeps the page it got.
//!
//! Run: `e2e/cluster up`, then `cargo test -p orchestrator-cli --test cluster_console -- --ignored`.

mod cluster_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cluster_support::{cli, setup};

/// The stand-in opener (see the module's comment); `$OPENER_DIR` is where it writes.
const OPENER: &str = r#"#!/bin/sh
tr '\0' ' ' < /proc/$$/cmdline > "$OPENER_DIR/cmdline"
if [ "$(id -u)" = 0 ]; then
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    curl -s -o "$OPENER_DIR/other.body" -w '%{http_code}' "$1" > "$OPENER_DIR/other.status"
fi
chromium --headless=new --no-sandbox --disable-gpu --no-first-run \
  --user-data-dir="$OPENER_DIR/profile" --dump-dom "$1" > "$OPENER_DIR/dom.html" 2> "$OPENER_DIR/chromium.log"
echo done > "$OPENER_DIR/done"
"#;

/// The console process, stopped when the test ends (passed or not).
struct Console(std::process::Child);

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One GET to the console at `port`; the status line's code and the whole answer.
fn get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("an HTTP status line")?;
    Ok((code, answer))
}

#[tokio::test]
#[ignore = "needs the e2e cluster (run ./test, or e2e/cluster up) and chromium (e2e/setup)"]
async fn the_browser_gets_the_session_without_the_token_on_a_command_line() -> Result<()> {
    let (_client, ns) = setup("cli-console").await?;
    let dir = tempfile::tempdir()?;
    // nobody must reach the output directory inside it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin)?;
    let opener = bin.join("xdg-open");
    std::fs::write(&opener, OPENER)?;
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755))?;
    let out = dir.path().join("out");
    std::fs::create_dir(&out)?;
    // nobody must be able to write its answer there.
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut console = Console(
        cli(&ns.name, &["console", "--port", "0"])
            .env("PATH", path)
            .env("OPENER_DIR", &out)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let stdout = console.0.stdout.take().context("stdout")?;
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first)?;
    let url = first
        .strip_prefix("console: ")
        .map(str::trim)
        .with_context(|| format!("the console's first line: {first:?}"))?
        .to_string();
    let (port, token) = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|rest| rest.split_once("/?token="))
        .with_context(|| format!("a URL with a token: {url}"))?;
    let (port, token): (u16, String) = (port.parse()?, token.to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !out.join("done").exists() {
        if Instant::now() > deadline {
            anyhow::bail!(
                "the opener did not finish within 60 s: {}",
                std::fs::read_to_string(out.join("chromium.log")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();

    // What every local user could read: the opener's command line, without the token.
    let cmdline = read("cmdline");
    assert!(
        !cmdline.contains(&token),
        "the token is on a command line: {cmdline}"
    );
    assert!(
        cmdline.contains(&format!("http://127.0.0.1:{port}/open")),
        "{cmdline}"
    );

    // Another local user who took the link first: refused, no cookie.
    if read("other.status").is_empty() {
        eprintln!("not root: the part where another local user opens the link is skipped");
    } else {
        assert_eq!(read("other.status"), "403", "{}", read("other.body"));
        assert!(
            read("other.body").contains("only for a browser of the user running"),
            "{}",
            read("other.body")
        );
    }

    // The user's browser: the console's page, with the session.
    let dom = read("dom.html");
    assert!(
        dom.contains("/assets/console.js") && !dom.contains("no console session"),
        "the page Chromium got:\n{dom}\n{}",
        read("chromium.log")
    );

    // Once: the link is spent; the URL printed (with the token) still opens a session.
    let (code, answer) = get(port, "/open")?;
    assert_eq!(code, 410, "{answer}");
    let (code, answer) = get(port, &format!("/?token={token}"))?;
    assert_eq!(code, 303, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("set-cookie: orchestrator_console_")
    );

    let _ = console.0.kill();
    let _ = console.0.wait();
    let mut stderr = String::new();
    if let Some(mut e) = console.0.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(!stderr.contains(&token), "{stderr}");
    Ok(())
}
