//! The router's tests, and helpers other modules' tests build tools with.

use super::*;

use crate::config::valid as config;

fn tool(name: &str) -> Tool {
    let mut t = Tool::default();
    t.name = name.to_string().into();
    t.title = Some(format!("Title of {name}"));
    t
}

fn lists(entries: &[(&str, &[&str])]) -> HashMap<ServerName, KnownList> {
    entries
        .iter()
        .map(|(s, ts)| (*s, ts.iter().map(|t| tool(t)).collect()))
        .map(|(s, tools)| one(s, tools))
        .collect()
}

fn one(server: &str, tools: Vec<Tool>) -> (ServerName, KnownList) {
    (
        ServerName::new(server),
        KnownList::first_sight(Arc::new(tools)),
    )
}

const TWO: &str = r#"
task: {name: t}
servers:
  - {name: gh, stdio: {command: x}, tools: {allow: ["create_issue", "list_*"], deny: ["delete_*"]}}
  - {name: fs, stdio: {command: y}}
  - {name: off, enabled: false, stdio: {command: z}}
"#;

#[test]
fn lists_only_allowed_tools_prefixed_with_definitions_unchanged() {
    let c = config(TWO);
    let r = Router::build(
        &c,
        &lists(&[
            (
                "gh",
                &["create_issue", "list_issues", "delete_repo", "merge_pr"],
            ),
            ("fs", &["read"]),
        ]),
    );
    let names: Vec<String> = r.tools().iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        names,
        vec!["gh__create_issue", "gh__list_issues", "fs__read"]
    );
    assert_eq!(r.tools()[0].title.as_deref(), Some("Title of create_issue"));
    assert!(r.missing_lists().is_empty());
    let route = r.route("gh__list_issues").expect("route");
    assert_eq!(
        (route.server.name.as_str(), route.tool.as_str()),
        ("gh", "list_issues")
    );
}

#[test]
fn denied_tools_are_known_with_their_rule() {
    let c = config(TWO);
    let r = Router::build(
        &c,
        &lists(&[("gh", &["delete_repo", "merge_pr"]), ("fs", &[])]),
    );
    match r.lookup("gh__delete_repo") {
        Lookup::Denied {
            rule: Rule::Deny { pattern, .. },
            ..
        } => assert_eq!(pattern, "delete_*"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        r.lookup("gh__merge_pr"),
        Lookup::Denied {
            rule: Rule::NotAllowed,
            ..
        }
    ));
    assert!(matches!(
        r.lookup("gh__nonexistent_tool_xyz"),
        Lookup::Denied {
            rule: Rule::NotAllowed,
            ..
        }
    ));
    assert!(matches!(r.lookup("fs__nope"), Lookup::Unknown));
    assert!(matches!(r.lookup("nobody__x"), Lookup::Unknown));
    assert!(matches!(r.lookup("no-separator"), Lookup::Unknown));
    let exposed: Vec<_> = r
        .known()
        .iter()
        .filter(|k| k.exposed_as.is_some())
        .collect();
    assert!(exposed.is_empty());
    assert_eq!(r.known().len(), 2);
}

#[test]
fn unknown_lists_are_reported_and_denials_need_no_list() {
    let c = config(TWO);
    let r = Router::build(&c, &HashMap::new());
    let missing: Vec<&str> = r.missing_lists().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        missing,
        vec!["gh", "fs"],
        "the disabled server is never needed"
    );
    assert!(matches!(r.lookup("gh__delete_repo"), Lookup::Denied { .. }));
    assert!(
        !r.is_listed("gh__delete_repo"),
        "denied by rule, but no upstream listed it"
    );
    assert!(matches!(
        r.lookup("off__anything"),
        Lookup::Denied {
            rule: Rule::ServerDisabled,
            ..
        }
    ));
    match r.lookup("gh__list_issues") {
        Lookup::NeedsLists(s) => assert_eq!(s[0].name.as_str(), "gh"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_prefix_exposes_names_as_is() {
    let c = config(
        "task: {name: t}\ntoolPrefix: none\nservers: [{name: e, stdio: {command: x}, tools: {deny: [secret]}}]",
    );
    let r = Router::build(&c, &lists(&[("e", &["echo", "secret"])]));
    let names: Vec<String> = r.tools().iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, vec!["echo"]);
    assert!(matches!(r.lookup("echo"), Lookup::Routed(_)));
    assert!(matches!(r.lookup("secret"), Lookup::Denied { .. }));
    // Listed (offered or denied) names may become metric labels; made-up ones may not.
    assert!(r.is_listed("echo") && r.is_listed("secret"));
    assert!(!r.is_listed("made_up"));
    let empty = Router::build(&c, &HashMap::new());
    assert!(matches!(empty.lookup("echo"), Lookup::NeedsLists(_)));
    assert!(matches!(empty.lookup("secret"), Lookup::Unknown));
}

/// A tool with these hints (also for other modules' tests).
pub(crate) fn annotated(name: &str, read_only: Option<bool>, destructive: Option<bool>) -> Tool {
    let mut t = tool(name);
    let mut hints = rmcp::model::ToolAnnotations::new();
    if let Some(r) = read_only {
        hints = hints.read_only(r);
    }
    if let Some(d) = destructive {
        hints = hints.destructive(d);
    }
    t.annotations = Some(hints);
    t
}

#[test]
fn a_changed_definition_is_hidden_under_block_and_offered_under_alert() {
    let mut first_seen = crate::policy::definitions::FirstSeen::default();
    first_seen.observe(Arc::new(vec![tool("a"), tool("b")]));
    let mut changed = tool("a");
    changed.description = Some("now with a new instruction".into());
    let list = first_seen.observe(Arc::new(vec![changed, tool("b")]));
    let lists: HashMap<ServerName, KnownList> =
        [(ServerName::new("s"), list)].into_iter().collect();
    let block = config("task: {name: t}\nservers: [{name: s, stdio: {command: x}}]");
    let r = Router::build(&block, &lists);
    let names: Vec<String> = r.tools().iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, vec!["s__b"]);
    match r.lookup("s__a") {
        Lookup::Denied {
            rule: Rule::DefinitionChanged { what },
            ..
        } => assert!(what.contains("changed since first seen"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.changes().len(), 1);
    assert_eq!(r.changes()[0].on_change, OnChange::Block);
    let alert = config(
        "task: {name: t}\npolicy: {onChange: alert}\nservers: [{name: s, stdio: {command: x}}]",
    );
    let r = Router::build(&alert, &lists);
    assert!(matches!(r.lookup("s__a"), Lookup::Routed(_)));
    assert_eq!(r.changes().len(), 1);
    let known = r
        .known()
        .iter()
        .find(|k| k.tool.as_str() == "a")
        .expect("a");
    assert!(known.definition_change.is_some());
    // A tool the patterns deny stays denied by its pattern, and is still reported.
    let denied =
        config("task: {name: t}\nservers: [{name: s, stdio: {command: x}, tools: {deny: [a]}}]");
    let r = Router::build(&denied, &lists);
    assert!(matches!(
        r.lookup("s__a"),
        Lookup::Denied {
            rule: Rule::Deny { .. },
            ..
        }
    ));
    assert_eq!(r.changes().len(), 1);
}

#[test]
fn tools_above_max_risk_are_hidden_and_refused_whatever_the_patterns_say() {
    let c = config(
        r#"
task: {name: t}
policy: {maxRisk: write}
servers:
  - {name: fs, stdio: {command: y}, risk: {rename: destructive, wipe: write}}
"#,
    );
    let list = vec![
        annotated("read", Some(true), None),
        annotated("write", Some(false), Some(false)),
        annotated("plain", None, None),
        annotated("delete", Some(false), Some(true)),
        annotated("odd", Some(true), Some(true)),
        annotated("rename", Some(false), Some(false)),
        annotated("wipe", None, Some(true)),
    ];
    let r = Router::build(&c, &[one("fs", list)].into_iter().collect());
    let names: Vec<String> = r.tools().iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        names,
        vec!["fs__read", "fs__write", "fs__plain", "fs__wipe"]
    );
    let risks: Vec<(&str, Risk)> = r
        .known()
        .iter()
        .map(|k| (k.tool.as_str(), k.risk))
        .collect();
    assert_eq!(
        risks,
        vec![
            ("read", Risk::Read),
            ("write", Risk::Write),
            ("plain", Risk::Write),
            ("delete", Risk::Destructive),
            ("odd", Risk::Destructive),
            ("rename", Risk::Destructive),
            ("wipe", Risk::Write),
        ]
    );
    match r.lookup("fs__delete") {
        Lookup::Denied { rule, risk, .. } => {
            assert_eq!(
                rule,
                Rule::AboveMaxRisk {
                    risk: Risk::Destructive,
                    max_risk: Risk::Write
                }
            );
            assert_eq!(risk, Some(Risk::Destructive));
            assert_eq!(
                crate::filter::RuleDisplay {
                    server: "fs",
                    rule: &rule
                }
                .to_string(),
                "policy.maxRisk \"write\" (servers[fs]: the tool is destructive)"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(r.lookup("fs__rename"), Lookup::Denied { .. }));
    assert_eq!(
        r.route("fs__read").map(|route| route.risk),
        Some(Risk::Read)
    );
    // Without a policy, every class is on offer.
    let open = config("task: {name: t}\nservers: [{name: fs, stdio: {command: y}}]");
    let r = Router::build(
        &open,
        &[one("fs", vec![annotated("delete", None, Some(true))])]
            .into_iter()
            .collect(),
    );
    assert!(matches!(r.lookup("fs__delete"), Lookup::Routed(_)));
}

#[test]
fn a_config_with_every_tool_revoked_offers_nothing_and_starts_nothing() {
    let c = config(
        r#"
task: {name: t}
servers:
  - {name: gh, stdio: {command: x}, tools: {deny: ["**"]}}
"#,
    );
    let r = Router::build(&c, &lists(&[("gh", &["create_issue"])]));
    assert!(r.tools().is_empty());
    assert!(matches!(
        r.lookup("gh__create_issue"),
        Lookup::Denied { .. }
    ));
    let unlisted = Router::build(&c, &HashMap::new());
    assert!(unlisted.missing_lists().is_empty(), "nothing is startable");
}
