//! Server-sent events read from a copy of a stream that is passed on unchanged: the bytes go to
//! the agent as they come, and the scanner sees each event once its blank line arrives. An
//! event larger than [`MAX_EVENT`] is skipped (and counted), so a hostile or broken endpoint
//! costs bounded memory.

/// The largest event kept (its `data` lines together).
pub const MAX_EVENT: usize = 1 << 20;

/// One event: its `event:` name (empty when none) and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    pub data: String,
}

#[derive(Debug, Default)]
pub struct Scanner {
    /// The bytes of the line being read.
    line: Vec<u8>,
    name: String,
    data: String,
    /// The current line or event is over [`MAX_EVENT`]: skipped up to its end.
    skipping: bool,
    /// A `\r` ended the last chunk: a `\n` first in the next one belongs to it.
    after_cr: bool,
    pub skipped: u64,
}

impl Scanner {
    /// Reads `chunk`, handing each complete event to `each`.
    pub fn feed(&mut self, chunk: &[u8], mut each: impl FnMut(Event)) {
        let mut rest = chunk;
        if self.after_cr && rest.first() == Some(&b'\n') {
            rest = &rest[1..];
        }
        self.after_cr = false;
        while let Some(at) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.push(&rest[..at]);
            let cr = rest[at] == b'\r';
            rest = &rest[at + 1..];
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.after_cr = true,
                    _ => {}
                }
            }
            self.end_line(&mut each);
        }
        self.push(rest);
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + self.data.len() + bytes.len() > MAX_EVENT {
            self.skipping = true;
            self.line = Vec::new();
            self.data = String::new();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self, each: &mut impl FnMut(Event)) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.skipping {
                self.skipping = false;
                self.skipped += 1;
            } else if !self.data.is_empty() || !self.name.is_empty() {
                each(Event {
                    name: std::mem::take(&mut self.name),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.name.clear();
            self.data.clear();
            return;
        }
        if self.skipping {
            return;
        }
        let line = String::from_utf8_lossy(&line);
        let (field, value) = line.split_once(':').unwrap_or((&line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.name = value.to_string(),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> (Vec<Event>, u64) {
        let mut scanner = Scanner::default();
        let mut seen = Vec::new();
        for chunk in chunks {
            scanner.feed(chunk, |e| seen.push(e));
        }
        (seen, scanner.skipped)
    }

    #[test]
    fn events_split_anywhere_are_read_whole_with_any_line_ending() {
        let stream = b"event: message_start\ndata: {\"a\":1}\n\n: comment\r\nevent: ping\r\ndata: x\r\ndata: y\r\n\r\ndata: z\r\r";
        let whole = events(&[stream]).0;
        assert_eq!(
            whole,
            vec![
                Event {
                    name: "message_start".into(),
                    data: "{\"a\":1}".into()
                },
                Event {
                    name: "ping".into(),
                    data: "x\ny".into()
                },
                Event {
                    name: String::new(),
                    data: "z".into()
                },
            ]
        );
        for split in 1..stream.len() {
            let (a, b) = stream.split_at(split);
            assert_eq!(events(&[a, b]).0, whole, "split at {split}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events(&bytes).0, whole);
    }

    #[test]
    fn an_oversized_event_is_skipped_and_the_next_one_read() {
        let big = vec![b'a'; MAX_EVENT + 10];
        let (seen, skipped) = events(&[b"data: ", &big, b"\n\n", b"event: ok\ndata: 1\n\n"]);
        assert_eq!(skipped, 1);
        assert_eq!(
            seen,
            vec![Event {
                name: "ok".into(),
                data: "1".into()
            }]
        );
    }
}
