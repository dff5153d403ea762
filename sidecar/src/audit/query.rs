//! The query of `GET /audit`: its parameters, parsed once with an error that names the bad one,
//! and the match of one kept record.

use super::ring::Entry;

/// Records answered when the query gives no `limit`.
pub const DEFAULT_LIMIT: usize = 1_000;

/// The parameters `GET /audit` takes.
pub const PARAMETERS: &[&str] = &["decision", "risk", "server", "tool", "since", "limit"];

/// A parsed query: every filter given must hold ("and").
#[derive(Debug, Default)]
pub struct Query {
    /// Exact decision (`allowed`, `denied`, ...: any string, so new decisions need no change).
    pub decision: Option<String>,
    /// Exact risk class (`read`, `write`, `destructive`).
    pub risk: Option<String>,
    /// The upstream server.
    pub server: Option<String>,
    /// The name the client called or the upstream tool's name.
    pub tool: Option<String>,
    /// Records at or after this instant.
    pub since: Option<jiff::Timestamp>,
    /// The newest this many matches.
    pub limit: usize,
}

/// A parameter `GET /audit` cannot use, and what it accepts.
#[derive(Debug, PartialEq, Eq)]
pub struct BadParameter {
    pub parameter: String,
    pub message: String,
}

impl std::fmt::Display for BadParameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "parameter {:?}: {}", self.parameter, self.message)
    }
}

impl Query {
    /// Parses the query's `(name, value)` pairs; `since` as a duration counts back from `now`.
    pub fn parse(pairs: &[(String, String)], now: jiff::Timestamp) -> Result<Self, BadParameter> {
        let mut query = Query {
            limit: DEFAULT_LIMIT,
            ..Default::default()
        };
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in pairs {
            let bad = |message: String| BadParameter {
                parameter: crate::names::clip(name).into_owned(),
                message,
            };
            let Some(known) = PARAMETERS.iter().find(|p| **p == name) else {
                return Err(bad(format!(
                    "unknown parameter; accepted: {}",
                    PARAMETERS.join(", ")
                )));
            };
            if seen.contains(known) {
                return Err(bad("given more than once; give it once".into()));
            }
            seen.push(known);
            let text = || Some(value.clone());
            match *known {
                "decision" => query.decision = text(),
                "risk" => query.risk = text(),
                "server" => query.server = text(),
                "tool" => query.tool = text(),
                "since" => query.since = Some(parse_since(value, now).map_err(bad)?),
                _ => query.limit = parse_limit(value).map_err(bad)?,
            }
        }
        Ok(query)
    }

    /// Whether `entry` passes every filter given.
    pub fn matches(&self, entry: &Entry) -> bool {
        let is = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| have == Some(w))
        };
        is(&self.decision, Some(&entry.decision))
            && is(&self.risk, entry.risk.as_deref())
            && is(&self.server, entry.server.as_deref())
            && self
                .tool
                .as_deref()
                .is_none_or(|t| *entry.tool == *t || entry.upstream_tool.as_deref() == Some(t))
            && self
                .since
                .is_none_or(|since| entry.ts.is_some_and(|ts| ts >= since))
    }
}

/// An RFC 3339 instant, or a duration back from `now` (`90s`, `10m`, `1h30m`, `2d`).
fn parse_since(value: &str, now: jiff::Timestamp) -> Result<jiff::Timestamp, String> {
    let accepted = "accepted: an RFC 3339 time (2026-05-01T12:00:00Z) or a duration back from \
                    now (90s, 10m, 1h30m, 2d)";
    if let Ok(at) = value.parse::<jiff::Timestamp>() {
        return Ok(at);
    }
    let span: jiff::Span = value
        .parse()
        .map_err(|_| format!("{:?} is neither; {accepted}", crate::names::clip(value)))?;
    if span.is_negative() {
        return Err(format!("a negative duration; {accepted}"));
    }
    // Days as 24 hours: the proxy counts back in UTC.
    let back = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|e| format!("{e}; {accepted}"))?;
    now.checked_sub(back)
        .map_err(|_| format!("{value:?} reaches back too far; {accepted}"))
}

fn parse_limit(value: &str) -> Result<usize, String> {
    match value.parse::<u64>() {
        Ok(0) | Err(_) => Err(format!(
            "{:?} is not a positive whole number; accepted: 1 or more (records beyond what \
             the proxy keeps are not there to return)",
            crate::names::clip(value)
        )),
        // A huge limit costs nothing: the answer is bounded by the records kept.
        Ok(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::ring::{
        Ring,
        tests::{entry, ids, record},
    };

    fn parse(pairs: &[(&str, &str)]) -> Result<Query, BadParameter> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Query::parse(&pairs, "2026-01-01T01:00:00Z".parse().expect("ts"))
    }

    #[test]
    fn parses_every_parameter() {
        let q = parse(&[
            ("decision", "denied"),
            ("risk", "write"),
            ("server", "gh"),
            ("tool", "create_issue"),
            ("since", "1h30m"),
            ("limit", "5"),
        ])
        .expect("valid");
        assert_eq!(q.decision.as_deref(), Some("denied"));
        assert_eq!(q.risk.as_deref(), Some("write"));
        assert_eq!(q.server.as_deref(), Some("gh"));
        assert_eq!(q.tool.as_deref(), Some("create_issue"));
        assert_eq!(q.since, Some("2025-12-31T23:30:00Z".parse().expect("ts")));
        assert_eq!(q.limit, 5);
        assert_eq!(parse(&[]).expect("valid").limit, DEFAULT_LIMIT);
        let at = parse(&[("since", "2026-01-01T00:59:00+01:00")]).expect("valid");
        assert_eq!(at.since, Some("2025-12-31T23:59:00Z".parse().expect("ts")));
        let iso = parse(&[("since", "PT10M")]).expect("valid");
        assert_eq!(iso.since, Some("2026-01-01T00:50:00Z".parse().expect("ts")));
        let days = parse(&[("since", "2d")]).expect("valid");
        assert_eq!(
            days.since,
            Some("2025-12-30T01:00:00Z".parse().expect("ts"))
        );
        let huge = parse(&[("limit", "18446744073709551615")]).expect("valid");
        assert!(huge.limit > 0);
    }

    #[test]
    fn bad_parameters_name_the_parameter_and_what_it_accepts() {
        for (pairs, parameter, says) in [
            (vec![("since", "yesterday")], "since", "RFC 3339"),
            (vec![("since", "-10m")], "since", "negative"),
            (vec![("since", "")], "since", "duration"),
            (vec![("limit", "0")], "limit", "positive whole number"),
            (vec![("limit", "ten")], "limit", "positive whole number"),
            (vec![("limit", "-1")], "limit", "positive whole number"),
            (
                vec![("limit", "99999999999999999999999")],
                "limit",
                "1 or more",
            ),
            (
                vec![("decison", "denied")],
                "decison",
                "accepted: decision, risk",
            ),
            (vec![("tool", "a"), ("tool", "b")], "tool", "more than once"),
        ] {
            let err = parse(&pairs).expect_err("invalid");
            assert_eq!(err.parameter, parameter, "{pairs:?}");
            assert!(err.to_string().contains(says), "{pairs:?}: {err}");
            assert!(err.to_string().contains(parameter), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn filters_compare_decision_risk_server_tool_and_time() {
        let ring = Ring::default();
        let rows = [
            (
                "2026-01-01T00:10:00Z",
                "fs__read_file",
                Some("fs"),
                Some("read_file"),
                "allowed",
                Some("read"),
            ),
            (
                "2026-01-01T00:20:00Z",
                "fs__write_file",
                Some("fs"),
                Some("write_file"),
                "denied",
                Some("write"),
            ),
            (
                "2026-01-01T00:55:00Z",
                "gh__create_issue",
                Some("gh"),
                Some("create_issue"),
                "rate_limited",
                Some("write"),
            ),
            ("2026-01-01T00:56:00Z", "nope", None, None, "unknown", None),
        ];
        for (i, (ts, tool, server, upstream, decision, risk)) in rows.into_iter().enumerate() {
            let mut r = record(ts, tool, server, upstream, decision, risk);
            r.request_id = i.to_string();
            ring.push(entry(&r));
        }
        let find = |pairs: &[(&str, &str)]| {
            let q = parse(pairs).expect("valid");
            ids(&ring.find(q.limit, |e| q.matches(e)))
        };
        assert_eq!(find(&[("decision", "denied")]), ["1"]);
        // Any decision string: values added later need no change here.
        assert_eq!(find(&[("decision", "rate_limited")]), ["2"]);
        assert_eq!(find(&[("risk", "write")]), ["1", "2"]);
        assert_eq!(find(&[("server", "fs")]), ["0", "1"]);
        // The name the client called, or the upstream tool's name.
        assert_eq!(find(&[("tool", "fs__write_file")]), ["1"]);
        assert_eq!(find(&[("tool", "create_issue")]), ["2"]);
        assert_eq!(find(&[("tool", "nope")]), ["3"]);
        // now is 01:00: the last 10 minutes, or from an instant on.
        assert_eq!(find(&[("since", "10m")]), ["2", "3"]);
        assert_eq!(find(&[("since", "2026-01-01T00:20:00Z")]), ["1", "2", "3"]);
        // Filters combine with "and".
        assert_eq!(find(&[("risk", "write"), ("server", "fs")]), ["1"]);
        assert!(find(&[("decision", "Denied")]).is_empty(), "exact strings");
    }
}
