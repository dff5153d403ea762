//! An upstream's stderr. It is read as bytes for as long as the pipe is open — a child whose
//! stderr pipe fills up blocks, and one whose pipe is closed dies of SIGPIPE on its next write —
//! split into lines of at most [`MAX_LINE`] bytes (the rest of a longer line is counted, not
//! kept), decoded lossily, kept as a short tail for error messages, and copied into the proxy's
//! log at a bounded rate.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::{names::ServerName, sync::lock};

/// The longest line kept, in bytes.
pub const MAX_LINE: usize = 16 * 1024;
/// Lines kept for error messages.
const TAIL_LINES: usize = 20;
/// Lines copied into the log: bursts of up to this many ...
const LOG_BURST: f64 = 200.0;
/// ... refilled at this many per second.
const LOG_PER_SECOND: f64 = 50.0;

/// The last lines a child wrote to stderr.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// Reads `stderr` until the child closes it (its pipe from a child of the proxy, or from a
/// process in its zone).
pub async fn drain(mut stderr: impl AsyncRead + Unpin, server: ServerName, tail: Tail) {
    let mut lines = Lines::default();
    let mut log = RateLimit::new(Instant::now());
    let mut buf = vec![0u8; 8 * 1024];
    let mut emit = |line: String| {
        match log.take(Instant::now()) {
            Admit::Yes { skipped } => {
                if skipped > 0 {
                    tracing::warn!(target: "upstream_stderr", %server, skipped, "stderr lines not copied to the log (rate limit)");
                }
                tracing::info!(target: "upstream_stderr", %server, "{line}");
            }
            Admit::No { first: true } => {
                tracing::warn!(target: "upstream_stderr", %server, "stderr is copied to the log at {LOG_PER_SECOND} lines/s at most; dropping lines until it slows down");
            }
            Admit::No { first: false } => {}
        }
        let mut tail = lock(&tail);
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    };
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => lines.push(&buf[..n], &mut emit),
            // Interrupted reads are retried by tokio; anything else means the pipe is unusable.
            Err(e) => {
                tracing::debug!(%server, error = %e, "reading the upstream's stderr");
                break;
            }
        }
    }
    lines.finish(&mut emit);
    let skipped = log.skipped;
    if skipped > 0 {
        tracing::warn!(target: "upstream_stderr", %server, skipped, "stderr lines not copied to the log (rate limit)");
    }
}

/// Splits bytes into lines of at most [`MAX_LINE`] bytes.
#[derive(Default)]
struct Lines {
    line: Vec<u8>,
    /// Bytes of the current line beyond [`MAX_LINE`].
    cut: usize,
}

impl Lines {
    fn push(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(String)) {
        while !bytes.is_empty() {
            let (part, rest, ends) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            let room = MAX_LINE - self.line.len();
            self.line.extend_from_slice(&part[..part.len().min(room)]);
            self.cut += part.len().saturating_sub(room);
            if ends {
                self.end(emit);
            }
            bytes = rest;
        }
    }

    fn finish(&mut self, emit: &mut impl FnMut(String)) {
        if !self.line.is_empty() || self.cut > 0 {
            self.end(emit);
        }
    }

    fn end(&mut self, emit: &mut impl FnMut(String)) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end_matches('\r');
        let line = match self.cut {
            0 => text.to_string(),
            cut => format!("{text}… ({cut} more bytes of this line not kept)"),
        };
        self.line.clear();
        self.cut = 0;
        emit(line);
    }
}

/// A token bucket for log lines.
struct RateLimit {
    tokens: f64,
    at: Instant,
    skipped: u64,
}

enum Admit {
    /// Log the line; `skipped` lines were dropped since the last one logged.
    Yes { skipped: u64 },
    /// Drop it; `first` of a run of dropped lines.
    No { first: bool },
}

impl RateLimit {
    fn new(now: Instant) -> Self {
        Self {
            tokens: LOG_BURST,
            at: now,
            skipped: 0,
        }
    }

    fn take(&mut self, now: Instant) -> Admit {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * LOG_PER_SECOND).min(LOG_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Admit::Yes {
                skipped: std::mem::take(&mut self.skipped),
            }
        } else {
            self.skipped += 1;
            Admit::No {
                first: self.skipped == 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut out = Vec::new();
        let mut lines = Lines::default();
        for chunk in chunks {
            lines.push(chunk, &mut |l| out.push(l));
        }
        lines.finish(&mut |l| out.push(l));
        out
    }

    #[test]
    fn lines_are_split_across_reads_decoded_lossily_and_capped() {
        assert_eq!(
            split(&[b"one\ntw", b"o\r\nthree"]),
            vec!["one", "two", "three"]
        );
        assert_eq!(
            split(&[b"bad \xff\xfe byte\n"]),
            vec!["bad \u{fffd}\u{fffd} byte"]
        );
        let long = vec![b'x'; MAX_LINE + 10];
        let out = split(&[&long[..MAX_LINE - 1], &long[MAX_LINE - 1..], b"\nnext\n"]);
        assert_eq!(out.len(), 2);
        assert!(out[0].starts_with(&"x".repeat(MAX_LINE)));
        assert!(out[0].ends_with("(10 more bytes of this line not kept)"));
        assert_eq!(out[1], "next");
    }

    #[test]
    fn the_log_takes_bursts_then_a_steady_rate_and_says_what_it_skipped() {
        let start = Instant::now();
        let mut limit = RateLimit::new(start);
        let admitted = (0..1000)
            .filter(|_| matches!(limit.take(start), Admit::Yes { .. }))
            .count();
        assert_eq!(admitted, LOG_BURST as usize);
        let later = start + Duration::from_secs(1);
        assert!(matches!(
            limit.take(later),
            Admit::Yes { skipped } if skipped == 1000 - LOG_BURST as u64
        ));
    }
}
