//! The external decision points (`policy.decisionPoints`, `orchestrator_crds::decision`): each
//! call's input POSTed to each point in order, as Open Policy Agent's data API takes it
//! (`{"input": ...}`), and the call allowed only when every point answers an explicit allow
//! (`{"result": true}` or `{"result": {"allow": true}}`). A `false`, a missing result, any other
//! answer, an HTTP error, a timeout or an unreachable service refuses it (fail closed), with the
//! point's `reason` when it gave one. A point may keep its decisions (`cache`), by the exact
//! input without `time`, for a while.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use orchestrator_crds::decision::{DEFAULT_TTL_SECONDS, DecisionPoint};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The most of an answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The points of one config, in order.
#[derive(Debug, Default)]
pub struct DecisionPoints {
    points: Vec<Point>,
}

#[derive(Debug)]
struct Point {
    index: usize,
    url: reqwest::Url,
    timeout: Duration,
    cache: Option<Cache>,
}

/// A point's kept decisions: at most `entries`, each for `ttl`, the oldest out first.
#[derive(Debug)]
struct Cache {
    entries: usize,
    ttl: Duration,
    kept: Mutex<Kept>,
}

/// A cache key: the hash of an input without its time.
type Key = [u8; 32];
/// The decisions kept, and their keys oldest first.
type Kept = (HashMap<Key, (Instant, Answer)>, VecDeque<Key>);

/// What a point said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Allow,
    /// An explicit refusal, with the point's reason when it gave one.
    Deny(Option<String>),
}

/// What the points decided about a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// A point refused: `rule` names it (`policy.decisionPoints[0] <url>`).
    Denied {
        rule: String,
        reason: Option<String>,
    },
    /// A point gave no decision (unreachable, an error, too slow, an answer that is no
    /// decision): refused all the same.
    Failed {
        rule: String,
        error: String,
    },
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            // A decision point is named by its URL: no redirect to somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default()
    })
}

impl DecisionPoints {
    /// The points of `wire`, or what is wrong with them as (path, message).
    pub fn compile(wire: &[DecisionPoint]) -> Result<Self, Vec<(String, String)>> {
        let mut problems = Vec::new();
        let mut points = Vec::new();
        for (index, p) in wire.iter().enumerate() {
            let at = format!("policy.decisionPoints[{index}]");
            let mut found = p.problems(&at);
            let url = reqwest::Url::parse(p.url.trim());
            if found.is_empty()
                && let Err(e) = &url
            {
                found.push((format!("{at}.url"), format!("{:?}: {e}", p.url)));
            }
            if !found.is_empty() {
                problems.extend(found);
                continue;
            }
            let Ok(url) = url else { continue };
            points.push(Point {
                index,
                url,
                timeout: Duration::from_millis(u64::from(p.timeout_milliseconds())),
                cache: p.cache.map(|c| Cache {
                    entries: c.entries as usize,
                    ttl: Duration::from_secs(u64::from(
                        c.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS),
                    )),
                    kept: Mutex::default(),
                }),
            });
        }
        match problems.is_empty() {
            true => Ok(Self { points }),
            false => Err(problems),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Asks each point about the call whose input is `input` (its `time` included), in order.
    pub async fn decide(&self, input: &Value) -> Verdict {
        let key = self
            .points
            .iter()
            .any(|p| p.cache.is_some())
            .then(|| cache_key(input));
        for point in &self.points {
            let rule = format!("policy.decisionPoints[{}] {}", point.index, point.url);
            let answer = match point.cached(key.as_ref()) {
                Some(answer) => Ok(answer),
                None => point.ask(input).await,
            };
            match answer {
                Ok(Answer::Allow) => point.keep(key.as_ref(), Answer::Allow),
                Ok(Answer::Deny(reason)) => {
                    point.keep(key.as_ref(), Answer::Deny(reason.clone()));
                    return Verdict::Denied { rule, reason };
                }
                Err(error) => return Verdict::Failed { rule, error },
            }
        }
        Verdict::Allow
    }
}

/// The input without `time`, hashed.
fn cache_key(input: &Value) -> [u8; 32] {
    let mut timeless = input.clone();
    if let Some(map) = timeless.as_object_mut() {
        map.remove("time");
    }
    // The canonical JSON's hash: the same input whatever its key order.
    Sha256::digest(orchestrator_crds::digest::sha256_jcs(&timeless)).into()
}

impl Point {
    fn cached(&self, key: Option<&[u8; 32]>) -> Option<Answer> {
        let (cache, key) = (self.cache.as_ref()?, key?);
        let kept = cache.kept.lock().ok()?;
        let (at, answer) = kept.0.get(key)?;
        (at.elapsed() < cache.ttl).then(|| answer.clone())
    }

    fn keep(&self, key: Option<&[u8; 32]>, answer: Answer) {
        let (Some(cache), Some(key)) = (self.cache.as_ref(), key) else {
            return;
        };
        let Ok(mut kept) = cache.kept.lock() else {
            return;
        };
        let (map, order) = &mut *kept;
        if map.insert(*key, (Instant::now(), answer)).is_none() {
            order.push_back(*key);
        }
        while map.len() > cache.entries {
            match order.pop_front() {
                Some(oldest) => {
                    map.remove(&oldest);
                }
                None => break,
            }
        }
    }

    async fn ask(&self, input: &Value) -> Result<Answer, String> {
        let body = json!({ "input": input });
        let sent = client()
            .post(self.url.clone())
            .timeout(self.timeout)
            .json(&body)
            .send();
        let response = match tokio::time::timeout(self.timeout, sent).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) if e.is_timeout() => return Err(self.too_slow()),
            Ok(Err(e)) => return Err(format!("the decision point could not be reached: {e}")),
            Err(_) => return Err(self.too_slow()),
        };
        let status = response.status();
        let mut bytes = Vec::new();
        let mut response = response;
        let read = async {
            while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
                if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(format!("its answer is over {MAX_ANSWER_BYTES} bytes"));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(())
        };
        match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "the decision point's answer could not be read: {e}"
                ));
            }
            Err(_) => return Err(self.too_slow()),
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let text: String = text.chars().take(300).collect();
            return Err(format!("the decision point answered HTTP {status}: {text}"));
        }
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("the decision point's answer is not JSON: {e}"))?;
        decision(&answer)
    }

    fn too_slow(&self) -> String {
        format!(
            "the decision point did not answer within {} ms",
            self.timeout.as_millis()
        )
    }
}

/// The decision in an OPA data API answer.
fn decision(answer: &Value) -> Result<Answer, String> {
    let Some(result) = answer.get("result") else {
        return Err(
            "the decision point has no decision for this input (its answer has no \"result\": \
             the rule is undefined for it, or the URL names no rule)"
                .into(),
        );
    };
    match result {
        Value::Bool(true) => Ok(Answer::Allow),
        Value::Bool(false) => Ok(Answer::Deny(None)),
        Value::Object(o) => {
            let reason = o
                .get("reason")
                .and_then(Value::as_str)
                .map(|r| r.chars().take(1024).collect());
            match o.get("allow") {
                Some(Value::Bool(true)) => Ok(Answer::Allow),
                Some(Value::Bool(false)) => Ok(Answer::Deny(reason)),
                _ => Err(
                    "the decision point's result has no boolean \"allow\"; answer true, false or \
                     {\"allow\": bool, \"reason\": string}"
                        .into(),
                ),
            }
        }
        other => Err(format!(
            "the decision point's result is {}, not a decision; answer true, false or \
             {{\"allow\": bool, \"reason\": string}}",
            match other {
                Value::Null => "null",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "a list",
                _ => "something else",
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_allow_allows() {
        assert_eq!(decision(&json!({"result": true})), Ok(Answer::Allow));
        assert_eq!(
            decision(&json!({"result": {"allow": true}})),
            Ok(Answer::Allow)
        );
        assert_eq!(decision(&json!({"result": false})), Ok(Answer::Deny(None)));
        assert_eq!(
            decision(&json!({"result": {"allow": false, "reason": "protected branch"}})),
            Ok(Answer::Deny(Some("protected branch".into())))
        );
        for no in [
            json!({}),
            json!({"result": null}),
            json!({"result": "yes"}),
            json!({"result": {"reason": "x"}}),
            json!({"result": {"allow": "true"}}),
        ] {
            assert!(decision(&no).is_err(), "{no}");
        }
    }

    #[test]
    fn bad_points_are_refused_naming_the_field() {
        let wire: Vec<DecisionPoint> = serde_json::from_value(json!([
            {"url": "opa:8181/v1/data/x"},
            {"url": "http://127.0.0.1:8181/v1/data/x", "timeoutMilliseconds": 1},
            {"url": "http://127.0.0.1:8181/v1/data/x", "cache": {"entries": 0}},
        ]))
        .expect("wire");
        let problems = DecisionPoints::compile(&wire).expect_err("refused");
        let paths: Vec<&str> = problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "policy.decisionPoints[0].url",
                "policy.decisionPoints[1].timeoutMilliseconds",
                "policy.decisionPoints[2].cache.entries"
            ]
        );
    }

    #[test]
    fn the_cache_key_leaves_out_the_time_and_the_cache_is_bounded() {
        let a = json!({"tool": {"name": "x"}, "args": {"a": 1}, "time": "2026-11-30T10:00:00Z"});
        let b = json!({"args": {"a": 1}, "time": "2026-11-30T10:00:01Z", "tool": {"name": "x"}});
        let c = json!({"args": {"a": 2}, "time": "2026-11-30T10:00:01Z", "tool": {"name": "x"}});
        assert_eq!(cache_key(&a), cache_key(&b));
        assert_ne!(cache_key(&a), cache_key(&c));
        let wire: Vec<DecisionPoint> = serde_json::from_value(json!([
            {"url": "http://127.0.0.1:9/v1/data/x", "cache": {"entries": 2, "ttlSeconds": 60}}]))
        .expect("wire");
        let points = DecisionPoints::compile(&wire).expect("compiles");
        let point = &points.points[0];
        for n in 0..5 {
            point.keep(Some(&cache_key(&json!({"n": n}))), Answer::Allow);
        }
        let kept = point
            .cache
            .as_ref()
            .map(|c| c.kept.lock().map(|k| k.0.len()).unwrap_or(0));
        assert_eq!(kept, Some(2));
        assert_eq!(
            point.cached(Some(&cache_key(&json!({"n": 4})))),
            Some(Answer::Allow)
        );
        assert_eq!(point.cached(Some(&cache_key(&json!({"n": 0})))), None);
    }
}
