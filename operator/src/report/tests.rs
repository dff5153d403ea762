use orchestrator_crds::taskrun::AgentRuntime;
use orchestrator_crds::taskrun::result::{MESSAGE_BYTES, TaskResult};
use serde_json::json;

use crate::report::fields::{Report, clip_json, object, whole};
use crate::report::{Outcome, no_result, reduce};

fn read(message: &str) -> TaskResult {
    assert!(message.len() < MESSAGE_BYTES, "{} bytes", message.len());
    TaskResult::from_termination_message(message)
        .expect("a result object")
        .expect("not empty")
}

/// The clip counts bytes as serde_json writes them, and never cuts a character in two.
#[test]
fn a_clip_takes_what_its_json_takes_and_never_cuts_a_character() {
    let s = "a\"\\\n\u{1}é😀\t✓".repeat(50);
    for max in 0..200 {
        let (clipped, cut) = clip_json(&s, max);
        let written = serde_json::to_string(&clipped).expect("JSON").len() - 2;
        assert!(written <= max, "{max}: {written}");
        assert!(cut, "{max}");
        // One more character would not have fitted.
        let next = s[clipped.len()..].chars().next().expect("more");
        let longer = format!("{clipped}{next}");
        assert!(serde_json::to_string(&longer).expect("JSON").len() - 2 > max);
    }
    assert_eq!(clip_json("short", 10), ("short".into(), false));
}

/// A lone surrogate escape (a JavaScript string cut inside an emoji) reads as U+FFFD; a pair
/// reads as its character, and an escaped backslash before `u` is left alone.
#[test]
fn a_lone_surrogate_reads_as_a_replacement_character() {
    let v = object(r#"{"a":"x\ud83dy","b":"\ud83d\ude00","c":"\\ud83d","d":"\ude00\ud83d"}"#)
        .expect("an object");
    assert_eq!(v["a"], "x\u{fffd}y");
    assert_eq!(v["b"], "😀");
    assert_eq!(v["c"], "\\ud83d");
    assert_eq!(v["d"], "\u{fffd}\u{fffd}");
    for not_one in ["[1]", "{\"a\":1} trailing", "", "{", "1"] {
        assert!(object(not_one).is_none(), "{not_one}");
    }
}

#[test]
fn only_whole_numbers_written_as_numbers_are_counts() {
    for (v, want) in [
        (json!(42), Some(42)),
        (json!(0), Some(0)),
        (json!(-5), None),
        (json!("7"), None),
        (json!(1e3), None),
        (json!(1.5), None),
        (json!(u64::MAX), None),
    ] {
        assert_eq!(whole(Some(&v)), want, "{v}");
    }
}

/// Whatever the strings hold (controls escape to six bytes each), the report is valid JSON
/// under the kubelet's 4096 bytes, with every field the reducer set.
#[test]
fn the_worst_report_still_fits_and_reads() {
    let controls = "\u{1}".repeat(10_000);
    let mut r = Report::default();
    r.short("subtype", &controls);
    r.short("sessionId", &controls);
    r.flag("isError", true);
    for key in ["turns", "inputTokens", "outputTokens", "durationMs"] {
        r.count(key, 1 << 53);
    }
    r.cost("costUsd", 123456.123456);
    r.text = Some(controls.clone());
    let message = r.message();
    let result = read(&message);
    assert!(result.text_truncated);
    assert!(result.text.is_some_and(|t| t.len() > 100));
    assert_eq!(result.turns, Some(1 << 53));
    assert_eq!(result.cost_usd.as_deref(), Some("123456.123456"));
}

#[test]
fn a_cost_keeps_nine_decimals_without_trailing_zeros() {
    for (usd, want) in [(0.000405 * 3.0, "0.001215"), (0.0123, "0.0123"), (2.0, "2")] {
        let mut r = Report::default();
        r.cost("costUsd", usd);
        assert_eq!(read(&r.message()).cost_usd.as_deref(), Some(want), "{usd}");
    }
}

/// The script's note (its own words, quotes and paths in them) is the text of a valid report.
#[test]
fn no_result_says_the_notes_words_or_the_runtime_and_its_code() {
    let note = r#"Gemini CLI did not start: "/etc/gemini-cli/settings.json" is missing \ odd"#;
    let r = read(&no_result(AgentRuntime::GeminiCli, 1, Some(note)));
    assert_eq!(r.text.as_deref(), Some(note));
    assert_eq!(
        (r.subtype.as_deref(), r.is_error),
        (Some("error_no_result"), Some(true))
    );
    let r = read(&no_result(AgentRuntime::Codex, 137, Some("")));
    assert_eq!(
        r.text.as_deref(),
        Some("Codex exited with code 137 without a JSON result (its output is in the log)")
    );
    let out = reduce(AgentRuntime::ClaudeCode, b"\xff\xfe not json", 1, None);
    assert!(matches!(out, Outcome::NoResult { .. }), "{out:?}");
}
