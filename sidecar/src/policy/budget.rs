//! A bound on the work of one argument validation. JSON Schema validation can cost exponential
//! time: a union of object types sharing a recursive `$ref` (a tree of document blocks, say)
//! evaluates each nested value once per branch at every level, so a short request nested a few
//! dozen levels deep never finishes. The validator cannot be interrupted, so instead the instance
//! it walks is: [`Metered`] is the arguments as the `jsonschema` crate sees them, and every step
//! into a member or element spends from a [`Budget`]. Once the budget is spent (in steps, or a
//! wall-clock deadline checked every few steps), every further step yields `null`: nothing
//! below it is walked, so the validation finishes in a few more steps with a result the caller
//! throws away (it asks [`Budget::exhausted`] and refuses the call).

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
        if self.exhausted.load(Ordering::Relaxed) {
            return false;
        }
        let spent = self.spent.fetch_add(1, Ordering::Relaxed) + 1;
        let out_of_steps = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err();
        let out_of_time =
            spent.is_multiple_of(CHECK_EVERY) && self.deadline.is_some_and(|d| Instant::now() >= d);
        if out_of_steps || out_of_time {
            self.exhausted.store(true, Ordering::Relaxed);
            return false;
        }
        true
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
            Value::String(s) => Some(Cow::Borrowed(s)),
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
        // Comparing every pair is the work of one step per element.
        for _ in self.items {
            if !self.at.budget.is_none_or(Budget::spend) {
                return true;
            }
        }
        unique::is_unique(self.items)
    }
}
