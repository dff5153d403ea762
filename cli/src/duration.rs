//! The one duration grammar of every flag that takes a duration (`--timeout`, `--since`): as
//! kubectl's and Go's, one or more `<number><unit>` in a row, the number may have a fraction
//! (`500ms`, `90s`, `1.5h`, `1h30m`, `2d`); a bare number is seconds. `--since` also takes an
//! RFC 3339 time and is sent to the proxy in a form it reads (whole seconds or milliseconds).

use std::time::Duration;

/// What a duration flag takes, for its error message.
pub const ACCEPTED: &str = "accepted: a number and a unit, several in a row, as kubectl's \
                            (500ms, 90s, 1.5h, 1h30m, 2d; units ms, s, m, h, d); a bare number \
                            is seconds";

/// Parses a duration of the grammar above.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let wrong = |why: &str| format!("{text:?}: {why}; {ACCEPTED}");
    if text.is_empty() {
        return Err(wrong("empty"));
    }
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        if number.is_empty() {
            return Err(wrong("expected a number before each unit"));
        }
        let n: f64 = number
            .parse()
            .map_err(|_| wrong(&format!("{number:?} is not a number")))?;
        let letters = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(letters);
        let seconds = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => return Err(wrong(&format!("{number} has no unit"))),
            other => return Err(wrong(&format!("unknown unit {other:?}"))),
        };
        total += n * seconds;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| wrong("too long"))
}

/// `--since`: an RFC 3339 time as it is, or a duration of the grammar above, written for the
/// proxy as whole seconds (`5400s`) or milliseconds (`1500ms`).
pub fn parse_since(text: &str) -> Result<String, String> {
    if text.parse::<k8s_openapi::jiff::Timestamp>().is_ok() {
        return Ok(text.to_string());
    }
    let d = parse(text).map_err(|e| format!("{e}; or an RFC 3339 time (2026-05-01T12:00:00Z)"))?;
    Ok(if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_durations_parse_everywhere() {
        assert_eq!(parse("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1m0.5s"), Ok(Duration::from_millis(60_500)));
    }

    #[test]
    fn a_wrong_duration_says_what_is_accepted() {
        for (text, says) in [
            ("5x", "unknown unit \"x\""),
            ("m", "expected a number"),
            ("10m5", "5 has no unit"),
            ("", "empty"),
            ("1..5h", "is not a number"),
            ("-5m", "expected a number"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.contains("500ms, 90s, 1.5h, 1h30m, 2d"), "{e}");
        }
    }

    #[test]
    fn since_takes_a_time_or_the_same_durations() {
        assert_eq!(parse_since("1.5h"), Ok("5400s".into()));
        assert_eq!(parse_since("1500ms"), Ok("1500ms".into()));
        assert_eq!(
            parse_since("2026-01-01T00:00:00+01:00"),
            Ok("2026-01-01T00:00:00+01:00".into())
        );
        let e = parse_since("yesterday").expect_err("neither");
        assert!(e.contains("RFC 3339"), "{e}");
    }
}
