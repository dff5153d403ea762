//! A held call's params as a person judges them, pure: the `arguments` member first, laid out
//! one value a line, without changing a token (key order, numbers, string escapes stay as the
//! proxy forwards them: only the whitespace between tokens differs). The whole params text, every
//! byte, stays in the view beside it; the digest is checked over that text, never over this.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The params' top level, as far as the page needs it.
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// The `arguments` member of `params` (a `tools/call` params object), laid out by [`layout`];
/// `None` when `params` is not a JSON object with exactly one `arguments` member (the page then
/// shows the whole text first).
pub fn arguments(params: &str) -> Option<String> {
    let top: Top = serde_json::from_str(params).ok()?;
    top.arguments.map(|raw| layout(raw.get()))
}

/// Valid JSON text laid out two spaces an indent, one member or element a line, an empty
/// object or array kept on its line. Strings are copied as they are, escapes and all; every
/// other token too; whitespace outside strings is replaced.
pub fn layout(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 2);
    let mut depth = 0usize;
    let mut chars = json.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', depth * 2));
    };
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push('"');
                while let Some(s) = chars.next() {
                    out.push(s);
                    match s {
                        '\\' => out.extend(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while chars.peek().is_some_and(|n| is_json_space(*n)) {
                    chars.next();
                }
                out.push(c);
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if is_json_space(c) => {}
            c => out.push(c),
        }
    }
    out
}

/// JSON's insignificant whitespace (RFC 8259: space, tab, line feed, carriage return).
fn is_json_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens only: what must survive the layout.
    fn squeeze(s: &str) -> String {
        let mut out = String::new();
        let mut in_string = false;
        let mut escaped = false;
        for c in s.chars() {
            if in_string {
                out.push(c);
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_string = false;
                }
            } else if c == '"' {
                in_string = true;
                out.push(c);
            } else if !is_json_space(c) {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn the_arguments_come_out_whole_one_member_a_line() {
        let params = r#"{"_meta":{"progressToken":7,"claudecode/toolUseId":"toolu_01"},"name":"echo","arguments":{"message":"a \"quoted\" line\nand \u202e more","n":12345678901234567890123,"x":1.50e+3,"list":[1, {"k":[]},{}],"z":null}}"#;
        let shown = arguments(params).expect("arguments");
        assert_eq!(
            shown,
            "{\n  \"message\": \"a \\\"quoted\\\" line\\nand \\u202e more\",\n  \"n\": 12345678901234567890123,\n  \
             \"x\": 1.50e+3,\n  \"list\": [\n    1,\n    {\n      \"k\": []\n    },\n    {}\n  ],\n  \"z\": null\n}"
        );
        // Not a token changed: the raw member, squeezed, is the shown text, squeezed.
        let raw = r#"{"message":"a \"quoted\" line\nand \u202e more","n":12345678901234567890123,"x":1.50e+3,"list":[1,{"k":[]},{}],"z":null}"#;
        assert_eq!(squeeze(&shown), raw);
        // A value whose text holds JSON punctuation is a string: left as it is.
        assert_eq!(
            arguments(r#"{"arguments":{"s":"{[,:]}  x"}}"#).as_deref(),
            Some("{\n  \"s\": \"{[,:]}  x\"\n}")
        );
    }

    #[test]
    fn params_without_one_arguments_object_show_no_arguments() {
        assert_eq!(arguments(r#"{"name":"echo"}"#), None);
        assert_eq!(arguments("[1,2]"), None);
        assert_eq!(arguments("not json"), None);
        // Two `arguments`: which one would the server take? The whole text is shown instead.
        assert_eq!(
            arguments(r#"{"arguments":{"a":1},"arguments":{"a":2}}"#),
            None
        );
        assert_eq!(
            arguments(r#"{"arguments": "text", "name": "x"}"#).as_deref(),
            Some("\"text\"")
        );
        assert_eq!(arguments(r#"{"arguments":{ }}"#).as_deref(), Some("{}"));
    }
}
