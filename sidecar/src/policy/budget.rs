//! A bound on the work of one argument validation. JSON Schema validation can cost exponential
//! time: a union of object types sharing a recursive `$ref` (a tree of document blocks, say)
//! evaluates each nested value once per branch at every level, so a short request nested a few
//! dozen levels deep never finishes. The validator cannot be interrupted, so instead the instance
//! it walks is: [`Metered`] is the arguments as the `jsonschema` crate sees them, and every step
//! into a member or element spends from a [`Budget`], as does work on one node that grows with
//! its size (a string read for a pattern or a length: a step per [`STRING_BYTES_PER_STEP`];
//! `uniqueItems`: the size of the array). Once the budget is spent (in steps, or a wall-clock
//! deadline checked every few steps), every further step yields `null`: nothing below it is
//! walked, so the validation finishes in a few more steps with a result the caller throws away
//! (it asks [`Budget::exhausted`] and refuses the call).

use std::{
    borrow::Cow,
    cell::Cell,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use jsonschema::json::{Array, Json, Node, NodeIdentity, Object, cmp, unique};
use jsonschema::types::JsonType;
use serde_json::{Map, Value};

/// Steps into members and elements that one call's validation may take.
pub const STEPS: u64 = 1_000_000;
/// Wall-clock time one call's validation may take, checked every [`CHECK_EVERY`] steps.
pub const DEADLINE: Duration = Duration::from_secs(1);
const CHECK_EVERY: u64 = 1024;
/// Bytes of a string that cost one step when it is read.
pub const STRING_BYTES_PER_STEP: usize = 4096;

static NULL: Value = Value::Null;

/// What one validation may still spend.
#[derive(Debug)]
pub struct Budget {
    left: AtomicU64,
    spent: AtomicU64,
    deadline: Option<Instant>,
    exhausted: AtomicBool,
}

impl Budget {
    /// `steps`, within `time` from now.
    pub fn new(steps: u64, time: Duration) -> Self {
        Self {
            deadline: Some(Instant::now() + time),
            ..Self::steps(steps)
        }
    }

    /// `steps`, however long they take (for budgets small enough not to need a clock).
    pub fn steps(steps: u64) -> Self {
        Self {
            left: AtomicU64::new(steps),
            spent: AtomicU64::new(0),
            deadline: None,
            exhausted: AtomicBool::new(false),
        }
    }

    /// Spends one step; `false` once the budget is gone.
    fn spend(&self) -> bool {
        self.charge(1)
    }

    /// Spends `steps`; `false` once the budget is gone.
    fn charge(&self, steps: u64) -> bool {
        if self.exhausted.load(Ordering::Relaxed) {
            return false;
        }
        let before = self.spent.fetch_add(steps, Ordering::Relaxed);
        let spent = before + steps;
        let out_of_steps = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                n.checked_sub(steps)
            })
            .is_err();
        // The clock is read each time the count crosses a multiple of CHECK_EVERY.
        let out_of_time = before / CHECK_EVERY != spent / CHECK_EVERY
            && self.deadline.is_some_and(|d| Instant::now() >= d);
        if out_of_steps || out_of_time {
            self.exhausted.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Steps left (0 once spent).
    fn left(&self) -> u64 {
        self.left.load(Ordering::Relaxed)
    }

    /// Whether the validation was cut short (its result means nothing).
    pub fn exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }

    /// Steps taken so far.
    pub fn spent(&self) -> u64 {
        self.spent.load(Ordering::Relaxed)
    }

    /// The root of `value` as the validator walks it, spending from this budget.
    pub fn root<'a>(&'a self, value: &'a Value) -> Metered<'a> {
        Metered {
            value,
            budget: Some(self),
        }
    }
}

/// The JSON representation whose nodes spend from a [`Budget`].
pub struct Budgeted;

/// One value of the arguments, walked within a budget. Property names handed to `propertyNames`
/// carry no budget (they have nothing below them).
#[derive(Clone, Copy, Debug)]
pub struct Metered<'a> {
    value: &'a Value,
    budget: Option<&'a Budget>,
}

impl<'a> Metered<'a> {
    /// `child`, or `null` once the budget is spent.
    fn step(&self, child: &'a Value) -> Metered<'a> {
        let within = self.budget.is_none_or(Budget::spend);
        Metered {
            value: if within { child } else { &NULL },
            budget: self.budget,
        }
    }
}

impl Json for Budgeted {
    type Node<'a> = Metered<'a>;
    type PreparedKey = String;
    type StringBuffer = ();

    fn prepare_key(key: &str) -> String {
        key.to_owned()
    }

    fn with_string_node<T>((): &mut (), string: &str, f: impl FnOnce(Metered<'_>) -> T) -> T {
        thread_local! {
            // Backs every name node on this thread, so names allocate only while it grows.
            static NAME: Cell<String> = const { Cell::new(String::new()) };
        }
        let mut name = NAME.take();
        name.clear();
        name.push_str(string);
        let node = Value::String(name);
        let result = f(Metered {
            value: &node,
            budget: None,
        });
        if let Value::String(name) = node {
            NAME.set(name);
        }
        result
    }
}

impl<'a> Node<'a, Budgeted> for Metered<'a> {
    type Object = Members<'a>;
    type Array = Elements<'a>;
    type Number = &'a serde_json::Number;

    fn as_object(&self) -> Option<Members<'a>> {
        match self.value {
            Value::Object(map) => Some(Members { map, at: *self }),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<Elements<'a>> {
        match self.value {
            Value::Array(items) => Some(Elements { items, at: *self }),
            _ => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match self.value {
            Value::String(s) => {
                // A long string costs what reading it costs (patterns, lengths, formats).
                if let Some(budget) = self.budget {
                    budget.charge((s.len() / STRING_BYTES_PER_STEP) as u64);
                }
                Some(Cow::Borrowed(s))
            }
            _ => None,
        }
    }

    fn as_number(&self) -> Option<&'a serde_json::Number> {
        match self.value {
            Value::Number(n) => Some(n),
            _ => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        self.value.as_bool()
    }

    fn is_null(&self) -> bool {
        self.value.is_null()
    }

    fn json_type(&self) -> JsonType {
        match self.value {
            Value::Null => JsonType::Null,
            Value::Bool(_) => JsonType::Boolean,
            Value::Number(_) => JsonType::Number,
            Value::String(_) => JsonType::String,
            Value::Array(_) => JsonType::Array,
            Value::Object(_) => JsonType::Object,
        }
    }

    fn equals_value(&self, expected: &Value) -> bool {
        if let Some(budget) = self.budget {
            budget.spend();
        }
        cmp::equal(self.value, expected)
    }

    fn to_value(&self) -> Cow<'a, Value> {
        Cow::Borrowed(self.value)
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(NodeIdentity::new(
            std::ptr::from_ref::<Value>(self.value) as usize
        ))
    }
}

/// The steps reading all of `value` costs (a step per node, and per [`STRING_BYTES_PER_STEP`] of
/// its strings), counted up to `limit` at most.
fn weight(value: &Value, limit: u64) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        total += 1;
        match v {
            Value::String(s) => total += (s.len() / STRING_BYTES_PER_STEP) as u64,
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
        if total > limit {
            break;
        }
    }
    total
}

/// An object's members, each a step.
pub struct Members<'a> {
    map: &'a Map<String, Value>,
    at: Metered<'a>,
}

pub struct MembersIter<'a> {
    inner: serde_json::map::Iter<'a>,
    at: Metered<'a>,
}

impl<'a> Iterator for MembersIter<'a> {
    type Item = (&'a str, Metered<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        self.inner
            .next()
            .map(|(key, value)| (key.as_str(), self.at.step(value)))
    }
}

impl<'a> Object<'a, Budgeted> for Members<'a> {
    type Node = Metered<'a>;
    type MemberName = &'a str;
    type MembersIter = MembersIter<'a>;

    fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, key: &String) -> Option<Metered<'a>> {
        self.map.get(key.as_str()).map(|value| self.at.step(value))
    }

    fn members(&self) -> MembersIter<'a> {
        MembersIter {
            inner: self.map.iter(),
            at: self.at,
        }
    }
}

/// An array's elements, each a step.
pub struct Elements<'a> {
    items: &'a [Value],
    at: Metered<'a>,
}

pub struct ElementsIter<'a> {
    inner: std::slice::Iter<'a, Value>,
    at: Metered<'a>,
}

impl<'a> Iterator for ElementsIter<'a> {
    type Item = Metered<'a>;

    fn next(&mut self) -> Option<Metered<'a>> {
        self.inner.next().map(|value| self.at.step(value))
    }
}

impl<'a> Array<'a, Budgeted> for Elements<'a> {
    type Node = Metered<'a>;
    type ElementsIter = ElementsIter<'a>;

    fn len(&self) -> usize {
        self.items.len()
    }

    fn elements(&self) -> ElementsIter<'a> {
        ElementsIter {
            inner: self.items.iter(),
            at: self.at,
        }
    }

    fn is_unique(&self) -> bool {
        // Telling the elements apart reads each of them whole: its size in steps, counted
        // without going past what is left.
        if let Some(budget) = self.at.budget {
            for item in self.items {
                if !budget.charge(weight(item, budget.left())) {
                    return true;
                }
            }
        }
        unique::is_unique(self.items)
    }
}

#[cfg(test)]
mod tests {
    use jsonschema::json::{Array, Node, Object};

    use super::*;

    #[test]
    fn steps_into_members_and_elements_and_long_strings_spend_the_budget() {
        let value = serde_json::json!({"a": [1, 2, 3], "b": "x".repeat(3 * STRING_BYTES_PER_STEP)});
        let budget = Budget::steps(100);
        let root = budget.root(&value);
        let object = root.as_object().expect("an object");
        let a = object.get(&"a".to_string()).expect("a");
        assert_eq!(a.as_array().expect("an array").elements().count(), 3);
        assert_eq!(budget.spent(), 4, "a member and three elements");
        let b = object.get(&"b".to_string()).expect("b");
        assert!(b.as_string().is_some());
        assert_eq!(budget.spent(), 8, "b, and three steps of its bytes");
        assert!(!budget.exhausted());
    }

    #[test]
    fn past_the_budget_every_step_yields_null() {
        let value = serde_json::json!({"a": {"deeper": [1, 2]}, "b": 2});
        let budget = Budget::steps(1);
        let object = budget.root(&value).as_object().expect("the root is walked");
        let a = object.get(&"a".to_string()).expect("a");
        assert!(a.as_object().is_some(), "the first step is within");
        let b = object.get(&"b".to_string()).expect("b");
        assert!(b.is_null() && budget.exhausted(), "the second is not: null");
        assert_eq!(weight(&value, u64::MAX), 6);
        assert!(weight(&value, 2) <= 3, "weighing stops past its limit");
    }

    #[test]
    fn a_budget_with_a_deadline_ends_when_the_time_is_up() {
        let budget = Budget::new(u64::MAX, Duration::ZERO);
        // The clock is read once the count crosses a multiple of CHECK_EVERY.
        assert!(budget.charge(CHECK_EVERY - 1), "no clock read yet");
        assert!(!budget.charge(1), "past the deadline");
        assert!(budget.exhausted());
    }
}
