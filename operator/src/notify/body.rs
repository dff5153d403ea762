//! The bodies the approval webhook gets (docs/design/operating.md, section 6): Slack's
//! `{"text": ...}` or a CloudEvents 1.0 structured-mode event. Never the call's arguments (even
//! masked, they may hold what the agent read): a person sees them with
//! `orchestrator-cli task approvals TASK --show ID`.
//!
//! Most strings here come from outside the operator: the server and tool names from a task's
//! upstream MCP server (which may be hostile), the ids and times from the proxy's Lease. Each is
//! clipped, and in Slack's text stripped of what would let it forge a line, leave its code span,
//! mention a channel (`<!channel>`) or make a link (Slack's `<`, `>`, `&` escaping).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::Notice;

/// The CloudEvents `type` of a call starting to wait.
pub const EVENT_TYPE: &str = "io.orchestrator.approval.requested";
/// The Content-Type of a structured-mode CloudEvent.
pub const CLOUDEVENTS_CONTENT_TYPE: &str = "application/cloudevents+json";
/// The most chars of one outside string in a body (MCP tool names are far shorter).
pub const MAX_FIELD_CHARS: usize = 128;

/// `s` cut to at most `max` chars, with `…` when cut.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some(_) => s.chars().take(max.saturating_sub(1)).chain(['…']).collect(),
        None => s.to_string(),
    }
}

/// An outside string made safe inside a Slack code span: clipped, control characters (a new
/// line would start a forged line) and backticks (which would end the span) replaced, then
/// `&`, `<`, `>` escaped as Slack asks, so no `<!channel>`, `<@user>` or `<url|text>` survives.
pub fn slack_safe(s: &str) -> String {
    let cleaned: String = clip(s, MAX_FIELD_CHARS)
        .chars()
        .map(|c| match c {
            '`' => '\'',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    cleaned
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A time from the Lease as RFC 3339 when it is one, else clipped as it came.
fn time(s: &str) -> String {
    s.parse::<Timestamp>()
        .map(|t| t.to_string())
        .unwrap_or_else(|_| clip(s, 64))
}

/// Slack's body: one message naming the namespace, TaskRun, task id, server/tool, expiry and
/// the commands to look and decide.
pub fn slack(n: &Notice) -> Value {
    let (ns, task) = (slack_safe(&n.namespace), slack_safe(&n.task_run));
    let id = slack_safe(&n.approval_id);
    let text = format!(
        "Tool call `{server}/{tool}` of TaskRun `{ns}/{task}` (task {task_id}) waits for approval \
         until {expires} (request `{id}`).\nSee it: `orchestrator-cli -n {ns} task approvals {task} \
         --show {id}`, then `orchestrator-cli -n {ns} task approve {task} {id} --digest …` or \
         `task reject`.",
        server = slack_safe(&n.server),
        tool = slack_safe(&n.tool),
        task_id = n.task_id,
        expires = slack_safe(&time(&n.expires_at)),
    );
    json!({ "text": text })
}

/// The CloudEvents 1.0 structured-mode event (sent as [`CLOUDEVENTS_CONTENT_TYPE`]); its `id`
/// is the approval id, unique within its `source` (the TaskRun).
pub fn cloudevent(n: &Notice, now: Timestamp) -> Value {
    let (server, tool) = (
        clip(&n.server, MAX_FIELD_CHARS),
        clip(&n.tool, MAX_FIELD_CHARS),
    );
    let id = clip(&n.approval_id, MAX_FIELD_CHARS);
    let requested = n.requested_at.parse::<Timestamp>().unwrap_or(now);
    json!({
        "specversion": "1.0",
        "type": EVENT_TYPE,
        "source": format!(
            "/apis/orchestrator.io/v1/namespaces/{}/taskruns/{}",
            n.namespace, n.task_run
        ),
        "id": id,
        "time": requested.to_string(),
        "subject": format!("{server}/{tool}"),
        "datacontenttype": "application/json",
        "data": {
            "namespace": n.namespace,
            "taskRun": n.task_run,
            "taskId": n.task_id,
            "approvalId": id,
            "server": server,
            "tool": tool,
            "digest": clip(&n.digest, MAX_FIELD_CHARS),
            "expiresAt": time(&n.expires_at),
        },
    })
}
