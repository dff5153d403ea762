//! Argument validation: a call's arguments are checked against the tool's `inputSchema` before
//! they leave the pod. Each schema is compiled once per definition hash and kept (bounded); a
//! schema that does not compile (a remote `$ref`, a bad regex) is not enforced and said so once.

use std::{collections::HashMap, sync::Arc};

use rmcp::model::JsonObject;
use serde_json::Value;

use super::definitions::DefinitionHash;
use crate::sync::lock;

/// Compiled schemas kept at most; past it the cache starts over (a task has far fewer tools).
const MAX_COMPILED: usize = 1024;
/// Problems named in one error at most.
const MAX_PROBLEMS: usize = 5;

enum Compiled {
    Enforced(jsonschema::Validator),
    /// The schema could not be compiled: calls pass unchecked.
    Unusable,
}

/// Compiled input schemas by definition hash.
#[derive(Default)]
pub struct Validators {
    compiled: std::sync::Mutex<HashMap<DefinitionHash, Arc<Compiled>>>,
}

impl Validators {
    /// Checks `arguments` (absent: `{}`) against `schema`, compiled once per `definition`.
    /// `Err` lists what is wrong, each naming the field (`arguments.path: ...`).
    pub fn check(
        &self,
        definition: &DefinitionHash,
        schema: &JsonObject,
        arguments: Option<&JsonObject>,
    ) -> Result<(), Vec<String>> {
        let compiled = self.compiled(definition, schema);
        let Compiled::Enforced(validator) = &*compiled else {
            return Ok(());
        };
        let instance = match arguments {
            Some(args) => Value::Object(args.clone()),
            None => Value::Object(Default::default()),
        };
        let problems: Vec<String> = validator
            .iter_errors(&instance)
            .take(MAX_PROBLEMS)
            .map(|error| {
                let field = error.instance_path().to_string().replace('/', ".");
                // Masked: the message names the field and the rule, not the value (which the
                // audit log records only when asked to).
                format!("arguments{field}: {}", error.masked())
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    fn compiled(&self, definition: &DefinitionHash, schema: &JsonObject) -> Arc<Compiled> {
        if let Some(c) = lock(&self.compiled).get(definition) {
            return c.clone();
        }
        let compiled = match jsonschema::validator_for(&Value::Object(schema.clone())) {
            Ok(v) => Compiled::Enforced(v),
            Err(e) => {
                tracing::warn!(definition = %definition, error = %e.masked(), "a tool's inputSchema does not compile; its calls are not validated");
                Compiled::Unusable
            }
        };
        let compiled = Arc::new(compiled);
        let mut all = lock(&self.compiled);
        if all.len() >= MAX_COMPILED {
            all.clear();
        }
        all.insert(definition.clone(), compiled.clone());
        compiled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: Value) -> JsonObject {
        match v {
            Value::Object(o) => o,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn invalid_arguments_name_the_field_and_valid_ones_pass() {
        let schema = object(serde_json::json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "edits": {"type": "array", "items": {"type": "object", "properties": {"line": {"type": "integer"}}}}
            },
            "required": ["path"]
        }));
        let v = Validators::default();
        let def: DefinitionHash = "sha256:1".into();
        let ok = object(serde_json::json!({"path": "/a", "edits": [{"line": 3}]}));
        assert_eq!(v.check(&def, &schema, Some(&ok)), Ok(()));
        let missing = v.check(&def, &schema, None).expect_err("path is required");
        assert_eq!(missing, vec!["arguments: \"path\" is a required property"]);
        let bad = object(serde_json::json!({"path": 7, "edits": [{"line": "three"}]}));
        let errors = v
            .check(&def, &schema, Some(&bad))
            .expect_err("two wrong types");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors.iter().any(|e| e.starts_with("arguments.path: ")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("arguments.edits.0.line: ")),
            "{errors:?}"
        );
        assert!(
            !errors.iter().any(|e| e.contains("three")),
            "values stay out: {errors:?}"
        );
        assert_eq!(lock(&v.compiled).len(), 1, "compiled once");
    }

    #[test]
    fn a_schema_that_does_not_compile_is_not_enforced() {
        let schema = object(serde_json::json!({"$ref": "https://example.invalid/schema.json"}));
        let v = Validators::default();
        assert_eq!(v.check(&"sha256:2".into(), &schema, None), Ok(()));
    }
}
