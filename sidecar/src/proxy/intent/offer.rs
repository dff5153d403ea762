//! The four tools intent mode offers in `tools/list`, fixed for the life of the proxy: their
//! names, descriptions (what the model reads to use them) and input schemas.

use std::sync::{Arc, LazyLock};

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::matrix::Variant;

/// The search tool's name.
pub const RETRIEVE_TOOLS: &str = "retrieve_tools";

/// `retrieve_tools`' `limit` when absent, and its largest value.
pub const DEFAULT_LIMIT: usize = 20;
pub const MAX_LIMIT: usize = 100;

/// The values `intent.data_sensitivity` takes.
pub const SENSITIVITIES: [&str; 4] = ["public", "internal", "private", "unknown"];

/// The most bytes of `intent.reason` the schema asks for (longer reasons are clipped in the
/// audit record, not refused).
pub const MAX_REASON: usize = 1000;

const RETRIEVE_DESCRIPTION: &str = "Search the tools you can use in this task. Returns the tools \
whose name or description contains words of `query` (every tool when it is empty), best matches \
first, each with its description, inputSchema, annotations, risk and `call_with`: the tool to \
call it through (call_tool_read, call_tool_write or call_tool_destructive). The set of tools can \
grow or shrink while you work, without notice: when the tool you need is not there, search \
again later.";

fn call_description(variant: Variant) -> String {
    let (what, refused) = match variant {
        Variant::Read => (
            "that only reads (its call_with is call_tool_read)",
            "or if the tool's server marks it as writing or destructive",
        ),
        Variant::Write => (
            "that creates or changes something without destroying it (its call_with is \
             call_tool_write; a read-only tool may be called here too)",
            "or if the tool's server marks it destructive",
        ),
        Variant::Destructive => (
            "that may delete or overwrite (its call_with is call_tool_destructive); any tool \
             may be called here",
            "",
        ),
    };
    let op = variant.operation();
    let refused = if refused.is_empty() {
        String::new()
    } else {
        format!(", {refused}")
    };
    format!(
        "Call a tool found with retrieve_tools {what}. Give its `name` as retrieve_tools \
         returned it, its arguments in `args` (matching its inputSchema) and \
         intent.operation_type \"{op}\". Refused if intent.operation_type is not \"{op}\"{refused}."
    )
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

fn retrieve_schema() -> JsonObject {
    object(json!({
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "Words to look for in tool names and descriptions; empty or absent: every tool."
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "default": DEFAULT_LIMIT,
                "description": "The most tools to return."
            }
        },
        "additionalProperties": false
    }))
}

fn call_schema(variant: Variant) -> JsonObject {
    object(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "As retrieve_tools returned it."},
            "args": {"type": "object", "description": "The tool's arguments (its inputSchema)."},
            "intent": {
                "type": "object",
                "properties": {
                    "operation_type": {
                        "type": "string",
                        "enum": ["read", "write", "destructive"],
                        "description": format!("Must be \"{}\" for {}.", variant.operation(), variant.tool())
                    },
                    "data_sensitivity": {
                        "type": "string",
                        "enum": SENSITIVITIES,
                        "description": "How sensitive the data the call touches is."
                    },
                    "reason": {"type": "string", "maxLength": MAX_REASON, "description": "Why the call is made."}
                },
                "required": ["operation_type"],
                "additionalProperties": false
            }
        },
        "required": ["name", "intent"],
        "additionalProperties": false
    }))
}

/// The four tools, built once.
pub fn tools() -> Arc<Vec<Tool>> {
    static TOOLS: LazyLock<Arc<Vec<Tool>>> = LazyLock::new(|| {
        let mut tools = vec![
            Tool::new(RETRIEVE_TOOLS, RETRIEVE_DESCRIPTION, retrieve_schema())
                .with_title("Find tools")
                .with_annotations(ToolAnnotations::new().read_only(true)),
        ];
        for variant in Variant::ALL {
            let hints = match variant {
                Variant::Read => ToolAnnotations::new().read_only(true),
                Variant::Write => ToolAnnotations::new().read_only(false).destructive(false),
                Variant::Destructive => ToolAnnotations::new().read_only(false).destructive(true),
            };
            let title = match variant {
                Variant::Read => "Call a read-only tool",
                Variant::Write => "Call a tool that writes",
                Variant::Destructive => "Call a destructive tool",
            };
            tools.push(
                Tool::new(
                    variant.tool(),
                    call_description(variant),
                    call_schema(variant),
                )
                .with_title(title)
                .with_annotations(hints),
            );
        }
        Arc::new(tools)
    });
    TOOLS.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_tools_whose_annotations_say_what_each_variant_does() {
        let tools = tools();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "retrieve_tools",
                "call_tool_read",
                "call_tool_write",
                "call_tool_destructive"
            ]
        );
        let hints = |i: usize| {
            let a = tools[i].annotations.as_ref().expect("annotations");
            (a.read_only_hint, a.destructive_hint)
        };
        assert_eq!(hints(0), (Some(true), None));
        assert_eq!(hints(1), (Some(true), None));
        assert_eq!(hints(2), (Some(false), Some(false)));
        assert_eq!(hints(3), (Some(false), Some(true)));
        let write = &tools[2];
        assert_eq!(
            write.input_schema["properties"]["intent"]["properties"]["operation_type"]["description"],
            "Must be \"write\" for call_tool_write."
        );
        assert_eq!(write.input_schema["required"], json!(["name", "intent"]));
        let described = write.description.as_deref().unwrap_or_default();
        assert!(
            described.contains("intent.operation_type \"write\""),
            "{described}"
        );
        assert!(described.ends_with("if the tool's server marks it destructive."));
        let search = tools[0].description.as_deref().unwrap_or_default();
        assert!(search.contains("search again later"), "{search}");
    }
}
