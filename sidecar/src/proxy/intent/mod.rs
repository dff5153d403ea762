//! Intent-declaration mode (`policy.toolMode: intent`, reference design 001). `tools/list`
//! offers four fixed tools instead of the enabled ones: `retrieve_tools` finds the enabled tools,
//! and `call_tool_read`, `call_tool_write` and `call_tool_destructive` call one with a declared
//! intent, which the two-key check ([`matrix`]) holds against the variant and against what the
//! tool's server says. A call that passes becomes the call of the tool it names and takes the
//! direct path unchanged: router lookup, deny rules, `check_arguments` (argument validation of
//! `args` against the real tool's schema, rate limits), forward, audit (with the intent) and
//! metrics.
//!
//! Children: `matrix` (the check), `offer` (the four tools), `declared` (a call's arguments),
//! `retrieve` (the search).

mod declared;
mod matrix;
mod offer;
mod retrieve;

use std::{ops::ControlFlow, sync::Arc, time::Instant};

use orchestrator_crds::proxy::ToolMode;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Tool};

pub use declared::Declared;
use matrix::{Refusal, Said, Variant};

use super::{CallRequest, Proxy, Snapshot, record::Denial};
use crate::{
    error::Error,
    names::{clip, clip_to},
    router::Route,
};

/// How much of a server's start error `retrieve_tools` shows.
const MAX_UNAVAILABLE: usize = 512;

/// What intent mode makes of a `tools/call`: an answer (`retrieve_tools`'s, or a refusal), or
/// the call of the tool a `call_tool_*` names, with its intent, to continue on the direct path.
pub(super) type Front = ControlFlow<Result<CallToolResponse, Error>, CallRequest>;

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

impl Proxy {
    /// Intent mode's front of `tools/call` (direct mode: the request, unchanged).
    pub(super) async fn intent_front(
        &self,
        snap: &Snapshot,
        req: CallRequest,
        started: Instant,
    ) -> Front {
        if snap.config.tool_mode != ToolMode::Intent {
            return ControlFlow::Continue(req);
        }
        if req.name == offer::RETRIEVE_TOOLS {
            return ControlFlow::Break(self.retrieve_tools(snap, &req, started).await);
        }
        let Some(variant) = Variant::of_tool(&req.name) else {
            // An enabled tool called by its own name would skip the two-key check.
            let error = Error::IntentDirectCall {
                tool: clip(&req.name).into_owned(),
            };
            let denial = snap.router_for(&req.session).route(&req.name).map(|route| {
                let rule = "policy.toolMode \"intent\" (tools are called through call_tool_*)";
                Denial::by_policy(route, rule.into(), "intent_required")
            });
            return ControlFlow::Break(self.refuse(snap, &req, started, error, denial));
        };
        let call = declared::parse(variant, req.arguments.as_ref());
        let refusal = match (&call.declared.operation_type, call.operation) {
            (None, _) => Some(Refusal::Required),
            (Some(_), Some(declared)) => matrix::check_declared(variant, Some(declared)).err(),
            // Not one of the three: among the problems.
            (Some(_), None) => None,
        };
        let takes = format!("takes intent.operation_type {:?}", variant.operation());
        let (error, what, decision) = match refusal {
            Some(Refusal::Mismatch { declared }) => (
                Error::IntentMismatch {
                    variant: variant.tool(),
                    declared: declared.operation(),
                    fits: declared.tool(),
                },
                takes,
                "intent_mismatch",
            ),
            Some(_) => (
                Error::IntentRequired {
                    variant: variant.tool(),
                    operation: variant.operation(),
                },
                takes,
                "intent_required",
            ),
            None if !call.problems.is_empty() => (
                Error::IntentArguments {
                    tool: variant.tool(),
                    problems: call.problems,
                },
                "arguments".to_string(),
                "invalid_arguments",
            ),
            None => {
                return ControlFlow::Continue(CallRequest {
                    name: call.name.unwrap_or_default(),
                    arguments: call.args,
                    intent: Some(call.declared),
                    ..req
                });
            }
        };
        // The record names the tool the call was for (by its exposed name), when there is one.
        let req = CallRequest {
            name: call.name.unwrap_or_else(|| variant.tool().to_string()),
            arguments: call.args,
            intent: Some(call.declared),
            ..req
        };
        let denial = snap
            .router_for(&req.session)
            .route(&req.name)
            .map(|route| Denial::by_policy(route, rule(variant, &what), decision));
        ControlFlow::Break(self.refuse(snap, &req, started, error, denial))
    }

    /// The second key, once the tool is known: the variant called must be at least what the
    /// tool's server (or a `risk` override) says the tool is. Nothing to check for a direct call.
    pub(super) fn check_intent(
        &self,
        route: &Route,
        req: &CallRequest,
    ) -> Result<(), Box<(Error, Denial)>> {
        let Some(declared) = &req.intent else {
            return Ok(());
        };
        let Err(Refusal::Server { said }) = matrix::check_server(declared.variant, Said::of(route))
        else {
            return Ok(());
        };
        let marked = said.risk();
        let fits = Variant::for_risk(marked);
        let error = Error::IntentServerMismatch {
            tool: clip(&req.name).into_owned(),
            server: route.server.name.clone(),
            marked,
            fits: fits.tool(),
        };
        let source = said.source(route.server.name.as_str(), route.tool.as_str());
        let rule = format!("policy.toolMode \"intent\" ({source}: use {fits})");
        Err(Box::new((
            error,
            Denial::by_policy(route, rule, "intent_mismatch"),
        )))
    }

    /// `retrieve_tools`: the enabled tools matching the query, from the current table. Servers
    /// whose list is not known yet are started first (in parallel), as `tools/list` does in
    /// direct mode; one that fails is named in the answer.
    async fn retrieve_tools(
        &self,
        snap: &Snapshot,
        req: &CallRequest,
        started: Instant,
    ) -> Result<CallToolResponse, Error> {
        let query = match retrieve::parse(req.arguments.as_ref()) {
            Ok(query) => query,
            Err(problems) => {
                let error = Error::IntentArguments {
                    tool: offer::RETRIEVE_TOOLS,
                    problems,
                };
                return self.refuse(snap, req, started, error, None);
            }
        };
        let router = snap.router_for(&req.session);
        let missing = router.lists_to_fetch();
        let (current, unavailable) = if missing.is_empty() {
            (None, Vec::new())
        } else {
            let errors = self.fetch_lists(&missing, &req.session).await;
            self.rebuild().await;
            let errors = errors
                .iter()
                .map(|e| clip_to(&e.to_string(), MAX_UNAVAILABLE).into_owned())
                .collect();
            (self.snapshot(), errors)
        };
        let table = current.as_deref().unwrap_or(snap);
        let answer = retrieve::answer(table.router_for(&req.session), &query, &unavailable);
        let response =
            CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(
                answer.to_string(),
            )]));
        self.answered(table, req, started, &response);
        Ok(response)
    }
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
