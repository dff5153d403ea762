//! `add-context --budget FIELD=VALUE`: change a task's `spec.budget` while it runs, in the same
//! guarded write as its tools (the operator re-renders the proxy's config and the gateway takes
//! the new limits at once, the way it takes new tools).

use orchestrator_crds::gateway::parse_usd_nanos;
use serde_json::{Map, Value, json};

/// The fields of `spec.budget`.
pub const FIELDS: [&str; 5] = [
    "inputTokens",
    "outputTokens",
    "costUsd",
    "requests",
    "wallTimeSeconds",
];

/// One `--budget FIELD=VALUE`: a whole number of tokens or requests, USD as a decimal
/// (`costUsd=2.50`), or `none` (no limit on that field). `Value::Null` stands for `none`.
pub fn parse(text: &str) -> Result<(String, Value), String> {
    let fields = FIELDS.join(", ");
    let Some((field, value)) = text.split_once('=') else {
        return Err(format!(
            "{text:?}: expected FIELD=VALUE, FIELD one of {fields}"
        ));
    };
    let value = value.trim();
    if !FIELDS.contains(&field) {
        return Err(format!(
            "{text:?}: no budget field {field:?}; one of {fields}"
        ));
    }
    if value == "none" {
        return Ok((field.to_string(), Value::Null));
    }
    let parsed = if field == "costUsd" {
        parse_usd_nanos(value)
            .map(|_| json!(value))
            .ok_or_else(|| format!("{text:?}: costUsd is USD as a decimal (2.50), or none"))
    } else {
        value
            .parse::<u64>()
            .map(|n| json!(n))
            .map_err(|_| format!("{text:?}: {field} is a whole number, or none"))
    };
    parsed.map(|v| (field.to_string(), v))
}

/// `spec.budget` after `changes` (in order; a later one of the same field wins), from its raw
/// JSON as read (unknown fields kept). `Value::Null`: no budget left at all.
pub fn apply(current: Option<&Value>, changes: &[(String, Value)]) -> Value {
    let mut budget: Map<String, Value> = current
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (field, value) in changes {
        if value.is_null() {
            budget.remove(field);
        } else {
            budget.insert(field.clone(), value.clone());
        }
    }
    if budget.is_empty() {
        Value::Null
    } else {
        Value::Object(budget)
    }
}

/// One line for the report: `outputTokens 2000 → 50000, costUsd none → 5`.
pub fn describe(before: &Value, after: &Value) -> String {
    let get = |v: &Value, f: &str| match v.get(f) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "none".to_string(),
        Some(other) => other.to_string(),
    };
    let changed: Vec<String> = FIELDS
        .iter()
        .filter(|f| before.get(**f) != after.get(**f))
        .map(|f| format!("{f} {} → {}", get(before, f), get(after, f)))
        .collect();
    if changed.is_empty() {
        "unchanged".into()
    } else {
        changed.join(", ")
    }
}
