//! `retrieve_tools`: the enabled tools of the current table (after the servers' patterns,
//! `maxRisk` and quarantine: exactly what direct mode would list) that match words of a query,
//! each with what calling it takes, including the `call_tool_*` to call it through.

use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};

use super::{
    declared::kind,
    matrix::Variant,
    offer::{DEFAULT_LIMIT, MAX_LIMIT},
};
use crate::{names::clip, router::Router};

/// How to use what `retrieve_tools` returns; part of every answer.
const USAGE: &str = "Call a tool through the tool its call_with names, with {\"name\": its name, \
\"args\": its arguments (matching its inputSchema), \"intent\": {\"operation_type\": \"read\" for \
call_tool_read, \"write\" for call_tool_write, \"destructive\" for call_tool_destructive; \
\"data_sensitivity\": \"public\", \"internal\", \"private\" or \"unknown\" (optional); \"reason\": \
why (optional)}}. A riskier call tool than call_with is accepted; a less risky one is refused.";

/// A `retrieve_tools` call's arguments, read.
#[derive(Debug, PartialEq, Eq)]
pub struct Query {
    /// The query, lowercased and trimmed.
    pub text: String,
    /// Its words (letters and digits, at least two), lowercased, each once. None: every tool.
    pub words: Vec<String>,
    pub limit: usize,
}

/// Reads `{query?, limit?}`; every problem names its field.
pub fn parse(arguments: Option<&JsonObject>) -> Result<Query, Vec<String>> {
    let mut query = Query {
        text: String::new(),
        words: Vec::new(),
        limit: DEFAULT_LIMIT,
    };
    let mut problems = Vec::new();
    for (key, value) in arguments.into_iter().flatten() {
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("query", Value::String(text)) => query.text = text.trim().to_lowercase(),
            ("query", other) => problems.push(format!(
                "query must be a string of words to look for, not {}",
                kind(other)
            )),
            ("limit", value) => match value.as_u64() {
                Some(n @ 1..) if n <= MAX_LIMIT as u64 => query.limit = n as usize,
                _ => problems.push(format!(
                    "limit must be a whole number from 1 to {MAX_LIMIT}, not {}",
                    clip(&value.to_string())
                )),
            },
            (other, _) => problems.push(format!(
                "unknown field {:?}: retrieve_tools takes query and limit",
                clip(other)
            )),
        }
    }
    for word in query
        .text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 2)
    {
        if !query.words.iter().any(|w| w == word) {
            query.words.push(word.to_string());
        }
    }
    if problems.is_empty() {
        Ok(query)
    } else {
        Err(problems)
    }
}

/// How well `tool` matches: each word found in the name counts 2, in the description 1; the
/// whole query equal to the name comes first. 0: no match.
fn score(query: &Query, tool: &Tool) -> usize {
    let name = tool.name.to_lowercase();
    if !query.text.is_empty() && name == query.text {
        return usize::MAX;
    }
    let description = tool
        .description
        .as_deref()
        .unwrap_or_default()
        .to_lowercase();
    query
        .words
        .iter()
        .map(|w| {
            2 * usize::from(name.contains(w.as_str()))
                + usize::from(description.contains(w.as_str()))
        })
        .sum()
}

/// One tool as `retrieve_tools` shows it.
fn entry(tool: &Tool, variant: Variant, risk: &str) -> Value {
    let mut entry = JsonObject::new();
    entry.insert("name".into(), json!(tool.name));
    entry.insert("call_with".into(), json!(variant.tool()));
    entry.insert("risk".into(), json!(risk));
    if let Some(description) = &tool.description {
        entry.insert("description".into(), json!(description));
    }
    if let Some(annotations) = &tool.annotations {
        entry.insert("annotations".into(), json!(annotations));
    }
    entry.insert(
        "inputSchema".into(),
        Value::Object((*tool.input_schema).clone()),
    );
    Value::Object(entry)
}

/// The answer: the best `limit` matches of the tools on offer, how many matched, how to call
/// them, and the servers whose tools could not be listed (`unavailable`, their errors).
pub fn answer(router: &Router, query: &Query, unavailable: &[String]) -> Value {
    let tools = router.tools();
    let mut found: Vec<(usize, &Tool)> = tools
        .iter()
        .map(|tool| (score(query, tool), tool))
        .filter(|(score, _)| query.words.is_empty() || *score > 0)
        .collect();
    // Stable: equal scores keep the table's order (servers in config order).
    found.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
    let matched = found.len();
    let listed: Vec<Value> = found
        .into_iter()
        .take(query.limit)
        .filter_map(|(_, tool)| {
            let route = router.route(&tool.name)?;
            Some(entry(
                tool,
                Variant::for_risk(route.risk),
                route.risk.as_str(),
            ))
        })
        .collect();
    let mut usage = USAGE.to_string();
    if matched > listed.len() {
        usage.push_str(&format!(
            " {} more tools match: use more precise words, or a larger limit (at most {MAX_LIMIT}).",
            matched - listed.len()
        ));
    }
    if matched == 0 {
        usage.push_str(
            " No tool matches: try other words, or no query for every tool. The tools on offer \
             can change during the task: search again later.",
        );
    }
    let mut answer = json!({
        "tools": listed,
        "matched": matched,
        "usage_instructions": usage,
    });
    if !unavailable.is_empty() {
        answer["unavailable"] = json!(unavailable);
    }
    answer
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use super::*;
    use crate::{config::valid as config, names::ServerName, policy::definitions::KnownList};

    fn args(value: Value) -> Result<Query, Vec<String>> {
        match value {
            Value::Object(map) => parse(Some(&map)),
            _ => parse(None),
        }
    }

    fn tool(
        name: &str,
        description: &str,
        read_only: Option<bool>,
        destructive: Option<bool>,
    ) -> Tool {
        let mut t = crate::router::tests::annotated(name, read_only, destructive);
        t.description = Some(description.to_string().into());
        t
    }

    fn router(policy: &str) -> Router {
        let c = config(&format!(
            "task: {{name: t}}\n{policy}\nservers: [{{name: fs, stdio: {{command: x}}, tools: {{deny: [secret]}}, risk: {{move_file: destructive}}}}]"
        ));
        let list = vec![
            tool("read_file", "Read a file's contents.", Some(true), None),
            tool(
                "write_file",
                "Write a file, replacing it.",
                Some(false),
                Some(true),
            ),
            tool(
                "create_directory",
                "Create a directory.",
                Some(false),
                Some(false),
            ),
            tool(
                "move_file",
                "Move or rename a file.",
                Some(false),
                Some(false),
            ),
            tool("plain", "No annotations; reads the file list.", None, None),
            tool("secret", "A denied tool about files.", Some(true), None),
        ];
        let lists: HashMap<ServerName, KnownList> = [(
            ServerName::new("fs"),
            KnownList::first_sight(Arc::new(list)),
        )]
        .into_iter()
        .collect();
        Router::build(&c, &lists)
    }

    fn names_and_calls(answer: &Value) -> Vec<(String, String)> {
        answer["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or_default().to_string(),
                    t["call_with"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    fn pair(name: &str, call: &str) -> (String, String) {
        (name.to_string(), call.to_string())
    }

    #[test]
    fn every_enabled_tool_with_the_call_tool_its_class_needs() {
        let r = router("");
        let all = answer(&r, &args(json!({})).expect("query"), &[]);
        assert_eq!(
            names_and_calls(&all),
            [
                pair("fs__read_file", "call_tool_read"),
                pair("fs__write_file", "call_tool_destructive"),
                pair("fs__create_directory", "call_tool_write"),
                // The catalog's or TaskRun's risk override counts as the server's word.
                pair("fs__move_file", "call_tool_destructive"),
                pair("fs__plain", "call_tool_write"),
            ]
        );
        assert_eq!(all["matched"], 5);
        let read = &all["tools"][0];
        assert_eq!(read["risk"], "read");
        assert_eq!(read["annotations"]["readOnlyHint"], true);
        assert_eq!(read["description"], "Read a file's contents.");
        assert!(read["inputSchema"].is_object());
        assert!(
            all["usage_instructions"]
                .as_str()
                .unwrap_or_default()
                .contains("call_with")
        );
        assert!(all.get("unavailable").is_none());
    }

    #[test]
    fn max_risk_still_hides_what_it_hides() {
        let r = router("policy: {maxRisk: write}");
        let all = answer(&r, &args(json!({})).expect("query"), &[]);
        assert_eq!(
            names_and_calls(&all),
            [
                pair("fs__read_file", "call_tool_read"),
                pair("fs__create_directory", "call_tool_write"),
                pair("fs__plain", "call_tool_write"),
            ]
        );
    }

    #[test]
    fn matches_rank_name_words_first_and_the_limit_bounds_them() {
        let r = router("");
        let q = args(json!({"query": "Read FILE"})).expect("query");
        assert_eq!(q.words, ["read", "file"]);
        let found = answer(&r, &q, &[]);
        let names: Vec<String> = names_and_calls(&found)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        // read_file: both words in its name and both in its description; plain: both in the
        // description only; write_file and move_file: "file" in name and description.
        assert_eq!(
            names,
            [
                "fs__read_file",
                "fs__write_file",
                "fs__move_file",
                "fs__plain"
            ]
        );
        let exact = answer(
            &r,
            &args(json!({"query": "fs__plain"})).expect("query"),
            &[],
        );
        assert_eq!(exact["tools"][0]["name"], "fs__plain");
        let one = answer(
            &r,
            &args(json!({"query": "file", "limit": 1})).expect("query"),
            &[],
        );
        assert_eq!(one["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(one["matched"], 4);
        assert!(
            one["usage_instructions"]
                .as_str()
                .unwrap_or_default()
                .contains("3 more tools match")
        );
        let none = answer(
            &r,
            &args(json!({"query": "kubernetes"})).expect("query"),
            &["x".into()],
        );
        assert_eq!(none["matched"], 0);
        assert!(
            none["usage_instructions"]
                .as_str()
                .unwrap_or_default()
                .contains("search again later")
        );
        assert_eq!(none["unavailable"], json!(["x"]));
    }

    #[test]
    fn bad_arguments_are_named() {
        assert_eq!(
            args(json!({"query": 3, "limit": 0, "q": "x"})),
            Err(vec![
                "limit must be a whole number from 1 to 100, not 0".to_string(),
                "unknown field \"q\": retrieve_tools takes query and limit".to_string(),
                "query must be a string of words to look for, not a number".to_string(),
            ])
        );
        assert!(args(json!({"limit": 101})).is_err());
        assert_eq!(args(json!({"limit": 100})).map(|q| q.limit), Ok(100));
        assert_eq!(args(json!(null)).map(|q| q.limit), Ok(DEFAULT_LIMIT));
        assert_eq!(args(json!({"query": null})).map(|q| q.words.len()), Ok(0));
    }
}
