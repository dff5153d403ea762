//! CEL conditions on calls (`policy.conditions`, `orchestrator_crds::condition`): compiled once
//! per config ([`Conditions::compile`]) and evaluated per call ([`Conditions::decide`]), in order,
//! against the call's facts: `args`, `tool` (`name`, `server`, `class`, `annotations`),
//! `server`, `task` (`name`, `namespace`, `labels`, `contextVersion`) and `time`.
//!
//! Cost: the checks of `orchestrator_crds::condition::check` bound an expression's size and its
//! macros' nesting; here every macro step takes one tick of a budget ([`MAX_STEPS`] per
//! evaluation) and must come before a deadline ([`MAX_TIME`]): each macro's loop condition is
//! rewritten into `@tick() && <condition>` (a name no expression can write). An evaluation that
//! runs out, fails, or is not a bool refuses the call (fail closed), naming the condition.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use cel::{
    Context, Env, ExecutionError, Value,
    common::ast::{CallExpr, Expr, IdedExpr, operators},
};
use globset::{Glob, GlobMatcher};
use orchestrator_crds::condition::{self, CallCondition, ConditionEffect};
use serde_json::Value as Json;

/// Macro steps one evaluation may take.
pub const MAX_STEPS: u64 = 100_000;
/// How long a call's conditions may take together, checked at each macro step: a safety net
/// for steps that each do much work (the step budget alone takes about 50 ms in a release
/// build).
pub const MAX_TIME: Duration = Duration::from_millis(250);
/// The function a macro step calls.
const TICK: &str = "@tick";

/// The compiled conditions, in config order.
#[derive(Debug, Default)]
pub struct Conditions {
    rules: Vec<Rule>,
}

/// One compiled condition.
#[derive(Debug)]
struct Rule {
    index: usize,
    name: String,
    /// `(server, tool)` globs; empty: every call.
    tools: Vec<(GlobMatcher, GlobMatcher)>,
    expr: IdedExpr,
    /// The variables `expr` reads: only these are bound for it.
    reads: BTreeSet<&'static str>,
    effect: ConditionEffect,
    message: Option<String>,
}

/// What a call is, as conditions (and, as [`Facts::input`], decision points) read it.
pub struct Facts<'a> {
    pub server: &'a str,
    pub tool: &'a str,
    pub class: Option<&'a str>,
    pub annotations: Json,
    pub args: Option<&'a serde_json::Map<String, Json>>,
    pub task: TaskFacts<'a>,
    pub now: chrono::DateTime<chrono::Utc>,
}

/// The task's part of [`Facts`].
pub struct TaskFacts<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub context_version: u64,
    /// Who created the task (`status.createdBy`): a decision point's input has it, conditions
    /// do not read it.
    pub created_by: Option<&'a str>,
}

impl Facts<'_> {
    /// The call as a decision point reads it (docs/proxy-config.md, "Decision points"): the
    /// conditions' facts as JSON, with the task's creator, and the time in RFC 3339.
    pub fn input(&self) -> Json {
        let mut tool = serde_json::json!({
            "name": self.tool,
            "server": self.server,
            "annotations": self.annotations,
        });
        if let Some(class) = self.class {
            tool["class"] = Json::from(class);
        }
        serde_json::json!({
            "tool": tool,
            "server": self.server,
            "args": self.args.cloned().unwrap_or_default(),
            "task": {
                "name": self.task.name,
                "namespace": self.task.namespace,
                "createdBy": self.task.created_by,
                "labels": self.task.labels,
                "contextVersion": self.task.context_version,
            },
            "time": self.now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        })
    }
}

/// What the conditions decided about a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No condition holds (or only ones that ask for approval: `approval` names the first).
    Pass { approval: Option<String> },
    /// A `deny` condition holds.
    Denied {
        rule: String,
        name: String,
        message: Option<String>,
    },
    /// A condition could not be evaluated on this call.
    Failed {
        rule: String,
        name: String,
        error: String,
    },
}

impl Conditions {
    /// Compiles `wire`, or says what is wrong with each bad entry (as `(path, message)`).
    pub fn compile(wire: &[CallCondition]) -> Result<Self, Vec<(String, String)>> {
        let problems = condition::problems(wire, "policy.conditions");
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut rules = Vec::with_capacity(wire.len());
        for (index, c) in wire.iter().enumerate() {
            let checked = condition::check(&c.when)
                .map_err(|e| vec![(format!("policy.conditions[{index}].when"), e.to_string())])?;
            let mut expr = checked.expr;
            add_ticks(&mut expr);
            let tools = c
                .tools
                .iter()
                .filter_map(|p| {
                    let (server, tool) = p.split_once('/')?;
                    let glob = |g: &str| Glob::new(g).ok().map(|g| g.compile_matcher());
                    Some((glob(server)?, glob(tool)?))
                })
                .collect();
            rules.push(Rule {
                index,
                name: c.name.clone(),
                tools,
                expr,
                reads: checked.reads,
                effect: c.effect,
                message: c.message.clone(),
            });
        }
        Ok(Self { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The conditions in order against `facts`: the first `deny` that holds, or the first
    /// failure, refuses; otherwise the first `requireApproval` that holds asks.
    pub fn decide(&self, facts: &Facts<'_>) -> Verdict {
        let mut approval = None;
        let mut bound: Option<Bound> = None;
        for rule in &self.rules {
            if !rule.applies(facts.server, facts.tool) {
                continue;
            }
            if rule.effect == ConditionEffect::RequireApproval && approval.is_some() {
                continue;
            }
            let bound = bound.get_or_insert_with(|| Bound::new(facts));
            bound.bind(&rule.reads);
            match bound.evaluate(&rule.expr) {
                Ok(false) => {}
                Ok(true) => match rule.effect {
                    ConditionEffect::Deny => {
                        return Verdict::Denied {
                            rule: rule.path(),
                            name: rule.name.clone(),
                            message: rule.message.clone(),
                        };
                    }
                    ConditionEffect::RequireApproval => approval = Some(rule.path()),
                },
                Err(error) => {
                    return Verdict::Failed {
                        rule: rule.path(),
                        name: rule.name.clone(),
                        error,
                    };
                }
            }
        }
        Verdict::Pass { approval }
    }
}

impl Rule {
    fn applies(&self, server: &str, tool: &str) -> bool {
        self.tools.is_empty()
            || self
                .tools
                .iter()
                .any(|(s, t)| s.is_match(server) && t.is_match(tool))
    }

    /// As the audit record and the answer name it: `policy.conditions[0] "name"`.
    fn path(&self) -> String {
        format!("policy.conditions[{}] {:?}", self.index, self.name)
    }
}

/// A call's CEL context, and the step budget: each variable is bound once per call, when the
/// first condition that reads it is evaluated (most conditions read only `args`).
struct Bound<'f, 'a> {
    facts: &'f Facts<'a>,
    ctx: Context<'static, 'static>,
    bound: BTreeSet<&'static str>,
    steps: Arc<AtomicU64>,
    deadline: Arc<OnceLock<Instant>>,
}

fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib())).clone()
}

impl<'f, 'a> Bound<'f, 'a> {
    fn new(facts: &'f Facts<'a>) -> Self {
        let mut ctx = Context::with_env(env());
        let steps = Arc::new(AtomicU64::new(0));
        let deadline = Arc::new(OnceLock::new());
        let (counter, until) = (steps.clone(), deadline.clone());
        let tick = move || -> Result<Value, ExecutionError> {
            let taken = counter.fetch_add(1, Ordering::Relaxed) + 1;
            let late = until.get().is_some_and(|d| Instant::now() > *d);
            if taken > MAX_STEPS || late {
                Err(ExecutionError::function_error(TICK, "over budget"))
            } else {
                Ok(Value::Bool(true))
            }
        };
        // A name no expression can write: only the rewritten loops call it.
        let _ = ctx.add_function(TICK, tick);
        Self {
            facts,
            ctx,
            bound: BTreeSet::new(),
            steps,
            deadline,
        }
    }

    /// Binds the variables of `reads` not bound yet.
    fn bind(&mut self, reads: &BTreeSet<&'static str>) {
        for &name in reads {
            if !self.bound.insert(name) {
                continue;
            }
            let facts = self.facts;
            let value = match name {
                "args" => facts
                    .args
                    .map(cel_map)
                    .unwrap_or_else(|| cel_map(&Default::default())),
                "tool" => {
                    let mut tool = HashMap::from([
                        ("name".to_string(), Value::from(facts.tool)),
                        ("server".to_string(), Value::from(facts.server)),
                        ("annotations".to_string(), to_cel(&facts.annotations)),
                    ]);
                    if let Some(class) = facts.class {
                        tool.insert("class".into(), Value::from(class));
                    }
                    Value::from(tool)
                }
                "server" => Value::from(facts.server),
                "task" => {
                    let labels: HashMap<String, Value> = facts
                        .task
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                        .collect();
                    let version = i64::try_from(facts.task.context_version)
                        .map(Value::Int)
                        .unwrap_or(Value::UInt(facts.task.context_version));
                    Value::from(HashMap::from([
                        ("name".to_string(), Value::from(facts.task.name)),
                        ("namespace".to_string(), Value::from(facts.task.namespace)),
                        ("labels".to_string(), Value::from(labels)),
                        ("contextVersion".to_string(), version),
                    ]))
                }
                "time" => Value::Timestamp(facts.now.fixed_offset()),
                // `check` lets no other name through.
                _ => continue,
            };
            self.ctx.add_variable_from_value(name, value);
        }
    }

    fn evaluate(&mut self, expr: &IdedExpr) -> Result<bool, String> {
        self.steps.store(0, Ordering::Relaxed);
        let started = Instant::now();
        // One deadline per call's conditions: set once, at the first evaluation.
        let _ = self.deadline.set(started + MAX_TIME);
        let result = Value::resolve(expr, &self.ctx);
        // `||` and `&&` can absorb an error: a budget that ran out refuses the call whatever the
        // value came to.
        let steps = self.steps.load(Ordering::Relaxed);
        if steps > MAX_STEPS {
            return Err(format!(
                "it went over its budget: more than {MAX_STEPS} macro steps"
            ));
        }
        if self.deadline.get().is_some_and(|d| Instant::now() > *d) && steps > 0 {
            return Err(format!(
                "it went over its budget: longer than {} ms",
                MAX_TIME.as_millis()
            ));
        }
        match result {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "it came to a {}, not true or false",
                other.type_of()
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Every macro's loop condition becomes `@tick() && <condition>`.
fn add_ticks(e: &mut IdedExpr) {
    match &mut e.expr {
        Expr::Call(c) => {
            if let Some(t) = &mut c.target {
                add_ticks(t);
            }
            c.args.iter_mut().for_each(add_ticks);
        }
        Expr::Comprehension(c) => {
            add_ticks(&mut c.iter_range);
            add_ticks(&mut c.accu_init);
            add_ticks(&mut c.loop_step);
            add_ticks(&mut c.result);
            add_ticks(&mut c.loop_cond);
            let cond = std::mem::take(&mut c.loop_cond);
            let tick = IdedExpr {
                id: 0,
                expr: Expr::Call(CallExpr {
                    func_name: TICK.into(),
                    target: None,
                    args: Vec::new(),
                }),
            };
            c.loop_cond = IdedExpr {
                id: cond.id,
                expr: Expr::Call(CallExpr {
                    func_name: operators::LOGICAL_AND.into(),
                    target: None,
                    args: vec![tick, cond],
                }),
            };
        }
        Expr::List(l) => l.elements.iter_mut().for_each(add_ticks),
        Expr::Map(m) => {
            for entry in &mut m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &mut entry.expr {
                    add_ticks(&mut me.key);
                    add_ticks(&mut me.value);
                }
            }
        }
        Expr::Select(s) => add_ticks(&mut s.operand),
        Expr::Struct(_) | Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// JSON as CEL reads it, as Kubernetes binds it: a whole number is an `int` (a `uint` only past
/// `int`'s range), so `args.n * 2` and `args.n > -1` work.
fn to_cel(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .or_else(|| n.as_u64().map(Value::UInt))
            .unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(f64::NAN))),
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(a) => Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Json::Object(o) => cel_map(o),
    }
}

fn cel_map(o: &serde_json::Map<String, Json>) -> Value {
    Value::from(
        o.iter()
            .map(|(k, v)| (k.clone(), to_cel(v)))
            .collect::<HashMap<String, Value>>(),
    )
}

#[cfg(test)]
mod tests;
