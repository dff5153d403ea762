//! The policy's rules on what a call does, compiled: `policy.conditions` (CEL) and
//! `policy.decisionPoints` (the policy services asked). A bad entry is a problem (its own code,
//! the field's path); the config then does not load.

use orchestrator_crds::proxy::PolicySpec;

use super::{Code, Problem};
use crate::{conditions::Conditions, decision::DecisionPoints};

/// The conditions and decision points of `wire`, problems pushed onto `problems`.
pub(super) fn compile(
    wire: &PolicySpec,
    problems: &mut Vec<Problem>,
) -> (Conditions, DecisionPoints) {
    let conditions = Conditions::compile(&wire.conditions).unwrap_or_else(|found| {
        for (at, message) in found {
            problems.push(Problem::new(Code::BadCondition, at, message));
        }
        Conditions::default()
    });
    let points = DecisionPoints::compile(&wire.decision_points).unwrap_or_else(|found| {
        for (at, message) in found {
            problems.push(Problem::new(Code::BadDecisionPoint, at, message));
        }
        DecisionPoints::default()
    });
    (conditions, points)
}
