//! Argument validation: a call's arguments are checked against the tool's `inputSchema` before
//! they leave the pod. Each schema is compiled once per definition hash and kept (bounded in
//! count and in schema bytes, [`memory::Bounds::validators`]); a schema that does not compile (a
//! remote `$ref`, a bad regex) is not enforced and said so once. A schema beyond
//! [`memory::Bounds::schema`] bytes or [`MAX_SCHEMA_DEPTH`] levels is not compiled either (its
//! validator could take more memory than the budget has), and the tool's calls are refused,
//! naming the bound and its setting: a tool whose arguments cannot be checked is not called.
//!
//! The work of one check is bounded ([`super::budget`]): it runs on the calling thread within a
//! small budget that every ordinary call fits in, and only a call that spends it is checked
//! again on a thread of its own (at most [`HEAVY_AT_ONCE`] at a time, at a lower CPU priority)
//! within the full budget, so the runtime thread that serves the other clients never stalls for
//! long, even on a busy machine. A call over the full budget is refused.

use std::{collections::HashMap, sync::Arc};

use rmcp::model::JsonObject;
use serde_json::Value;

use super::{
    budget::{self, Budget, Budgeted},
    definitions::DefinitionHash,
};
use crate::{
    memory::{self, Pool},
    sync::lock,
};

/// Compiled schemas kept at most; past it the cache starts over (a task has far fewer tools).
const MAX_COMPILED: usize = 1024;
/// Problems named in one error at most.
const MAX_PROBLEMS: usize = 5;
/// The deepest input schema compiled (nested objects and arrays); calls to a tool with a deeper
/// one are refused.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Steps a check may take on the calling (runtime) thread before it moves to a blocking one.
const INLINE_STEPS: u64 = 1_000;
/// Checks that ran past [`INLINE_STEPS`] running at once; more wait for a turn.
pub const HEAVY_AT_ONCE: usize = 2;
/// The niceness of a check's own thread (the proxy's other threads keep theirs).
const HEAVY_NICE: i32 = 10;

enum Compiled {
    Enforced(jsonschema::Validator<Budgeted>),
    /// The schema could not be compiled: calls pass unchecked.
    Unusable,
    /// The schema is beyond the bounds: calls are refused.
    TooLarge {
        bytes: usize,
        depth: usize,
    },
}

/// Compiled input schemas by definition hash.
pub struct Validators {
    /// With each, the schema's bytes (counted in [`Pool::Validators`]).
    compiled: std::sync::Mutex<HashMap<DefinitionHash, (Arc<Compiled>, usize)>>,
    heavy: tokio::sync::Semaphore,
}

impl Default for Validators {
    fn default() -> Self {
        Self {
            compiled: Default::default(),
            heavy: tokio::sync::Semaphore::new(HEAVY_AT_ONCE),
        }
    }
}

/// The outcome of one check, when it is not a pass.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// What is wrong, each naming the field (`arguments.path: ...`).
    Invalid(Vec<String>),
    /// The check took its whole budget without an answer.
    TooCostly { steps: u64 },
    /// The tool's schema is beyond the bounds of what is compiled.
    SchemaTooLarge { bytes: usize, depth: usize },
}

impl Refused {
    /// The problems to name in the refusal.
    pub fn problems(self) -> Vec<String> {
        match self {
            Refused::Invalid(problems) => problems,
            Refused::TooCostly { steps } => vec![format!(
                "arguments: checking them against the tool's inputSchema took more than its \
                 budget ({steps} steps into members and elements, at most {}s); send them less \
                 deeply nested",
                budget::DEADLINE.as_secs()
            )],
            Refused::SchemaTooLarge { bytes, depth } => vec![format!(
                "the tool's inputSchema ({}, {depth} levels deep) is beyond what the proxy \
                 compiles ({}, --max-schema-bytes; {MAX_SCHEMA_DEPTH} levels), so its arguments \
                 cannot be checked and its calls are refused",
                memory::human(bytes),
                memory::human(memory::bounds().schema)
            )],
        }
    }
}

impl Drop for Validators {
    fn drop(&mut self) {
        let held: usize = lock(&self.compiled).values().map(|(_, b)| b).sum();
        Pool::Validators.sub(held);
    }
}

impl Validators {
    /// Checks `arguments` (absent: `{}`) against `schema`, compiled once per `definition`.
    pub async fn check(
        &self,
        definition: &DefinitionHash,
        schema: &JsonObject,
        arguments: Option<&JsonObject>,
    ) -> Result<(), Refused> {
        let compiled = self.compiled(definition, schema).await;
        match *compiled {
            Compiled::Unusable => return Ok(()),
            Compiled::TooLarge { bytes, depth } => {
                return Err(Refused::SchemaTooLarge { bytes, depth });
            }
            Compiled::Enforced(_) => {}
        }
        let instance = match arguments {
            Some(args) => Value::Object(args.clone()),
            None => Value::Object(Default::default()),
        };
        let inline = Budget::steps(INLINE_STEPS);
        if let Some(outcome) = check_within(&compiled, &instance, &inline) {
            return outcome;
        }
        // Costly: off the runtime thread, a few at a time, within the whole budget.
        let Ok(_turn) = self.heavy.acquire().await else {
            return Err(Refused::TooCostly {
                steps: inline.spent(),
            });
        };
        let (done, outcome) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("argument-check".into())
            .spawn(move || {
                // Behind the threads that serve clients when the machine is busy.
                let _ = rustix::process::setpriority_process(
                    Some(rustix::thread::gettid()),
                    HEAVY_NICE,
                );
                let full = Budget::new(budget::STEPS, budget::DEADLINE);
                let _ = done.send(check_within(&compiled, &instance, &full).unwrap_or(Err(
                    Refused::TooCostly {
                        steps: full.spent(),
                    },
                )));
            });
        let too_costly = Err(Refused::TooCostly {
            steps: budget::STEPS,
        });
        match spawned {
            Ok(_) => outcome.await.unwrap_or(too_costly),
            Err(_) => too_costly,
        }
    }

    async fn compiled(&self, definition: &DefinitionHash, schema: &JsonObject) -> Arc<Compiled> {
        if let Some((c, _)) = lock(&self.compiled).get(definition) {
            return c.clone();
        }
        let schema = Value::Object(schema.clone());
        let name = definition.clone();
        let (compiled, bytes) = tokio::task::spawn_blocking(move || compile(&name, &schema))
            .await
            .unwrap_or((Compiled::Unusable, 0));
        let compiled = Arc::new(compiled);
        // Only what was compiled is held; a refusal costs nothing to keep.
        let bytes = if matches!(*compiled, Compiled::Enforced(_)) {
            bytes
        } else {
            0
        };
        let mut all = lock(&self.compiled);
        let held: usize = all.values().map(|(_, b)| b).sum();
        if all.len() >= MAX_COMPILED || held + bytes > memory::bounds().validators {
            all.clear();
            Pool::Validators.sub(held);
        }
        if let Some((_, before)) = all.insert(definition.clone(), (compiled.clone(), bytes)) {
            Pool::Validators.sub(before);
        }
        Pool::Validators.add(bytes);
        compiled
    }
}

/// The check within `budget`: `None` when the budget ran out first.
fn check_within(
    compiled: &Compiled,
    instance: &Value,
    budget: &Budget,
) -> Option<Result<(), Refused>> {
    let validator = match compiled {
        Compiled::Enforced(validator) => validator,
        Compiled::Unusable => return Some(Ok(())),
        Compiled::TooLarge { bytes, depth } => {
            return Some(Err(Refused::SchemaTooLarge {
                bytes: *bytes,
                depth: *depth,
            }));
        }
    };
    let valid = validator.is_valid(budget.root(instance));
    if budget.exhausted() {
        return None;
    }
    if valid {
        return Some(Ok(()));
    }
    let problems: Vec<String> = validator
        .iter_errors(budget.root(instance))
        .take(MAX_PROBLEMS)
        .map(|error| {
            let field = error.instance_path().to_string().replace('/', ".");
            // Masked: the message names the field and the rule, not the value (which the
            // audit log records only when asked to).
            format!("arguments{field}: {}", error.masked())
        })
        .collect();
    if budget.exhausted() {
        return None;
    }
    Some(Err(Refused::Invalid(problems)))
}

/// The schema compiled, and its serialized bytes.
fn compile(definition: &DefinitionHash, schema: &Value) -> (Compiled, usize) {
    let bytes = serde_json::to_vec(schema).map_or(usize::MAX, |b| b.len());
    let depth = depth(schema);
    let max_bytes = memory::bounds().schema;
    if bytes > max_bytes || depth > MAX_SCHEMA_DEPTH {
        tracing::warn!(definition = %definition, bytes, depth, max_bytes, max_depth = MAX_SCHEMA_DEPTH, "a tool's inputSchema is too large to compile; its calls are refused");
        return (Compiled::TooLarge { bytes, depth }, bytes);
    }
    let compiled = match jsonschema::options_for::<Budgeted>().build(schema) {
        Ok(v) => Compiled::Enforced(v),
        Err(e) => {
            tracing::warn!(definition = %definition, error = %e.masked(), "a tool's inputSchema does not compile; its calls are not validated");
            Compiled::Unusable
        }
    };
    (compiled, bytes)
}

/// How deeply `value` nests (a scalar: 0), without recursion.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Object(map) => stack.extend(map.values().map(|c| (c, d + 1))),
            Value::Array(items) => stack.extend(items.iter().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    deepest
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

    fn problems(r: Result<(), Refused>) -> Vec<String> {
        match r {
            Err(Refused::Invalid(p)) => p,
            other => panic!("expected invalid arguments, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn invalid_arguments_name_the_field_and_valid_ones_pass() {
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
        assert_eq!(v.check(&def, &schema, Some(&ok)).await, Ok(()));
        let missing = problems(v.check(&def, &schema, None).await);
        assert_eq!(missing, vec!["arguments: \"path\" is a required property"]);
        let bad = object(serde_json::json!({"path": 7, "edits": [{"line": "three"}]}));
        let errors = problems(v.check(&def, &schema, Some(&bad)).await);
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

    #[tokio::test]
    async fn a_schema_that_does_not_compile_is_not_enforced() {
        let schema = object(serde_json::json!({"$ref": "https://example.invalid/schema.json"}));
        let v = Validators::default();
        assert_eq!(v.check(&"sha256:2".into(), &schema, None).await, Ok(()));
    }

    /// A tree of document blocks: each block is one of three object types whose `children` are
    /// blocks again. Every branch of the union walks the children, so the work triples per
    /// level of nesting.
    fn blocks() -> JsonObject {
        object(serde_json::json!({
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/block"}},
            "$defs": {
                "block": {"oneOf": [
                    {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/block"}}, "kind": {"const": "paragraph"}}},
                    {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/block"}}, "kind": {"const": "list"}}},
                    {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/block"}}, "kind": {"const": "quote"}}}
                ]}
            }
        }))
    }

    fn nested(levels: usize, kind: &str) -> Value {
        let mut block = serde_json::json!({"kind": kind, "children": []});
        for _ in 0..levels {
            block = serde_json::json!({"kind": kind, "children": [block, {"kind": kind}]});
        }
        block
    }

    #[tokio::test]
    async fn a_check_that_would_not_finish_is_cut_off_and_refused() {
        let v = Validators::default();
        let def: DefinitionHash = "sha256:blocks".into();
        // 40 levels: 3^40 evaluations without the budget (the request is under 2 KiB).
        let deep = object(serde_json::json!({"root": nested(40, "zzz")}));
        match v.check(&def, &blocks(), Some(&deep)).await {
            Err(Refused::TooCostly { steps }) => assert!(steps >= INLINE_STEPS, "{steps}"),
            other => panic!("expected a refusal for cost, got {other:?}"),
        }
        // Shallow trees are still checked in full, both ways.
        let fine = object(serde_json::json!({"root": nested(3, "paragraph")}));
        assert_eq!(v.check(&def, &blocks(), Some(&fine)).await, Ok(()));
        let wrong = object(serde_json::json!({"root": nested(3, "zzz")}));
        assert!(!problems(v.check(&def, &blocks(), Some(&wrong)).await).is_empty());
    }

    #[tokio::test]
    async fn calls_to_a_tool_whose_schema_is_beyond_the_bounds_are_refused() {
        let v = Validators::default();
        let mut deep = serde_json::json!({"type": "string"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            deep = serde_json::json!({"type": "object", "properties": {"a": deep}});
        }
        let deep = object(deep);
        assert!(depth(&Value::Object(deep.clone())) > MAX_SCHEMA_DEPTH);
        let args = object(serde_json::json!({"a": 1}));
        assert!(matches!(
            v.check(&"sha256:deep".into(), &deep, Some(&args)).await,
            Err(Refused::SchemaTooLarge { depth, .. }) if depth > MAX_SCHEMA_DEPTH
        ));
        let big = object(serde_json::json!({
            "type": "object",
            "description": "x".repeat(memory::bounds().schema),
            "required": ["a"]
        }));
        let refused = v.check(&"sha256:big".into(), &big, None).await;
        let text = refused.expect_err("refused").problems().join("\n");
        assert!(
            text.contains("--max-schema-bytes") && text.contains("256 KiB"),
            "{text}"
        );
    }
}
