//! The approval types' own tests: the fixed digest vectors (the operator's and the sidecar's
//! tests assert the same), what a digest covers, and the check of a digest against what a
//! request shows.

use serde_json::json;

use super::*;

#[test]
fn a_call_waits_by_class_or_by_pattern() {
    let policy = RequireApproval {
        risk: Some(Risk::Destructive),
        tools: vec!["github/merge_*".into()],
        timeout_seconds: None,
    };
    assert!(policy.requires("fs", "rm", Some(Risk::Destructive)));
    assert!(!policy.requires("fs", "write", Some(Risk::Write)));
    assert!(!policy.requires("fs", "write", None));
    assert!(policy.requires("github", "merge_pull_request", Some(Risk::Write)));
    assert!(!policy.requires("gitlab", "merge_pull_request", Some(Risk::Write)));
    assert_eq!(policy.timeout_seconds(), DEFAULT_TIMEOUT_SECONDS);
}

/// The fixed vector the operator's and the sidecar's tests assert too.
pub(crate) fn vector_params() -> serde_json::Value {
    json!({"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234i64}})
}

pub(crate) const VECTOR: &str =
    "sha256:e1afe37203b00ff1c6bc666d39c20ba74fdf32752e80297c55f90aad034133a3";

fn vector<'a>(params: &'a serde_json::Value) -> CallDigest<'a> {
    CallDigest {
        v: CALL_DIGEST_VERSION,
        namespace: "team-a",
        task_run: "held",
        id: "0a1b2c3d",
        server: "everything",
        definition: "sha256:1111111111111111111111111111111111111111111111111111111111111111",
        context_version: 3,
        params,
    }
}

#[test]
fn call_digest_is_jcs_sha256_over_every_part() {
    let params = vector_params();
    let base = vector(&params);
    assert_eq!(base.digest(), VECTOR);
    // Key order does not matter.
    let reordered: serde_json::Value = serde_json::from_str(
        r#"{"arguments": {"n": 12345678901234, "message": "B: rm -rf /"}, "name": "echo"}"#,
    )
    .unwrap_or_default();
    assert_eq!(vector(&reordered).digest(), VECTOR);
    // Every part counts.
    let other_args =
        json!({"name": "echo", "arguments": {"message": "A: hello", "n": 12345678901234i64}});
    let empty_args = json!({"name": "echo", "arguments": {}});
    let no_args = json!({"name": "echo"});
    let with_meta = json!({"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234i64}, "_meta": {"x": 1}});
    let other_name =
        json!({"name": "echo2", "arguments": {"message": "B: rm -rf /", "n": 12345678901234i64}});
    let variants = [
        CallDigest {
            id: "0a1b2c3e",
            ..base
        },
        CallDigest {
            server: "other",
            ..base
        },
        CallDigest {
            namespace: "team-b",
            ..base
        },
        CallDigest {
            task_run: "held2",
            ..base
        },
        CallDigest {
            definition: "sha256:2222222222222222222222222222222222222222222222222222222222222222",
            ..base
        },
        CallDigest {
            context_version: 4,
            ..base
        },
        CallDigest { v: 2, ..base },
        CallDigest {
            params: &other_args,
            ..base
        },
        CallDigest {
            params: &with_meta,
            ..base
        },
        CallDigest {
            params: &other_name,
            ..base
        },
    ];
    let mut seen = std::collections::BTreeSet::from([VECTOR.to_string()]);
    for d in variants {
        assert!(seen.insert(d.digest()), "{d:?} hashes like another");
    }
    assert_ne!(
        vector(&empty_args).digest(),
        vector(&no_args).digest(),
        "arguments: {{}} and absent differ"
    );
    assert!(crate::digest::is_pin(&base.digest()));
}

/// The salted form of the fixed vector (the sidecar's tests assert it too).
pub(crate) const SALTED_VECTOR: &str =
    "sha256:3d6929cb14acadf7dc8b78dd0ee58b95ca26245dcf324984855efb0af01b72d4";

#[test]
fn a_salted_digest_covers_the_salt_and_cannot_be_told_from_the_params() {
    let params = vector_params();
    let base = vector(&params);
    let salt = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    assert_eq!(base.salted(salt), SALTED_VECTOR);
    // The salt is one more member beside the others.
    let mut spelled = serde_json::to_value(base).unwrap_or_default();
    spelled["salt"] = json!(salt);
    assert_eq!(crate::digest::sha256_jcs(&spelled), SALTED_VECTOR);
    assert_ne!(base.salted(salt), base.digest());
    assert_ne!(base.salted(salt), base.salted(&salt.replace('0', "1")));
    assert!(crate::digest::is_pin(&base.salted(salt)));
}

#[test]
fn a_digest_is_checked_against_the_params_shown_when_nothing_is_masked() {
    fn shown<'a>(params: Option<&'a str>, masked: bool, digest: &'a str) -> ShownCall<'a> {
        ShownCall {
            namespace: "team-a",
            task_run: "held",
            id: "0a1b2c3d",
            server: "everything",
            definition: "sha256:1111111111111111111111111111111111111111111111111111111111111111",
            context_version: 3,
            params,
            masked,
            digest,
        }
    }
    let params = vector_params().to_string();
    assert_eq!(
        shown(Some(&params), false, VECTOR).check(),
        DigestCheck::Covers
    );
    let other = r#"{"name":"echo","arguments":{"message":"A: hello","n":12345678901234}}"#;
    assert!(matches!(
        shown(Some(other), false, VECTOR).check(),
        DigestCheck::Mismatch { computed } if computed != VECTOR
    ));
    assert_eq!(
        shown(Some(other), true, VECTOR).check(),
        DigestCheck::Salted
    );
    assert_eq!(shown(None, false, VECTOR).check(), DigestCheck::Salted);
    assert_eq!(
        shown(Some("[1]"), false, VECTOR).check(),
        DigestCheck::Unreadable
    );
}
