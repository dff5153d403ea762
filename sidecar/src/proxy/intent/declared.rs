//! The arguments of a `call_tool_*` call, read strictly: the tool's `name`, its `args`, and the
//! declared `intent`. Every problem is named with its field and the fix, all at once.

use rmcp::model::JsonObject;
use serde_json::Value;

use super::{
    matrix::Variant,
    offer::{MAX_REASON, SENSITIVITIES},
};
use crate::{
    audit,
    names::{clip, clip_to},
};

/// What the agent declared with a call, as given (strings only), kept for the audit record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    /// The `call_tool_*` it came through.
    pub variant: Variant,
    pub operation_type: Option<String>,
    pub data_sensitivity: Option<String>,
    pub reason: Option<String>,
}

impl Declared {
    /// The audit record's `intent`, each field clipped.
    pub fn audit(&self) -> audit::Intent<'_> {
        audit::Intent {
            variant: self.variant.tool(),
            operation_type: self.operation_type.as_deref().map(clip),
            data_sensitivity: self.data_sensitivity.as_deref().map(clip),
            reason: self.reason.as_deref().map(|r| clip_to(r, MAX_REASON)),
        }
    }
}

/// A `call_tool_*` call's arguments, read.
#[derive(Debug)]
pub struct Call {
    /// The tool to call (`None`: missing, a problem).
    pub name: Option<String>,
    /// The tool's arguments (`None`: absent, as a direct call without arguments).
    pub args: Option<JsonObject>,
    pub declared: Declared,
    /// `intent.operation_type` when it is one of the three (`None`: missing or not one).
    pub operation: Option<Variant>,
    /// What is wrong, each naming its field and the fix.
    pub problems: Vec<String>,
}

/// How a JSON value is named in a message.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads a `call_tool_*` call's arguments.
pub fn parse(variant: Variant, arguments: Option<&JsonObject>) -> Call {
    let mut call = Call {
        name: None,
        args: None,
        declared: Declared {
            variant,
            operation_type: None,
            data_sensitivity: None,
            reason: None,
        },
        operation: None,
        problems: Vec::new(),
    };
    let empty = JsonObject::new();
    let arguments = arguments.unwrap_or(&empty);
    for (key, value) in arguments {
        match key.as_str() {
            "name" => call.name(value),
            "args" => call.args(value),
            "intent" => call.intent(value),
            other => call.problems.push(unknown_field(variant, other)),
        }
    }
    if call.name.is_none() && !arguments.contains_key("name") {
        call.problems
            .push("name is required: the tool's name, as retrieve_tools returned it".into());
    }
    call
}

fn unknown_field(variant: Variant, key: &str) -> String {
    let key = clip(key);
    match &*key {
        "arguments" | "args_json" | "input" | "parameters" | "params" => {
            format!("unknown field {key:?}: the tool's arguments go in \"args\"")
        }
        "tool" | "tool_name" => format!("unknown field {key:?}: the tool's name goes in \"name\""),
        "operation_type" | "data_sensitivity" | "reason" => {
            format!("unknown field {key:?}: it goes inside \"intent\"")
        }
        _ => format!("unknown field {key:?}: {variant} takes name, args and intent"),
    }
}

impl Call {
    fn name(&mut self, value: &Value) {
        match value {
            Value::String(name) if !name.is_empty() => self.name = Some(name.clone()),
            Value::String(_) | Value::Null => self
                .problems
                .push("name is required: the tool's name, as retrieve_tools returned it".into()),
            other => self.problems.push(format!(
                "name must be a string (the tool's name, as retrieve_tools returned it), not {}",
                kind(other)
            )),
        }
    }

    fn args(&mut self, value: &Value) {
        match value {
            Value::Object(args) => self.args = Some(args.clone()),
            Value::Null => {}
            Value::String(text)
                if serde_json::from_str::<JsonObject>(text).is_ok() =>
            {
                self.problems.push(
                    "args must be an object of the tool's arguments, not a string: pass the object itself, not its JSON text".into(),
                )
            }
            other => self.problems.push(format!(
                "args must be an object of the tool's arguments (matching its inputSchema), not {}",
                kind(other)
            )),
        }
    }

    fn intent(&mut self, value: &Value) {
        let op = self.declared.variant.operation();
        let intent = match value {
            Value::Object(intent) => intent,
            Value::Null => return,
            other => {
                if let Value::String(text) = other {
                    self.declared.operation_type = Some(text.clone());
                }
                self.problems.push(format!(
                    "intent must be an object, e.g. {{\"operation_type\": \"{op}\"}}, not {}",
                    kind(other)
                ));
                return;
            }
        };
        for (key, value) in intent {
            match (key.as_str(), value) {
                (_, Value::Null) => {}
                ("operation_type", Value::String(text)) => {
                    self.declared.operation_type = Some(text.clone());
                    self.operation = Variant::of_operation(text);
                    if self.operation.is_none() {
                        self.problems.push(format!(
                            "intent.operation_type must be \"read\", \"write\" or \"destructive\" (\"{op}\" for {}), not {:?}",
                            self.declared.variant,
                            clip(text)
                        ));
                    }
                }
                ("data_sensitivity", Value::String(text)) => {
                    self.declared.data_sensitivity = Some(text.clone());
                    if !SENSITIVITIES.contains(&text.as_str()) {
                        self.problems.push(format!(
                            "intent.data_sensitivity must be \"public\", \"internal\", \"private\" or \"unknown\", not {:?}",
                            clip(text)
                        ));
                    }
                }
                ("reason", Value::String(text)) => self.declared.reason = Some(text.clone()),
                (field @ ("operation_type" | "data_sensitivity" | "reason"), other) => {
                    self.problems.push(format!(
                        "intent.{field} must be a string, not {}",
                        kind(other)
                    ))
                }
                (other, _) => self.problems.push(format!(
                    "unknown field \"intent.{}\": intent takes operation_type, data_sensitivity and reason",
                    clip(other)
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(value: Value) -> Call {
        let Value::Object(map) = value else {
            panic!("not an object")
        };
        parse(Variant::Read, Some(&map))
    }

    #[test]
    fn a_well_formed_call_is_read_whole() {
        let call = read(json!({
            "name": "fs__read_text_file",
            "args": {"path": "/w/a.txt"},
            "intent": {"operation_type": "read", "data_sensitivity": "internal", "reason": "look"}
        }));
        assert!(call.problems.is_empty(), "{:?}", call.problems);
        assert_eq!(call.name.as_deref(), Some("fs__read_text_file"));
        assert_eq!(call.args, json!({"path": "/w/a.txt"}).as_object().cloned());
        assert_eq!(call.operation, Some(Variant::Read));
        assert_eq!(call.declared.data_sensitivity.as_deref(), Some("internal"));
        let audit = call.declared.audit();
        assert_eq!(
            serde_json::to_value(&audit).expect("json"),
            json!({"variant": "call_tool_read", "operation_type": "read", "data_sensitivity": "internal", "reason": "look"})
        );
    }

    #[test]
    fn a_missing_intent_leaves_the_operation_unset_and_args_optional() {
        let call = read(json!({"name": "x__y"}));
        assert!(call.problems.is_empty(), "{:?}", call.problems);
        assert_eq!((call.operation, call.args), (None, None));
        assert!(call.declared.operation_type.is_none());
        let call = read(json!({"name": "x__y", "intent": {}}));
        assert_eq!(call.operation, None);
    }

    #[test]
    fn every_problem_is_named_with_its_field_and_fix() {
        let call = read(json!({
            "arguments": {"path": "x"},
            "intent": {"operation_type": "delete", "data_sensitivity": "secret", "reason": 5, "why": "x"}
        }));
        assert_eq!(
            call.problems,
            [
                "unknown field \"arguments\": the tool's arguments go in \"args\"",
                // Keys in order (serde_json's map is sorted).
                "intent.data_sensitivity must be \"public\", \"internal\", \"private\" or \"unknown\", not \"secret\"",
                "intent.operation_type must be \"read\", \"write\" or \"destructive\" (\"read\" for call_tool_read), not \"delete\"",
                "intent.reason must be a string, not a number",
                "unknown field \"intent.why\": intent takes operation_type, data_sensitivity and reason",
                "name is required: the tool's name, as retrieve_tools returned it",
            ]
        );
        assert_eq!(call.declared.operation_type.as_deref(), Some("delete"));
        let call = read(json!({"name": 3, "args": "{\"a\": 1}", "intent": "read"}));
        assert_eq!(
            call.problems,
            [
                "args must be an object of the tool's arguments, not a string: pass the object itself, not its JSON text",
                "intent must be an object, e.g. {\"operation_type\": \"read\"}, not a string",
                "name must be a string (the tool's name, as retrieve_tools returned it), not a number",
            ]
        );
    }

    #[test]
    fn a_long_reason_is_clipped_in_the_audit_record() {
        let call = read(
            json!({"name": "a__b", "intent": {"operation_type": "read", "reason": "x".repeat(5000)}}),
        );
        assert!(call.problems.is_empty());
        let audit = call.declared.audit();
        let reason = audit.reason.expect("reason");
        assert!(reason.starts_with(&"x".repeat(MAX_REASON)));
        assert!(reason.ends_with("…(+4000 bytes)"), "{reason}");
    }
}
