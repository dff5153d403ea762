//! `add-context --conditions FILE`: replace a task's CEL conditions on calls
//! (`spec.toolConfig.policy.conditions`) while it runs, in the same guarded write as its tools:
//! the list is read and checked here as the operator checks it, and the write tests the list it
//! replaces.

use orchestrator_crds::condition::{self, CallCondition};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The conditions in `path` (`-`: stdin), a YAML or JSON list, each checked as the operator
/// checks it (every problem at once, by its place in the file).
pub fn read_conditions(path: &std::path::Path) -> Result<Vec<CallCondition>> {
    let shown = path.display();
    let text = match path.as_os_str() == "-" {
        true => std::io::read_to_string(std::io::stdin()),
        false => std::fs::read_to_string(path),
    }
    .map_err(|e| Error::Usage(format!("--conditions {shown}: {e}")))?;
    let list: Vec<CallCondition> = serde_saphyr::from_str(&text).map_err(|e| {
        Error::Usage(format!(
            "--conditions {shown}: not a list of conditions ({e}); each is {{name, when, tools?, \
             effect?, message?}}"
        ))
    })?;
    let problems = condition::problems(&list, "--conditions");
    if !problems.is_empty() {
        let lines: Vec<String> = problems
            .iter()
            .map(|(at, message)| format!("{at}: {message}"))
            .collect();
        return Err(Error::Usage(format!(
            "--conditions {shown}: nothing was changed:\n{}",
            lines.join("\n")
        )));
    }
    Ok(list)
}

/// Where the conditions are.
pub const CONDITIONS: &str = "/spec/toolConfig/policy/conditions";

/// The JSON Patch operations, after [`guarded_patch`]'s (which make `spec.toolConfig`), that
/// test the conditions are still `before` (missing tests as null) and write `after` (null:
/// remove them), making `spec.toolConfig.policy` when `read` has none.
pub fn conditions_ops(
    read: &Value,
    before: &Value,
    after: &Value,
) -> Vec<json_patch::PatchOperation> {
    let policy = read.pointer("/spec/toolConfig/policy");
    let mut ops = Vec::new();
    match policy {
        Some(p) if p.is_object() => {
            ops.push(json!({"op": "test", "path": CONDITIONS, "value": before}));
            match (before.is_null(), after.is_null()) {
                (_, false) => ops.push(json!({"op": "add", "path": CONDITIONS, "value": after})),
                (false, true) => ops.push(json!({"op": "remove", "path": CONDITIONS})),
                (true, true) => {}
            }
        }
        _ if after.is_null() => {}
        _ => {
            ops.push(
                json!({"op": "test", "path": "/spec/toolConfig/policy", "value": Value::Null}),
            );
            ops.push(json!({"op": "add", "path": "/spec/toolConfig/policy",
                "value": {"conditions": after}}));
        }
    }
    ops.into_iter()
        .filter_map(|op| serde_json::from_value(op).ok())
        .collect()
}

/// `before → after` by the conditions' names (`none` for no list), or `(unchanged)`.
pub fn describe(before: &Value, after: &Value) -> String {
    let names = |v: &Value| -> String {
        let names: Vec<&str> = v
            .as_array()
            .map(|l| l.iter().filter_map(|c| c["name"].as_str()).collect())
            .unwrap_or_default();
        match names.is_empty() {
            true => "none".into(),
            false => names.join(", "),
        }
    };
    let unchanged = if before == after { " (unchanged)" } else { "" };
    format!("{} → {}{unchanged}", names(before), names(after))
}
