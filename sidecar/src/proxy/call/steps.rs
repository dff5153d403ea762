//! The call path's checks that need nothing but the call and what they check it against: each a
//! function `-> Result<_, Refusal>`, applied in the order `super::decide` lists.

use crate::{
    conditions::{Facts, TaskFacts, Verdict},
    decision,
    error::Error,
    filter::{Risk, Rule, RuleDisplay},
    names::{ServerName, ToolName},
    policy::{
        arguments::Validators,
        limits::Limiters,
        refusal::{Reason, Refusal, Target},
    },
    router::{Lookup, Route},
};

use super::super::{CallRequest, Snapshot};

/// Step: a proxy that is shutting down takes no new call.
pub(super) fn open(draining: bool) -> Result<(), Refusal> {
    match draining {
        true => Err(Error::ShuttingDown.into()),
        false => Ok(()),
    }
}

/// Step: the tool must be on offer. The table decided that when it was built, in this order:
/// the server's allow/deny patterns, `maxRisk` against the tool's class, and under
/// `onChange: block` a definition that is not the pinned (or first seen) one. A name on no
/// known list is unknown.
pub(super) fn offered(lookup: Lookup<'_>) -> Result<Route, Refusal> {
    match lookup {
        Lookup::Routed(route) => Ok(route.clone()),
        Lookup::Denied {
            server,
            tool,
            rule,
            risk,
        } => Err(denied(server, tool, &rule, risk)),
        Lookup::NeedsLists(_) | Lookup::Unknown => Err(Refusal::new(Reason::Unknown)),
    }
}

/// A tool hidden by a rule.
fn denied(server: ServerName, tool: ToolName, rule: &Rule, risk: Option<Risk>) -> Refusal {
    let shown = RuleDisplay {
        server: &server,
        rule,
    }
    .to_string();
    let target = Target {
        server,
        tool: tool.to_string(),
        risk,
        // A tool whose risk is known is on its server's list; one refused by its name's
        // pattern alone may be on none.
        listed: risk.map(|_| true),
    };
    Refusal::of(Reason::Denied, target, shown)
}

/// Step: the arguments must fit the tool's `inputSchema` (unless `policy.validateArguments` is
/// off).
pub(super) async fn arguments(
    validators: &Validators,
    snap: &Snapshot,
    route: &Route,
    req: &CallRequest,
) -> Result<(), Refusal> {
    if !snap.config.validate_arguments {
        return Ok(());
    }
    let checked = validators
        .check(
            &route.definition,
            &route.input_schema,
            req.arguments.as_ref(),
        )
        .await;
    let Err(refused) = checked else {
        return Ok(());
    };
    let rule = format!(
        "policy.validateArguments (servers[{}]: the inputSchema of {:?})",
        route.server.name, route.tool
    );
    let problems = refused.problems();
    let reason = Reason::InvalidArguments { problems };
    Err(Refusal::of(reason, route.target(), rule))
}

/// Step: the policy's CEL conditions (`policy.conditions`), in order. A `deny` one that holds,
/// or one that cannot be evaluated on the call, refuses it; `Ok(Some(rule))`: a
/// `requireApproval` one holds, and the call waits for a person (the next step).
pub(super) fn conditions(
    snap: &Snapshot,
    route: &Route,
    req: &CallRequest,
) -> Result<Option<String>, Refusal> {
    let config = &snap.config;
    if config.conditions.is_empty() {
        return Ok(None);
    }
    let facts = call_facts(snap, route, req);
    match config.conditions.decide(&facts) {
        Verdict::Pass { approval } => Ok(approval),
        Verdict::Denied {
            rule,
            name,
            message,
        } => Err(Refusal::of(
            Reason::ConditionDenied { name, message },
            route.target(),
            rule,
        )),
        Verdict::Failed { rule, name, error } => Err(Refusal::of(
            Reason::ConditionFailed { name, error },
            route.target(),
            rule,
        )),
    }
}

/// Step: the policy services of `policy.decisionPoints`, asked with the call's input (the
/// conditions' facts as JSON, and the task's identity); only an explicit allow of each goes on.
pub(super) async fn decision(
    snap: &Snapshot,
    route: &Route,
    req: &CallRequest,
) -> Result<(), Refusal> {
    let config = &snap.config;
    if config.decision_points.is_empty() {
        return Ok(());
    }
    let input = call_facts(snap, route, req).input();
    match config.decision_points.decide(&input).await {
        decision::Verdict::Allow => Ok(()),
        decision::Verdict::Denied { rule, reason } => Err(Refusal::of(
            Reason::DecisionDenied { reason },
            route.target(),
            rule,
        )),
        decision::Verdict::Failed { rule, error } => Err(Refusal::of(
            Reason::DecisionFailed { error },
            route.target(),
            rule,
        )),
    }
}

/// What the call is, as conditions and decision points read it.
fn call_facts<'a>(snap: &'a Snapshot, route: &'a Route, req: &'a CallRequest) -> Facts<'a> {
    let config = &snap.config;
    Facts {
        server: route.server.name.as_str(),
        tool: route.tool.as_str(),
        class: Some(route.risk.as_str()),
        annotations: annotations(route),
        args: req.arguments.as_ref(),
        task: TaskFacts {
            name: &config.task_name,
            namespace: &config.task_namespace,
            labels: &config.task_labels,
            context_version: config.context_version,
            created_by: config.task_created_by.as_deref(),
        },
        now: chrono::Utc::now(),
    }
}

/// The tool's annotations the proxy knows (its server's hints), as conditions and decision
/// points read them.
fn annotations(route: &Route) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    for (key, hint) in [
        ("readOnlyHint", route.hints.read_only),
        ("destructiveHint", route.hints.destructive),
    ] {
        if let Some(hint) = hint {
            annotations.insert(key.into(), hint.into());
        }
    }
    annotations.into()
}

/// Step (after a wait for approval, which may have been long): the call goes on only if its
/// tool is still on offer in `now`, the table in force now, with the definition that was
/// approved.
pub(super) fn still_offered(
    now: &Snapshot,
    req: &CallRequest,
    route: Route,
) -> Result<Route, Refusal> {
    match now.router_for(&req.session).lookup(&req.name) {
        Lookup::Routed(now)
            if now.server.name == route.server.name && now.definition == route.definition =>
        {
            Ok(now.clone())
        }
        _ => {
            let rule = format!(
                "the tool was withdrawn or changed while its call waited for approval (servers[{}])",
                route.server.name
            );
            // Whether the name is still listed is the new table's to say.
            let target = Target {
                listed: None,
                ..route.target()
            };
            Err(Refusal::of(Reason::Denied, target, rule))
        }
    }
}

/// Step: the call must fit its tool's and its server's rate limits (after any wait for
/// approval, so a call that waits or is refused takes no token).
pub(super) fn rate_limits(limiters: &Limiters, route: &Route) -> Result<(), Refusal> {
    let Err(limited) = limiters.check(&route.server, route.tool.as_str()) else {
        return Ok(());
    };
    let rule = format!("{} ({})", limited.path, limited.limit);
    let reason = Reason::RateLimited {
        limit: limited.path,
        rate: limited.limit.to_string(),
        retry_after: limited.retry_after,
    };
    Err(Refusal::of(reason, route.target(), rule))
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use rmcp::model::Tool;

    use super::*;
    use crate::{config::valid as config, policy::definitions::KnownList, router::Router};

    const TASK: &str = r#"
task: {name: t}
policy: {maxRisk: write}
servers:
  - name: gh
    stdio: {command: x}
    tools: {deny: ["delete_*"]}
    risk: {merge_pr: destructive}
    rateLimit: {perMinute: 1, burst: 1}
  - {name: fs, stdio: {command: y}}
"#;

    fn table() -> Router {
        let tools = |names: &[&str]| {
            let tools = names.iter().map(|n| {
                let mut t = Tool::default();
                t.name = n.to_string().into();
                t
            });
            KnownList::first_sight(Arc::new(tools.collect()))
        };
        let lists = HashMap::from([(
            ServerName::new("gh"),
            tools(&["list_issues", "delete_repo", "merge_pr"]),
        )]);
        Router::build(&config(TASK), &lists)
    }

    #[test]
    fn a_call_is_on_offer_only_as_the_table_says_and_names_the_deciding_rule() {
        let table = table();
        let route = offered(table.lookup("gh__list_issues")).expect("on offer");
        assert_eq!(route.tool.as_str(), "list_issues");
        for (name, rule) in [
            ("gh__delete_repo", "servers[gh].tools.deny[0]"),
            ("gh__merge_pr", "maxRisk"),
            // Not listed, refused by its pattern without starting anything.
            ("gh__delete_branch", "servers[gh].tools.deny[0]"),
        ] {
            let refused = offered(table.lookup(name)).expect_err(name);
            assert_eq!(refused.code(), "PROXY.TOOL_DENIED", "{name}");
            let shown = refused.rule.as_deref().unwrap_or_default();
            assert!(shown.contains(rule), "{name}: {shown}");
        }
        let unlisted = offered(table.lookup("gh__delete_branch")).expect_err("denied");
        assert_eq!(unlisted.target.as_ref().and_then(|t| t.listed), None);
        let unknown = offered(table.lookup("nope")).expect_err("unknown");
        assert!(unknown.is_unknown());
        // fs has no list yet: undecided names are unknown to this step (the route step starts
        // the servers first).
        assert!(
            offered(table.lookup("fs__read"))
                .expect_err("undecided")
                .is_unknown()
        );
    }

    #[test]
    fn a_draining_proxy_refuses_and_a_rate_limit_takes_a_token_per_call() {
        assert!(open(false).is_ok());
        let refused = open(true).expect_err("draining");
        assert_eq!(refused.code(), "PROXY.SHUTTING_DOWN");
        assert_eq!(refused.decision(), "unknown");

        let table = table();
        let route = offered(table.lookup("gh__list_issues")).expect("on offer");
        let limiters = Limiters::default();
        assert!(rate_limits(&limiters, &route).is_ok());
        let limited = rate_limits(&limiters, &route).expect_err("burst 1");
        assert_eq!(limited.code(), "PROXY.RATE_LIMITED");
        assert_eq!(
            limited.rule.as_deref(),
            Some("servers[gh].rateLimit (1/min, burst 1)")
        );
        assert_eq!(limited.decision(), "rate_limited");
    }
}
