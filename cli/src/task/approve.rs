//! `task approvals`, `task approve`, `task reject`: the calls a task's proxy holds for a
//! person's decision (`status.approvals`, written by the operator), and deciding one by creating
//! a ToolApproval named `<task>-<id>` (so the first decision is the only one). The API server
//! decides who may: RBAC (the chart's `orchestrator-approver` ClusterRole) and an admission
//! policy that `spec.decidedBy` is the caller.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Resource, ResourceExt};
use orchestrator_crds::approval::{
    Approval, ApprovalState, Decision, MAX_REASON_CHARS, ToolApproval, ToolApprovalSpec,
    object_name,
};
use orchestrator_crds::taskrun::TaskRun;

use crate::args::{ApprovalsArgs, DecideArgs, Global};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result, is_conflict};
use crate::identity;
use crate::output::{self, Format, Table, age};

/// How long `approve`/`reject` wait for the operator to record the decision.
const RECORDED_WITHIN: Duration = Duration::from_secs(30);

/// `task approvals TASK`: pending and recent approvals, newest last.
pub async fn list(global: &Global, args: &ApprovalsArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task).await?;
    let approvals = approvals_of(&tr);
    let approvals: Vec<&Approval> = approvals
        .iter()
        .filter(|a| !args.pending || a.state == ApprovalState::Pending)
        .collect();
    match global.output {
        Format::Table => output::print(&table(&approvals, Timestamp::now())),
        format => output::print(&output::render(format, &approvals)?),
    }
}

fn approvals_of(tr: &TaskRun) -> Vec<Approval> {
    tr.status
        .as_ref()
        .map(|s| s.approvals.clone())
        .unwrap_or_default()
}

/// The approvals as a table (also `task describe`'s section).
pub fn table(approvals: &[&Approval], now: Timestamp) -> String {
    if approvals.is_empty() {
        return "No calls wait or waited for approval.\n".into();
    }
    let mut t = Table::new(&[
        "ID",
        "STATE",
        "TOOL",
        "REQUESTED",
        "EXPIRES",
        "BY",
        "ARGUMENTS",
    ]);
    for a in approvals {
        let when = |s: &str| {
            s.parse::<Timestamp>()
                .map(|t| age(t, now))
                .unwrap_or_else(|_| s.to_string())
        };
        let expires = match a.state {
            ApprovalState::Pending => a
                .expires_at
                .parse::<Timestamp>()
                .map(|e| format!("in {}", age(now, e)))
                .unwrap_or_else(|_| a.expires_at.clone()),
            _ => "-".into(),
        };
        let by = match (&a.decided_by, &a.reason) {
            (Some(by), Some(reason)) => format!("{by}: {reason}"),
            (Some(by), None) => by.clone(),
            _ => "-".into(),
        };
        let args = a
            .arguments
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        t.row(vec![
            a.id.clone(),
            a.state.as_str().into(),
            format!("{}/{}", a.server, a.tool),
            when(&a.requested_at),
            expires,
            by,
            if args.is_empty() { "-".into() } else { args },
        ]);
    }
    t.render()
}

/// `task approve TASK ID` / `task reject TASK ID --reason R`.
pub async fn decide(global: &Global, args: &DecideArgs, decision: Decision) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task()).await?;
    let task = tr.name_any();
    let approvals = approvals_of(&tr);
    let Some(approval) = approvals.iter().find(|a| a.id == args.id) else {
        return Err(Error::NotFound(format!(
            "TaskRun {task} has no approval request {:?} (see `orchestrator-cli task approvals {task}`)",
            args.id
        )));
    };
    if approval.state != ApprovalState::Pending {
        return Err(Error::Failed(format!(
            "request {} of TaskRun {task} is {} already{}; nothing was changed",
            args.id,
            approval.state.as_str(),
            approval
                .decided_by
                .as_deref()
                .map(|by| format!(" (by {by})"))
                .unwrap_or_default()
        )));
    }
    if let Some(reason) = &args.reason
        && reason.chars().count() > MAX_REASON_CHARS
    {
        return Err(Error::Usage(format!(
            "--reason is {} characters; at most {MAX_REASON_CHARS}",
            reason.chars().count()
        )));
    }
    let Some(me) = identity::whoami(&cluster.client).await else {
        return Err(Error::Cluster(
            "the API server did not say who you are (SelfSubjectReview), which a decision must name; nothing was changed".into(),
        ));
    };
    let object = ToolApproval {
        metadata: ObjectMeta {
            name: Some(object_name(&task, &args.id)),
            namespace: Some(cluster.namespace.clone()),
            owner_references: owner(&tr).map(|o| vec![o]),
            ..Default::default()
        },
        spec: ToolApprovalSpec {
            task_run: task.clone(),
            id: args.id.clone(),
            decision,
            reason: args.reason.clone(),
            decided_by: me.clone(),
        },
    };
    let api: Api<ToolApproval> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let verb = match decision {
        Decision::Approve => "approving",
        Decision::Reject => "rejecting",
    };
    if let Err(e) = api.create(&PostParams::default(), &object).await {
        return Err(if is_conflict(&e) {
            already_decided(&api, &task, &args.id).await
        } else {
            Error::kube(
                format!("{verb} request {} of TaskRun {task} as {me}", args.id),
                e,
            )
        });
    }
    let state = recorded(&cluster, &task, &args.id).await?;
    let call = format!("{}/{}", approval.server, approval.tool);
    match state {
        Some(ApprovalState::Approved) => output::print(&format!(
            "approved: request {} ({call}) of TaskRun {task}, by {me}\n",
            args.id
        )),
        Some(ApprovalState::Rejected) => output::print(&format!(
            "rejected: request {} ({call}) of TaskRun {task}, by {me}\n",
            args.id
        )),
        Some(other) => Err(Error::Failed(format!(
            "request {} ({call}) of TaskRun {task} became {} before your decision counted",
            args.id,
            other.as_str()
        ))),
        None => {
            output::note(&format!(
                "your decision is recorded (ToolApproval {}), but the operator has not applied it within {}s",
                object_name(&task, &args.id),
                RECORDED_WITHIN.as_secs()
            ));
            Ok(())
        }
    }
}

/// The TaskRun as the owner of its decisions, so they go with it.
fn owner(tr: &TaskRun) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: TaskRun::api_version(&()).into_owned(),
        kind: TaskRun::kind(&()).into_owned(),
        name: tr.name_any(),
        uid: tr.metadata.uid.clone()?,
        ..Default::default()
    })
}

/// Someone decided first: say who and what.
async fn already_decided(api: &Api<ToolApproval>, task: &str, id: &str) -> Error {
    match api.get(&object_name(task, id)).await {
        Ok(first) => Error::Failed(format!(
            "request {id} of TaskRun {task} was already decided: {} by {}; nothing was changed",
            match first.spec.decision {
                Decision::Approve => "approved",
                Decision::Reject => "rejected",
            },
            first.spec.decided_by
        )),
        Err(e) => Error::kube(
            format!("reading the decision on request {id} of TaskRun {task}"),
            e,
        ),
    }
}

/// Waits until the operator records a state other than pending for `id`; `None` when it has
/// not within [`RECORDED_WITHIN`].
async fn recorded(cluster: &Cluster, task: &str, id: &str) -> Result<Option<ApprovalState>> {
    let deadline = tokio::time::Instant::now() + RECORDED_WITHIN;
    let mut pause = Duration::from_millis(100);
    loop {
        let tr = super::get_named(cluster, task).await?;
        let state = approvals_of(&tr)
            .into_iter()
            .find(|a| a.id == id)
            .map(|a| a.state)
            .filter(|s| *s != ApprovalState::Pending);
        if state.is_some() || tokio::time::Instant::now() >= deadline {
            return Ok(state);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_table_shows_what_a_person_decides_on() {
        let pending = Approval {
            id: "a1b2c3d4".into(),
            server: "filesystem".into(),
            tool: "write_file".into(),
            arguments: BTreeMap::from([("path".into(), "\"/workspace/a\"".into())]),
            requested_at: "2026-01-01T00:00:00Z".into(),
            expires_at: "2026-01-01T00:05:00Z".into(),
            state: ApprovalState::Pending,
            decided_by: None,
            decided_at: None,
            reason: None,
        };
        let rejected = Approval {
            id: "e5f6".into(),
            state: ApprovalState::Rejected,
            decided_by: Some("alice".into()),
            reason: Some("wrong file".into()),
            ..pending.clone()
        };
        let now: Timestamp = "2026-01-01T00:01:00Z"
            .parse()
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let text = table(&[&pending, &rejected], now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID"), "{text}");
        assert!(
            lines[1].contains("a1b2c3d4") && lines[1].contains("Pending"),
            "{text}"
        );
        assert!(
            lines[1].contains("filesystem/write_file") && lines[1].contains("in 4m"),
            "{text}"
        );
        assert!(lines[1].contains("path=\"/workspace/a\""), "{text}");
        assert!(lines[2].contains("alice: wrong file"), "{text}");
        assert_eq!(table(&[], now), "No calls wait or waited for approval.\n");
    }
}
