use rmcp::model::ErrorCode;

use super::*;

fn to(server: &str) -> Target {
    Target {
        server: ServerName::new(server),
        tool: "write_file".into(),
        risk: Some(Risk::Write),
        listed: Some(true),
    }
}

fn result(refusal: Refusal, tool: &str) -> (String, Value) {
    let Ok(CallToolResponse::Complete(result)) = refusal.answer(tool) else {
        panic!("a refusal by policy is a tool result");
    };
    assert_eq!(result.is_error, Some(true));
    let text = result.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .unwrap_or_default();
    let data = result
        .meta
        .and_then(|m| m.get("io.orchestrator/proxy").cloned())
        .unwrap_or_default();
    (text, data)
}

#[test]
fn an_approval_refusal_names_who_decided_and_why() {
    let rejected = Refusal::of(
        Reason::ApprovalRejected {
            id: "0a1b2c3d".into(),
            decided_by: "alice@example.com".into(),
            reason: Some("not this file".into()),
        },
        to("fs"),
        "policy.requireApproval.tools[0]".into(),
    );
    assert_eq!(
        (rejected.decision(), rejected.approval_outcome()),
        ("rejected", Some("rejected"))
    );
    assert_eq!(
        result(rejected, "fs__write_file"),
        (
            "tool \"fs__write_file\" was rejected by alice@example.com (approval 0a1b2c3d): not this file; the call was not made".into(),
            json!({
                "code": "PROXY.APPROVAL_REJECTED", "server": "fs", "approvalId": "0a1b2c3d",
                "decidedBy": "alice@example.com", "reason": "not this file",
            })
        )
    );
    let expired = Refusal::of(
        Reason::ApprovalExpired {
            id: "0a1b2c3d".into(),
            timeout: Duration::from_secs(3),
        },
        to("fs"),
        "policy.requireApproval.tools[0]".into(),
    );
    let (text, data) = result(expired, "fs__write_file");
    assert!(text.contains("not approved within 3s"), "{text}");
    assert_eq!(
        data,
        json!({"code": "PROXY.APPROVAL_EXPIRED", "server": "fs", "approvalId": "0a1b2c3d", "timeoutSeconds": 3})
    );
}

#[test]
fn a_call_too_large_to_show_or_decided_under_another_digest_is_not_made() {
    let rule = || "policy.requireApproval.tools[0]".to_string();
    let large = Refusal::of(
        Reason::ApprovalTooLarge {
            bytes: 20_512,
            limit: 12_288,
        },
        to("fs"),
        rule(),
    );
    assert_eq!(
        (
            large.decision(),
            large.approval_outcome(),
            large.metric_outcome()
        ),
        (
            "approval_too_large",
            Some("too_large"),
            "approval_too_large"
        )
    );
    assert_eq!(
        result(large, "fs__write_file"),
        (
            "tool \"fs__write_file\" needs a person's approval (policy.requireApproval), and its call would take 20512 bytes to show, more than the 12288 a request may hold; the call was not made: send smaller arguments (e.g. write the file in parts)".into(),
            json!({"code": "PROXY.APPROVAL_TOO_LARGE", "server": "fs", "bytes": 20_512, "limit": 12_288})
        )
    );
    let (named, held) = (
        format!("sha256:{}", "a".repeat(64)),
        format!("sha256:{}", "b".repeat(64)),
    );
    let mismatch = Refusal::of(
        Reason::ApprovalMismatch {
            id: "0a1b2c3d".into(),
            named: named.clone(),
            held: held.clone(),
        },
        to("fs"),
        rule(),
    );
    assert_eq!(
        (mismatch.decision(), mismatch.approval_outcome()),
        ("approval_mismatch", Some("mismatch"))
    );
    assert_eq!(
        result(mismatch, "fs__write_file"),
        (
            "approval 0a1b2c3d names another call (sha256:aaaaaaaaaaaa…), not this one (sha256:bbbbbbbbbbbb…); the call to tool \"fs__write_file\" was not made".into(),
            json!({"code": "PROXY.APPROVAL_MISMATCH", "server": "fs", "approvalId": "0a1b2c3d", "named": named, "held": held})
        )
    );
    assert_eq!(short(""), "no digest");
    assert_eq!(short("sha256:ab"), "sha256:ab");
}

#[test]
fn a_denial_names_its_rule_and_a_failure_stays_a_json_rpc_error() {
    let denied = Refusal::of(Reason::Denied, to("gh"), "servers[gh].tools.deny[0]".into());
    assert_eq!(
        (denied.outcome(), denied.metric_outcome()),
        (Outcome::Denied, "denied")
    );
    assert_eq!(
        result(denied, "gh__delete_repo"),
        (
            "tool \"gh__delete_repo\" is not allowed: denied by servers[gh].tools.deny[0]".into(),
            json!({"code": "PROXY.TOOL_DENIED", "server": "gh", "rule": "servers[gh].tools.deny[0]"})
        )
    );
    let unknown = Refusal::new(Reason::Unknown);
    assert_eq!(
        (unknown.decision(), unknown.metric_outcome()),
        ("unknown", "tool_error")
    );
    let limited = Refusal::of(
        Reason::RateLimited {
            limit: "servers[gh].rateLimit".into(),
            rate: "6/min, burst 2".into(),
            retry_after: Duration::from_millis(2500),
        },
        to("gh"),
        "servers[gh].rateLimit (6/min, burst 2)".into(),
    );
    assert_eq!(limited.metric_outcome(), "rate_limited");
    let (text, data) = result(limited, "gh__x");
    assert_eq!(
        text,
        "tool \"gh__x\" is rate limited by servers[gh].rateLimit (6/min, burst 2); retry in 2.5s"
    );
    assert_eq!(data["rule"], "servers[gh].rateLimit");
    assert_eq!(data["retryAfterSeconds"], 2.5);

    let failed = Refusal::from(Error::ShuttingDown);
    assert_eq!(
        (failed.decision(), failed.metric_outcome()),
        ("unknown", "protocol_error")
    );
    let Err(error) = failed.answer("gh__x") else {
        panic!("a failure is a JSON-RPC error");
    };
    assert_eq!(error.to_mcp().code, ErrorCode::INTERNAL_ERROR);
    let withdrawn = Refusal::new(Reason::Withdrawn(Error::Cancelled("the client")));
    assert_eq!(
        (
            withdrawn.decision(),
            withdrawn.outcome(),
            withdrawn.approval_outcome()
        ),
        ("withdrawn", Outcome::ProtocolError, Some("withdrawn"))
    );
    assert_eq!(withdrawn.code(), "PROXY.CANCELLED");
}

/// The texts of the validation matrix (docs/design/approval-and-intent.md), each followed by
/// its fix where the matrix's words lack one.
#[test]
fn intent_refusals_say_the_matrix_words_and_carry_their_codes() {
    let required = Refusal::new(Reason::IntentRequired {
        variant: "call_tool_read",
        operation: "read",
    });
    assert_eq!(
        required.text("x"),
        "intent.operation_type is required (call call_tool_read with intent: {\"operation_type\": \"read\"})"
    );
    let mismatch = Refusal::new(Reason::IntentMismatch {
        variant: "call_tool_read",
        declared: "write",
        fits: "call_tool_write",
    });
    assert_eq!(
        mismatch.text("x"),
        "Intent mismatch: tool is call_tool_read but intent declares write (for a write call call_tool_write)"
    );
    let server = Refusal::of(
        Reason::IntentServerMismatch {
            marked: Risk::Destructive,
            fits: "call_tool_destructive",
            unannotated: false,
        },
        to("fs"),
        "policy.toolMode \"intent\"".into(),
    );
    assert_eq!(
        server.text("fs__write_file"),
        "Tool 'fs__write_file' is marked destructive by server, use call_tool_destructive"
    );
    assert_eq!(
        server.data(),
        json!({"code": "PROXY.INTENT_SERVER_MISMATCH", "server": "fs", "risk": "destructive"})
    );
    for (refusal, code, decision) in [
        (required, "PROXY.INTENT_REQUIRED", "intent_required"),
        (mismatch, "PROXY.INTENT_MISMATCH", "intent_mismatch"),
        (server, "PROXY.INTENT_SERVER_MISMATCH", "intent_mismatch"),
    ] {
        assert_eq!(refusal.code(), code);
        assert_eq!(refusal.decision(), decision);
        assert_eq!(
            refusal.outcome(),
            Outcome::Denied,
            "{code} is a tool error result"
        );
    }
}
