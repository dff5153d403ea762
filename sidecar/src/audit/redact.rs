//! Argument values kept out of text the proxy writes about a call (the audit record's `error`,
//! log lines) when the configuration keeps them out: an upstream's error message may echo its
//! arguments (`invalid token "ghp_..."`), and whatever the upstream says, the values it was sent
//! are replaced by `<redacted>`. Every string value of the arguments of [`MIN_LEN`] characters or
//! more is looked for, as sent and as escaped inside a JSON string; numbers, booleans and keys
//! are left (they name fields and amounts, and short strings would blank common words).

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

/// Shorter string values are not looked for.
pub const MIN_LEN: usize = 4;
/// Distinct values looked for at most (the longest first); a call with more has the text
/// replaced whole.
const MAX_VALUES: usize = 4096;
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
    let mut stack: Vec<&Value> = arguments.values().collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.chars().count() >= MIN_LEN => {
                values.push(s.clone());
                // As it reads inside a JSON string (quotes, backslashes, control characters).
                if let Ok(quoted) = serde_json::to_string(s) {
                    let escaped = &quoted[1..quoted.len() - 1];
                    if escaped != s {
                        values.push(escaped.to_string());
                    }
                }
            }
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
        if values.len() > MAX_VALUES {
            return format!("{REDACTED} (the message may quote the call's arguments, which are too many to look for)").into();
        }
    }
    if values.is_empty() {
        return text.into();
    }
    // The longest value wins where values overlap.
    let Ok(finder) = AhoCorasick::builder()
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
    fn text_without_values_is_returned_as_is() {
        let a = args(serde_json::json!({"path": "/etc/passwd"}));
        assert!(matches!(
            without_values("not found", Some(&a)),
            Cow::Borrowed("not found")
        ));
        assert!(matches!(without_values("x", None), Cow::Borrowed("x")));
    }
}
