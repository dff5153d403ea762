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

An approval approves one exact call: a person sees every byte the proxy will forward (`task
approvals --show`, `task describe`), with the values of the task's Secrets masked and never in
the status; a decision names the call's digest, and one naming another call's digest rejects it.
Only the task pod's own proxy may write its Lease (the chart's admission policy on the pod the
operator binds it to): a pod running the same ServiceAccount cannot publish requests in the
task's name, though RBAC lets it patch the Lease.

Needs the cluster with its real node (`./test` provides it).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time

import pytest

from story import (
    MCP,
    MODEL_PORT,
    ScriptedModel,
    Story,
    agent_task,
    chart_object,
    text,
    tool_result_text,
    tool_use,
    wait_until,
)

TASK = "held"
TIMEOUT = 30  # requireApproval.timeoutSeconds
# A Secret value the agent has (env from a secretKeyRef) and passes in a call: masked in what
# the approver reads, forwarded as is.
PASSPHRASE = "open sesame 4711"
APPROVE = f"approve me: {PASSPHRASE}"
MESSAGES = [APPROVE, "reject me", "swap me", "let me expire"]


class HeldCalls:
    """The model asks for echo with each message in turn; what each call answered is kept by
    message."""

    def __init__(self, messages: list[str]):
        self.messages = messages
        self.results: dict[str, str] = {}
        self.done = threading.Event()

    def __call__(self, first):
        for message in self.messages:
            r = yield tool_use(MCP + "everything__echo", {"message": message})
            self.results[message] = tool_result_text(r)
        self.done.set()
        yield text("done")


def approvals(story: Story, task: str = TASK) -> list[dict]:
    tr = story.json("get", "taskrun", task, "-n", story.work_ns)
    return tr.get("status", {}).get("approvals", [])


def shown_message(approval: dict) -> str:
    """The echo message of a pending approval, as its params show it (Secret values masked)."""
    return json.loads(approval.get("params") or "{}").get("arguments", {}).get("message", "")


def pending(story: Story, marker: str, task: str = TASK) -> dict:
    def find():
        for a in approvals(story, task):
            if a["state"] == "Pending" and marker in shown_message(a):
                return a
        return None

    return wait_until(f"the call {marker!r} to be listed as pending", find, timeout=120, interval=0.2)


def call_digest(namespace: str, task: str, request: dict, params: dict) -> str:
    """The digest of a call (orchestrator_crds::approval::CallDigest): SHA-256 of the RFC 8785
    canonical JSON, which for ASCII text and integers is sorted-key compact json.dumps."""
    call = {"v": 1, "namespace": namespace, "taskRun": task, "id": request["id"],
            "server": request["server"], "definition": request["definition"],
            "contextVersion": request["contextVersion"], "params": params}
    canonical = json.dumps(call, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_the_call_digest_is_the_shared_test_vector():
    request = {"id": "0a1b2c3d", "server": "everything", "definition": "sha256:" + "1" * 64, "contextVersion": 3}
    params = {"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234}}
    assert call_digest("team-a", "held", request, params) == \
        "sha256:e1afe37203b00ff1c6bc666d39c20ba74fdf32752e80297c55f90aad034133a3"


def apply_task(story: Story, name: str, task_id: int, prompt: str, tool_config: dict,
               env: list | None = None, service_account: str | None = None) -> None:
    """A TaskRun on the real node whose agent (Claude Code) talks to the scripted model."""
    taskrun = agent_task(name, task_id, "approval", prompt, tool_config)
    taskrun["spec"]["agent"]["env"] += env or []
    if service_account:
        taskrun["spec"]["serviceAccountName"] = service_account
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))


def cli_as(story: Story, user: str, *args: str) -> subprocess.CompletedProcess:
    return story.cli("--as", user, *args)


def test_approve_reject_and_expire_while_claude_code_waits_and_only_approvers_decide(story: Story):
    script = HeldCalls(MESSAGES)
    story.model = ScriptedModel(script, port=MODEL_PORT).start()
    story.cleanup.callback(story.model.stop)
    ns = story.work_ns
    story.kubectl("create", "secret", "generic", "anthropic", "-n", ns, "--from-literal=api-key=sk-ant-stand-in-approval")
    story.kubectl("create", "secret", "generic", "deploy", "-n", ns, f"--from-literal=passphrase={PASSPHRASE}")
    # alice may decide (the chart's ClusterRole, bound in the namespace); mallory may only read.
    story.kubectl("create", "rolebinding", "alice-approves", "-n", ns, f"--clusterrole={chart_object('approver')}", "--user=alice")
    story.kubectl("create", "role", "taskrun-reader", "-n", ns, "--verb=get,list,watch", "--resource=taskruns.orchestrator.io")
    story.kubectl("create", "rolebinding", "mallory-reads", "-n", ns, "--role=taskrun-reader", "--user=mallory")
    apply_task(story, TASK, 3001, "echo four things", {
        "policy": {"requireApproval": {"tools": ["everything/echo"], "timeoutSeconds": TIMEOUT}},
        "mcpServers": [{"name": "everything", "tools": {"allow": ["echo", "get-sum"]}}],
    }, env=[{"name": "DEPLOY_PASSPHRASE", "valueFrom": {"secretKeyRef": {"name": "deploy", "key": "passphrase"}}}])

    # 1. The first call is held and the agent waits. What a person reads is the whole call as
    # the proxy will forward it, the Secret value masked with this request's nonce, and its
    # digest; the value itself is nowhere in the status.
    first = pending(story, "approve me")
    mask = f"<secret:deploy/passphrase:{first['maskNonce']}>"
    assert shown_message(first) == f"approve me: {mask}", first
    assert first["masked"] == [{"secret": "deploy", "key": "passphrase", "count": 1}], first
    # Everything forwarded is shown: the client's _meta too (Claude Code sends its tool use id).
    params = json.loads(first["params"])
    assert {k: v for k, v in params.items() if k != "_meta"} == \
        {"name": "echo", "arguments": {"message": f"approve me: {mask}"}}, params
    assert "claudecode/toolUseId" in params.get("_meta", {}), params
    assert PASSPHRASE not in json.dumps(story.json("get", "taskrun", TASK, "-n", ns)), "the Secret value is in the TaskRun"
    lease = story.json("get", "lease", TASK, "-n", ns)["metadata"].get("annotations", {})
    assert mask in lease.get("orchestrator.io/approval-requests", "") and PASSPHRASE not in json.dumps(lease), lease
    listed = cli_as(story, "alice", "task", "approvals", TASK)
    assert listed.returncode == 0, listed.stderr
    assert first["id"] in listed.stdout and "everything/echo" in listed.stdout and "Pending" in listed.stdout, listed.stdout
    assert f"--show {first['id']}" in listed.stdout and PASSPHRASE not in listed.stdout, listed.stdout
    shown = cli_as(story, "alice", "task", "approvals", TASK, "--show", first["id"])
    assert shown.returncode == 0, shown.stderr
    assert first["params"] in shown.stdout and first["digest"] in shown.stdout, shown.stdout
    assert f"{mask} = the value of key passphrase of Secret deploy" in shown.stdout, shown.stdout
    assert PASSPHRASE not in shown.stdout, shown.stdout
    described = story.cli("task", "describe", TASK)
    assert described.returncode == 0, described.stderr
    assert f"approve me: {mask}" in described.stdout and PASSPHRASE not in described.stdout, described.stdout
    asked = len(story.model.requests)
    assert APPROVE not in script.results, "the held call answered before any decision"

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
             "spec": {"taskRun": TASK, "id": first["id"], "digest": first["digest"], "decision": "approve",
                      "decidedBy": "bob"}}
    with pytest.raises(subprocess.CalledProcessError) as spoofed:
        story.kubectl("--as", "alice", "create", "-f", "-", stdin=json.dumps(spoof))
    assert "spec.decidedBy must be the identity making the request (alice)" in spoofed.value.stderr, spoofed.value.stderr
    # A decision without a digest is refused by the CRD's schema: nobody approves blind by id.
    blind = {**spoof, "spec": {k: v for k, v in spoof["spec"].items() if k != "digest"} | {"decidedBy": "alice"}}
    with pytest.raises(subprocess.CalledProcessError) as refused_blind:
        story.kubectl("--as", "alice", "create", "-f", "-", stdin=json.dumps(blind))
    assert "spec.digest" in refused_blind.value.stderr, refused_blind.value.stderr
    assert [a["state"] for a in approvals(story) if a["id"] == first["id"]] == ["Pending"]
    assert len(story.model.requests) == asked and APPROVE not in script.results

    # 3. alice approves what she read (--digest as --show printed it): the call is made with
    # the Secret's real value, and Claude Code gets echo's real answer.
    approved = cli_as(story, "alice", "task", "approve", TASK, first["id"], "--reason", "fine",
                      "--digest", first["digest"][:19])
    assert approved.returncode == 0, approved.stderr
    assert f"approved: request {first['id']} (everything/echo) of TaskRun {TASK}, by alice" in approved.stdout
    decision = story.json("get", "toolapproval", f"{TASK}-{first['id']}", "-n", ns)
    assert decision["spec"]["digest"] == first["digest"], decision
    wait_until("the approved call's result", lambda: APPROVE in script.results, timeout=60, interval=0.2)
    assert script.results[APPROVE] == f"Echo: {APPROVE}", script.results
    again = cli_as(story, "alice", "task", "reject", TASK, first["id"])
    assert again.returncode == 5 and "is Approved already (by alice)" in again.stderr, again
    decided = next(a for a in approvals(story) if a["id"] == first["id"])
    assert "params" not in decided and decided["digest"] == first["digest"], decided

    # 4. The second call: alice rejects it with a reason, which the agent sees. Nothing in it is
    # masked, so its digest is recomputed here from what is shown: the same.
    second = pending(story, "reject me")
    assert second["digest"] == call_digest(ns, TASK, second, json.loads(second["params"])), second
    rejected = cli_as(story, "alice", "task", "reject", TASK, second["id"], "--reason", "not today")
    assert rejected.returncode == 0, rejected.stderr
    wait_until("the rejected call's answer", lambda: "reject me" in script.results, timeout=60, interval=0.2)
    answer = script.results["reject me"]
    assert answer.startswith("ERROR") and "rejected by alice" in answer and "not today" in answer, answer

    # 5. The third: a decision naming another call's digest (the first's, which alice saw)
    # under this request's id. The CLI refuses before writing anything; a ToolApproval made
    # by hand rejects the call, and echo never runs.
    swapped = pending(story, "swap me")
    stale = cli_as(story, "alice", "task", "approve", TASK, swapped["id"], "--digest", first["digest"])
    assert stale.returncode == 5 and "no longer names the call you saw" in stale.stderr, stale
    assert story.kubectl("get", "toolapprovals", "-n", ns, "-o", "name").count(swapped["id"]) == 0
    by_hand = {"apiVersion": "orchestrator.io/v1", "kind": "ToolApproval",
               "metadata": {"name": f"{TASK}-{swapped['id']}", "namespace": ns},
               "spec": {"taskRun": TASK, "id": swapped["id"], "digest": first["digest"], "decision": "approve",
                        "decidedBy": "alice"}}
    story.kubectl("--as", "alice", "create", "-f", "-", stdin=json.dumps(by_hand))
    wait_until("the swapped call's answer", lambda: "swap me" in script.results, timeout=60, interval=0.2)
    answer = script.results["swap me"]
    assert answer.startswith("ERROR") and "not this call" in answer and "Echo" not in answer, answer
    entry = next(a for a in approvals(story) if a["id"] == swapped["id"])
    assert entry["state"] == "Rejected" and f"names {first['digest'][:19]}" in entry["reason"], entry

    # 6. The fourth: nobody decides; past the timeout the proxy refuses it.
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
                      swapped["id"]: ("Rejected", "alice", entry["reason"]),
                      third["id"]: ("Expired", None, None)}, states
    events = story.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={TASK}")["items"]
    reasons = [e["reason"] for e in events]
    for reason in ["ApprovalRequested", "ApprovalGranted", "ApprovalRejected", "ApprovalDigestMismatch", "ApprovalExpired"]:
        assert reason in reasons, reasons
    assert PASSPHRASE not in json.dumps(events), "the Secret value is in an Event"
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


def as_token(story: Story, token: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """kubectl with a bearer token alone (not the admin's kubeconfig credentials)."""
    server = next(line.split("server: ")[1] for line in story.kubeconfig.read_text().splitlines() if "server: " in line)
    argv = [str(story.bins / "kubectl"), "--kubeconfig", "/dev/null", "--server", server,
            "--certificate-authority", str(story.kubeconfig.parent / "pki/ca.crt"), "--token", token,
            "-n", story.work_ns, *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True)


def pod_bound_token(story: Story, account: str, pod: dict) -> str:
    """A token of `account` bound to `pod`: the claims the kubelet projects into its containers."""
    return story.kubectl("create", "token", account, "-n", story.work_ns, "--duration", "10m",
                         "--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
                         "--bound-object-uid", pod["metadata"]["uid"]).strip()


def test_a_pod_with_the_same_service_account_cannot_publish_requests_for_another_task(story: Story):
    ns, task = story.work_ns, "sa-a"
    script = HeldCalls(["legit call"])
    if getattr(story, "model", None):
        story.model.stop()
    story.model = ScriptedModel(script, port=MODEL_PORT).start()
    story.cleanup.callback(story.model.stop)
    if "anthropic" not in story.kubectl("get", "secrets", "-n", ns, "-o", "name"):
        story.kubectl("create", "secret", "generic", "anthropic", "-n", ns, "--from-literal=api-key=sk-ant-stand-in-approval")
    # A ServiceAccount several workloads share; the task runs as it, and RBAC (the task's Role,
    # bound to the account) lets every pod of the account patch the task's Lease.
    story.kubectl("create", "serviceaccount", "shared", "-n", ns)
    apply_task(story, task, 3003, "echo one thing", {
        "policy": {"requireApproval": {"tools": ["everything/echo"], "timeoutSeconds": 300}},
        "mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}],
    }, service_account="shared")

    # The operator binds the task's Lease to the task's pod; its proxy publishes through it.
    def bound_pod():
        pods = story.json("get", "pods", "-n", ns, "-l", f"job-name={task}")["items"]
        leases = story.json("get", "leases", "-n", ns, "--field-selector", f"metadata.name={task}")["items"]
        uid = (leases[0]["metadata"].get("annotations") or {}).get("orchestrator.io/proxy-pod-uid") if leases else None
        return next((p for p in pods if p["metadata"]["uid"] == uid), None)

    pod = wait_until("the task's Lease bound to its pod", bound_pod, timeout=120, interval=0.3)
    assert pod["spec"]["serviceAccountName"] == "shared", pod["spec"]
    lease = story.json("get", "lease", task, "-n", ns)["metadata"]
    assert lease["labels"].get("orchestrator.io/proxy-lease") == "true", lease
    assert lease["annotations"].get("orchestrator.io/proxy-pod") == pod["metadata"]["name"], lease
    legit = pending(story, "legit call", task)

    # Another workload of the account: a pod that only has to exist (it selects no node), and a
    # token of the account bound to it, as the kubelet would project it.
    forger = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "forger", "namespace": ns},
              "spec": {"serviceAccountName": "shared", "automountServiceAccountToken": False,
                       "nodeSelector": {"e2e.orchestrator.io/node": "nowhere"},
                       "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                           "seccompProfile": {"type": "RuntimeDefault"}},
                       "containers": [{"name": "c", "image": "e2e.orchestrator.invalid/none:1",
                                       "securityContext": {"allowPrivilegeEscalation": False,
                                                           "capabilities": {"drop": ["ALL"]}}}]}}
    story.kubectl("apply", "-f", "-", stdin=json.dumps(forger))
    story.cleanup.callback(story.kubectl, "delete", "pod", "forger", "-n", ns, "--wait=false")
    forger = story.json("get", "pod", "forger", "-n", ns)
    token = pod_bound_token(story, "shared", forger)
    can = as_token(story, token, "auth", "can-i", "patch", f"leases/{task}")
    assert can.stdout.strip() == "yes", can

    # A well-formed request in the task's name (its digest covers what it shows: the operator
    # would list it), next to the real one: refused by the admission policy.
    params = {"name": "echo", "arguments": {"message": "benign: list issues"}}
    fake = {"id": "f0f0f0f0", "server": "everything", "tool": "echo",
            "definition": legit["definition"], "contextVersion": legit["contextVersion"],
            "params": json.dumps(params, separators=(",", ":")), "paramsBytes": 0, "maskNonce": "0f0f0f",
            "requestedAt": legit["requestedAt"], "expiresAt": legit["expiresAt"]}
    fake["digest"] = call_digest(ns, task, fake, params)
    fake["paramsBytes"] = len(fake["params"])
    listed = json.loads(story.json("get", "lease", task, "-n", ns)["metadata"]["annotations"]
                        ["orchestrator.io/approval-requests"])
    forged = {"metadata": {"annotations": {"orchestrator.io/approval-requests": json.dumps(listed + [fake])}}}
    patched = as_token(story, token, "patch", "lease", task, "--type=merge", "-p", json.dumps(forged))
    assert patched.returncode != 0, f"the forger's patch was admitted: {patched.stdout}"
    assert "Forbidden" in patched.stderr and f"only the proxy of the task pod {pod['metadata']['name']} may write Lease {task}" \
        in patched.stderr, patched.stderr
    # Withdrawing the real request is refused as well.
    withdrawn = as_token(story, token, "patch", "lease", task, "--type=merge", "-p",
                         json.dumps({"metadata": {"annotations": {"orchestrator.io/approval-requests": "[]"}}}))
    assert withdrawn.returncode != 0 and "Forbidden" in withdrawn.stderr, withdrawn

    # Over a few reconciles, status.approvals lists the real request only, still pending.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        listed = {a["id"]: a["state"] for a in approvals(story, task)}
        assert listed == {legit["id"]: "Pending"}, listed
        time.sleep(0.5)

    # Controls: a token bound to the task's own pod may write what the proxy writes, but not the
    # binding, which is the operator's.
    own = pod_bound_token(story, "shared", pod)
    served = story.json("get", "lease", task, "-n", ns)["metadata"]["annotations"].get(
        "orchestrator.io/served-context-version", "1")
    report = as_token(story, own, "patch", "lease", task, "--type=merge", "-p",
                      json.dumps({"metadata": {"annotations": {"orchestrator.io/served-context-version": served}}}))
    assert report.returncode == 0, report.stderr
    rebind = as_token(story, own, "patch", "lease", task, "--type=merge", "-p",
                      json.dumps({"metadata": {"annotations": {"orchestrator.io/proxy-pod-uid": forger["metadata"]["uid"]}}}))
    assert rebind.returncode != 0 and "may not change the binding annotations" in rebind.stderr, rebind
    lease = story.json("get", "lease", task, "-n", ns)["metadata"]["annotations"]
    assert lease["orchestrator.io/proxy-pod-uid"] == pod["metadata"]["uid"], lease

    # The real request is decided as usual, and the task finishes.
    decided = story.cli("task", "reject", task, legit["id"], "--reason", "test over")
    assert decided.returncode == 0, decided.stderr
    wait_until("the legit call's answer", lambda: "legit call" in script.results, timeout=60, interval=0.2)
    assert "test over" in script.results["legit call"], script.results
    wait_until("the TaskRun to succeed", lambda: story.json("get", "taskrun", task, "-n", ns)
               .get("status", {}).get("phase") == "Succeeded", timeout=120, interval=0.5)
