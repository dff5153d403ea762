//! The zone protocol over TCP (`v: 2`), spoken by `tcp` (the zone) and `upstream::zone_tcp`
//! (the proxy). Three JSON lines of at most [`MAX_LINE`](super::protocol::MAX_LINE) bytes
//! authenticate the proxy and start the process; frames carry everything after:
//!
//! ```text
//! zone  -> proxy  {"event":"hello","v":2,"server":"git","nonce":"<64 hex>"}
//! proxy -> zone   {"op":"start","v":2,"nonce":"<64 hex>","proof":"<64 hex>"}
//!                 proof = HMAC-SHA256(key, zone's nonce || "orchestrator-zone/v1" || server)
//! zone  -> proxy  {"event":"started","v":2,"pid":4242,"proof":"<64 hex>"}
//!                 proof = HMAC-SHA256(key, proxy's nonce || "orchestrator-zone/v1 zone" || server)
//!            or   {"event":"error","message":"..."}   refused or cannot run; then closes
//! then both ways  frames: chan (1 byte) | length (4 bytes, big-endian) | length bytes
//! ```
//!
//! Channels: 0 stdin (proxy to zone), 1 stdout and 2 stderr (zone to proxy), 3 control (a JSON
//! message: the proxy's `signal` and `window`, the zone's `window` and `exit`). A data frame of
//! length 0 ends its stream (the reader sees EOF). Data frames are flow-controlled: each end may
//! have at most [`WINDOW`] bytes of a channel unconsumed at the other, which returns credit with
//! `{"op"|"event":"window","chan":"stdout","bytes":N}` as it consumes them. So both ends always
//! read the connection (control is never stuck behind data) and buffer at most [`WINDOW`] per
//! channel. A frame longer than [`MAX_FRAME`], of an unknown channel or the wrong direction,
//! beyond the window, or a control message that is not the protocol ends the connection.

use std::{
    io,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::Notify,
};

use super::protocol::{MAX_LINE, SignalName};
use crate::sync::lock;

/// The protocol version over TCP.
pub const VERSION: u32 = 2;
/// The largest frame payload either end sends or accepts.
pub const MAX_FRAME: usize = 64 * 1024;
/// Bytes of a channel one end may send beyond what the other has consumed.
pub const WINDOW: usize = 256 * 1024;
/// Consumed bytes are returned as credit in batches of at least this many (or at EOF).
pub const GRANT_AT: usize = WINDOW / 4;

/// A frame's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Chan {
    Stdin,
    Stdout,
    Stderr,
    Control,
}

impl Chan {
    fn byte(self) -> u8 {
        match self {
            Chan::Stdin => 0,
            Chan::Stdout => 1,
            Chan::Stderr => 2,
            Chan::Control => 3,
        }
    }

    fn of(byte: u8) -> io::Result<Self> {
        Ok(match byte {
            0 => Chan::Stdin,
            1 => Chan::Stdout,
            2 => Chan::Stderr,
            3 => Chan::Control,
            other => return Err(invalid(format!("a frame of unknown channel {other}"))),
        })
    }
}

/// What the zone sends (lines, then control frames).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "lowercase", deny_unknown_fields)]
pub enum Event {
    Hello {
        v: u32,
        server: String,
        nonce: String,
    },
    Started {
        v: u32,
        pid: u32,
        proof: String,
    },
    Error {
        message: String,
    },
    Window {
        chan: Chan,
        bytes: u32,
    },
    Exit {
        status: String,
    },
}

/// What the proxy sends (a line, then control frames).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    Start {
        v: u32,
        nonce: String,
        proof: String,
    },
    Signal {
        signal: SignalName,
    },
    Window {
        chan: Chan,
        bytes: u32,
    },
}

pub fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// A control message's bytes.
pub fn control_of(message: &impl Serialize) -> io::Result<Vec<u8>> {
    serde_json::to_vec(message).map_err(io::Error::other)
}

/// Reads one frame into `buf` (replacing its contents); `None` at the end of the stream
/// between frames. Never holds more than [`MAX_FRAME`] bytes.
pub async fn read_frame(
    reader: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> io::Result<Option<Chan>> {
    let mut header = [0u8; 5];
    let first = reader.read(&mut header[..1]).await?;
    if first == 0 {
        return Ok(None);
    }
    reader.read_exact(&mut header[1..]).await?;
    let chan = Chan::of(header[0])?;
    let len = usize::try_from(u32::from_be_bytes([
        header[1], header[2], header[3], header[4],
    ]))
    .unwrap_or(usize::MAX);
    if len > MAX_FRAME {
        return Err(invalid(format!(
            "a frame of {len} bytes (at most {MAX_FRAME})"
        )));
    }
    if chan == Chan::Control && len > MAX_LINE {
        return Err(invalid(format!(
            "a control message of {len} bytes (at most {MAX_LINE})"
        )));
    }
    buf.clear();
    buf.resize(len, 0);
    reader.read_exact(buf).await?;
    Ok(Some(chan))
}

/// Writes one frame.
pub async fn write_frame(
    writer: &mut (impl AsyncWrite + Unpin),
    chan: Chan,
    payload: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len as usize <= MAX_FRAME)
        .ok_or_else(|| io::Error::other("a frame too long to send"))?;
    let mut frame = Vec::with_capacity(5 + payload.len());
    frame.push(chan.byte());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(payload);
    writer.write_all(&frame).await
}

/// Parses a control message of protocol `v: 2` (lines carry `v`; control frames do not).
pub fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| invalid(format!("not a JSON message of the zone protocol: {e}")))?;
    if let Some(v) = value.get("v")
        && v.as_u64() != Some(u64::from(VERSION))
    {
        return Err(invalid(format!(
            "protocol version {v} is not spoken here (this end speaks {VERSION})"
        )));
    }
    serde_json::from_value(value)
        .map_err(|e| invalid(format!("not a message of the zone protocol: {e}")))
}

/// What a sender may still send on a channel: taken before sending, granted back by the
/// receiver as it consumes.
pub struct Credit {
    state: Mutex<(usize, bool)>,
    notify: Notify,
}

impl Default for Credit {
    fn default() -> Self {
        Self {
            state: Mutex::new((WINDOW, false)),
            notify: Notify::new(),
        }
    }
}

impl Credit {
    /// Waits for credit and takes up to `max` bytes of it; `None` once closed.
    pub async fn take(&self, max: usize) -> Option<usize> {
        loop {
            let notified = self.notify.notified();
            {
                let mut state = lock(&self.state);
                if state.1 {
                    return None;
                }
                if state.0 > 0 {
                    let n = state.0.min(max);
                    state.0 -= n;
                    return Some(n);
                }
            }
            notified.await;
        }
    }

    /// Adds credit; an error when that would exceed [`WINDOW`] (the peer breaks the protocol).
    pub fn grant(&self, bytes: usize) -> io::Result<()> {
        let mut state = lock(&self.state);
        match state.0.checked_add(bytes) {
            Some(total) if total <= WINDOW => state.0 = total,
            _ => {
                return Err(invalid(format!("a window grant beyond {WINDOW} bytes")));
            }
        }
        drop(state);
        self.notify.notify_one();
        Ok(())
    }

    /// Wakes the sender for good: there is nothing more to send to.
    pub fn close(&self) {
        lock(&self.state).1 = true;
        self.notify.notify_one();
    }
}

/// What a receiver holds of a channel's window: bytes received and not yet granted back.
#[derive(Default)]
pub struct Budget(AtomicUsize);

impl Budget {
    /// Counts `bytes` received; an error when the sender went beyond the window.
    pub fn received(&self, bytes: usize) -> io::Result<()> {
        let before = self.0.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > WINDOW {
            return Err(invalid(format!(
                "more than the {WINDOW}-byte window of a channel unconsumed"
            )));
        }
        Ok(())
    }

    /// Counts `bytes` consumed, to be granted back now.
    pub fn consumed(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_hostile_headers_are_refused_before_any_allocation() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        write_frame(&mut a, Chan::Stdout, b"hello")
            .await
            .expect("w");
        write_frame(&mut a, Chan::Stdin, b"").await.expect("w");
        drop(a);
        let mut buf = Vec::new();
        assert_eq!(
            read_frame(&mut b, &mut buf).await.expect("r"),
            Some(Chan::Stdout)
        );
        assert_eq!(buf, b"hello");
        assert_eq!(
            read_frame(&mut b, &mut buf).await.expect("r"),
            Some(Chan::Stdin)
        );
        assert!(buf.is_empty(), "an empty frame: the end of the stream");
        assert_eq!(read_frame(&mut b, &mut buf).await.expect("r"), None);

        // A 4 GiB frame, a control message over a line, an unknown channel: refused from the
        // header alone (the buffer never grows).
        for (header, why) in [
            (
                vec![1u8, 0xff, 0xff, 0xff, 0xff],
                "a frame of 4294967295 bytes (at most 65536)",
            ),
            (
                vec![3u8, 0, 0, 0x20, 0],
                "a control message of 8192 bytes (at most 4096)",
            ),
            (vec![9u8, 0, 0, 0, 1], "a frame of unknown channel 9"),
        ] {
            let (mut a, mut b) = tokio::io::duplex(64);
            a.write_all(&header).await.expect("w");
            let mut buf = Vec::new();
            let error = read_frame(&mut b, &mut buf).await.expect_err("refused");
            assert_eq!(error.to_string(), why);
            assert_eq!(buf.capacity(), 0);
        }
        // A frame cut short is an error, not a hang or a partial frame.
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[1, 0, 0, 0, 10, b'x']).await.expect("w");
        drop(a);
        assert!(read_frame(&mut b, &mut Vec::new()).await.is_err());
    }

    #[tokio::test]
    async fn credit_waits_for_grants_and_refuses_more_than_the_window() {
        let credit = Credit::default();
        assert_eq!(credit.take(usize::MAX).await, Some(WINDOW));
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), credit.take(10));
        assert!(waiting.await.is_err(), "no credit: the sender waits");
        credit.grant(4).expect("within the window");
        assert_eq!(credit.take(10).await, Some(4));
        assert!(credit.grant(WINDOW + 1).is_err());
        credit.close();
        assert_eq!(credit.take(10).await, None);

        let budget = Budget::default();
        budget.received(WINDOW).expect("the whole window");
        assert!(budget.received(1).is_err(), "beyond the window");
        budget.consumed(WINDOW + 1);
        budget.received(1).expect("room again");
    }

    #[test]
    fn messages_are_the_documented_json() {
        let text = |v: &[u8]| String::from_utf8(v.to_vec()).expect("utf-8");
        assert_eq!(
            text(
                &control_of(&Request::Window {
                    chan: Chan::Stdout,
                    bytes: 5
                })
                .expect("j")
            ),
            r#"{"op":"window","chan":"stdout","bytes":5}"#
        );
        assert_eq!(
            parse::<Event>(br#"{"event":"exit","status":"exit status: 0"}"#).expect("p"),
            Event::Exit {
                status: "exit status: 0".into()
            }
        );
        let old = parse::<Request>(br#"{"op":"start","v":1}"#).expect_err("v1");
        assert_eq!(
            old.to_string(),
            "protocol version 1 is not spoken here (this end speaks 2)"
        );
        assert!(
            parse::<Request>(br#"{"op":"start","v":2}"#).is_err(),
            "no proof"
        );
    }
}
