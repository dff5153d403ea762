//! Each runtime's output, read into a [`Report`] (`None`: it holds no result). What each field
//! means per runtime is in docs/api.md ("The agent's result").

use serde_json::{Map, Value};

use crate::report::fields::{Report, at, object, string, usd, whole};

/// Claude Code's `--output-format json`: one object, its fields as they are.
pub fn claude_code(output: &str) -> Option<Report> {
    let v = object(output)?;
    if !["subtype", "result", "is_error"]
        .iter()
        .any(|k| v.contains_key(*k))
    {
        return None;
    }
    let mut r = Report::default();
    if let Some(subtype) = string(&v, &["subtype"]) {
        r.short("subtype", subtype);
    }
    if let Some(failed) = v.get("is_error").and_then(Value::as_bool) {
        r.flag("isError", failed);
    }
    r.maybe_count("turns", whole(v.get("num_turns")));
    for (key, field) in [
        ("inputTokens", "input_tokens"),
        ("outputTokens", "output_tokens"),
        ("cacheReadInputTokens", "cache_read_input_tokens"),
        ("cacheCreationInputTokens", "cache_creation_input_tokens"),
    ] {
        r.maybe_count(key, whole(at(&v, &["usage", field])));
    }
    if let Some(cost) = usd(v.get("total_cost_usd")) {
        r.cost("costUsd", cost);
    }
    r.maybe_count("durationMs", whole(v.get("duration_ms")));
    if let Some(id) = string(&v, &["session_id"]) {
        r.short("sessionId", id);
    }
    r.text = string(&v, &["result"]).map(str::to_string);
    Some(r)
}

/// Codex's `exec --json` events, one object a line: the last agent message is the answer, the
/// usage of each completed turn adds up (`input_tokens` counts the cached ones too), and a
/// failed turn or an error event makes the run an error. Lines that are no object are skipped.
pub fn codex(output: &str, code: i32) -> Option<Report> {
    let (mut answer, mut problem, mut session) = (None::<String>, None::<String>, None::<String>);
    let (mut turns, mut done, mut failed) = (0u64, false, false);
    let [mut input, mut cached, mut written, mut out] = [0u64; 4];
    for v in output.lines().filter_map(object) {
        match string(&v, &["type"]).unwrap_or_default() {
            "thread.started" => session = owned(&v, &["thread_id"]).or(session),
            "item.completed" if string(&v, &["item", "type"]) == Some("agent_message") => {
                answer = owned(&v, &["item", "text"]).or(answer);
            }
            "turn.completed" => {
                turns += 1;
                done = true;
                let usage = |k: &str| whole(at(&v, &["usage", k])).unwrap_or(0);
                input = input.saturating_add(usage("input_tokens"));
                cached = cached.saturating_add(usage("cached_input_tokens"));
                written = written.saturating_add(usage("cache_write_input_tokens"));
                out = out.saturating_add(usage("output_tokens"));
            }
            "turn.failed" => {
                turns += 1;
                failed = true;
                problem = owned(&v, &["error", "message"]).or(problem);
            }
            "error" => {
                failed = true;
                problem = owned(&v, &["message"]).or(problem);
            }
            _ => {}
        }
    }
    if !done && !failed {
        return None;
    }
    let mut r = Report::default();
    r.outcome(failed || code != 0);
    r.count("turns", turns);
    r.count("inputTokens", input.saturating_sub(cached));
    r.count("outputTokens", out);
    r.count("cacheReadInputTokens", cached);
    r.count("cacheCreationInputTokens", written);
    if let Some(id) = session {
        r.short("sessionId", &id);
    }
    r.text = answer.filter(|a| !a.is_empty()).or(problem);
    Some(r)
}

/// Gemini CLI's `-o json`: one object. `response` is the answer, the tokens of every model it
/// used add up (`input` is the uncached prompt; thoughts are output), turns are the requests of
/// the main role, and `error` (or exit code 53, its turn limit) makes the run an error.
pub fn gemini(output: &str, code: i32) -> Option<Report> {
    let v = object(output)?;
    let error_message = string(&v, &["error", "message"]);
    if !v.contains_key("response") && !v.contains_key("session_id") && error_message.is_none() {
        return None;
    }
    let [mut input, mut cached, mut out, mut turns] = [0u64; 4];
    let models = at(&v, &["stats", "models"]).and_then(Value::as_object);
    for model in models.into_iter().flat_map(Map::values) {
        let Some(model) = model.as_object() else {
            continue;
        };
        let tokens = |k: &str| whole(at(model, &["tokens", k])).unwrap_or(0);
        input = input.saturating_add(tokens("input"));
        cached = cached.saturating_add(tokens("cached"));
        out = out
            .saturating_add(tokens("candidates"))
            .saturating_add(tokens("thoughts"));
        let requests = whole(at(model, &["roles", "main", "totalRequests"]));
        turns = turns.saturating_add(requests.unwrap_or(0));
    }
    let failed = error_message.is_some() || at(&v, &["error", "type"]).is_some();
    let mut r = Report::default();
    if code == 53 {
        r.short("subtype", "error_max_turns");
        r.flag("isError", true);
    } else {
        r.outcome(failed || code != 0);
    }
    r.count("turns", turns);
    r.count("inputTokens", input);
    r.count("outputTokens", out);
    r.count("cacheReadInputTokens", cached);
    if let Some(id) = string(&v, &["session_id"]) {
        r.short("sessionId", id);
    }
    let answer = string(&v, &["response"]).filter(|a| !a.is_empty());
    r.text = answer.or(error_message).map(str::to_string);
    Some(r)
}

/// OpenCode's `--format json` events, one object a line: the last text part is the answer,
/// each `step_finish` is a turn whose tokens and cost add up, and an error event makes the run
/// an error. (Its events carry the time they were written, not when their step ran: no
/// duration.)
pub fn opencode(output: &str, code: i32) -> Option<Report> {
    let (mut answer, mut problem, mut session) = (None::<String>, None::<String>, None::<String>);
    let (mut turns, mut failed, mut cost) = (0u64, false, None::<f64>);
    let [mut input, mut out, mut read, mut written] = [0u64; 4];
    for v in output.lines().filter_map(object) {
        if session.is_none() {
            session = owned(&v, &["sessionID"]);
        }
        match string(&v, &["type"]).unwrap_or_default() {
            "text" => answer = owned(&v, &["part", "text"]).or(answer),
            "step_finish" => {
                turns += 1;
                let tokens = |path: &[&str]| {
                    let path: Vec<&str> = ["part", "tokens"].iter().chain(path).copied().collect();
                    whole(at(&v, &path)).unwrap_or(0)
                };
                input = input.saturating_add(tokens(&["input"]));
                out = out
                    .saturating_add(tokens(&["output"]))
                    .saturating_add(tokens(&["reasoning"]));
                read = read.saturating_add(tokens(&["cache", "read"]));
                written = written.saturating_add(tokens(&["cache", "write"]));
                if let Some(c) = usd(at(&v, &["part", "cost"])) {
                    cost = Some(cost.unwrap_or(0.0) + c);
                }
            }
            "error" => {
                failed = true;
                problem = owned(&v, &["error", "data", "message"])
                    .or_else(|| owned(&v, &["error", "name"]))
                    .or(problem);
            }
            _ => {}
        }
    }
    if turns == 0 && !failed {
        return None;
    }
    let mut r = Report::default();
    r.outcome(failed || code != 0);
    r.count("turns", turns);
    r.count("inputTokens", input);
    r.count("outputTokens", out);
    r.count("cacheReadInputTokens", read);
    r.count("cacheCreationInputTokens", written);
    if let Some(usd) = cost {
        r.cost("costUsd", usd);
    }
    if let Some(id) = session {
        r.short("sessionId", &id);
    }
    r.text = answer.filter(|a| !a.is_empty()).or(problem);
    Some(r)
}

/// The string at `path`, owned (it outlives its line).
fn owned(v: &Map<String, Value>, path: &[&str]) -> Option<String> {
    string(v, path).map(str::to_string)
}
