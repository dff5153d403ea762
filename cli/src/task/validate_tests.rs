//! `task validate`: the files' documents and the operator's checks, without a cluster (the dry
//! run is tested against the real control plane in tests/cluster_cli.rs).

use orchestrator_crds::catalog::Catalog;

use super::validate::{Report, check, parse};

fn catalog() -> Catalog {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/catalog.yaml");
    Catalog::parse(&std::fs::read_to_string(path).expect("the repo's catalog")).expect("it parses")
}

const SAMPLE: &str = include_str!("../../../config/samples/taskrun.yaml");

fn reports(text: &str, catalog: Option<&Catalog>) -> Vec<Report> {
    let (docs, _) = parse("f.yaml", text).expect("YAML");
    docs.into_iter()
        .map(|d| check(d, catalog, None).0)
        .collect()
}

fn reasons(r: &Report) -> Vec<&str> {
    r.problems.iter().map(|p| p.reason.as_str()).collect()
}

#[test]
fn the_shipped_sample_is_valid_against_the_shipped_catalog() {
    let r = reports(SAMPLE, Some(&catalog()));
    assert_eq!(r.len(), 1);
    assert!(r[0].problems.is_empty(), "{:?}", r[0].problems);
    assert_eq!(
        (r[0].source.as_str(), r[0].name.as_str()),
        ("f.yaml", "task-1001")
    );
    assert_eq!(r[0].checked, ["operator"]);
}

#[test]
fn each_document_is_checked_and_other_kinds_are_listed_not_judged() {
    let bad_condition = SAMPLE.replace(
        "  toolConfig:\n",
        "  toolConfig:\n    policy:\n      conditions:\n        - name: no-secrets\n          \
         when: 'args.message.contains('\n",
    );
    let unknown = SAMPLE
        .replace("name: task-1001", "name: task-1002")
        .replace("- name: memory", "- name: memroy");
    let text = format!(
        "{bad_condition}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n{unknown}"
    );
    let (docs, others) = parse("f.yaml", &text).expect("YAML");
    assert_eq!(others, ["f.yaml#2: ConfigMap c"]);
    let r: Vec<Report> = docs
        .into_iter()
        .map(|d| check(d, Some(&catalog()), None).0)
        .collect();
    assert_eq!(
        r.iter().map(|r| r.source.as_str()).collect::<Vec<_>>(),
        ["f.yaml#1", "f.yaml#3"]
    );
    // The operator's reasons and messages, naming the rule and the field.
    assert_eq!(reasons(&r[0]), ["InvalidCondition"]);
    let message = &r[0].problems[0].message;
    assert!(
        message.starts_with("spec.toolConfig.policy.conditions[0]")
            && message.contains("no-secrets"),
        "{message}"
    );
    assert_eq!(reasons(&r[1]), ["UnknownServer"]);
    assert!(
        r[1].problems[0].message.contains("\"memroy\""),
        "{:?}",
        r[1].problems
    );
}

#[test]
fn without_a_catalog_only_the_checks_that_need_none_run() {
    let text = SAMPLE.replace("- name: memory", "- name: memroy").replace(
        "        deny: [\"WebFetch\"]\n",
        "        deny: [\"WebFetch\"]\n    policy:\n      decisionPoint: {url: \"opa:8181\"}\n",
    );
    let r = reports(&text, None);
    assert_eq!(
        reasons(&r[0]),
        ["InvalidDecisionPoint"],
        "{:?}",
        r[0].problems
    );
    assert_eq!(r[0].checked, ["operatorWithoutCatalog"]);
}

#[test]
fn a_malformed_field_is_named_by_its_path_and_an_unknown_version_refused() {
    let r = reports(
        &SAMPLE.replace("taskId: 1001", "taskId: soon"),
        Some(&catalog()),
    );
    assert_eq!(reasons(&r[0]), ["Malformed"]);
    assert!(
        r[0].problems[0].message.starts_with("spec.taskId: "),
        "{:?}",
        r[0].problems
    );

    let r = reports(
        &SAMPLE.replace("orchestrator.io/v1", "orchestrator.io/v2"),
        Some(&catalog()),
    );
    assert_eq!(reasons(&r[0]), ["UnknownVersion"]);
}

#[test]
fn text_that_is_not_yaml_is_bad_input() {
    let e = parse("f.yaml", "spec: [unclosed").expect_err("refused");
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().starts_with("f.yaml: not YAML or JSON"), "{e}");
}
