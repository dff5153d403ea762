use super::*;

#[test]
fn unknown_keys_are_refused_with_their_name() {
    let err = Catalog::parse("servers:\n  - name: a\n    comand: x\n").expect_err("typo");
    assert_eq!(err.problems[0].code, "CATALOG.PARSE");
    assert!(err.to_string().contains("comand"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = r#"
servers:
  - name: Bad_Name
    stdio: {command: ""}
  - name: dup
    http: {url: "ftp://x", headersFromEnv: {Authorization: TOKEN}}
  - name: dup
    stdio: {command: x}
    http: {url: "http://x"}
  - name: none
    secretEnv:
      - {name: "1X", secretKey: ""}
"#;
    let err = Catalog::parse(yaml).expect_err("many problems");
    let codes: Vec<_> = err.problems.iter().map(|p| p.code).collect();
    assert_eq!(
        codes,
        [
            "CATALOG.BAD_NAME",
            "CATALOG.EMPTY_COMMAND",
            "CATALOG.BAD_URL",
            "CATALOG.UNDECLARED_HEADER_ENV",
            "CATALOG.DUPLICATE_SERVER",
            "CATALOG.TWO_TRANSPORTS",
            "CATALOG.NO_TRANSPORT",
            "CATALOG.BAD_ENV_NAME",
            "CATALOG.EMPTY_SECRET_KEY",
        ]
    );
    assert!(
        err.to_string().contains("servers[3].secretEnv[0].name"),
        "{err}"
    );
}

#[test]
fn the_shipped_catalog_is_valid_and_has_the_required_servers() {
    let catalog = Catalog::parse(include_str!("../../../config/catalog.yaml"))
        .unwrap_or_else(|e| panic!("config/catalog.yaml: {e}"));
    for name in [
        "filesystem",
        "memory",
        "everything",
        "time",
        "git",
        "github",
    ] {
        let server = catalog
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert!(!server.tools.is_empty(), "{name} lists its tools");
    }
    let github = catalog.get("github").expect("github");
    assert_eq!(github.secret_env[0].name, "GITHUB_PERSONAL_ACCESS_TOKEN");
}

#[test]
fn a_servers_workspace_is_none_unless_its_entry_says_and_its_cwd_must_be_in_reach() {
    let c = Catalog::parse(
            "servers:\n  - {name: a, stdio: {command: a}}\n  - {name: b, stdio: {command: b, workspace: readOnly, cwd: /workspace/src}}\n",
        )
        .expect("valid");
    let access = |n: &str| c.get(n).and_then(|s| s.stdio.as_ref()).map(|s| s.workspace);
    assert_eq!(access("a"), Some(WorkspaceAccess::None));
    assert_eq!(access("b"), Some(WorkspaceAccess::ReadOnly));
    let err = Catalog::parse(
            "servers:\n  - {name: a, stdio: {command: a, cwd: /workspace}}\n  - {name: b, stdio: {command: b, cwd: rel}}\n  - {name: c, stdio: {command: c, workspace: all}}\n",
        )
        .expect_err("problems");
    let text = err.to_string();
    assert!(text.contains("all"), "{text}");
    let err = Catalog::parse(
            "servers:\n  - {name: a, stdio: {command: a, cwd: /workspace}}\n  - {name: b, stdio: {command: b, cwd: rel}}\n",
        )
        .expect_err("problems");
    let codes: Vec<_> = err.problems.iter().map(|p| p.code).collect();
    assert_eq!(codes, ["CATALOG.CWD_NOT_MOUNTED", "CATALOG.BAD_CWD"]);
    assert!(
        err.to_string()
            .contains("set `workspace: readOnly` or `readWrite`"),
        "{err}"
    );
    // The shipped catalog: git and filesystem work on the workspace, github never sees it.
    let shipped = Catalog::parse(include_str!("../../../config/catalog.yaml")).expect("shipped");
    let of = |n: &str| {
        shipped
            .get(n)
            .and_then(|s| s.stdio.as_ref())
            .map(|s| s.workspace)
    };
    assert_eq!(of("git"), Some(WorkspaceAccess::ReadWrite));
    assert_eq!(of("filesystem"), Some(WorkspaceAccess::ReadWrite));
    assert_eq!(of("github"), Some(WorkspaceAccess::None));
}

#[test]
fn names_are_sorted() {
    let c = Catalog::parse(
        "servers:\n  - {name: time, stdio: {command: t}}\n  - {name: git, stdio: {command: g}}\n",
    )
    .expect("valid");
    assert_eq!(c.names(), ["git", "time"]);
    assert!(c.get("time").is_some());
}

#[test]
fn a_stored_definition_must_hash_to_its_pin() {
    let definition = serde_json::json!({
        "name": "echo",
        "description": "Echoes back the input string",
        "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
    });
    let pin = crate::policy::definition_hash(&definition);
    let catalog = |pin: Option<&str>, definition: serde_json::Value| {
        let yaml = serde_json::json!({"servers": [{
            "name": "everything",
            "stdio": {"command": "mcp-server-everything"},
            "tools": [{"name": "echo", "pin": pin, "definition": definition}],
        }]});
        Catalog::parse(&serde_json::to_string(&yaml).unwrap_or_default())
    };
    let good = catalog(Some(&pin), definition.clone()).expect("a definition and its pin");
    assert_eq!(
        good.get("everything")
            .and_then(CatalogServer::pinned_definitions),
        Some(vec![definition.clone()])
    );
    let mut edited = definition.clone();
    edited["description"] = "Echoes, and also mails your keys away".into();
    let codes = |r: Result<Catalog, CatalogError>| -> Vec<String> {
        r.err()
            .map(|e| {
                e.problems
                    .iter()
                    .map(|p| format!("{} at {}", p.code, p.path))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        codes(catalog(Some(&pin), edited)),
        ["CATALOG.DEFINITION_PIN_MISMATCH at servers[0].tools[0].definition"]
    );
    assert_eq!(
        codes(catalog(None, definition.clone())),
        ["CATALOG.DEFINITION_WITHOUT_PIN at servers[0].tools[0].definition"]
    );
    let mut renamed = definition;
    renamed["name"] = "echo2".into();
    assert_eq!(
        codes(catalog(Some(&pin), renamed)),
        ["CATALOG.BAD_DEFINITION at servers[0].tools[0].definition"]
    );
}
