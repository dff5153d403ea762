use super::*;

fn rule(name: &str, tools: &[&str], when: &str, effect: ConditionEffect) -> CallCondition {
    CallCondition {
        name: name.into(),
        tools: tools.iter().map(|s| s.to_string()).collect(),
        when: when.into(),
        effect,
        message: Some(format!("{name} says no")),
    }
}

fn deny(name: &str, tools: &[&str], when: &str) -> CallCondition {
    rule(name, tools, when, ConditionEffect::Deny)
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("orchestrator.io/repository".into(), "acme/app".into())])
}

fn decide(conditions: &[CallCondition], server: &str, tool: &str, args: Json) -> Verdict {
    decide_at(conditions, server, tool, args, "2026-11-30T12:00:00Z")
}

fn decide_at(
    conditions: &[CallCondition],
    server: &str,
    tool: &str,
    args: Json,
    now: &str,
) -> Verdict {
    let compiled = Conditions::compile(conditions).expect("compiles");
    let labels = labels();
    compiled.decide(&facts(server, tool, args.as_object(), &labels, now))
}

/// A write call of task team-a/t (created by alice, context version 3).
fn facts<'a>(
    server: &'a str,
    tool: &'a str,
    args: Option<&'a serde_json::Map<String, Json>>,
    labels: &'a BTreeMap<String, String>,
    now: &str,
) -> Facts<'a> {
    Facts {
        server,
        tool,
        class: Some("write"),
        annotations: serde_json::json!({"destructiveHint": false}),
        args,
        task: TaskFacts {
            name: "t",
            namespace: "team-a",
            labels,
            context_version: 3,
            created_by: Some("alice"),
        },
        now: now.parse().expect("a time"),
    }
}

fn pass() -> Verdict {
    Verdict::Pass { approval: None }
}

#[test]
fn a_write_outside_the_allowed_path_is_denied_naming_the_rule_and_inside_passes() {
    let c = [deny(
        "writes-under-src",
        &["filesystem/write_*", "filesystem/edit_file"],
        r#"!args.path.startsWith("/workspace/src/")"#,
    )];
    let out = decide(
        &c,
        "filesystem",
        "write_file",
        serde_json::json!({"path": "/etc/passwd"}),
    );
    assert_eq!(
        out,
        Verdict::Denied {
            rule: "policy.conditions[0] \"writes-under-src\"".into(),
            name: "writes-under-src".into(),
            message: Some("writes-under-src says no".into()),
        }
    );
    let inside = serde_json::json!({"path": "/workspace/src/main.rs"});
    assert_eq!(
        decide(&c, "filesystem", "write_file", inside.clone()),
        pass()
    );
    // Another tool or server: the condition does not apply.
    let outside = serde_json::json!({"path": "/etc/passwd"});
    assert_eq!(
        decide(&c, "filesystem", "read_file", outside.clone()),
        pass()
    );
    assert_eq!(decide(&c, "other", "write_file", outside), pass());
}

#[test]
fn every_variable_reads_what_the_call_is() {
    let c = [deny(
        "all",
        &[],
        r#"server == "github" && tool.name == "add_comment" && tool.server == "github"
           && tool.class == "write" && tool.annotations.destructiveHint == false
           && task.labels["orchestrator.io/repository"] == args.owner + "/" + args.repo
           && task.namespace == "team-a" && task.contextVersion == 3 && args.n * 2 == 4
           && time.getHours() == 12"#,
    )];
    let args = serde_json::json!({"owner": "acme", "repo": "app", "n": 2});
    assert!(matches!(
        decide(&c, "github", "add_comment", args),
        Verdict::Denied { .. }
    ));
    let args = serde_json::json!({"owner": "evil", "repo": "app", "n": 2});
    assert_eq!(decide(&c, "github", "add_comment", args), pass());
}

#[test]
fn after_hours_writes_ask_for_approval_and_a_deny_still_wins() {
    let c = [
        rule(
            "after-18",
            &[],
            r#"tool.class != "read" && time.getHours("Europe/Berlin") >= 18"#,
            ConditionEffect::RequireApproval,
        ),
        deny(
            "short-comments",
            &["github/*comment*"],
            "size(args.body) >= 2000",
        ),
    ];
    let short = serde_json::json!({"body": "ok"});
    let evening = "2026-11-30T18:30:00Z"; // 19:30 in Berlin
    assert_eq!(
        decide_at(&c, "github", "add_comment", short.clone(), evening),
        Verdict::Pass {
            approval: Some("policy.conditions[0] \"after-18\"".into())
        }
    );
    assert_eq!(
        decide_at(&c, "github", "add_comment", short, "2026-11-30T09:00:00Z"),
        pass()
    );
    let long = serde_json::json!({"body": "x".repeat(2000)});
    assert!(matches!(
        decide_at(&c, "github", "add_comment", long, evening),
        Verdict::Denied { name, .. } if name == "short-comments"
    ));
}

#[test]
fn a_failing_expression_refuses_the_call_fail_closed() {
    let c = [deny("needs-path", &[], r#"!args.path.startsWith("/w")"#)];
    let Verdict::Failed { rule, error, .. } = decide(&c, "fs", "write", serde_json::json!({}))
    else {
        panic!("refused");
    };
    assert_eq!(rule, "policy.conditions[0] \"needs-path\"");
    assert!(error.contains("path"), "{error}");
    // Guarded, it passes.
    let c = [deny(
        "guarded",
        &[],
        r#"has(args.path) && !args.path.startsWith("/w")"#,
    )];
    assert_eq!(decide(&c, "fs", "write", serde_json::json!({})), pass());
    // Not a bool.
    let c = [deny("number", &[], "size(args)")];
    let Verdict::Failed { error, .. } = decide(&c, "fs", "write", serde_json::json!({})) else {
        panic!("refused");
    };
    assert!(error.contains("not true or false"), "{error}");
}

#[test]
fn an_expression_that_would_run_long_is_stopped_by_its_budget() {
    // 1,000 x 1,000 steps: ten times the budget. The `||` would absorb the error; the budget
    // refuses anyway.
    let c = [deny(
        "quadratic",
        &[],
        "args.l.all(x, args.l.all(y, y >= 0)) || true",
    )];
    let l: Vec<i64> = (0..1000).collect();
    let Verdict::Failed { error, .. } = decide(&c, "fs", "write", serde_json::json!({"l": l}))
    else {
        panic!("refused");
    };
    // The step budget, or in a slow (debug) build the deadline, whichever comes first.
    assert!(error.starts_with("it went over its budget"), "{error}");
    // Within the budget: evaluated.
    let l: Vec<i64> = (0..30).collect();
    assert_eq!(
        decide(&c, "fs", "write", serde_json::json!({"l": l})),
        Verdict::Denied {
            rule: "policy.conditions[0] \"quadratic\"".into(),
            name: "quadratic".into(),
            message: Some("quadratic says no".into()),
        }
    );
}

#[test]
fn bad_conditions_do_not_compile_and_say_where() {
    let err = Conditions::compile(&[deny("x", &["nope"], "args.x ==")]).expect_err("refused");
    let paths: Vec<&str> = err.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        ["policy.conditions[0].tools[0]", "policy.conditions[0].when"]
    );
}

#[test]
fn a_decision_points_input_is_the_conditions_facts_with_the_tasks_creator() {
    let labels = labels();
    let args = serde_json::json!({"path": "/workspace/x"});
    let facts = facts(
        "filesystem",
        "write_file",
        args.as_object(),
        &labels,
        "2026-11-30T18:30:00Z",
    );
    assert_eq!(
        facts.input(),
        serde_json::json!({
            "tool": {"name": "write_file", "server": "filesystem", "class": "write",
                     "annotations": {"destructiveHint": false}},
            "server": "filesystem",
            "args": {"path": "/workspace/x"},
            "task": {"name": "t", "namespace": "team-a", "createdBy": "alice",
                     "labels": serde_json::to_value(&labels).expect("labels"), "contextVersion": 3},
            "time": "2026-11-30T18:30:00.000Z",
        })
    );
}

#[test]
fn every_variable_reads_as_before_when_bound_only_for_the_conditions_that_read_it() {
    // Each rule reads one variable: each is bound lazily, in turn, with the same values.
    let rules = [
        deny("args", &[], "args.path == '/workspace/x'"),
        deny(
            "tool",
            &[],
            "tool.name == 'write_file' && tool.class == 'write' && !tool.annotations.destructiveHint",
        ),
        deny("server", &[], "server == 'filesystem'"),
        deny(
            "task",
            &[],
            "task.name == 't' && task.namespace == 'team-a' && task.contextVersion == 3",
        ),
        deny("time", &[], "time.getHours() == 18"),
    ];
    for (i, rule) in rules.iter().enumerate() {
        // The rules before it do not hold (negated); it does.
        let mut list: Vec<CallCondition> = rules[..i]
            .iter()
            .map(|r| CallCondition {
                when: format!("!({})", r.when),
                ..r.clone()
            })
            .collect();
        list.push(rule.clone());
        let verdict = decide_at(
            &list,
            "filesystem",
            "write_file",
            serde_json::json!({"path": "/workspace/x"}),
            "2026-11-30T18:30:00Z",
        );
        assert!(
            matches!(&verdict, Verdict::Denied { name, .. } if name == &rule.name),
            "{}: {verdict:?}",
            rule.name
        );
    }
}
