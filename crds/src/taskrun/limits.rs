//! Upper bounds on what a TaskRun's spec may hold, so that one tenant cannot make the operator
//! (which caches every TaskRun and renders each into a ConfigMap and a Job) hold or render
//! unbounded text. The spec's own fields declare theirs where they are defined
//! (`#[schemars(length(...))]`, with the numbers below); the Kubernetes types embedded in the spec
//! (env, resources, affinity, tolerations, pull secrets) and the tool policy get theirs here, from
//! schema transforms that bound every string, list and map without a bound of its own, and CEL
//! rules for map keys (a structural schema cannot bound them otherwise). Every rule's cost is
//! bounded by the list or map bound it runs over, so the API server's CEL budget holds.
//! docs/api.md lists the numbers.

use schemars::Schema;
use serde_json::{Map, Value, json};

/// Characters of an inline task text (`spec.task.prompt`); a longer one goes by reference
/// (`configMapKeyRef`, `secretKeyRef`), which the operator does not cache.
pub const PROMPT_CHARS: usize = 262_144;
/// Characters of one item of the agent's `command` (an inline script fits: `bash -c "..."`).
pub const COMMAND_ITEM_CHARS: usize = 32_768;
/// Characters of one item of the agent's `args`.
pub const ARG_CHARS: usize = 32_768;
/// Characters of an env var's `value` (`spec.agent.env[].value`).
pub const ENV_VALUE_CHARS: u64 = 8_192;
/// Characters of any other string of an env var (its name, the names and keys it refers to).
pub const ENV_OTHER_CHARS: u64 = 512;
/// Characters of a qualified name with a prefix (a label key, a resource name, a taint key):
/// a 253-character DNS subdomain, `/` and a 63-character name.
pub const QUALIFIED_NAME_CHARS: u64 = 317;
/// Characters of a label value.
pub const LABEL_VALUE_CHARS: u64 = 63;
/// Characters of an object's name (a DNS-1123 subdomain).
pub const NAME_CHARS: u64 = 253;
/// Characters of a quantity (`500m`, `1Gi`) and of a resource claim's names.
pub const QUANTITY_CHARS: u64 = 64;
/// Entries of a container's `limits` or `requests`, and resource claims.
pub const RESOURCES: u64 = 16;
/// Items of every list of the pod's affinity (terms, expressions, values, namespaces, keys).
pub const AFFINITY_ITEMS: u64 = 32;
/// Entries of a label map in the pod's affinity (`matchLabels`).
pub const AFFINITY_LABELS: u64 = 64;
/// Characters of a tool name or pattern in `spec.toolConfig` (a key of `risk` or of
/// `rateLimit.tools`, an item of `policy.requireApproval.tools`).
pub const TOOL_CHARS: u64 = 256;
/// Items of a list, and entries of a map, of the tool policy that have no bound of their own.
pub const POLICY_ITEMS: u64 = 128;

/// What [`bound`] sets where a schema has none.
#[derive(Clone, Copy)]
struct Bounds {
    chars: u64,
    /// `None`: lists and maps are bounded where they are declared.
    items: Option<u64>,
    entries: Option<u64>,
}

/// Sets `maxLength` on every string (and int-or-string), `maxItems` on every list and
/// `maxProperties` on every map of `schema` that has none; an enum needs none.
fn bound(schema: &mut Schema, b: Bounds) {
    if let Some(obj) = schema.as_object_mut() {
        bound_object(obj, b);
    }
}

fn bound_value(schema: &mut Value, b: Bounds) {
    if let Some(obj) = schema.as_object_mut() {
        bound_object(obj, b);
    }
}

fn bound_object(obj: &mut Map<String, Value>, b: Bounds) {
    let type_ = obj.get("type").and_then(Value::as_str).map(str::to_string);
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if (type_.as_deref() == Some("string") || int_or_string) && !obj.contains_key("enum") {
        obj.entry("maxLength").or_insert(json!(b.chars));
    }
    if let Some(items) = b.items.filter(|_| type_.as_deref() == Some("array")) {
        obj.entry("maxItems").or_insert(json!(items));
    }
    let map = obj
        .get("additionalProperties")
        .is_some_and(Value::is_object);
    if let Some(entries) = b.entries.filter(|_| map) {
        obj.entry("maxProperties").or_insert(json!(entries));
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = obj.get_mut(key) {
            bound_value(sub, b);
        }
    }
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for sub in props.values_mut() {
            bound_value(sub, b);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(subs)) = obj.get_mut(key) {
            for sub in subs {
                bound_value(sub, b);
            }
        }
    }
}

/// Adds a CEL rule to `schema` (after any it has).
fn add_rule(schema: &mut Map<String, Value>, rule: String, message: String) {
    let rules = schema
        .entry("x-kubernetes-validations")
        .or_insert_with(|| json!([]));
    if let Value::Array(rules) = rules {
        rules.push(json!({"rule": rule, "message": message}));
    }
}

/// A rule on a map that its keys are at most `chars` long.
fn keys_at_most(schema: &mut Map<String, Value>, chars: u64, what: &str) {
    add_rule(
        schema,
        format!("self.all(k, size(k) <= {chars})"),
        format!("{what} must be at most {chars} characters"),
    );
}

/// `spec.agent.env`: values up to [`ENV_VALUE_CHARS`], every other string up to
/// [`ENV_OTHER_CHARS`].
pub fn env(schema: &mut Schema) {
    if let Some(value) = schema
        .pointer_mut("/items/properties/value")
        .and_then(Value::as_object_mut)
    {
        value.insert("maxLength".into(), json!(ENV_VALUE_CHARS));
    }
    bound(
        schema,
        Bounds {
            chars: ENV_OTHER_CHARS,
            items: None,
            entries: None,
        },
    );
}

/// A container's `resources`: [`RESOURCES`] limits, requests and claims, quantities and claim
/// names up to [`QUANTITY_CHARS`], resource names up to [`QUALIFIED_NAME_CHARS`].
pub fn resources(schema: &mut Schema) {
    bound(
        schema,
        Bounds {
            chars: QUANTITY_CHARS,
            items: Some(RESOURCES),
            entries: Some(RESOURCES),
        },
    );
    for key in ["limits", "requests"] {
        if let Some(map) = schema
            .pointer_mut(&format!("/properties/{key}"))
            .and_then(Value::as_object_mut)
        {
            keys_at_most(map, QUALIFIED_NAME_CHARS, "resource names");
        }
    }
}

/// A map of labels (`spec.podTemplate.nodeSelector`): keys up to [`QUALIFIED_NAME_CHARS`],
/// values up to [`LABEL_VALUE_CHARS`] (its number of entries is declared on the field).
pub fn labels(schema: &mut Schema) {
    if let Some(map) = schema.as_object_mut() {
        if let Some(Value::Object(values)) = map.get_mut("additionalProperties") {
            values.insert("maxLength".into(), json!(LABEL_VALUE_CHARS));
        }
        keys_at_most(map, QUALIFIED_NAME_CHARS, "label keys");
    }
}

/// `spec.podTemplate.affinity`: [`AFFINITY_ITEMS`] per list, [`AFFINITY_LABELS`] per label map,
/// strings (label keys and values, topology keys, namespaces) up to [`QUALIFIED_NAME_CHARS`].
pub fn affinity(schema: &mut Schema) {
    bound(
        schema,
        Bounds {
            chars: QUALIFIED_NAME_CHARS,
            items: Some(AFFINITY_ITEMS),
            entries: Some(AFFINITY_LABELS),
        },
    );
}

/// `spec.podTemplate.tolerations`: keys, values, operators and effects up to
/// [`QUALIFIED_NAME_CHARS`] (the list's bound is declared on the field).
pub fn tolerations(schema: &mut Schema) {
    bound(
        schema,
        Bounds {
            chars: QUALIFIED_NAME_CHARS,
            items: None,
            entries: None,
        },
    );
}

/// Lists of object references (`spec.podTemplate.imagePullSecrets`): names up to [`NAME_CHARS`].
pub fn names(schema: &mut Schema) {
    bound(
        schema,
        Bounds {
            chars: NAME_CHARS,
            items: None,
            entries: None,
        },
    );
}

/// `spec.toolConfig.policy`: tool patterns up to [`TOOL_CHARS`], lists and maps up to
/// [`POLICY_ITEMS`], wherever the policy's own types set none.
pub fn policy(schema: &mut Schema) {
    bound(
        schema,
        Bounds {
            chars: TOOL_CHARS,
            items: Some(POLICY_ITEMS),
            entries: Some(POLICY_ITEMS),
        },
    );
}

/// A server's `rateLimit`: tool names (the keys of `tools`) up to [`TOOL_CHARS`].
pub fn rate_limits(schema: &mut Schema) {
    policy(schema);
    if let Some(tools) = schema
        .pointer_mut("/properties/tools")
        .and_then(Value::as_object_mut)
    {
        keys_at_most(tools, TOOL_CHARS, "tool names");
    }
}

/// A server's `risk`: tool names (its keys) up to [`TOOL_CHARS`].
pub fn risk(schema: &mut Schema) {
    if let Some(map) = schema.as_object_mut() {
        keys_at_most(map, TOOL_CHARS, "tool names");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_sets_what_is_missing_and_keeps_what_is_there() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "free": {"type": "string"},
                "kept": {"type": "string", "maxLength": 5},
                "choice": {"type": "string", "enum": ["a", "b"]},
                "list": {"type": "array", "items": {"type": "string"}},
                "map": {"type": "object", "additionalProperties": {"type": "string"}},
                "quantity": {"x-kubernetes-int-or-string": true},
                "maybe": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
            }
        });
        let b = Bounds {
            chars: 10,
            items: Some(3),
            entries: Some(4),
        };
        bound_value(&mut schema, b);
        let p = &schema["properties"];
        assert_eq!(p["free"]["maxLength"], 10);
        assert_eq!(p["kept"]["maxLength"], 5);
        assert!(p["choice"].get("maxLength").is_none());
        assert_eq!(p["list"]["maxItems"], 3);
        assert_eq!(p["list"]["items"]["maxLength"], 10);
        assert_eq!(p["map"]["maxProperties"], 4);
        assert_eq!(p["map"]["additionalProperties"]["maxLength"], 10);
        assert_eq!(p["quantity"]["maxLength"], 10);
        assert_eq!(p["maybe"]["anyOf"][0]["maxLength"], 10);
        assert!(p["maybe"]["anyOf"][1].get("maxLength").is_none());
    }
}
