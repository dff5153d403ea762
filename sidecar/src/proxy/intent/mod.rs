//! Intent-declaration mode (`policy.toolMode: intent`, reference design 001). `tools/list`
//! offers four fixed tools instead of the enabled ones: `retrieve_tools` finds the enabled tools,
//! and `call_tool_read`, `call_tool_write` and `call_tool_destructive` call one with a declared
//! intent, which the two-key check ([`matrix`]) holds against the variant and against what the
//! tool's server says. Both keys are steps of the call pipeline (`super::call`): [`front`] (the
//! first key, before the route) and [`second_key`] (once the tool's route is known). A call that
//! passes becomes the call of the tool it names and takes the direct path's other steps
//! unchanged (its arguments are `args`, checked against the real tool's schema), with its intent
//! in the audit record.
//!
//! Children: `matrix` (the check), `offer` (the four tools), `declared` (a call's arguments),
//! `retrieve` (the search).

mod declared;
mod matrix;
mod offer;
mod retrieve;

use std::sync::Arc;

use orchestrator_crds::proxy::ToolMode;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Tool};

pub use declared::Declared;
pub use retrieve::Query;

use matrix::{Said, Unmatched, Variant};

use super::{CallRequest, Snapshot};
use crate::{
    names::clip_to,
    policy::refusal::{Reason, Refusal},
    router::Route,
};

/// How much of a server's start error `retrieve_tools` shows.
const MAX_UNAVAILABLE: usize = 512;

/// What intent mode makes of a `tools/call` that passes its first key.
pub(super) enum Front {
    /// Go on with the call (in intent mode, now the call of the tool a `call_tool_*` names,
    /// with its declared intent).
    Call,
    /// `retrieve_tools`: the proxy answers it (see [`retrieve`]).
    Retrieve(Query),
}

/// The tools `tools/list` offers in intent mode.
pub(super) fn offered() -> Arc<Vec<Tool>> {
    offer::tools()
}

/// Whether clients should re-list: always when the mode changed; never within intent mode (its
/// four tools do not change, and `retrieve_tools` reads the current table each time); within
/// direct mode, when the tools changed.
pub(super) fn offer_changed(
    before: ToolMode,
    after: ToolMode,
    tools_changed: impl FnOnce() -> bool,
) -> bool {
    match (before, after) {
        (before, after) if before != after => true,
        (_, ToolMode::Intent) => false,
        (_, ToolMode::Direct) => tools_changed(),
    }
}

/// The audit rule of a refusal of the call itself.
fn rule(variant: Variant, what: &str) -> String {
    format!("policy.toolMode \"intent\" ({variant} {what})")
}

/// Step (intent mode; a direct-mode call passes unchanged): its own tools. A `call_tool_*` must
/// declare the intent of its variant (the first key), and becomes the call of the tool it names
/// (`req` is rewritten: name, arguments, intent); `retrieve_tools` is the proxy's to answer; an
/// enabled tool called by its own name is refused, as it would skip the two-key check. A refused
/// call's record names the tool it was for, when there is one.
pub(super) fn front(snap: &Snapshot, req: &mut CallRequest) -> Result<Front, Refusal> {
    if snap.config.tool_mode != ToolMode::Intent {
        return Ok(Front::Call);
    }
    let on = |req: &CallRequest, reason: Reason, rule: String| match snap
        .router_for(&req.session)
        .route(&req.name)
    {
        Some(route) => Refusal::of(reason, route.target(), rule),
        None => Refusal::new(reason),
    };
    if req.name == offer::RETRIEVE_TOOLS {
        return match retrieve::parse(req.arguments.as_ref()) {
            Ok(query) => Ok(Front::Retrieve(query)),
            Err(problems) => Err(Refusal::new(Reason::IntentArguments {
                tool: offer::RETRIEVE_TOOLS,
                problems,
            })),
        };
    }
    let Some(variant) = Variant::of_tool(&req.name) else {
        let rule = "policy.toolMode \"intent\" (tools are called through call_tool_*)";
        return Err(on(req, Reason::IntentDirectCall, rule.into()));
    };
    let call = declared::parse(variant, req.arguments.as_ref());
    let unmatched = match (&call.declared.operation_type, call.operation) {
        (None, _) => Some(Unmatched::Required),
        (Some(_), Some(declared)) => matrix::check_declared(variant, Some(declared)).err(),
        // Not one of the three: among the problems.
        (Some(_), None) => None,
    };
    let takes = format!("takes intent.operation_type {:?}", variant.operation());
    let refused = match unmatched {
        Some(Unmatched::Mismatch { declared }) => Some((
            Reason::IntentMismatch {
                variant: variant.tool(),
                declared: declared.operation(),
                fits: declared.tool(),
            },
            takes,
        )),
        Some(_) => Some((
            Reason::IntentRequired {
                variant: variant.tool(),
                operation: variant.operation(),
            },
            takes,
        )),
        None if !call.problems.is_empty() => Some((
            Reason::IntentArguments {
                tool: variant.tool(),
                problems: call.problems,
            },
            "arguments".to_string(),
        )),
        None => None,
    };
    req.name = match (&refused, call.name) {
        (_, Some(name)) => name,
        (Some(_), None) => variant.tool().to_string(),
        (None, None) => String::new(),
    };
    req.arguments = call.args;
    req.intent = Some(call.declared);
    match refused {
        Some((reason, what)) => Err(on(req, reason, rule(variant, &what))),
        None => Ok(Front::Call),
    }
}

/// Step: the second key, once the tool is known: the variant called must be at least what the
/// tool's server (or a `risk` override) says the tool is. Nothing to check for a direct call.
pub(super) fn second_key(route: &Route, req: &CallRequest) -> Result<(), Refusal> {
    let Some(declared) = &req.intent else {
        return Ok(());
    };
    let Err(Unmatched::Server { said }) = matrix::check_server(declared.variant, Said::of(route))
    else {
        return Ok(());
    };
    let marked = said.risk();
    let fits = Variant::for_risk(marked);
    let source = said.source(route.server.name.as_str(), route.tool.as_str());
    let rule = format!("policy.toolMode \"intent\" ({source}: use {fits})");
    let reason = Reason::IntentServerMismatch {
        marked,
        fits: fits.tool(),
        unannotated: said == Said::Unannotated,
    };
    Err(Refusal::of(reason, route.target(), rule))
}

/// `retrieve_tools`'s answer: the enabled tools matching the query in `table` (every list known
/// that could be), naming the servers that could not be started.
pub(super) fn retrieved(
    table: &Snapshot,
    req: &CallRequest,
    query: &Query,
    unavailable: &[crate::error::Error],
) -> CallToolResponse {
    let unavailable: Vec<String> = unavailable
        .iter()
        .map(|e| clip_to(&e.to_string(), MAX_UNAVAILABLE).into_owned())
        .collect();
    let answer = retrieve::answer(table.router_for(&req.session), query, &unavailable);
    CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(
        answer.to_string(),
    )]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_change_of_mode_or_of_direct_tools_is_announced() {
        use ToolMode::{Direct, Intent};
        let changed = || true;
        assert!(offer_changed(Direct, Intent, || false));
        assert!(offer_changed(Intent, Direct, || false));
        assert!(
            !offer_changed(Intent, Intent, changed),
            "a grant is not announced"
        );
        assert!(offer_changed(Direct, Direct, changed));
        assert!(!offer_changed(Direct, Direct, || false));
    }
}
