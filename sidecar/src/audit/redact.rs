//! Argument values kept out of text the proxy writes about a call (the audit record's `error`,
//! log lines) when the configuration keeps them out: an upstream's error message may echo its
//! arguments (`invalid token "ghp_..."`), and whatever the upstream says, the values it was sent
//! are replaced by `<redacted>`. Every string value of the arguments of [`MIN_LEN`] characters or
//! more is looked for as sent, as escaped inside a JSON string, and as escaped with every
//! non-ASCII character as `\uXXXX` (what Python's `json.dumps` writes by default); numbers,
//! booleans and keys are left (they name fields and amounts, and short strings would blank
//! common words).
//!
//! The work is bounded by the text, not by the arguments: a value longer than the text cannot
//! be in it, and when the values to look for exceed [`MAX_PATTERN_BYTES`] the text is replaced
//! whole.

use std::{borrow::Cow, fmt::Write};

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use serde_json::Value;

/// Shorter string values are not looked for.
pub const MIN_LEN: usize = 4;
/// The bytes of the values looked for at most; with more the text is replaced whole.
const MAX_PATTERN_BYTES: usize = 64 * 1024;
const REDACTED: &str = "<redacted>";

/// `text` with every argument value in it replaced by `<redacted>`.
pub fn without_values<'t>(
    text: &'t str,
    arguments: Option<&serde_json::Map<String, Value>>,
) -> Cow<'t, str> {
    let Some(arguments) = arguments else {
        return text.into();
    };
    let mut values: Vec<String> = Vec::new();
    let mut bytes = 0;
    let mut stack: Vec<&Value> = arguments.values().collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.chars().count() >= MIN_LEN => {
                for form in forms(s) {
                    // A value longer than the text is not in it.
                    if form.len() <= text.len() && !values.contains(&form) {
                        bytes += form.len();
                        values.push(form);
                    }
                }
                if bytes > MAX_PATTERN_BYTES {
                    return format!("{REDACTED} (the message may quote the call's arguments, too many to look for)").into();
                }
            }
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    if values.is_empty() {
        return text.into();
    }
    // A contiguous NFA: memory linear in the values (a DFA could take gigabytes), the search
    // linear in the text. The longest value wins where values overlap.
    let Ok(finder) = AhoCorasick::builder()
        .kind(Some(AhoCorasickKind::ContiguousNFA))
        .match_kind(MatchKind::LeftmostLongest)
        .build(&values)
    else {
        return REDACTED.into();
    };
    if !finder.is_match(text) {
        return text.into();
    }
    finder
        .replace_all(text, &vec![REDACTED; values.len()])
        .into()
}

/// A value as sent, as escaped in a JSON string, and as escaped in ASCII-only JSON (also what
/// `approval::mask` looks for).
pub(crate) fn forms(s: &str) -> Vec<String> {
    let mut out = vec![s.to_string()];
    if let Ok(quoted) = serde_json::to_string(s) {
        out.push(quoted[1..quoted.len() - 1].to_string());
    }
    let ascii = out.last().map(|escaped| ascii_escaped(escaped));
    out.extend(ascii);
    out.dedup();
    out
}

/// `escaped` (already JSON-escaped) with every non-ASCII character as `\uXXXX` (UTF-16).
fn ascii_escaped(escaped: &str) -> String {
    let mut out = String::with_capacity(escaped.len());
    for c in escaped.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> serde_json::Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn values_echoed_by_an_upstream_are_redacted_as_sent_and_json_escaped() {
        let a = args(serde_json::json!({
            "token": "ghp_0123456789abcdef",
            "nested": {"list": ["s3cr\"et-value"]},
            "n": 12345,
            "id": "ab"
        }));
        let text = r#"bad request {"token":"ghp_0123456789abcdef","nested":{"list":["s3cr\"et-value"]},"n":12345,"id":"ab"}"#;
        let out = without_values(text, Some(&a));
        assert!(!out.contains("ghp_0123456789abcdef"), "{out}");
        assert!(!out.contains("s3cr"), "{out}");
        assert!(out.contains("<redacted>"), "{out}");
        assert!(
            out.contains("12345") && out.contains("\"ab\""),
            "numbers and short values stay: {out}"
        );
        let plain = without_values("invalid token ghp_0123456789abcdef.", Some(&a));
        assert_eq!(plain, "invalid token <redacted>.");
    }

    #[test]
    fn values_escaped_as_python_writes_json_are_redacted_too() {
        let a = args(serde_json::json!({"password": "pässwörd-ünïcode"}));
        // json.dumps({"password": "pässwörd-ünïcode"})
        let text = r#"rejected {"password": "p\u00e4ssw\u00f6rd-\u00fcn\u00efcode"}"#;
        assert_eq!(
            without_values(text, Some(&a)),
            r#"rejected {"password": "<redacted>"}"#
        );
    }

    #[test]
    fn text_without_values_is_returned_as_is() {
        let a = args(serde_json::json!({"path": "/etc/passwd"}));
        assert!(matches!(
            without_values("not found", Some(&a)),
            Cow::Borrowed("not found")
        ));
        assert!(matches!(without_values("x", None), Cow::Borrowed("x")));
    }

    #[test]
    fn huge_arguments_cost_what_the_text_costs() {
        // A 4 MiB value of every byte: longer than the text, so never looked for.
        let huge: String = (0..4 * 1024 * 1024)
            .map(|i| char::from(b'!' + (i % 90) as u8))
            .collect();
        let a = args(serde_json::json!({"blob": huge, "token": "ghp_abcdef"}));
        assert_eq!(
            without_values("unknown tool, token ghp_abcdef", Some(&a)),
            "unknown tool, token <redacted>"
        );
        // Many values that fit the text: the text is replaced whole.
        let text = "x".repeat(1000);
        let many: Vec<String> = (0..200).map(|i| format!("{i:0>500}")).collect();
        let a = args(serde_json::json!({ "many": many }));
        assert!(without_values(&text, Some(&a)).starts_with("<redacted> (the message"));
    }
}
