//! `policy.requireApproval` in its normalized form: the patterns compiled once, the wait as a
//! `Duration`. Decides exactly as the contract's `RequireApproval::requires` (a test holds the two
//! together), and also names the part of the policy that decided, for the audit record.

use std::time::Duration;

use globset::{Glob, GlobMatcher};
use orchestrator_crds::{approval::RequireApproval, proxy::Risk};

use super::{Code, Problem};
use crate::names::clip;

/// Which calls wait for a person's decision, and how long.
#[derive(Debug)]
pub struct ApprovalPolicy {
    /// Calls to tools of this class and riskier wait.
    pub risk: Option<Risk>,
    /// `server/glob` patterns, in config order.
    pub tools: Vec<ApprovalPattern>,
    /// How long a held call waits for a decision.
    pub timeout: Duration,
}

/// One `requireApproval.tools` entry.
#[derive(Debug)]
pub struct ApprovalPattern {
    /// As written, e.g. `github/merge_*`.
    pub text: String,
    server: GlobMatcher,
    tool: GlobMatcher,
}

impl ApprovalPolicy {
    /// Compiles `wire`; a pattern that is not `server/glob` with two valid globs is a problem
    /// (`PROXY.BAD_PATTERN`, an error: the operator never renders one).
    pub fn normalize(wire: &RequireApproval, problems: &mut Vec<Problem>) -> Self {
        let mut tools = Vec::with_capacity(wire.tools.len());
        for (i, text) in wire.tools.iter().enumerate() {
            match compile(text) {
                Ok((server, tool)) => tools.push(ApprovalPattern {
                    text: text.clone(),
                    server,
                    tool,
                }),
                Err(why) => problems.push(Problem::new(
                    Code::BadPattern,
                    format!("policy.requireApproval.tools[{i}]"),
                    format!(
                        "{:?} {why}; write server/glob, e.g. \"github/merge_*\"",
                        clip(text)
                    ),
                )),
            }
        }
        Self {
            risk: wire.risk,
            tools,
            timeout: Duration::from_secs(u64::from(wire.timeout_seconds())),
        }
    }

    /// The part of the policy that makes a call to `tool` of `server` (of class `risk`) wait, as
    /// a config path (`policy.requireApproval.risk "write"`); `None`: the call does not wait.
    pub fn rule_for(&self, server: &str, tool: &str, risk: Risk) -> Option<String> {
        if let Some(min) = self.risk
            && risk >= min
        {
            return Some(format!("policy.requireApproval.risk \"{min}\""));
        }
        self.tools
            .iter()
            .position(|p| p.server.is_match(server) && p.tool.is_match(tool))
            .map(|i| {
                format!(
                    "policy.requireApproval.tools[{i}] {:?}",
                    clip(&self.tools[i].text)
                )
            })
    }
}

fn compile(text: &str) -> Result<(GlobMatcher, GlobMatcher), String> {
    let Some((server, tool)) = text.split_once('/') else {
        return Err("has no '/' between the server and the tool".into());
    };
    if server.is_empty() || tool.is_empty() {
        return Err("needs both a server and a tool pattern".into());
    }
    let glob = |p: &str| {
        Glob::new(p)
            .map(|g| g.compile_matcher())
            .map_err(|e| format!("is not a valid glob: {e}"))
    };
    Ok((glob(server)?, glob(tool)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(risk: Option<Risk>, tools: &[&str]) -> (RequireApproval, ApprovalPolicy) {
        let wire = RequireApproval {
            risk,
            tools: tools.iter().map(|t| t.to_string()).collect(),
            timeout_seconds: Some(7),
        };
        let mut problems = Vec::new();
        let normalized = ApprovalPolicy::normalize(&wire, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        (wire, normalized)
    }

    #[test]
    fn decides_as_the_contract_does_and_names_what_decided() {
        let (wire, p) = policy(
            Some(Risk::Destructive),
            &["github/merge_*", "fs/write_file", "*/drop_?"],
        );
        assert_eq!(p.timeout, Duration::from_secs(7));
        let calls = [
            ("fs", "rm", Risk::Destructive),
            ("fs", "write", Risk::Write),
            ("fs", "write_file", Risk::Read),
            ("github", "merge_pull_request", Risk::Write),
            ("gitlab", "merge_pull_request", Risk::Write),
            ("db", "drop_x", Risk::Read),
            ("db", "drop_xy", Risk::Read),
        ];
        for (server, tool, risk) in calls {
            assert_eq!(
                p.rule_for(server, tool, risk).is_some(),
                wire.requires(server, tool, Some(risk)),
                "{server}/{tool} ({risk})"
            );
        }
        assert_eq!(
            p.rule_for("fs", "rm", Risk::Destructive).as_deref(),
            Some("policy.requireApproval.risk \"destructive\"")
        );
        assert_eq!(
            p.rule_for("github", "merge_it", Risk::Read).as_deref(),
            Some("policy.requireApproval.tools[0] \"github/merge_*\"")
        );
    }

    #[test]
    fn the_rendered_policy_is_loaded_and_a_bad_pattern_refuses_the_config() {
        let text = |pattern: &str| {
            format!(
                "task: {{name: t}}\npolicy:\n  requireApproval: {{risk: write, tools: [{pattern:?}], timeoutSeconds: 3}}\nservers:\n  - name: fs\n    stdio: {{command: x}}\n"
            )
        };
        let loaded = crate::config::load_bytes(text("fs/write_*").as_bytes());
        let policy = loaded
            .config
            .and_then(|c| c.require_approval)
            .expect("the policy");
        assert_eq!(policy.risk, Some(Risk::Write));
        assert_eq!(policy.timeout, Duration::from_secs(3));
        assert!(policy.rule_for("fs", "write_file", Risk::Read).is_some());
        let loaded = crate::config::load_bytes(text("write_*").as_bytes());
        assert!(loaded.config.is_none());
        assert!(
            loaded
                .problems
                .errors()
                .any(|p| p.path == "policy.requireApproval.tools[0]")
        );
    }

    #[test]
    fn a_pattern_that_is_not_server_slash_glob_is_a_problem() {
        let wire = RequireApproval {
            risk: None,
            tools: vec!["merge_*".into(), "gh/[".into(), "/x".into(), "ok/x".into()],
            timeout_seconds: None,
        };
        let mut problems = Vec::new();
        let p = ApprovalPolicy::normalize(&wire, &mut problems);
        let paths: Vec<_> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "policy.requireApproval.tools[0]",
                "policy.requireApproval.tools[1]",
                "policy.requireApproval.tools[2]"
            ]
        );
        assert!(problems.iter().all(|p| p.code == Code::BadPattern));
        assert_eq!(p.tools.len(), 1);
        assert_eq!(
            p.timeout,
            Duration::from_secs(u64::from(
                orchestrator_crds::approval::DEFAULT_TIMEOUT_SECONDS
            ))
        );
    }
}
