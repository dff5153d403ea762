use super::*;

#[test]
fn series_an_alert_counts_exist_at_zero_before_the_first_event() {
    let m = Metrics::new();
    m.servers(["gh", "memory"]);
    let text = m.encode();
    for outcome in APPROVAL_OUTCOMES {
        let series = format!("mcp_proxy_approvals_total{{outcome=\"{outcome}\"}} 0");
        assert!(text.contains(&series), "{series} missing in\n{text}");
    }
    for family in [
        "upstream_restarts",
        "upstream_start_failures",
        "upstream_exits",
    ] {
        for server in ["gh", "memory"] {
            let series = format!("mcp_proxy_{family}_total{{server=\"{server}\"}} 0");
            assert!(text.contains(&series), "{series} missing in\n{text}");
        }
    }
}

#[test]
fn in_shared_mode_each_task_has_its_own_gauges_removed_with_it() {
    let m = Metrics::shared();
    let (a, b) = (m.for_task("team-a", "fix-1"), m.for_task("team-b", "fix-2"));
    a.config_in_use(3);
    b.config_in_use(7);
    b.approvals_pending(1);
    a.call("gh", "create_issue", "ok", 0.001);
    let text = m.encode();
    for needle in [
        r#"mcp_proxy_context_version{namespace="team-a",taskrun="fix-1"} 3"#,
        r#"mcp_proxy_context_version{namespace="team-b",taskrun="fix-2"} 7"#,
        r#"mcp_proxy_config_loaded{namespace="team-a",taskrun="fix-1"} 1"#,
        r#"mcp_proxy_approvals_pending{namespace="team-b",taskrun="fix-2"} 1"#,
        r#"mcp_proxy_tool_calls_total{server="gh",tool="create_issue",outcome="ok"} 1"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    a.forget_task();
    let text = m.encode();
    assert!(!text.contains(r#"taskrun="fix-1""#), "{text}");
    assert!(text.contains(r#"mcp_proxy_context_version{namespace="team-b",taskrun="fix-2"} 7"#));
}

#[test]
fn in_shared_mode_each_tasks_model_spending_is_its_own_series_removed_with_it() {
    let m = Metrics::shared();
    let (a, b) = (m.for_task("team-a", "fix-1"), m.for_task("team-b", "fix-2"));
    for (task, tokens) in [(&a, 100), (&b, 7)] {
        let at = task.model_task();
        task.model
            .request(&at, "claude-sonnet-4-5", "ok", 1.5, [tokens, 10, 0, 0]);
        task.model.cost(&at, "claude-sonnet-4-5", 0.25);
    }
    a.model.refused(&a.model_task(), "outputTokens");
    let text = m.encode();
    for needle in [
        r#"mcp_proxy_model_tokens_total{namespace="team-a",taskrun="fix-1",model="claude-sonnet-4-5",kind="input"} 100"#,
        r#"mcp_proxy_model_tokens_total{namespace="team-b",taskrun="fix-2",model="claude-sonnet-4-5",kind="input"} 7"#,
        r#"mcp_proxy_model_cost_usd_total{namespace="team-a",taskrun="fix-1",model="claude-sonnet-4-5"} 0.25"#,
        r#"mcp_proxy_model_budget_refusals_total{namespace="team-a",taskrun="fix-1",limit="outputTokens"} 1"#,
        // Each task's refusal series exist at 0 once it used the gateway.
        r#"mcp_proxy_model_budget_refusals_total{namespace="team-b",taskrun="fix-2",limit="wallTimeSeconds"} 0"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    a.forget_task();
    let text = m.encode();
    assert!(!text.contains(r#"taskrun="fix-1""#), "{text}");
    assert!(text.contains(r#"mcp_proxy_model_tokens_total{namespace="team-b",taskrun="fix-2",model="claude-sonnet-4-5",kind="input"} 7"#));
    // A sidecar's series name no task (one per process).
    let sidecar = Metrics::new();
    let task = sidecar.for_task("team-a", "fix-1");
    task.model.request(
        &task.model_task(),
        "claude-sonnet-4-5",
        "ok",
        1.0,
        [1, 1, 0, 0],
    );
    assert!(
        sidecar.encode().contains(
            r#"mcp_proxy_model_requests_total{model="claude-sonnet-4-5",outcome="ok"} 1"#
        )
    );
}

#[test]
fn exposes_counters_with_labels() {
    let m = Metrics::new();
    m.call("gh", "create_issue", "ok", 0.002);
    m.call("gh", "delete_repo", "denied", 0.0);
    m.reload("file", "failed");
    m.config_in_use(4);
    m.approval("rejected");
    m.approvals_pending(2);
    m.upstream_started(&ServerName::new("gh"), "tools_call", true);
    let text = m.encode();
    for needle in [
        r#"mcp_proxy_tool_calls_total{server="gh",tool="create_issue",outcome="ok"} 1"#,
        r#"mcp_proxy_tool_calls_total{server="gh",tool="delete_repo",outcome="denied"} 1"#,
        r#"mcp_proxy_config_reloads_total{result="failed",source="file"} 1"#,
        "mcp_proxy_context_version 4",
        r#"mcp_proxy_approvals_total{outcome="rejected"} 1"#,
        "mcp_proxy_approvals_pending 2",
        r#"mcp_proxy_upstream_restarts_total{server="gh"} 1"#,
        r#"mcp_proxy_tool_call_duration_seconds_count{server="gh",outcome="ok"} 1"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[test]
fn the_build_is_one_series_in_both_modes() {
    for m in [Metrics::new(), Metrics::shared()] {
        let text = m.encode();
        let line = format!(
            "mcp_proxy_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
}
