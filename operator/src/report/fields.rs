//! The report the reducers fill ([`Report`]: every string clipped where it fits, the whole under
//! the kubelet's 4096 bytes) and what they read JSON output with.

use orchestrator_crds::taskrun::result::MESSAGE_BYTES;
use serde_json::{Map, Value};

/// The most bytes a short string (`subtype`, `sessionId`) takes in the report, escaped.
const SHORT_BYTES: usize = 256;
/// Room kept free under [`MESSAGE_BYTES`] (the awk reducers kept the same).
const SLACK: usize = 96;

/// What a reducer read: the report's fields (in order) and the final text.
#[derive(Debug, Default)]
pub struct Report {
    fields: Map<String, Value>,
    /// The runtime's final message (stdout and the report's `text`).
    pub text: Option<String>,
}

impl Report {
    /// A string field, clipped to [`SHORT_BYTES`] escaped.
    pub fn short(&mut self, key: &str, value: &str) {
        let (clipped, _) = clip_json(value, SHORT_BYTES);
        self.fields.insert(key.into(), Value::String(clipped));
    }
    /// A count.
    pub fn count(&mut self, key: &str, value: u64) {
        self.fields.insert(key.into(), Value::from(value));
    }
    /// A count, when there is one.
    pub fn maybe_count(&mut self, key: &str, value: Option<u64>) {
        if let Some(v) = value {
            self.count(key, v);
        }
    }
    pub fn flag(&mut self, key: &str, value: bool) {
        self.fields.insert(key.into(), Value::Bool(value));
    }
    /// A cost in US dollars: written as a JSON number, nine decimals at most.
    pub fn cost(&mut self, key: &str, usd: f64) {
        let text = format!("{usd:.9}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        if let Ok(n) = text.parse::<serde_json::Number>() {
            self.fields.insert(key.into(), Value::Number(n));
        }
    }
    /// `subtype` and `isError` from whether the run failed (its exit code or its own word).
    pub fn outcome(&mut self, failed: bool) {
        let subtype = if failed {
            "error_during_execution"
        } else {
            "success"
        };
        self.short("subtype", subtype);
        self.flag("isError", failed);
    }

    /// The termination message: the fields, then `text` clipped to what fits (with
    /// `textTruncated` when it was cut).
    pub fn message(mut self) -> String {
        if let Some(text) = self.text.take() {
            let used = Value::Object(self.fields.clone()).to_string().len();
            // `,"text":""` and `,"textTruncated":true`.
            let room = MESSAGE_BYTES.saturating_sub(used + SLACK + 32);
            let (clipped, cut) = clip_json(&text, room);
            self.fields.insert("text".into(), Value::String(clipped));
            if cut {
                self.fields
                    .insert("textTruncated".into(), Value::Bool(true));
            }
        }
        Value::Object(self.fields).to_string()
    }
}

/// `s` cut so that it takes at most `max` bytes as a JSON string's contents (serde_json's
/// escapes: two bytes for `"`, `\` and `\n`-style controls, six for other controls; other
/// characters as UTF-8), never inside a character; and whether it was cut.
pub fn clip_json(s: &str, max: usize) -> (String, bool) {
    let mut used = 0;
    for (at, c) in s.char_indices() {
        let width = match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if used + width > max {
            return (s[..at].to_string(), true);
        }
        used += width;
    }
    (s.to_string(), false)
}

/// One JSON object from `text`, or `None` for anything else. JavaScript runtimes may write a
/// lone surrogate escape (`\ud83d` of a string cut between the two halves of an emoji), which
/// serde_json refuses: such an escape reads as U+FFFD instead.
pub fn object(text: &str) -> Option<Map<String, Value>> {
    let text = text.trim();
    if !text.starts_with('{') {
        return None;
    }
    let parsed = match serde_json::from_str::<Value>(text) {
        Ok(v) => v,
        Err(_) if text.contains("\\u") => {
            serde_json::from_str::<Value>(&lone_surrogates_replaced(text)).ok()?
        }
        Err(_) => return None,
    };
    match parsed {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// `text` with each `\uD800`-`\uDFFF` escape that is not half of a pair written `\uFFFD`.
fn lone_surrogates_replaced(text: &str) -> String {
    let hex_at = |i: usize| -> Option<u32> {
        let digits = text.get(i..i + 4)?;
        u32::from_str_radix(digits, 16).ok()
    };
    let escape_at = |i: usize| -> Option<u32> {
        (text.get(i..i + 2) == Some("\\u"))
            .then(|| hex_at(i + 2))
            .flatten()
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(cp) = escape_at(i) else {
            i += 2; // `\\`, `\"` and the like: the next byte is escaped, whatever it is
            continue;
        };
        let high = (0xD800..0xDC00).contains(&cp);
        let paired = high && escape_at(i + 6).is_some_and(|lo| (0xDC00..0xE000).contains(&lo));
        if paired {
            i += 12;
        } else if (0xD800..0xE000).contains(&cp) {
            out.push_str(&text[rest..i]);
            out.push_str("\\uFFFD");
            i += 6;
            rest = i;
        } else {
            i += 6;
        }
    }
    out.push_str(&text[rest..]);
    out
}

/// A count: a whole number the runtime wrote as one (not a string, a fraction or a negative).
pub fn whole(v: Option<&Value>) -> Option<u64> {
    v?.as_u64().filter(|n| i64::try_from(*n).is_ok())
}

/// A cost: a non-negative finite number the runtime wrote as one.
pub fn usd(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64().filter(|f| f.is_finite() && *f >= 0.0),
        _ => None,
    }
}

/// The value at `path` (object keys) under `v`.
pub fn at<'a>(v: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(v.get(*first)?, |v, k| v.get(k))
}

/// The string at `path`.
pub fn string<'a>(v: &'a Map<String, Value>, path: &[&str]) -> Option<&'a str> {
    at(v, path)?.as_str()
}
