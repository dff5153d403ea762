//! CEL conditions on tool calls (`toolConfig.policy.conditions`, the proxy config's
//! `policy.conditions`): a rule with a [CEL](https://cel.dev) expression over the call and an
//! effect, `deny` or `requireApproval`, applied when the expression is true.
//!
//! An expression reads `args` (the call's arguments), `tool` (`name`, `server`, `class`,
//! `annotations`), `server`, `task` (`name`, `namespace`, `labels`, `contextVersion`) and `time`
//! (a timestamp). [`check`] parses it and holds it to what the proxy can evaluate within a bounded
//! cost: only those variables (and a macro's own), only the functions of [`FUNCTIONS`], regular
//! expressions written as literals that compile, at most [`MAX_NODES`] nodes and
//! [`MAX_NESTING`] nested macros (`all`, `exists`, `map`, ...). The operator and the CLI's
//! `validate` run it on every condition; the proxy runs it again and evaluates the checked
//! expression with a step budget (`orchestrator_mcp_proxy::conditions`).

use std::collections::BTreeSet;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, operators};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallCondition {
    /// The rule's name, unique among the conditions: a refusal and the audit record name it.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The calls it applies to: `server/glob` patterns (e.g. `filesystem/write_*`); unset or
    /// empty: every call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 256)))]
    pub tools: Vec<String>,
    /// A CEL expression over the call; when it is true, the effect applies. Variables: `args`,
    /// `tool` (`name`, `server`, `class`, `annotations`), `server`, `task` (`name`, `namespace`,
    /// `labels`, `contextVersion`), `time`. An expression that fails on a call (a missing
    /// argument: guard it with `has(args.x)`) refuses the call.
    #[schemars(length(min = 1, max = 4096))]
    pub when: String,
    /// `deny` (the default: the call is refused with `message`) or `requireApproval` (the call
    /// waits for a person's decision, as `requireApproval` does).
    #[serde(default, skip_serializing_if = "is_default")]
    pub effect: ConditionEffect,
    /// Shown to the agent with a refusal and recorded in the audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// What a true condition does to the call.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ConditionEffect {
    /// Refused, with the condition's message.
    #[default]
    Deny,
    /// Held for a person's decision.
    RequireApproval,
}

impl ConditionEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionEffect::Deny => "deny",
            ConditionEffect::RequireApproval => "requireApproval",
        }
    }
}

/// At most this many conditions.
pub const MAX_CONDITIONS: usize = 32;
/// At most this many nodes in an expression's tree (its macros expanded).
pub const MAX_NODES: usize = 1024;
/// At most this many macros (`all`, `exists`, `exists_one`, `map`, `filter`) inside each other.
pub const MAX_NESTING: usize = 2;
/// The variables an expression reads.
pub const VARIABLES: [&str; 5] = ["args", "tool", "server", "task", "time"];
/// The functions an expression may call, besides the operators (`&&`, `==`, `in`, `[]`, ...).
pub const FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
    "dyn",
    "timestamp",
    "duration",
    "getFullYear",
    "getMonth",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    // Optional values: `args.?path.orValue("")`.
    "hasValue",
    "value",
    "orValue",
    "or",
];

/// Why an expression is refused: its position (1-based line and column, when known) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionError {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConditionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "at {l}:{c}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConditionError {}

/// An expression that passed [`check`]: its tree, macros expanded, and the variables it reads.
#[derive(Clone, Debug)]
pub struct Checked {
    pub expr: IdedExpr,
    /// The names of [`VARIABLES`] the expression reads (the proxy binds only these).
    pub reads: BTreeSet<&'static str>,
}

/// Parses `when` and holds it to the rules of the module's doc.
pub fn check(when: &str) -> Result<Checked, ConditionError> {
    let env = cel::Env::stdlib();
    let expr = env.parser().parse(when).map_err(|errors| {
        let first = errors.errors.first();
        ConditionError {
            line: first.and_then(|e| usize::try_from(e.pos.0).ok()),
            column: first.and_then(|e| usize::try_from(e.pos.1).ok()),
            message: first
                .map(|e| e.msg.clone())
                .unwrap_or_else(|| errors.to_string()),
        }
    })?;
    let mut walk = Walk::default();
    walk.expr(&expr, 0)?;
    if walk.nodes > MAX_NODES {
        return Err(plain(format!(
            "the expression has {} nodes (macros expanded); at most {MAX_NODES}",
            walk.nodes
        )));
    }
    Ok(Checked {
        expr,
        reads: walk.reads,
    })
}

fn plain(message: String) -> ConditionError {
    ConditionError {
        line: None,
        column: None,
        message,
    }
}

/// The tree walk of [`check`]: the nodes counted, the names in scope.
#[derive(Default)]
struct Walk {
    nodes: usize,
    /// Macro variables in scope (a macro's element and its accumulator).
    scope: Vec<String>,
    /// The variables read (a macro variable of the same name counted too: binding one more
    /// than needed costs only time).
    reads: BTreeSet<&'static str>,
}

impl Walk {
    fn expr(&mut self, e: &IdedExpr, nesting: usize) -> Result<(), ConditionError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Ok(()); // reported once by `check`
        }
        match &e.expr {
            Expr::Ident(name) => {
                if let Some(variable) = VARIABLES.iter().find(|v| **v == name.as_str()) {
                    self.reads.insert(variable);
                } else if !self.scope.contains(name) {
                    return Err(plain(format!(
                        "unknown variable `{name}`: a condition reads {}",
                        VARIABLES.join(", ")
                    )));
                }
            }
            Expr::Call(call) => {
                let name = call.func_name.as_str();
                if !(is_operator(name) || FUNCTIONS.contains(&name)) {
                    return Err(plain(format!(
                        "unknown or unsupported function `{name}`; the functions a condition may \
                         call: {}",
                        FUNCTIONS.join(", ")
                    )));
                }
                if name == "matches" {
                    let pattern = match (&call.target, call.args.as_slice()) {
                        (Some(_), [p]) | (None, [_, p]) => p,
                        _ => return Err(plain("matches takes one pattern".into())),
                    };
                    let Expr::Literal(cel::common::ast::LiteralValue::String(p)) = &pattern.expr
                    else {
                        return Err(plain(
                            "the pattern of matches must be a string literal (it is compiled \
                             once, when the condition is checked)"
                                .into(),
                        ));
                    };
                    regex::Regex::new(p.as_ref()).map_err(|e| {
                        plain(format!("the pattern of matches does not compile: {e}"))
                    })?;
                }
                if let Some(target) = &call.target {
                    self.expr(target, nesting)?;
                }
                for arg in &call.args {
                    self.expr(arg, nesting)?;
                }
            }
            Expr::Comprehension(c) => {
                let inner = nesting + 1;
                if inner > MAX_NESTING {
                    return Err(plain(format!(
                        "macros (all, exists, exists_one, map, filter) nest {inner} deep; at most \
                         {MAX_NESTING}"
                    )));
                }
                if c.iter_var2.is_some() {
                    return Err(plain(
                        "two-variable macros are not supported; write x.all(e, ...) with one"
                            .into(),
                    ));
                }
                self.expr(&c.iter_range, nesting)?;
                self.expr(&c.accu_init, nesting)?;
                // The accumulator is in scope for the result too; the element only inside.
                self.scope.push(c.accu_var.clone());
                self.scope.push(c.iter_var.clone());
                let inside = [&c.loop_cond, &c.loop_step]
                    .into_iter()
                    .try_for_each(|e| self.expr(e, inner));
                self.scope.pop();
                let result = inside.and_then(|()| self.expr(&c.result, nesting));
                self.scope.pop();
                result?;
            }
            Expr::List(list) => {
                for e in &list.elements {
                    self.expr(e, nesting)?;
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(m) => {
                            self.expr(&m.key, nesting)?;
                            self.expr(&m.value, nesting)?;
                        }
                        EntryExpr::StructField(_) => {
                            return Err(plain("message fields are not supported".into()));
                        }
                    }
                }
            }
            Expr::Select(select) => self.expr(&select.operand, nesting)?,
            Expr::Struct(_) => {
                return Err(plain("message construction is not supported".into()));
            }
            Expr::Literal(_) | Expr::Unspecified => {}
        }
        Ok(())
    }
}

fn is_operator(name: &str) -> bool {
    use operators::*;
    [
        CONDITIONAL,
        LOGICAL_AND,
        LOGICAL_OR,
        LOGICAL_NOT,
        SUBSTRACT,
        ADD,
        MULTIPLY,
        DIVIDE,
        MODULO,
        EQUALS,
        NOT_EQUALS,
        GREATER_EQUALS,
        LESS_EQUALS,
        GREATER,
        LESS,
        NEGATE,
        INDEX,
        OPT_INDEX,
        OPT_SELECT,
        NOT_STRICTLY_FALSE,
        IN,
    ]
    .contains(&name)
}

/// The problems of a list of conditions, each as (field path, message): a duplicate name, a
/// pattern that is not `server/glob`, an expression [`check`] refuses. `at` is the list's path
/// (e.g. `spec.toolConfig.policy.conditions`).
pub fn problems(conditions: &[CallCondition], at: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if conditions.len() > MAX_CONDITIONS {
        out.push((
            at.to_string(),
            format!("{} conditions; at most {MAX_CONDITIONS}", conditions.len()),
        ));
    }
    let mut names = BTreeSet::new();
    for (i, c) in conditions.iter().enumerate() {
        if !names.insert(c.name.as_str()) {
            out.push((
                format!("{at}[{i}].name"),
                format!(
                    "{:?} is the name of an earlier condition; names must be unique",
                    c.name
                ),
            ));
        }
        for (j, pattern) in c.tools.iter().enumerate() {
            if let Err(why) = pattern_problem(pattern) {
                out.push((format!("{at}[{i}].tools[{j}]"), why));
            }
        }
        if let Err(e) = check(&c.when) {
            out.push((
                format!("{at}[{i}].when"),
                format!("condition {:?}: {e}", c.name),
            ));
        }
    }
    out
}

/// Whether `pattern` is `server/glob` with two valid globs.
pub fn pattern_problem(pattern: &str) -> Result<(), String> {
    let Some((server, tool)) = pattern.split_once('/') else {
        return Err(format!(
            "{pattern:?} has no '/' between the server and the tool; write server/glob, e.g. \
             \"filesystem/write_*\""
        ));
    };
    if server.is_empty() || tool.is_empty() {
        return Err(format!(
            "{pattern:?} needs both a server and a tool pattern"
        ));
    }
    for p in [server, tool] {
        globset::Glob::new(p).map_err(|e| format!("{pattern:?} is not a valid glob: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
