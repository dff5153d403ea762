//! Hashes over canonical JSON: tool definition pins and approval digests (`sha256:` and 64
//! lowercase hex digits of the SHA-256 of the RFC 8785 canonical JSON).

use serde::Serialize;

/// The prefix of a tool definition hash: `sha256:` and 64 lowercase hex digits.
pub const PIN_PREFIX: &str = "sha256:";

/// `sha256:` and the first 12 hex digits of a definition hash: enough to tell definitions apart
/// in a message or a table.
pub fn short_pin(hash: &str) -> &str {
    hash.get(..PIN_PREFIX.len() + 12).unwrap_or(hash)
}

/// Whether `pin` is a well-formed definition hash (`sha256:` + 64 lowercase hex digits).
pub fn is_pin(pin: &str) -> bool {
    pin.strip_prefix(PIN_PREFIX).is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The hash of a tool's definition: [`sha256_jcs`] of the tool as `tools/list` gives it, every
/// field included (name, title, description, inputSchema, outputSchema, annotations, icons,
/// `_meta`), so a change to any of them is a changed definition. What `pins`, the catalog's `pin`
/// and `catalog pin` hold. `tool` is the MCP `Tool` object (the proxy and the CLI pass rmcp's
/// `Tool`, the catalog its stored `definition`; both serialise to the same JSON).
pub fn definition_hash(tool: &impl Serialize) -> String {
    sha256_jcs(tool)
}

/// `sha256:` and the SHA-256 of the RFC 8785 (JCS) canonical JSON of `value`: the same for the
/// same value whatever its key order, different when any part changes. Tool pins
/// ([`definition_hash`]) and approval digests (`approval::CallDigest`) are made with it.
pub fn sha256_jcs(value: &impl Serialize) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    if let Err(e) = serde_json_canonicalizer::to_writer(value, &mut hasher) {
        // Only a non-finite number could fail, which JSON cannot carry: hash its message
        // so the value stays a hash and still differs from any good value.
        hasher.update(e.to_string().as_bytes());
    }
    let digest = hasher.finalize();
    let mut out = String::with_capacity(PIN_PREFIX.len() + 64);
    out.push_str(PIN_PREFIX);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_sha256_and_64_lowercase_hex_digits() {
        let good = format!("sha256:{}", "0a".repeat(32));
        assert!(is_pin(&good));
        assert!(!is_pin(&good.to_uppercase()));
        assert!(!is_pin(&good[..good.len() - 1]));
        assert!(!is_pin(&format!("sha1:{}", "0a".repeat(32))));
    }

    #[test]
    fn a_definition_hash_ignores_key_order_and_sees_every_part() {
        let base_tool = serde_json::json!({
            "name": "read",
            "title": "Read",
            "description": "Reads.",
            "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {}}},
            "outputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": true},
            "_meta": {"x": 1},
        });
        let base = definition_hash(&base_tool);
        assert!(is_pin(&base), "{base}");
        let reordered: serde_json::Value = serde_json::from_str(
            r#"{"_meta":{"x":1},"annotations":{"readOnlyHint":true},"outputSchema":{"type":"object"},
               "inputSchema":{"properties":{"b":{},"a":{"type":"string"}},"type":"object"},
               "description":"Reads.","title":"Read","name":"read"}"#,
        )
        .expect("json");
        assert_eq!(base, definition_hash(&reordered));
        let mut seen = std::collections::BTreeSet::from([base]);
        for (field, value) in [
            ("name", serde_json::json!("read2")),
            ("title", serde_json::json!("Read!")),
            ("description", serde_json::json!("Reads!")),
            ("inputSchema", serde_json::json!({"type": "object"})),
            ("outputSchema", serde_json::json!({"type": "string"})),
            ("annotations", serde_json::json!({"readOnlyHint": false})),
            ("_meta", serde_json::json!({"x": 2})),
            (
                "icons",
                serde_json::json!([{"src": "https://example.invalid/i.png"}]),
            ),
        ] {
            let mut changed = base_tool.clone();
            changed[field] = value;
            assert!(
                seen.insert(definition_hash(&changed)),
                "{field} is not hashed"
            );
        }
        let mut without_title = base_tool.clone();
        if let Some(o) = without_title.as_object_mut() {
            o.remove("title");
        }
        assert!(seen.insert(definition_hash(&without_title)));
    }
}
