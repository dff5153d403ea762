//! How much of one message a stdio upstream (or a zoned one) may make the proxy hold: its stdout
//! is read here, a line at a time, before rmcp parses it. A line whose bytes or
//! [`weight`](crate::memory::weight) is beyond [`memory::Bounds::result`] is not kept: the rest of
//! it is read and dropped, and when it answers a request of ours (its head names an `id` and no
//! `method`) that request is answered in its place with a JSON-RPC error naming the server, the
//! bound, its setting and the size seen (`PROXY.RESULT_TOO_LARGE`), so the call ends at once
//! instead of at its timeout. Anything else that large is dropped and logged.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

use super::stdio::Stdout;
use crate::{memory, names::ServerName};

/// Bytes of an oversized line kept to find its `id` in.
const HEAD: usize = 4096;
/// The pipe between the reader and rmcp.
const PIPE: usize = 64 * 1024;
/// A line buffer grown past this is given back after its line.
const KEEP: usize = 1024 * 1024;

/// `stdout`, with every line beyond `max` replaced as the module says.
pub fn bounded(stdout: Stdout, server: ServerName, max: usize) -> Stdout {
    let (near, far) = tokio::io::duplex(PIPE);
    tokio::spawn(pump(stdout, far, server, max));
    Box::new(near)
}

/// One line read: whole, or only its head and its length.
enum Line {
    Whole,
    Over { head: Vec<u8>, seen: usize },
    End,
}

async fn pump(stdout: Stdout, mut to: DuplexStream, server: ServerName, max: usize) {
    let mut read = BufReader::with_capacity(PIPE, stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        let what = read_line(&mut read, &mut line, max).await;
        let ended = matches!(what, Line::End);
        let out = match what {
            Line::End if line.is_empty() => return,
            Line::End | Line::Whole => {
                let weight = memory::weight(&line);
                if weight > max {
                    let head = line[..line.len().min(HEAD)].to_vec();
                    refusal(&server, &head, weight, max, "would take")
                } else {
                    Some(std::mem::take(&mut line))
                }
            }
            Line::Over { head, seen } => refusal(&server, &head, seen, max, "is"),
        };
        if let Some(out) = out {
            if to.write_all(&out).await.is_err() {
                return;
            }
            // Kept for the next line unless it grew large.
            if out.capacity() <= KEEP {
                line = out;
            }
        }
        if ended {
            return;
        }
    }
}

/// Reads up to a newline into `line`, keeping at most `max` bytes of it.
async fn read_line(read: &mut BufReader<Stdout>, line: &mut Vec<u8>, max: usize) -> Line {
    let mut over: Option<(Vec<u8>, usize)> = None;
    loop {
        let Ok(buf) = read.fill_buf().await else {
            return Line::End;
        };
        if buf.is_empty() {
            return match over {
                Some((head, seen)) => Line::Over { head, seen },
                None => Line::End,
            };
        }
        let newline = buf.iter().position(|b| *b == b'\n');
        let take = newline.map_or(buf.len(), |i| i + 1);
        match &mut over {
            Some((_, seen)) => *seen += take,
            None if line.len() + take > max => {
                let seen = line.len() + take;
                let mut head = line[..line.len().min(HEAD)].to_vec();
                let room = HEAD.saturating_sub(head.len()).min(take);
                head.extend_from_slice(&buf[..room]);
                *line = Vec::new();
                over = Some((head, seen));
            }
            None => line.extend_from_slice(&buf[..take]),
        }
        read.consume(take);
        if newline.is_some() {
            return match over {
                Some((head, seen)) => Line::Over { head, seen },
                None => Line::Whole,
            };
        }
    }
}

/// The line sent to rmcp in place of one too large: an error answering its request, or nothing
/// (logged) when it is not an answer.
fn refusal(
    server: &ServerName,
    head: &[u8],
    seen: usize,
    max: usize,
    verb: &str,
) -> Option<Vec<u8>> {
    let id = answered_id(head);
    tracing::warn!(server = %server, bytes = seen, max, answers = id.is_some(), "an upstream message beyond --max-result-bytes was dropped");
    let id = id?;
    let message = format!(
        "upstream server {server:?} sent an answer that {verb} {}, more than the proxy takes in \
         one message from an upstream ({}, --max-result-bytes); it was dropped",
        memory::human(seen),
        memory::human(max)
    );
    let error = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32603,
            "message": message,
            "data": {
                "code": "PROXY.RESULT_TOO_LARGE",
                "server": server.as_str(),
                "bound": "result",
                "setting": "--max-result-bytes",
                "max": max,
                "seen": seen,
            }
        }
    });
    let mut out = serde_json::to_vec(&error).ok()?;
    out.push(b'\n');
    Some(out)
}

/// The `id` of the JSON-RPC response `head` begins (a top-level `"id"` member, with no
/// `"method"` before it), if it names one within the head.
fn answered_id(head: &[u8]) -> Option<Value> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i + 1;
                let end = string_end(head, start)?;
                i = end + 1;
                if depth == 1 {
                    let key = &head[start..end];
                    let rest = &head[i..];
                    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
                    if rest[colon] == b':' {
                        let value = &rest[colon + 1..];
                        match key {
                            b"method" => return None,
                            b"id" => {
                                return serde_json::Deserializer::from_slice(value)
                                    .into_iter::<Value>()
                                    .next()?
                                    .ok()
                                    .filter(|v| v.is_number() || v.is_string());
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Where the string whose first byte is at `start` ends (its closing quote).
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut escaped = false;
    for (at, b) in text.iter().enumerate().skip(start) {
        match (escaped, *b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return Some(at),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_an_answer_is_found_in_its_head_and_requests_have_none() {
        let answer = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"xx"#;
        assert_eq!(answered_id(answer), Some(json!(7)));
        let named = br#"{"jsonrpc": "2.0", "result": {"id": 1}, "id" : "a\"b"}"#;
        assert_eq!(answered_id(named), Some(json!("a\"b")));
        let request = br#"{"jsonrpc":"2.0","method":"sampling/createMessage","id":3,"params":{"#;
        assert_eq!(answered_id(request), None);
        assert_eq!(
            answered_id(br#"{"jsonrpc":"2.0","result":{"text":"xxxx"#),
            None
        );
    }

    #[tokio::test]
    async fn a_line_beyond_the_bound_becomes_an_error_answering_its_request() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{{\"text\":\"{}\"}}}}\n",
            "x".repeat(300_000)
        );
        let small = "{\"jsonrpc\":\"2.0\",\"id\":6,\"result\":{}}\n";
        let notification = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{}\"}}}}\n",
            "y".repeat(300_000)
        );
        let nodes = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":[{}0]}}\n",
            "0,".repeat(20_000)
        );
        let input = format!("{big}{small}{notification}{nodes}{small}");
        let stdout: Stdout = Box::new(std::io::Cursor::new(input.into_bytes()));
        let mut out = bounded(stdout, ServerName::new("big"), 200_000);
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut out, &mut text)
            .await
            .expect("reads");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0]["id"], 5);
        assert_eq!(lines[0]["error"]["data"]["code"], "PROXY.RESULT_TOO_LARGE");
        assert_eq!(lines[0]["error"]["data"]["server"], "big");
        assert!(
            lines[0]["error"]["data"]["seen"]
                .as_u64()
                .is_some_and(|n| n > 300_000)
        );
        assert_eq!(lines[1]["id"], 6);
        // The notification is dropped; a short line of many values weighs too much.
        assert_eq!(lines[2]["id"], 8);
        assert!(
            lines[2]["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("would take")),
            "{}",
            lines[2]
        );
        assert_eq!(lines[3]["id"], 6);
    }
}
