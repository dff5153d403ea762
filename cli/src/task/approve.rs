//! `task approvals`, `task approve`, `task reject`: the calls a task's proxy holds for a
//! person's decision (`status.approvals`, written by the operator), and deciding one by creating
//! a ToolApproval named `<task>-<id>` (so the first decision is the only one). The API server
//! decides who may: RBAC (the chart's `orchestrator-approver` ClusterRole) and an admission
//! policy that `spec.decidedBy` is the caller.
//!
//! An approval approves one exact call: `--show ID` prints every byte the proxy will forward
//! (the values of the task's Secrets masked as `<secret:NAME/KEY:NONCE>`) with the call's
//! digest, and a decision names that digest (`spec.digest`, from the entry read; `--digest`
//! makes sure it is still the call you looked at). When nothing is masked the digest is
//! recomputed here from the params shown (`ShownCall::check`): a request whose params are not
//! the call its digest names is refused before anything is created, whatever it claims (a
//! masked call's digest is salted by the proxy and only the proxy can check it). A call whose
//! params could not be shown (`withheld`) can only be rejected. What a terminal would not show
//! (control characters, bidi overrides, zero-width characters) is printed escaped as `\u{…}`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Resource, ResourceExt};
use orchestrator_crds::approval::{
    Approval, ApprovalState, Decision, DigestCheck, MAX_REASON_CHARS, ToolApproval,
    ToolApprovalSpec, object_name,
};
use orchestrator_crds::policy::{PIN_PREFIX, is_pin, short_pin};
use orchestrator_crds::taskrun::TaskRun;

use crate::args::{ApprovalsArgs, DecideArgs, Global};
use crate::connect::{Cluster, connect};
use crate::error::{Error, Result, is_conflict};
use crate::identity;
pub use crate::output::visible;
use crate::output::{self, Format, Table, age};

/// How long `approve`/`reject` wait for the operator to record the decision.
const RECORDED_WITHIN: Duration = Duration::from_secs(30);

/// `task approvals TASK`: pending and recent approvals, newest last; `--show ID`: one whole.
pub async fn list(global: &Global, args: &ApprovalsArgs) -> Result<()> {
    let cluster = connect(global).await?;
    let tr = super::resolve(&cluster, &args.task()).await?;
    let approvals = approvals_of(&tr);
    if let Some(id) = &args.show {
        let task = tr.name_any();
        let Some(approval) = approvals.iter().find(|a| &a.id == id) else {
            return Err(Error::NotFound(format!(
                "TaskRun {task} has no approval request {id:?} (see `orchestrator-cli task approvals {task}`)"
            )));
        };
        let ns = tr.namespace().unwrap_or_default();
        return match &global.output {
            Format::Table | Format::Wide => {
                output::print(&show(approval, &ns, &task, Timestamp::now()))
            }
            format => output::print(&output::render(format, approval)?),
        };
    }
    let approvals: Vec<&Approval> = approvals
        .iter()
        .filter(|a| !args.pending || a.state == ApprovalState::Pending)
        .collect();
    match &global.output {
        Format::Table | Format::Wide => output::print(&table(&approvals, Timestamp::now())),
        format => output::print(&output::render(format, &approvals)?),
    }
}

pub fn approvals_of(tr: &TaskRun) -> Vec<Approval> {
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
        let args = preview(a);
        t.row(vec![
            a.id.clone(),
            a.state.as_str().into(),
            format!("{}/{}", a.server, a.tool),
            when(&a.requested_at),
            expires,
            by,
            args,
        ]);
    }
    t.render_with(output::headers())
}

/// The characters of a preview in the table's ARGUMENTS column.
const PREVIEW_CHARS: usize = 48;

/// The ARGUMENTS cell: the start of the call's arguments on one line, and where to see it all.
fn preview(a: &Approval) -> String {
    let Some(params) = &a.params else {
        return match a.params_bytes {
            0 => "-".into(),
            n => format!("({n} bytes)"),
        };
    };
    let arguments = serde_json::from_str::<serde_json::Value>(params)
        .ok()
        .and_then(|p| p.get("arguments").map(|a| a.to_string()))
        .unwrap_or_else(|| params.clone());
    let mut text: String = arguments.chars().take(PREVIEW_CHARS).collect();
    if arguments.chars().count() > PREVIEW_CHARS {
        text.push('…');
    }
    format!(
        "{} ({} bytes; --show {})",
        visible(&text),
        match a.params_bytes {
            0 => params.len(),
            n => n as usize,
        },
        a.id
    )
}

/// What the digest of `a` (in the status of `task` in `namespace`) says of the params it shows.
pub fn digest_check(a: &Approval, namespace: &str, task: &str) -> DigestCheck {
    a.shown(namespace, task).check()
}

/// The digest check in words, after the digest.
fn check_words(a: &Approval, check: &DigestCheck) -> String {
    match check {
        DigestCheck::Covers => "recomputed from the params below: it names exactly them".into(),
        DigestCheck::Salted if a.withheld.is_some() => {
            "salted by the proxy (nothing of the call is shown)".into()
        }
        DigestCheck::Salted if a.params.is_some() => {
            "salted by the proxy (Secret values are masked below): only the proxy can check it, and it does".into()
        }
        DigestCheck::Salted => "(the params are not kept once decided)".into(),
        DigestCheck::Mismatch { computed } => format!(
            "DOES NOT NAME THE PARAMS BELOW (they hash to {}): this request shows another call than it names; do not approve it",
            short_pin(computed)
        ),
        DigestCheck::Unreadable => {
            "the params below are not a JSON object: this request cannot be checked; do not approve it".into()
        }
    }
}

/// One approval whole (`task approvals T --show ID`, and `task describe` for a pending one) of
/// task `task` in `namespace`: the call, its digest (checked against the params shown when
/// nothing is masked), and every byte the proxy forwards (with the task's Secret values
/// masked), escaped where a terminal would hide something.
pub fn show(a: &Approval, namespace: &str, task: &str, now: Timestamp) -> String {
    let when = |s: &str| match s.parse::<Timestamp>() {
        Ok(t) if t > now => format!("{s} (in {})", age(now, t)),
        Ok(t) => format!("{s} ({} ago)", age(t, now)),
        Err(_) => visible(s),
    };
    let check = digest_check(a, namespace, task);
    let mut out = format!("Request {}: {}\n", visible(&a.id), a.state.as_str());
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<16} {v}\n"));
    line("Call:", visible(&format!("{}/{}", a.server, a.tool)));
    line(
        "Digest:",
        if a.digest.is_empty() {
            "none (published by a proxy older than digests: it cannot be approved)".into()
        } else {
            visible(&a.digest)
        },
    );
    if !a.digest.is_empty() {
        line("", check_words(a, &check));
    }
    if !a.definition.is_empty() {
        line("Definition:", visible(&a.definition));
    }
    line("Context version:", a.context_version.to_string());
    line("Requested:", when(&a.requested_at));
    line("Expires:", when(&a.expires_at));
    if let Some(by) = &a.decided_by {
        let reason = a
            .reason
            .as_deref()
            .map(|r| format!(": {}", visible(r)))
            .unwrap_or_default();
        line("Decided by:", format!("{}{reason}", visible(by)));
    }
    line(
        "Params:",
        format!("{} bytes as shown (Secret values masked)", a.params_bytes),
    );
    if !a.masked.is_empty() {
        out.push_str(&format!(
            "Masked (only these placeholders, with nonce {}, are masks; any other `<secret:…>` is text the agent sent):\n",
            visible(&a.mask_nonce)
        ));
        for m in &a.masked {
            out.push_str(&format!(
                "  <secret:{}/{}:{}> = the value of key {} of Secret {}, forwarded as is ({} time{})\n",
                visible(&m.secret),
                visible(&m.key),
                visible(&a.mask_nonce),
                visible(&m.key),
                visible(&m.secret),
                m.count,
                if m.count == 1 { "" } else { "s" }
            ));
        }
    }
    match (&a.params, a.withheld) {
        (_, Some(why)) => out.push_str(&format!(
            "Params: not shown: {}. Nobody can see what this call sends, so it cannot be approved: reject it (task reject), or let it expire\n",
            why.describe()
        )),
        (Some(params), None) => {
            out.push_str("Params (the tools/call params the proxy forwards, byte for byte):\n");
            out.push_str(&visible(params));
            out.push('\n');
        }
        (None, None) => {
            out.push_str("Params: not kept once decided (the digest names the call)\n")
        }
    }
    out
}

/// The fewest hex digits `--digest` may give.
const MIN_DIGEST_HEX: usize = 12;

/// Whether `--digest` names `digest`: the whole value, or `sha256:` and at least
/// [`MIN_DIGEST_HEX`] of its first hex digits.
fn names(given: &str, digest: &str) -> Result<bool> {
    let hex = given.strip_prefix(PIN_PREFIX).unwrap_or_default();
    if hex.len() < MIN_DIGEST_HEX
        || hex.len() > 64
        || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(Error::Usage(format!(
            "--digest {given:?}: give sha256: and at least {MIN_DIGEST_HEX} lowercase hex digits of the digest `task approvals TASK --show ID` prints"
        )));
    }
    Ok(digest.starts_with(given))
}

/// `task approve TASK ID` / `task reject TASK ID --reason R`.
pub async fn decide(global: &Global, args: &DecideArgs, decision: Decision) -> Result<()> {
    let cluster = connect(global).await?;
    decide_on(&cluster, args, decision).await
}

/// [`decide`] on a cluster already connected to.
pub async fn decide_on(cluster: &Cluster, args: &DecideArgs, decision: Decision) -> Result<()> {
    match decide_quietly(cluster, args, decision).await? {
        Decided::Recorded(text) => output::print(&format!("{text}\n")),
        Decided::NotYetApplied(text) => {
            output::note(&text);
            Ok(())
        }
    }
}

/// What a decision came to, in words (the CLI prints it; the console shows it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decided {
    /// The operator recorded it: `approved: request … by …`.
    Recorded(String),
    /// The ToolApproval is written, but the operator has not applied it yet.
    NotYetApplied(String),
}

impl Decided {
    pub fn text(&self) -> &str {
        match self {
            Decided::Recorded(t) | Decided::NotYetApplied(t) => t,
        }
    }
}

/// The checks, the ToolApproval, and the wait for the operator to record it; prints nothing.
pub async fn decide_quietly(
    cluster: &Cluster,
    args: &DecideArgs,
    decision: Decision,
) -> Result<Decided> {
    let tr = super::resolve(cluster, &args.task()).await?;
    let task = tr.name_any();
    let approvals = approvals_of(&tr);
    let Some(approval) = approvals.iter().find(|a| a.id == args.id) else {
        return Err(Error::NotFound(format!(
            "TaskRun {task} has no approval request {:?} (see `orchestrator-cli task approvals {task}`)",
            args.id
        )));
    };
    if let Some(given) = &args.digest
        && !names(given, &approval.digest)?
    {
        return Err(Error::Failed(format!(
            "request {} of TaskRun {task} no longer names the call you saw: it names {}, not {given} (see `orchestrator-cli task approvals {task} --show {}`); nothing was changed",
            args.id,
            if approval.digest.is_empty() {
                "no digest"
            } else {
                short_pin(&approval.digest)
            },
            args.id
        )));
    }
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
    if !is_pin(&approval.digest) {
        return Err(Error::Failed(format!(
            "request {} of TaskRun {task} names no digest: it was published by a proxy older than digests, and cannot be approved or rejected (it expires at {}); nothing was changed",
            args.id, approval.expires_at
        )));
    }
    // What a person approves is what they were shown: the params shown must be the call the
    // digest names (recomputed when nothing is masked), and there must be params to see.
    if decision == Decision::Approve {
        let ns = tr.namespace().unwrap_or_else(|| cluster.namespace.clone());
        unseen(approval, &ns, &task)?;
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
            digest: approval.digest.clone(),
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
    let state = recorded(cluster, &task, &args.id).await?;
    let call = format!("{}/{}", approval.server, approval.tool);
    match state {
        Some(ApprovalState::Approved) => Ok(Decided::Recorded(format!(
            "approved: request {} ({call}) of TaskRun {task}, by {me}",
            args.id
        ))),
        Some(ApprovalState::Rejected) => Ok(Decided::Recorded(format!(
            "rejected: request {} ({call}) of TaskRun {task}, by {me}",
            args.id
        ))),
        Some(other) => Err(Error::Failed(format!(
            "request {} ({call}) of TaskRun {task} became {} before your decision counted",
            args.id,
            other.as_str()
        ))),
        None => Ok(Decided::NotYetApplied(format!(
            "your decision is recorded (ToolApproval {}), but the operator has not applied it within {}s",
            object_name(&task, &args.id),
            RECORDED_WITHIN.as_secs()
        ))),
    }
}

/// Why `approval` (pending, of `task` in `namespace`) cannot be approved: its params are not
/// the call its digest names, or they are not shown.
fn unseen(approval: &Approval, namespace: &str, task: &str) -> Result<()> {
    let id = &approval.id;
    let show = format!("orchestrator-cli task approvals {task} --show {id}");
    if let Some(why) = approval.withheld {
        return Err(Error::Failed(format!(
            "request {id} of TaskRun {task} cannot be approved: its params are not shown ({}), so nobody can see what the call sends; reject it (`orchestrator-cli task reject {task} {id}`) or let it expire; nothing was changed",
            why.describe()
        )));
    }
    if approval.params.is_none() {
        return Err(Error::Failed(format!(
            "request {id} of TaskRun {task} shows no params, so nobody can see what the call sends; it cannot be approved; nothing was changed"
        )));
    }
    let digest = &approval.digest;
    match digest_check(approval, namespace, task) {
        DigestCheck::Covers | DigestCheck::Salted => Ok(()),
        DigestCheck::Mismatch { computed } => Err(Error::Failed(format!(
            "request {id} of TaskRun {task} names digest {}, but the params it shows hash to {}: it shows another call than the one an approval would let through; it cannot be approved (see `{show}`); nothing was changed",
            short_pin(digest),
            short_pin(&computed)
        ))),
        DigestCheck::Unreadable => Err(Error::Failed(format!(
            "request {id} of TaskRun {task} shows params that are not a JSON object, so its digest cannot be checked against them; it cannot be approved (see `{show}`); nothing was changed"
        ))),
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
