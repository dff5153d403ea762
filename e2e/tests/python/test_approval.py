"""Human approval of held tool calls, end to end on the real node: Claude Code (with the scripted
model stand-in) calls a tool that `toolConfig.policy.requireApproval` names; its proxy holds the
call and lists it on the task's Lease; the operator shows it in status.approvals; a person decides
with `orchestrator-cli task approve|reject` (a ToolApproval); the verdict reaches the proxy
through the task's ConfigMap and the agent gets the call's result, the rejection, or, when nobody
decides in time, the expiry. And who may decide: only an identity with the chart's
`orchestrator-approver` ClusterRole (403 for others, the task pod's own ServiceAccount
included), and only in its own name (the chart's admission policy). Then intent mode with the
same agent: four tools offered, a search, a read through call_tool_read, a declared intent that
does not fit refused, and approval holding a call made through call_tool_read.

Needs the cluster with its real node (`./test` provides it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "story"))

from story import (  # noqa: E402
    MCP,
    MODEL_PORT,
    ScriptedModel,
    Story,
    agent_task,
    text,
    tool_result_text,
    tool_use,
    wait_until,
)

TASK = "held"
TIMEOUT = 20  # requireApproval.timeoutSeconds


class HeldCalls:
    """The model asks for echo three times; what each call answered is kept by message."""

    def __init__(self):
        self.results: dict[str, str] = {}
        self.done = threading.Event()

    def __call__(self, first):
        for message in ["approve me", "reject me", "let me expire"]:
            r = yield tool_use(MCP + "everything__echo", {"message": message})
            self.results[message] = tool_result_text(r)
        self.done.set()
        yield text("done")


@pytest.fixture(scope="module")
def story():
    story = Story(say=lambda *_: None)
    with ExitStack() as cleanup:
        story.prepare(cleanup)
        yield story


def approvals(story: Story) -> list[dict]:
    tr = story.json("get", "taskrun", TASK, "-n", story.work_ns)
    return tr.get("status", {}).get("approvals", [])


def pending(story: Story, message: str) -> dict:
    def find():
        for a in approvals(story):
            if a["state"] == "Pending" and message in a.get("arguments", {}).get("message", ""):
                return a
        return None

    return wait_until(f"the call {message!r} to be listed as pending", find, timeout=120, interval=0.2)


def apply_task(story: Story, name: str, task_id: int, prompt: str, tool_config: dict) -> None:
    """A TaskRun on the real node whose agent (Claude Code) talks to the scripted model."""
    taskrun = agent_task(name, task_id, "approval", prompt, tool_config)
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))


def cli_as(story: Story, user: str, *args: str) -> subprocess.CompletedProcess:
    return story.cli("--as", user, *args)


def test_approve_reject_and_expire_while_claude_code_waits_and_only_approvers_decide(story: Story):
    script = HeldCalls()
    story.model = ScriptedModel(script, port=MODEL_PORT).start()
    story.cleanup.callback(story.model.stop)
    ns = story.work_ns
    story.kubectl("create", "secret", "generic", "anthropic", "-n", ns, "--from-literal=api-key=sk-ant-stand-in-approval")
    # alice may decide (the chart's ClusterRole, bound in the namespace); mallory may only read.
    story.kubectl("create", "rolebinding", "alice-approves", "-n", ns, "--clusterrole=orchestrator-approver", "--user=alice")
    story.kubectl("create", "role", "taskrun-reader", "-n", ns, "--verb=get,list,watch", "--resource=taskruns.orchestrator.io")
    story.kubectl("create", "rolebinding", "mallory-reads", "-n", ns, "--role=taskrun-reader", "--user=mallory")
    apply_task(story, TASK, 3001, "echo three things", {
        "policy": {"requireApproval": {"tools": ["everything/echo"], "timeoutSeconds": TIMEOUT}},
        "mcpServers": [{"name": "everything", "tools": {"allow": ["echo", "get-sum"]}}],
    })

    # 1. The first call is held: listed with a summary of its arguments, and the agent waits.
    first = pending(story, "approve me")
    listed = cli_as(story, "alice", "task", "approvals", TASK)
    assert listed.returncode == 0, listed.stderr
    assert first["id"] in listed.stdout and "everything/echo" in listed.stdout and "Pending" in listed.stdout, listed.stdout
    asked = len(story.model.requests)
    assert "approve me" not in script.results, "the held call answered before any decision"

    # 2. Who may not decide. mallory (can read the TaskRun, no approver role): 403 from the API
    # server, and nothing changes.
    refused = cli_as(story, "mallory", "task", "approve", TASK, first["id"])
    assert refused.returncode == 1, refused
    assert "HTTP 403" in refused.stderr and "toolapprovals" in refused.stderr, refused.stderr
    # The task pod's own ServiceAccount cannot either.
    sa = story.json("get", "pods", "-n", ns, "-l", f"job-name={TASK}")["items"][0]["spec"]["serviceAccountName"]
    can = subprocess.run([str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "auth", "can-i",
                          "create", "toolapprovals.orchestrator.io", "-n", ns, "--as", f"system:serviceaccount:{ns}:{sa}"],
                         capture_output=True, text=True)
    assert can.stdout.strip() == "no", can
    # alice cannot decide in bob's name: the chart's admission policy.
    spoof = {"apiVersion": "orchestrator.io/v1", "kind": "ToolApproval",
             "metadata": {"name": f"{TASK}-{first['id']}", "namespace": ns},
             "spec": {"taskRun": TASK, "id": first["id"], "decision": "approve", "decidedBy": "bob"}}
    with pytest.raises(subprocess.CalledProcessError) as spoofed:
        story.kubectl("--as", "alice", "create", "-f", "-", stdin=json.dumps(spoof))
    assert "spec.decidedBy must be the identity making the request (alice)" in spoofed.value.stderr, spoofed.value.stderr
    assert [a["state"] for a in approvals(story) if a["id"] == first["id"]] == ["Pending"]
    assert len(story.model.requests) == asked and "approve me" not in script.results

    # 3. alice approves: the call is made and Claude Code gets echo's real answer.
    approved = cli_as(story, "alice", "task", "approve", TASK, first["id"], "--reason", "fine")
    assert approved.returncode == 0, approved.stderr
    assert f"approved: request {first['id']} (everything/echo) of TaskRun {TASK}, by alice" in approved.stdout
    wait_until("the approved call's result", lambda: "approve me" in script.results, timeout=60, interval=0.2)
    assert script.results["approve me"] == "Echo: approve me", script.results
    again = cli_as(story, "alice", "task", "reject", TASK, first["id"])
    assert again.returncode == 5 and "is Approved already (by alice)" in again.stderr, again

    # 4. The second call: alice rejects it with a reason, which the agent sees.
    second = pending(story, "reject me")
    rejected = cli_as(story, "alice", "task", "reject", TASK, second["id"], "--reason", "not today")
    assert rejected.returncode == 0, rejected.stderr
    wait_until("the rejected call's answer", lambda: "reject me" in script.results, timeout=60, interval=0.2)
    answer = script.results["reject me"]
    assert answer.startswith("ERROR") and "rejected by alice" in answer and "not today" in answer, answer

    # 5. The third: nobody decides; past the timeout the proxy refuses it.
    third = pending(story, "let me expire")
    wait_until("the expired call's answer", lambda: "let me expire" in script.results, timeout=TIMEOUT + 60, interval=0.5)
    answer = script.results["let me expire"]
    assert answer.startswith("ERROR") and f"was not approved within {TIMEOUT}s (approval {third['id']} expired)" in answer, answer
    wait_until("the TaskRun to succeed", lambda: story.json("get", "taskrun", TASK, "-n", ns)
               .get("status", {}).get("phase") == "Succeeded", timeout=120, interval=0.5)

    # What a person reads afterwards: the status, the events, describe.
    states = {a["id"]: (a["state"], a.get("decidedBy"), a.get("reason")) for a in approvals(story)}
    assert states == {first["id"]: ("Approved", "alice", "fine"),
                      second["id"]: ("Rejected", "alice", "not today"),
                      third["id"]: ("Expired", None, None)}, states
    reasons = [e["reason"] for e in story.json("get", "events", "-n", ns,
                                               "--field-selector", f"involvedObject.name={TASK}")["items"]]
    for reason in ["ApprovalRequested", "ApprovalGranted", "ApprovalRejected", "ApprovalExpired"]:
        assert reason in reasons, reasons
    described = story.cli("task", "describe", TASK)
    assert "Approvals:" in described.stdout and "alice: not today" in described.stdout, described.stdout


class IntentCalls:
    """In intent mode: what the model is offered, a search, a read through call_tool_read, a
    declared intent that does not fit, and a held call through call_tool_read."""

    def __init__(self):
        self.offered: list[str] = []
        self.results: dict[str, str] = {}

    def __call__(self, first):
        self.offered = first.mcp_tools()
        steps = {
            "search": ("retrieve_tools", {"query": "sum"}),
            "read": ("call_tool_read", {"name": "everything__get-sum", "args": {"a": 2, "b": 3},
                                        "intent": {"operation_type": "read", "reason": "add"}}),
            "mismatch": ("call_tool_read", {"name": "everything__get-sum", "args": {"a": 1, "b": 1},
                                            "intent": {"operation_type": "write"}}),
            "held": ("call_tool_read", {"name": "everything__echo", "args": {"message": "intent held"},
                                        "intent": {"operation_type": "read"}}),
        }
        for step, (tool, arguments) in steps.items():
            r = yield tool_use(MCP + tool, arguments)
            self.results[step] = tool_result_text(r)
        yield text("done")


def test_intent_mode_on_the_real_node_offers_four_tools_checks_the_intent_and_still_holds_for_approval(story: Story):
    script = IntentCalls()
    story.model.stop()
    story.model = ScriptedModel(script, port=MODEL_PORT).start()
    story.cleanup.callback(story.model.stop)
    ns, task = story.work_ns, "intent"
    apply_task(story, task, 3002, "add two numbers", {
        "policy": {"toolMode": "intent", "requireApproval": {"tools": ["everything/echo"], "timeoutSeconds": 120}},
        "mcpServers": [{"name": "everything", "tools": {"allow": ["echo", "get-sum"]}}],
    })

    def held():
        tr = story.json("get", "taskrun", task, "-n", ns)
        return next((a for a in tr.get("status", {}).get("approvals", []) if a["state"] == "Pending"), None)

    request = wait_until("the intent-mode call to be held", held, timeout=180, interval=0.3)
    assert script.offered == ["call_tool_destructive", "call_tool_read", "call_tool_write", "retrieve_tools"], script.offered
    found = json.loads(script.results["search"])
    sums = [t for t in found["tools"] if t["name"] == "everything__get-sum"]
    assert sums and sums[0]["call_with"] == "call_tool_read", found
    assert script.results["read"] == "The sum of 2 and 3 is 5.", script.results
    mismatch = script.results["mismatch"]
    assert mismatch.startswith("ERROR") and "Intent mismatch: tool is call_tool_read but intent declares write" in mismatch, mismatch
    assert (request["server"], request["tool"]) == ("everything", "echo"), request
    decided = story.cli("--as", "alice", "task", "approve", task, request["id"])
    assert decided.returncode == 0, decided.stderr
    wait_until("the held intent call's result", lambda: "held" in script.results, timeout=60, interval=0.2)
    assert script.results["held"] == "Echo: intent held", script.results
