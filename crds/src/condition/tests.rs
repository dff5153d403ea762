use super::*;

fn refused(when: &str) -> String {
    check(when).map(|_| ()).expect_err(when).to_string()
}

#[test]
fn the_rules_the_issue_lists_are_accepted() {
    for when in [
        r#"!args.path.startsWith("/workspace/src/")"#,
        r#"server == "git" && tool.name == "git_push" && !args.branch.matches("^agent/.*$")"#,
        "has(args.body) && size(args.body) >= 2000",
        r#"args.owner + "/" + args.repo != task.labels["orchestrator.io/repository"]"#,
        r#"tool.class != "read" && time.getHours("Europe/Berlin") >= 18"#,
        "args.paths.all(p, p.startsWith('/workspace/') && !p.contains('..'))",
        "args.items.exists(i, i.tags.exists(t, t == 'secret'))",
        r#"args.?path.orValue("").endsWith(".env") || task.contextVersion > 3"#,
        "'force' in args && args.force == true",
    ] {
        check(when).unwrap_or_else(|e| panic!("{when}: {e}"));
    }
}

#[test]
fn a_syntax_error_names_its_position() {
    let e = check("args.path.startsWith(").expect_err("refused");
    assert_eq!(e.line, Some(1));
    assert!(e.column.is_some_and(|c| c >= 21), "{e:?}");
    assert!(e.to_string().starts_with("at 1:"), "{e}");
}

#[test]
fn unknown_names_are_refused_naming_them() {
    let e = refused("argz.path == '/'");
    assert!(
        e.contains("unknown variable `argz`") && e.contains("args, tool, server, task, time"),
        "{e}"
    );
    let e = refused("args.path.lowerAscii() == '/'");
    assert!(
        e.contains("`lowerAscii`") && e.contains("startsWith"),
        "{e}"
    );
    // A macro's variable is in scope only inside it.
    check("args.l.all(x, x > 0)").expect("x inside");
    let e = refused("args.l.all(x, x > 0) && x > 0");
    assert!(e.contains("unknown variable `x`"), "{e}");
}

#[test]
fn what_could_cost_without_bound_is_refused() {
    let e = refused("args.a.all(x, args.b.all(y, args.c.all(z, z == x + y)))");
    assert!(e.contains("nest 3 deep"), "{e}");
    check("args.a.all(x, args.b.exists(y, y == x))").expect("two deep");
    let e = refused("args.path.matches(args.pattern)");
    assert!(e.contains("string literal"), "{e}");
    let e = refused("args.path.matches('(')");
    assert!(e.contains("does not compile"), "{e}");
    let big = vec!["args.n == 1"; 300].join(" || ");
    let e = refused(&big);
    assert!(e.contains("nodes") && e.contains("at most 1024"), "{e}");
}

#[test]
fn a_list_names_each_problem_by_its_path() {
    let c = |name: &str, tools: &[&str], when: &str| CallCondition {
        name: name.into(),
        tools: tools.iter().map(|s| s.to_string()).collect(),
        when: when.into(),
        effect: ConditionEffect::Deny,
        message: None,
    };
    let list = [
        c("a", &["filesystem/write_*"], "true"),
        c("a", &["nope"], "args.x =="),
    ];
    let p = problems(&list, "spec.toolConfig.policy.conditions");
    let paths: Vec<&str> = p.iter().map(|(at, _)| at.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.toolConfig.policy.conditions[1].name",
            "spec.toolConfig.policy.conditions[1].tools[0]",
            "spec.toolConfig.policy.conditions[1].when",
        ]
    );
    assert!(p[2].1.starts_with("condition \"a\": at 1:"), "{}", p[2].1);
    assert!(problems(&list[..1], "c").is_empty());
}

#[test]
fn the_variables_an_expression_reads_are_listed() {
    let reads = |when: &str| {
        check(when)
            .expect("accepted")
            .reads
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(reads("args.path.startsWith('/src/')"), ["args"]);
    assert_eq!(
        reads("tool.class != 'read' && task.labels['team'] == 'a'"),
        ["task", "tool"]
    );
    assert_eq!(
        reads("args.paths.all(p, p.startsWith(server))"),
        ["args", "server"]
    );
    assert_eq!(reads("time.getHours() >= 18"), ["time"]);
    assert!(reads("1 == 1").is_empty());
}
