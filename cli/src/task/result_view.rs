//! How a finished task is shown: `status.result` (what the agent reported: outcome, turns,
//! tokens, cost, duration, its final text) and `status.cancellation` (who cancelled, when).
//!
//! Everything in `status.result` is the agent's claim, read from a file the agent wrote: a
//! prompt-injected agent can put anything there. Every string of it is printed through
//! [`visible`], so control characters, ANSI escapes, bidi overrides and zero-width characters
//! appear as `\u{…}` instead of acting on the terminal, and the final text keeps its line breaks
//! only as separate indented lines.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use orchestrator_crds::taskrun::TaskRun;
use orchestrator_crds::taskrun::result::{CANCEL_ANNOTATION, CancelRequest, TaskResult};

use crate::output::{age, visible};

/// The most characters of a table cell taken from the result (RESULT column).
const CELL_CHARS: usize = 24;

/// The RESULT, TURNS and COST cells of the list table.
pub fn cells(tr: &TaskRun) -> [String; 3] {
    let Some(r) = tr.status.as_ref().and_then(|s| s.result.as_ref()) else {
        return ["".into(), "".into(), "".into()];
    };
    let outcome = match (&r.subtype, &r.error) {
        (Some(s), _) => clip(&visible(s), CELL_CHARS),
        (None, Some(_)) => "(unreadable)".into(),
        (None, None) => match r.is_error {
            Some(true) => "error".into(),
            _ => "".into(),
        },
    };
    [
        outcome,
        r.turns.map(|t| t.to_string()).unwrap_or_default(),
        r.cost_usd
            .as_deref()
            .map(|c| format!("${}", visible(c)))
            .unwrap_or_default(),
    ]
}

fn clip(s: &str, chars: usize) -> String {
    if s.chars().count() <= chars {
        return s.to_string();
    }
    s.chars().take(chars - 1).collect::<String>() + "…"
}

/// `5400` ms as `5.4s`, `125000` as `2m5s`.
pub fn duration(ms: i64) -> String {
    let secs = ms / 1000;
    match secs {
        s if s < 60 => format!("{}.{}s", s, (ms % 1000) / 100),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// What the proxy counted, in one line (the console): `12 requests (2 refused by the budget),
/// 5400 tokens in, 310 out, $0.021; budget spent (spec.budget.outputTokens)`.
pub fn usage_line(u: &orchestrator_crds::gateway::ModelUsage) -> String {
    let mut line = format!(
        "{} requests{}, {} tokens in, {} out",
        u.requests,
        refused(u),
        tokens_in(u),
        u.output_tokens
    );
    if let Some(c) = &u.cost_usd {
        line.push_str(&format!(", ${}", visible(c)));
    }
    if let Some(limit) = &u.exceeded {
        line.push_str(&format!("; budget spent (spec.budget.{})", visible(limit)));
    }
    line
}

/// `status.usage`: what the task's proxy counted from the model's answers (not the agent's
/// claim), and whether the budget stops it.
pub fn usage_section(tr: &TaskRun) -> String {
    let Some(u) = tr.status.as_ref().and_then(|s| s.usage.as_ref()) else {
        return String::new();
    };
    let mut out = String::from("Usage (counted by the task's proxy from the model's answers):\n");
    out.push_str(&format!(
        "  Requests:  {}{}\n  Tokens:    {} in ({} cache writes, {} cache reads), {} out\n",
        u.requests,
        refused(u),
        tokens_in(u),
        u.cache_creation_input_tokens,
        u.cache_read_input_tokens,
        u.output_tokens
    ));
    if let Some(c) = &u.cost_usd {
        out.push_str(&format!("  Cost:      ${}\n", visible(c)));
    }
    if let Some(limit) = &u.exceeded {
        out.push_str(&format!(
            "  Budget:    spent (spec.budget.{}): its model requests are refused\n",
            visible(limit)
        ));
    }
    out
}

/// ` (2 refused by the budget)`, or nothing.
fn refused(u: &orchestrator_crds::gateway::ModelUsage) -> String {
    if u.refused > 0 {
        format!(" ({} refused by the budget)", u.refused)
    } else {
        String::new()
    }
}

/// Input tokens of every kind (cache writes and reads included), as budgets count them.
fn tokens_in(u: &orchestrator_crds::gateway::ModelUsage) -> u64 {
    u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens
}

/// The describe section of the result: `Result (reported by the agent):` and its fields, or a
/// line saying there is none (yet).
pub fn result_section(tr: &TaskRun) -> String {
    let status = tr.status.clone().unwrap_or_default();
    let finished = status.phase.is_some_and(|p| p.is_terminal());
    let Some(r) = &status.result else {
        return if finished {
            "Result:      <none> (the agent reported nothing)\n".into()
        } else {
            "Result:      <none yet> (the agent reports when it finishes)\n".into()
        };
    };
    let mut out = String::from("Result (reported by the agent; its claim, not checked):\n");
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<10} {v}\n"));
    if let Some(e) = &r.error {
        line("Unreadable:", visible(e));
    }
    if let Some(s) = &r.subtype {
        line("Outcome:", visible(s));
    }
    if let Some(e) = r.is_error {
        line("Error:", if e { "yes" } else { "no" }.into());
    }
    if let Some(t) = r.turns {
        line("Turns:", t.to_string());
    }
    if let Some(tokens) = tokens(r) {
        line("Tokens:", tokens);
    }
    if let Some(c) = &r.cost_usd {
        line("Cost:", format!("${} (USD)", visible(c)));
    }
    if let Some(d) = r.duration_ms {
        line("Duration:", duration(d));
    }
    if let Some(s) = &r.session_id {
        line("Session:", visible(s));
    }
    if let Some(text) = &r.text {
        out.push_str(&format!(
            "  Text{}:\n",
            if r.text_truncated { " (truncated)" } else { "" }
        ));
        // Each line escaped on its own: a carriage return or escape inside a line is shown, and
        // only line feeds break lines.
        for l in text.split('\n') {
            out.push_str(&format!("    {}\n", visible(l)).replace("    \n", "\n"));
        }
    }
    out
}

fn tokens(r: &TaskResult) -> Option<String> {
    if r.input_tokens.is_none() && r.output_tokens.is_none() {
        return None;
    }
    let n = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_else(|| "?".into());
    let mut s = format!("{} in, {} out", n(r.input_tokens), n(r.output_tokens));
    if r.cache_read_input_tokens.is_some() || r.cache_creation_input_tokens.is_some() {
        s.push_str(&format!(
            " (cache: {} read, {} written)",
            n(r.cache_read_input_tokens),
            n(r.cache_creation_input_tokens)
        ));
    }
    Some(s)
}

/// Who cancelled the task (status.cancellation), or who asked and the operator has not acted
/// on it yet (the annotation only). `None` when nobody did.
pub fn cancellation_line(tr: &TaskRun, now: Timestamp) -> Option<String> {
    if let Some(c) = tr.status.as_ref().and_then(|s| s.cancellation.as_ref()) {
        return Some(format!(
            "by {} at {} ({} ago)",
            visible(&c.requested_by),
            c.time.0,
            age(c.time.0, now)
        ));
    }
    let asked = tr.annotations().get(CANCEL_ANNOTATION)?;
    Some(format!(
        "requested by {}; the operator has not stopped the task yet",
        visible(&CancelRequest::parse(asked).user)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taskrun(annotations: serde_json::Value, status: serde_json::Value) -> TaskRun {
        serde_json::from_value(json!({
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
            "metadata": {"name": "t", "namespace": "n", "annotations": annotations},
            "spec": {"taskId": 1, "serviceName": "s", "task": {"prompt": "x"}},
            "status": status,
        }))
        .expect("valid TaskRun")
    }

    fn now() -> Timestamp {
        "2025-01-01T00:05:00Z".parse().expect("valid")
    }

    #[test]
    fn a_result_shows_every_field() {
        let tr = taskrun(
            json!({}),
            json!({"phase": "Succeeded", "result": {"subtype": "success", "isError": false,
                "text": "All done.\nTwo files changed.", "turns": 3, "inputTokens": 1200,
                "outputTokens": 45, "cacheReadInputTokens": 7, "costUsd": "0.0123",
                "durationMs": 5400, "sessionId": "abc"}}),
        );
        assert_eq!(
            result_section(&tr),
            "\
Result (reported by the agent; its claim, not checked):
  Outcome:   success
  Error:     no
  Turns:     3
  Tokens:    1200 in, 45 out (cache: 7 read, ? written)
  Cost:      $0.0123 (USD)
  Duration:  5.4s
  Session:   abc
  Text:
    All done.
    Two files changed.
"
        );
        assert_eq!(cells(&tr), ["success", "3", "$0.0123"]);
    }

    #[test]
    fn hostile_result_text_cannot_act_on_the_terminal() {
        // ANSI (clear screen, a fake prompt in colour), a carriage return that would overwrite
        // the line, a bidi override that reverses what follows, C1 CSI, zero-width space.
        let text = "ok\u{1b}[2J\u{1b}[31mFAKE\rRESULT: approved\u{202e}evil\u{9b}1m\u{200b}x";
        let tr = taskrun(
            json!({}),
            json!({"phase": "Succeeded", "result": {"subtype": "succ\u{1b}[0mess\u{7}",
                "text": text, "costUsd": "1\u{202e}0", "sessionId": "\u{0}"}}),
        );
        let out = result_section(&tr);
        for bad in [
            '\u{1b}', '\r', '\u{202e}', '\u{9b}', '\u{200b}', '\u{7}', '\u{0}',
        ] {
            assert!(!out.contains(bad), "{bad:?} printed raw in {out:?}");
        }
        assert!(
            out.contains(
                "ok\\u{1b}[2J\\u{1b}[31mFAKE\\u{d}RESULT: approved\\u{202e}evil\\u{9b}1m\\u{200b}x"
            ),
            "{out}"
        );
        let [outcome, _, cost] = cells(&tr);
        assert_eq!(outcome, "succ\\u{1b}[0mess\\u{7}");
        assert_eq!(cost, "$1\\u{202e}0");
    }

    #[test]
    fn no_result_unreadable_result_and_truncated_text() {
        let running = taskrun(json!({}), json!({"phase": "Running"}));
        assert!(result_section(&running).contains("<none yet>"));
        assert_eq!(cells(&running), ["", "", ""]);
        let silent = taskrun(json!({}), json!({"phase": "Failed"}));
        assert!(result_section(&silent).contains("the agent reported nothing"));
        let bad = taskrun(
            json!({}),
            json!({"phase": "Failed", "result": {"error": "not a result: \u{1b}[31m"}}),
        );
        assert!(
            result_section(&bad).contains("Unreadable: not a result: \\u{1b}[31m"),
            "{}",
            result_section(&bad)
        );
        assert_eq!(cells(&bad)[0], "(unreadable)");
        let cut = taskrun(
            json!({}),
            json!({"phase": "Succeeded", "result": {"text": "a", "textTruncated": true}}),
        );
        assert!(result_section(&cut).contains("  Text (truncated):\n    a\n"));
        let long = taskrun(json!({}), json!({"result": {"subtype": "s".repeat(100)}}));
        assert_eq!(cells(&long)[0].chars().count(), CELL_CHARS);
    }

    #[test]
    fn cancellation_names_who_and_when_or_who_asked() {
        let done = taskrun(
            json!({CANCEL_ANNOTATION: r#"{"user":"alice"}"#}),
            json!({"phase": "Cancelled", "cancellation": {"requestedBy": "alice",
                "time": "2025-01-01T00:04:00Z"}}),
        );
        assert_eq!(
            cancellation_line(&done, now()).as_deref(),
            Some("by alice at 2025-01-01T00:04:00Z (60s ago)")
        );
        let asked = taskrun(
            json!({CANCEL_ANNOTATION: "{\"user\":\"bob\\u001b[2J\"}"}),
            json!({"phase": "Running"}),
        );
        assert_eq!(
            cancellation_line(&asked, now()).as_deref(),
            Some("requested by bob\\u{1b}[2J; the operator has not stopped the task yet")
        );
        assert_eq!(
            cancellation_line(&taskrun(json!({}), json!({})), now()),
            None
        );
    }

    #[test]
    fn durations_read_like_ages() {
        assert_eq!(duration(5400), "5.4s");
        assert_eq!(duration(125_000), "2m5s");
        assert_eq!(duration(7_380_000), "2h3m");
    }
}
