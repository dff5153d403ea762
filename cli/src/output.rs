//! Output formats shared by every command: aligned tables for people, JSON and YAML for
//! programs (`-o json|yaml` print whole objects, as kubectl does), and kubectl's `-o name`,
//! `-o wide` and `-o jsonpath=TEMPLATE` (over what `-o json` prints).

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::jsonpath::Template;

/// `-o` values.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Format {
    #[default]
    Table,
    /// The table with more columns (a CRD's printer columns of priority > 0).
    Wide,
    Json,
    Yaml,
    /// `kind.group/name` of each object printed.
    Name,
    /// A kubectl JSONPath template (its text as given, parsed when the flag is).
    JsonPath(String),
}

/// What `-o` takes, for the flag's help and its error.
pub const FORMATS: &str = "table, wide, json, yaml, name, jsonpath=TEMPLATE";

impl Format {
    /// Parses `-o`'s value; a bad one names the flag and what it takes.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let format = match text {
            "table" => Self::Table,
            "wide" => Self::Wide,
            "json" => Self::Json,
            "yaml" => Self::Yaml,
            "name" => Self::Name,
            _ => match text.split_once('=') {
                Some(("jsonpath", template)) => {
                    Template::parse(template).map_err(|e| e.to_string())?;
                    Self::JsonPath(template.to_string())
                }
                _ => {
                    return Err(format!(
                        "{text:?} is not an output format; -o takes {FORMATS} (e.g. \
                         -o jsonpath='{{.items[*].metadata.name}}')"
                    ));
                }
            },
        };
        Ok(format)
    }

    /// A table for people (`table` or `wide`).
    pub fn is_table(&self) -> bool {
        matches!(self, Self::Table | Self::Wide)
    }
}

/// Whether tables print their header line: `--no-headers` turns it off for the process.
static HEADERS: AtomicBool = AtomicBool::new(true);

/// Sets `--no-headers` for this run (called once, by `run`).
pub fn set_headers(on: bool) {
    HEADERS.store(on, Ordering::Relaxed);
}

/// Whether tables print their header line (false with `--no-headers`).
pub fn headers() -> bool {
    HEADERS.load(Ordering::Relaxed)
}

/// Serializes `value` as JSON (pretty), YAML, its object names (`-o name`) or through a
/// JSONPath template. `Table` and `Wide` are the caller's job (YAML if asked here).
pub fn render<T: Serialize>(format: &Format, value: &T) -> Result<String> {
    match format {
        Format::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| Error::Output(e.to_string())),
        Format::Name => {
            let value = serde_json::to_value(value).map_err(|e| Error::Output(e.to_string()))?;
            names(&value)
        }
        Format::JsonPath(template) => {
            let value = serde_json::to_value(value).map_err(|e| Error::Output(e.to_string()))?;
            Template::parse(template)?.render(&value)
        }
        Format::Yaml | Format::Table | Format::Wide => {
            let mut s = serde_saphyr::to_string(value).map_err(|e| Error::Output(e.to_string()))?;
            if !s.ends_with('\n') {
                s.push('\n');
            }
            Ok(s)
        }
    }
}

/// `-o name`: `kind.group/name` per object (a `List`: per item), as kubectl prints it, e.g.
/// `taskrun.orchestrator.io/task-1001`. What is not an API object is refused (exit 2).
pub fn names(value: &serde_json::Value) -> Result<String> {
    let objects: Vec<&serde_json::Value> = match value.get("items").and_then(|i| i.as_array()) {
        Some(items) if value.get("kind").and_then(|k| k.as_str()) == Some("List") => {
            items.iter().collect()
        }
        _ => vec![value],
    };
    let mut out = String::new();
    for object in objects {
        let kind = object.get("kind").and_then(|k| k.as_str());
        let api_version = object.get("apiVersion").and_then(|v| v.as_str());
        let name = object.pointer("/metadata/name").and_then(|n| n.as_str());
        let (Some(kind), Some(api_version), Some(name)) = (kind, api_version, name) else {
            return Err(Error::Usage(
                "-o name prints the names of API objects (task get, task list, task submit); \
                 this command prints other data: use -o json, -o yaml or -o jsonpath=TEMPLATE"
                    .into(),
            ));
        };
        let kind = kind.to_lowercase();
        match api_version.split_once('/') {
            Some((group, _)) => writeln!(out, "{kind}.{group}/{name}"),
            None => writeln!(out, "{kind}/{name}"),
        }
        .map_err(|e| Error::Output(e.to_string()))?;
    }
    Ok(out)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a message.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Error::Output(e.to_string())),
    }
}

/// A note for the user on stderr (never mixed into stdout, which scripts parse).
pub fn note(text: &str) {
    eprintln!("note: {text}");
}

/// A table with a header row, columns padded to their widest cell (three spaces apart, as
/// kubectl prints them).
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, each line ending in a newline, no trailing spaces.
    pub fn render(&self) -> String {
        self.render_with(true)
    }

    /// The table as text, with or without its header line (`--no-headers`: then, as kubectl's,
    /// the columns are as wide as their widest cell below).
    pub fn render_with(&self, headers: bool) -> String {
        let widths = self.widths_with(headers);
        let mut out = String::new();
        let rows = std::iter::once(&self.headers).skip(usize::from(!headers));
        for row in rows.chain(&self.rows) {
            out.push_str(&row_line(&widths, row));
        }
        out
    }

    /// The column widths with the header line, or (`--no-headers`) of the rows alone.
    pub fn widths_with(&self, headers: bool) -> Vec<usize> {
        if headers {
            return self.widths();
        }
        Self {
            headers: vec![String::new(); self.headers.len()],
            rows: self.rows.clone(),
        }
        .widths()
    }

    /// Each column's width: its widest cell so far, header included.
    pub fn widths(&self) -> Vec<usize> {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        widths
    }
}

/// One row padded to `widths`, as [`Table::render`] prints it (a wider cell pushes the rest to
/// the right): `--watch` prints later rows under a table printed before.
pub fn row_line(widths: &[usize], row: &[String]) -> String {
    let columns = widths.len();
    let mut line = String::new();
    for (i, width) in widths.iter().enumerate() {
        let cell = row.get(i).map(String::as_str).unwrap_or("");
        if i + 1 == columns {
            line.push_str(cell);
        } else {
            let _ = write!(line, "{cell:<width$}   ");
        }
    }
    let mut line = line.trim_end().to_string();
    line.push('\n');
    line
}

/// kubectl-style age: `45s`, `12m`, `5h`, `3d`, `2y` (the largest unit, rounded down; for
/// short spans two units, e.g. `2m30s`, `3h12m`).
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    let (m, h, d) = (60, 3600, 86400);
    match secs {
        s if s < 2 * m => format!("{s}s"),
        s if s < 10 * m => {
            let rest = s % m;
            if rest == 0 {
                format!("{}m", s / m)
            } else {
                format!("{}m{}s", s / m, rest)
            }
        }
        s if s < 3 * h => format!("{}m", s / m),
        s if s < 8 * h => {
            let rest = (s % h) / m;
            if rest == 0 {
                format!("{}h", s / h)
            } else {
                format!("{}h{}m", s / h, rest)
            }
        }
        s if s < 2 * d => format!("{}h", s / h),
        s if s < 365 * d => format!("{}d", s / d),
        s => format!("{}y", s / (365 * d)),
    }
}

/// Whether a terminal would hide `c`, or act on it: C0 and C1 controls (U+009B is a CSI),
/// bidi embeddings, overrides and isolates, zero-width and invisible formatting characters.
fn hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{ad}' | '\u{61c}' | '\u{180e}'
        | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}'
        | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

/// `text` with every character a terminal would hide written as `\u{…}`, so what is printed is
/// what is there.
pub fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `<none>` for an absent cell, as kubectl prints it.
pub fn or_none(value: Option<String>) -> String {
    value.unwrap_or_else(|| "<none>".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_trailing_space() {
        let mut t = Table::new(&["NAME", "PHASE", "AGE"]);
        t.row(vec!["task-1001".into(), "Running".into(), "5m".into()]);
        t.row(vec!["t".into(), "".into(), "12d".into()]);
        assert_eq!(
            t.render(),
            "NAME        PHASE     AGE\n\
             task-1001   Running   5m\n\
             t                     12d\n"
        );
        let mut t = Table::new(&["A", "B"]);
        t.row(vec!["x".into(), "".into()]);
        assert_eq!(t.render(), "A   B\nx\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = Timestamp::from_second(1_000_000_000).expect("valid");
        let ago = |s: i64| {
            age(
                Timestamp::from_second(1_000_000_000 - s).expect("valid"),
                now,
            )
        };
        assert_eq!(ago(0), "0s");
        assert_eq!(ago(119), "119s");
        assert_eq!(ago(150), "2m30s");
        assert_eq!(ago(300), "5m");
        assert_eq!(ago(3 * 3600 + 12 * 60), "3h12m");
        assert_eq!(ago(20 * 3600), "20h");
        assert_eq!(ago(3 * 86400 + 5), "3d");
        assert_eq!(ago(800 * 86400), "2y");
        assert_eq!(ago(-5), "0s", "clock skew is not a negative age");
    }

    #[test]
    fn json_and_yaml_render_the_same_value() {
        let v = serde_json::json!({"name": "task-1", "tools": ["a", "b"]});
        assert_eq!(
            render(&Format::Json, &v).expect("json"),
            "{\n  \"name\": \"task-1\",\n  \"tools\": [\n    \"a\",\n    \"b\"\n  ]\n}\n"
        );
        let yaml = render(&Format::Yaml, &v).expect("yaml");
        let back: serde_json::Value = serde_saphyr::from_str(&yaml).expect("yaml parses back");
        assert_eq!(back, v);
    }

    #[test]
    fn o_takes_kubectl_formats_and_names_them_when_wrong() {
        assert_eq!(Format::parse("wide"), Ok(Format::Wide));
        assert_eq!(Format::parse("name"), Ok(Format::Name));
        assert_eq!(
            Format::parse("jsonpath={.metadata.name}"),
            Ok(Format::JsonPath("{.metadata.name}".into()))
        );
        let e = Format::parse("jsonpat={.a}").expect_err("unknown");
        assert!(
            e.contains("table, wide, json, yaml, name, jsonpath=TEMPLATE"),
            "{e}"
        );
        let e = Format::parse("jsonpath={.a").expect_err("unclosed");
        assert!(e.contains("not closed"), "{e}");
    }

    #[test]
    fn name_prints_kind_group_and_name_per_object() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": "task-1"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
        ]});
        assert_eq!(
            render(&Format::Name, &list).expect("names"),
            "taskrun.orchestrator.io/task-1\nconfigmap/c\n"
        );
        let e = render(&Format::Name, &serde_json::json!({"records": []})).expect_err("no object");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("-o jsonpath"), "{e}");
    }

    #[test]
    fn no_headers_drops_the_header_line_and_its_width() {
        let mut t = Table::new(&["NAME", "PHASE"]);
        t.row(vec!["t".into(), "Running".into()]);
        assert_eq!(t.render_with(false), "t   Running\n");
    }
}
