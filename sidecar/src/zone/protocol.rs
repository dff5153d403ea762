//! The zone socket protocol, spoken by both ends: the proxy (`upstream::zoned`) and the zone
//! (`zone`). JSON lines of at most [`MAX_LINE`] bytes each over a unix stream socket, one
//! connection per process:
//!
//! ```text
//! zone  -> proxy  {"event":"hello","v":3,"server":"git"}     first line, once the peer's uid may
//!                                                            start it (else an error; then closes)
//! proxy -> zone   {"op":"start","v":3,"server":"git"}        once, after checking the zone's uid
//!                                                            and that the hello names its server
//! zone  -> proxy  {"event":"started","v":3,"pid":4242}       with the process's stdin (write
//!                                                            end), stdout and stderr (read ends)
//!                                                            attached (SCM_RIGHTS, in that order)
//!            or   {"event":"error","message":"..."}          refused or cannot run; then closes
//! proxy -> zone   {"op":"signal","signal":"term"|"kill"}     any time: to the process's group
//! zone  -> proxy  {"event":"exit","status":"exit status: 1"} the process ended; then closes
//! ```
//!
//! Both ends name the server, so each knows whom it speaks to: the proxy has checked the path
//! (the socket itself, owned by the zone's uid) and the peer's uid (`SO_PEERCRED`) before it
//! reads the hello, and starts nothing in a zone whose hello names another server; the zone
//! starts nothing for a start that names another server than its own (`zone --server`).
//!
//! The proxy closing the connection (it stopped the server, or it died) makes the zone end the
//! process group: SIGTERM, SIGKILL after the zone's grace. A line that is too long, not JSON, of
//! another protocol version or not a message of the protocol ends the connection. `v` is the
//! protocol version: a message of another version is refused with an `error` naming both.
//! Version 1 was this exchange without the hello and the names; version 2 is the TCP protocol
//! (`frames`). The proxy and the zone are the same binary (the operator renders one image for
//! both), so both ends of a pod always speak the same version.

use std::{
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    os::fd::{BorrowedFd, OwnedFd},
};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use tokio::{io::Interest, net::UnixStream};

/// The protocol version both ends speak.
pub const VERSION: u32 = 3;
/// The longest line either end accepts, without its newline.
pub const MAX_LINE: usize = 4096;
/// Descriptors that come with `started`: stdin, stdout, stderr.
pub const FDS: usize = 3;

/// A signal the proxy asks for.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SignalName {
    Term,
    Kill,
}

/// What the proxy sends.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Start the server's process; `server` is the server the proxy means to start.
    Start {
        v: u32,
        server: String,
    },
    Signal {
        signal: SignalName,
    },
}

/// What the zone sends.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "lowercase", deny_unknown_fields)]
pub enum Event {
    /// The zone's first line: the server it runs (`zone --server`).
    Hello {
        v: u32,
        server: String,
    },
    Started {
        v: u32,
        pid: u32,
    },
    Exit {
        status: String,
    },
    Error {
        message: String,
    },
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Parses one line (without its newline) as a message: JSON, then the version (when the line
/// has one), then the message's shape.
pub fn parse<T: DeserializeOwned>(line: &[u8]) -> io::Result<T> {
    let value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| invalid(format!("not a JSON line of the zone protocol: {e}")))?;
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

/// Lines read from a stream, at most [`MAX_LINE`] bytes each. Bytes read stay buffered, so a
/// read that is given up (a `select!` branch not taken) loses nothing.
#[derive(Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// Bytes that arrived before this reader took over.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// A complete line, if one is buffered; an error when [`MAX_LINE`] bytes hold no newline.
    pub fn take(&mut self) -> io::Result<Option<Vec<u8>>> {
        match self.buf.iter().position(|b| *b == b'\n') {
            Some(end) if end <= MAX_LINE => {
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                Ok(Some(line))
            }
            Some(_) => Err(too_long()),
            None if self.buf.len() > MAX_LINE => Err(too_long()),
            None => Ok(None),
        }
    }

    /// How many bytes may be read before the buffer holds a line or is too long.
    fn room(&self) -> usize {
        (MAX_LINE + 1).saturating_sub(self.buf.len()).max(1)
    }

    /// The next line; `None` at the end of the stream.
    pub async fn next(&mut self, stream: &UnixStream) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(line) = self.take()? {
                return Ok(Some(line));
            }
            let mut chunk = [0u8; 1024];
            let room = self.room().min(chunk.len());
            stream.readable().await?;
            match stream.try_read(&mut chunk[..room]) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(invalid("the stream ended inside a line".into())),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line from any reader (a TCP connection's read half); `None` at the end of the
    /// stream. Reads no further than a line allows, so little beyond it is buffered.
    pub async fn next_from(
        &mut self,
        reader: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> io::Result<Option<Vec<u8>>> {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some(line) = self.take()? {
                return Ok(Some(line));
            }
            let mut chunk = [0u8; 1024];
            let room = self.room().min(chunk.len());
            match reader.read(&mut chunk[..room]).await? {
                0 if self.buf.is_empty() => return Ok(None),
                0 => return Err(invalid("the stream ended inside a line".into())),
                n => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The bytes read beyond the last line taken (the first frames, over TCP).
    pub fn into_rest(self) -> Vec<u8> {
        self.buf
    }

    /// The next line and the descriptors that came with its bytes (`recvmsg`); `None` at the end
    /// of the stream. More than [`FDS`] descriptors is an error (the kernel closes the excess).
    pub async fn next_with_fds(
        &mut self,
        stream: &UnixStream,
    ) -> io::Result<(Option<Vec<u8>>, Vec<OwnedFd>)> {
        let mut fds = Vec::new();
        loop {
            if let Some(line) = self.take()? {
                return Ok((Some(line), fds));
            }
            let mut chunk = [0u8; 1024];
            let room = self.room().min(chunk.len());
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS))];
            let (n, received) = stream
                .async_io(Interest::READABLE, || {
                    let mut control = RecvAncillaryBuffer::new(&mut space);
                    let mut iov = [IoSliceMut::new(&mut chunk[..room])];
                    let msg = rustix::net::recvmsg(
                        stream,
                        &mut iov,
                        &mut control,
                        RecvFlags::CMSG_CLOEXEC,
                    )?;
                    let mut received = Vec::new();
                    for message in control.drain() {
                        if let RecvAncillaryMessage::ScmRights(passed) = message {
                            received.extend(passed);
                        }
                    }
                    if msg.flags.contains(ReturnFlags::CTRUNC) {
                        return Err(invalid(format!(
                            "more than {FDS} descriptors came with the line"
                        )));
                    }
                    Ok((msg.bytes, received))
                })
                .await?;
            fds.extend(received);
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok((None, fds))
                } else {
                    Err(invalid("the stream ended inside a line".into()))
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn too_long() -> io::Error {
    invalid(format!("a line longer than {MAX_LINE} bytes"))
}

/// A message as a line, newline included.
pub fn line_of(message: &impl Serialize) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// Writes one message as a line.
pub async fn send(stream: &UnixStream, message: &impl Serialize) -> io::Result<()> {
    write_all(stream, &line_of(message)?).await
}

/// Writes one message as a line with `fds` attached (`sendmsg`, SCM_RIGHTS).
pub async fn send_with_fds(
    stream: &UnixStream,
    message: &impl Serialize,
    fds: [BorrowedFd<'_>; FDS],
) -> io::Result<()> {
    let line = line_of(message)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS))];
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for the descriptors"));
            }
            Ok(rustix::net::sendmsg(
                stream,
                &[IoSlice::new(&line)],
                &mut control,
                SendFlags::NOSIGNAL,
            )?)
        })
        .await?;
    // The descriptors went with the first byte; the rest (if the socket took only part) follows.
    write_all(stream, &line[sent..]).await
}

async fn write_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(message: &impl Serialize) -> String {
        String::from_utf8(line_of(message).expect("serializes")).expect("utf-8")
    }

    #[test]
    fn messages_are_the_documented_lines() {
        assert_eq!(
            line(&Event::Hello {
                v: VERSION,
                server: "git".into()
            }),
            "{\"event\":\"hello\",\"v\":3,\"server\":\"git\"}\n"
        );
        assert_eq!(
            line(&Request::Start {
                v: VERSION,
                server: "git".into()
            }),
            "{\"op\":\"start\",\"v\":3,\"server\":\"git\"}\n"
        );
        assert_eq!(
            line(&Request::Signal {
                signal: SignalName::Term
            }),
            "{\"op\":\"signal\",\"signal\":\"term\"}\n"
        );
        assert_eq!(
            line(&Event::Started { v: 3, pid: 7 }),
            "{\"event\":\"started\",\"v\":3,\"pid\":7}\n"
        );
        assert_eq!(
            parse::<Event>(br#"{"event":"exit","status":"exit status: 1"}"#).expect("parses"),
            Event::Exit {
                status: "exit status: 1".into()
            }
        );
        assert_eq!(
            parse::<Request>(br#"{"v":3,"server":"git","op":"start"}"#).expect("parses"),
            Request::Start {
                v: 3,
                server: "git".into()
            }
        );
    }

    #[test]
    fn bad_json_unknown_versions_and_strange_messages_are_refused_by_name() {
        let error = |line: &[u8]| parse::<Request>(line).expect_err("refused").to_string();
        assert!(
            error(b"not json").starts_with("not a JSON line"),
            "{}",
            error(b"not json")
        );
        assert_eq!(
            error(br#"{"v":1,"op":"start"}"#),
            "protocol version 1 is not spoken here (this end speaks 3)"
        );
        assert!(error(br#"{"v":"3","op":"start"}"#).contains("protocol version \"3\""));
        for strange in [
            &br#"{"op":"start"}"#[..],
            br#"{"v":3,"op":"start"}"#,
            br#"{"v":3,"op":"exec","command":"sh"}"#,
            br#"{"op":"signal","signal":"hup"}"#,
            br#"{"v":3,"op":"start","server":"git","env":{"A":"b"}}"#,
            br#"[1,2]"#,
        ] {
            assert!(
                error(strange).starts_with("not a message of the zone protocol"),
                "{}: {}",
                String::from_utf8_lossy(strange),
                error(strange)
            );
        }
    }

    #[test]
    fn lines_are_bounded_and_split_across_reads() {
        let mut lines = Lines::default();
        lines.push(b"{\"a\":1}\n{\"b\"");
        assert_eq!(lines.take().expect("ok"), Some(b"{\"a\":1}".to_vec()));
        assert_eq!(lines.take().expect("ok"), None);
        lines.push(b":2}\n");
        assert_eq!(lines.take().expect("ok"), Some(b"{\"b\":2}".to_vec()));

        let mut exact = Lines::default();
        exact.push(&[b'x'; MAX_LINE]);
        assert_eq!(exact.take().expect("a full line is not too long yet"), None);
        assert_eq!(exact.room(), 1, "one more byte decides");
        exact.push(b"\n");
        assert_eq!(exact.take().expect("ok").map(|l| l.len()), Some(MAX_LINE));

        let mut endless = Lines::default();
        endless.push(&[b'x'; MAX_LINE + 1]);
        let error = endless.take().expect_err("too long");
        assert_eq!(
            error.to_string(),
            format!("a line longer than {MAX_LINE} bytes")
        );
        let mut late_newline = Lines::default();
        late_newline.push(&[b'x'; MAX_LINE + 1]);
        late_newline.push(b"\n");
        assert!(late_newline.take().is_err());
    }
}
