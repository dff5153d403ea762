"""Shared-service mode on the real node (issue 31; docs/proxy.md "Shared mode"): the chart's
shared proxy Deployment serves two tasks, each isolated, reached through its ClusterIP Service
over the node's pod network.

Two TaskRuns in `spec.proxy.mode: shared`, alpha and beta, each allowed the tools of its own
HTTP MCP server on the host (reached through the pods' portal), and agents that are scripts (the
image's Python; no model). What a user and an attacker would check:
- each task's agent is offered exactly its own tools, through the Service, with its pod's token;
- alpha's agent, calling beta's tool by its exposed name, gets an unknown tool and beta's server
  never runs it;
- beta's agent holding alpha's token (read out of alpha's pod) is refused from its own pod (the
  peer check), and alpha's session id with beta's token is unknown (404);
- add-context on alpha reaches alpha's open session as `notifications/tools/list_changed` (the
  time from the CLI's return is reported), not beta's;
- when alpha is cancelled, its token is refused as a task no longer served (403
  PROXY.UNKNOWN_TASK), and the time that took is reported.
And the story with the real agent: Claude Code (the default agent image, the scripted model
stand-in) in shared mode reaches the shared proxy with its pod's token through the rendered
`headersHelper`, is offered exactly its task's tools (an HTTP server's and a stdio server's in its
pod's zone), is offered a tool granted with add-context on its next turn, and waits for a person's
approval of a held call, which carries a value of the task's Secret: the person reads it masked,
the upstream gets the real value; the task succeeds and the shared proxy's audit records of its
calls carry its task's uid.
Needs the cluster with its real node and pod network (e2e/cluster up).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from shared_mode import (
    ALPHA_PORT,
    BETA_PORT,
    COMPONENT,
    GAMMA_PORT,
    PROBE,
    TOKEN_FILE,
    exec_agent,
    proxy_log,
    running_agent,
    served,
    shared_story,
    taskrun,
)
from story import (
    MCP,
    MODEL_PORT,
    ScriptedModel,
    Story,
    agent_task,
    chart_object,
    text,
    tls_pair,
    tool_result_text,
    tool_use,
    wait_until,
)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with ExitStack() as cleanup:
        story = shared_story(cleanup, tmp_path_factory.mktemp("shared"),
                             [("alpha", ALPHA_PORT), ("beta", BETA_PORT), ("gamma", GAMMA_PORT)])
        # alpha also has a stdio server: it runs in alpha's pod (its zone), which the shared
        # proxy reaches over TCP with the zone's key.
        zoned = [{"name": "everything", "tools": {"allow": ["echo"]}}]
        for tr in (taskrun("alpha", 1, "alpha", more=zoned), taskrun("beta", 2, "beta")):
            story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(tr))
        story.pods = {job: running_agent(story, job) for job in ("alpha", "beta")}
        yield story


def calls(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def test_each_task_gets_exactly_its_own_tools_and_a_stolen_token_is_refused(shared):
    story = shared
    alpha_pod, beta_pod = (story.pods[j]["metadata"]["name"] for j in ("alpha", "beta"))
    for job in ("alpha", "beta"):
        tr = story.json("get", "taskrun", job, "-n", story.work_ns)
        assert tr["status"].get("proxyMode") == "shared", tr["status"]
        pod = story.pods[job]
        names = [c["name"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]]
        assert "mcp-proxy" not in names, f"a shared task's pod has no proxy: {names}"

    # alpha sees its own tools only, and calling beta's by name reaches nothing.
    alpha = wait_until("alpha's tools through the shared proxy", lambda: served(
        story, "alpha", alpha_pod, [["alpha__read", {"text": "mine"}], ["beta__read", {"text": "theirs"}],
                                    ["everything__echo", {"message": "through the zone"}]]),
        timeout=60, interval=0.5)
    assert alpha["tools"] == ["alpha__read", "everything__echo"], alpha
    ok, refused, zoned = alpha["calls"]
    assert "through the zone" in json.dumps(zoned.get("result")), zoned
    names = [c["name"] for c in story.pods["alpha"]["spec"].get("initContainers", [])]
    assert "zone-everything" in names, names
    assert ok["result"]["content"][0]["text"] == "read:mine", ok
    text = json.dumps(refused)
    assert "beta__read" in text and ("unknown" in text.lower() or "not" in text.lower()), refused
    assert [c["text"] for c in calls(story.records["alpha"])] == ["mine"]
    assert calls(story.records["beta"]) == [], "beta's server ran a call alpha made"

    beta = wait_until("beta's tools", lambda: served(story, "beta", beta_pod, []), timeout=60, interval=0.5)
    assert beta["tools"] == ["beta__read"], beta

    # alpha's session id, with beta's own token: no such session for beta.
    answer = exec_agent(story, beta_pod, {"do": "raw", "session": alpha["session"],
                                          "body": {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                                          "token": story.kubectl("exec", "-n", story.work_ns, beta_pod, "-c", "agent",
                                                                 "--", "cat", TOKEN_FILE).strip()})
    assert answer["status"] == 404, answer

    # alpha's token, stolen out of alpha's pod, used from beta's pod: the peer check refuses it.
    stolen = story.kubectl("exec", "-n", story.work_ns, alpha_pod, "-c", "agent", "--", "cat", TOKEN_FILE).strip()
    answer = exec_agent(story, beta_pod, {"do": "raw", "token": stolen})
    assert answer["status"] == 403 and "PROXY.PEER_MISMATCH" in answer["body"], answer
    # No token, a forged one, and the pod's API token are refused before any task is chosen.
    for token in (None, "x.y.z"):
        answer = exec_agent(story, beta_pod, {"do": "raw", "token": token})
        assert answer["status"] == 401, answer

    # The token is no API token: the API server refuses it (its audience is the shared proxy's).
    out = subprocess.run([str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "--token", stolen,
                          "auth", "whoami"], capture_output=True, text=True)
    assert out.returncode != 0 and "Unauthorized" in out.stderr + out.stdout, out

    # add-context on alpha: alpha's open session is told; the time from the CLI's return.
    listener = subprocess.Popen(
        [str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "exec", "-n", story.work_ns, alpha_pod,
         "-c", "agent", "--", "python3", "-c", PROBE, json.dumps({"do": "listen", "timeout": 60})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = listener.stdout.readline()
        assert line.strip(), f"the listener in alpha's pod did not start: {listener.communicate(timeout=30)}"
        first = json.loads(line)
        assert "listening" in first, first
        asked = time.time()
        done = story.cli("task", "add-context", "alpha", "--enable-tools", "alpha:write")
        assert done.returncode == 0, done.stderr
        returned = time.time()
        out, err = listener.communicate(timeout=60)
    finally:
        listener.kill()
    told = json.loads(out.strip().splitlines()[-1])
    assert "list_changed_at" in told, (out, err)
    # From the CLI's start (it reads the TaskRun and the catalog, then writes) and from its return.
    from_start, from_return = told["list_changed_at"] - asked, told["list_changed_at"] - returned
    print(f"add-context -> list_changed on alpha's session: {from_start:.3f} s from the CLI's start, "
          f"{from_return:.3f} s after it returned")
    assert from_start <= 5, f"add-context took {from_start:.1f} s to reach alpha's session"
    alpha = exec_agent(story, alpha_pod, {"do": "tools"})
    assert alpha["tools"] == ["alpha__read", "alpha__write", "everything__echo"], alpha
    assert exec_agent(story, beta_pod, {"do": "tools"})["tools"] == ["beta__read"]

    # alpha ends: its token is refused as a task no longer served, from its own pod's address too.
    cancelled = time.time()
    done = story.cli("task", "cancel", "alpha")
    assert done.returncode == 0, done.stderr

    def refused_unknown():
        answer = exec_agent(story, beta_pod, {"do": "raw", "token": stolen})
        return answer if answer["status"] == 403 and "PROXY.UNKNOWN_TASK" in answer["body"] else None

    wait_until("alpha's token to be refused as a finished task's", refused_unknown, timeout=60, interval=0.2)
    story.figures["shared_cancel_to_token_refused_s"] = round(time.time() - cancelled, 2)
    print(f"cancel -> alpha's token refused: {story.figures['shared_cancel_to_token_refused_s']} s")
    assert not story.json("get", "configmap", "-n", story.system_ns,
                          "-l", "orchestrator.io/shared-proxy-config=true",
                          "--field-selector", f"metadata.name=task.{story.work_ns}.alpha")["items"]
    # beta goes on.
    assert exec_agent(story, beta_pod, {"do": "tools"})["tools"] == ["beta__read"]


# How long Claude Code may take to list the shared proxy's tools (it connects --mcp-config servers
# in the background; the model keeps it busy with a harmless built-in call meanwhile).
CONNECT_BUDGET_S = 60
# A value of the task's Secret deploy/passphrase (in the agent's env): the call held for approval
# carries it, and what a person reads must show it masked (the shared proxy reads the task's Secret
# keys the operator lists, mask-keys.json, through the API).
PASSPHRASE = "open sesame 4711"
HELD = f"approve me: {PASSPHRASE}"


class SharedAgent:
    """The model's script: what Claude Code offers, a read, busy reads until add-context's grant is
    offered, the granted write, then echo (held for approval)."""

    def __init__(self):
        self.seen: dict = {}
        self.ready = threading.Event()  # the first call answered: a person may grant now
        self.done = threading.Event()

    def __call__(self, first):
        r, deadline = first, time.monotonic() + CONNECT_BUDGET_S
        while not r.mcp_tools():
            assert time.monotonic() < deadline, f"Claude Code offered no MCP tools within {CONNECT_BUDGET_S}s"
            r = yield tool_use("Glob", {"pattern": "*.none"}).after(0.3)
        self.seen["offered"] = r.mcp_tools()
        r = yield tool_use(MCP + "gamma__read", {"text": "first"})
        self.seen["read"] = tool_result_text(r)
        self.ready.set()
        busy, deadline = 0, time.monotonic() + 120
        while "gamma__write" not in r.mcp_tools():
            assert time.monotonic() < deadline, "gamma__write was not offered within 120 s"
            busy += 1
            r = yield tool_use(MCP + "gamma__read", {"text": f"busy {busy}"}).after(0.1)
        self.seen["offered_after"], self.seen["busy"] = r, busy
        r = yield tool_use(MCP + "gamma__write", {"text": "granted"})
        self.seen["write"] = tool_result_text(r)
        self.seen["write_request_tail"] = json.dumps(r.messages[-3:])[-3000:]
        r = yield tool_use(MCP + "everything__echo", {"message": HELD})
        self.seen["echo"] = tool_result_text(r)
        self.done.set()
        yield text("done")


def audit_records(story: Story) -> list[dict]:
    """Every audit record in the shared proxy replicas' logs."""
    out = story.kubectl("logs", "-n", story.system_ns, "-l", f"app.kubernetes.io/component={COMPONENT}",
                        "--tail", "-1")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"recordType"' in line]


def test_claude_code_in_shared_mode_is_offered_its_tools_a_grant_on_its_next_turn_and_waits_for_approval(shared):
    story = shared
    ns, task = story.work_ns, "claude"
    script = SharedAgent()
    # The model stand-in serves HTTPS with a CA of its own, in the task's ConfigMap model-ca; the
    # key is in the task's Secret, which only the shared proxy reads (the task's Role names it).
    tls = tls_pair(story.workdir / "shared-model-tls")
    story.model = ScriptedModel(script, port=MODEL_PORT, tls=tls[1:]).start()
    story.cleanup.callback(story.model.stop)
    api_key = f"sk-ant-stand-in-shared-{secrets.token_hex(6)}"
    story.kubectl("create", "secret", "generic", "anthropic", "-n", ns, f"--from-literal=api-key={api_key}")
    story.kubectl("create", "configmap", "model-ca", "-n", ns, f"--from-file=ca.crt={tls[0]}")
    story.kubectl("create", "secret", "generic", "deploy", "-n", ns, f"--from-literal=passphrase={PASSPHRASE}")
    story.kubectl("create", "rolebinding", "alice-approves", "-n", ns, f"--clusterrole={chart_object('approver')}",
                  "--user=alice")
    tr = agent_task(task, 31, "shared", "read, then write, then echo", {
        "policy": {"requireApproval": {"tools": ["everything/echo"], "timeoutSeconds": 120}},
        "mcpServers": [{"name": "gamma", "tools": {"allow": ["read"]}},
                       {"name": "everything", "tools": {"allow": ["echo"]}}],
    }, gateway=True)
    tr["spec"]["model"] |= {"endpoint": f"https://127.0.0.1:{MODEL_PORT}",
                            "caConfigMapKeyRef": {"name": "model-ca", "key": "ca.crt"}}
    tr["spec"]["agent"] = {"env": [
        {"name": "DEPLOY_PASSPHRASE", "valueFrom": {"secretKeyRef": {"name": "deploy", "key": "passphrase"}}}]}
    tr["spec"]["proxy"] = {"mode": "shared"}
    story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(tr))
    pod = running_agent(story, task)
    names = [c["name"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]]
    assert "mcp-proxy" not in names and "zone-everything" in names, names
    # The model key is nowhere in the pod: no container's env names the Secret, no volume
    # mounts it; the agent's runtime is pointed at the shared proxy.
    assert not re.search(r'"(name|secretName)": "anthropic"', json.dumps(pod["spec"])), "the pod names the model key's Secret"
    agent_env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] if c["name"] == "agent"
                 for e in c.get("env", [])}
    assert agent_env.get("ANTHROPIC_BASE_URL", "").endswith("/model") and "ANTHROPIC_API_KEY" not in agent_env, agent_env

    def failed(what: str) -> str:
        logs = story.kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", "agent", "--tail", "60")
        return f"{what}\nthe agent's log:\n{logs}\nthe shared proxy's log:\n{proxy_log(story)}"

    # Claude Code ran the rendered headersHelper (its pod's token): the shared proxy served it.
    assert script.ready.wait(180), failed(f"Claude Code did not get through its first call: {script.seen}")
    assert script.seen["offered"] == ["everything__echo", "gamma__read"], script.seen["offered"]
    # The default agent command waited until the shared proxy served the pod's token (with the
    # image's Python: the agent image has no Node.js), without complaint.
    waited = story.kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", "agent")
    assert "not found" not in waited and "does not serve" not in waited and "no python3" not in waited, waited
    # (The SDK's server answers with structured content too: Claude Code passes the model that.)
    assert "read:first" in script.seen["read"] and "ERROR" not in script.seen["read"], script.seen

    # A person grants gamma's write; the model is offered it on Claude Code's next turn.
    started = time.time()
    done = story.cli("task", "add-context", task, "--enable-tools", "gamma:write", "--wait-synced")
    assert done.returncode == 0, done.stdout + done.stderr
    synced = time.time()
    assert wait_until("the model to be offered gamma__write", lambda: "offered_after" in script.seen,
                      timeout=120, interval=0.1)
    offered = script.seen["offered_after"]
    print(f"shared mode, Claude Code: add-context --wait-synced returned {synced - started:.2f} s after it started; "
          f"the model was offered the granted tool {offered.wall - started:.2f} s after it started "
          f"({script.seen['busy']} busy calls)")
    assert offered.mcp_tools() == ["everything__echo", "gamma__read", "gamma__write"], offered.mcp_tools()
    assert offered.wall - started <= 5, f"the grant reached the model {offered.wall - started:.1f} s after add-context"
    status = story.json("get", "taskrun", task, "-n", ns)["status"]
    assert status.get("servedContextVersion") == status.get("contextVersion"), status

    # The granted write runs; echo is held until alice approves it.
    def held():
        for a in story.json("get", "taskrun", task, "-n", ns).get("status", {}).get("approvals", []):
            if a["state"] == "Pending" and "approve me" in (a.get("params") or ""):
                return a
        return None

    pending = wait_until("echo to wait for approval", held, timeout=120, interval=0.2)
    # What a person reads shows the Secret's value masked, in the status and on the Lease alike.
    mask = f"<secret:deploy/passphrase:{pending['maskNonce']}>"
    assert json.loads(pending["params"])["arguments"] == {"message": f"approve me: {mask}"}, pending
    assert pending["masked"] == [{"secret": "deploy", "key": "passphrase", "count": 1}], pending
    assert PASSPHRASE not in json.dumps(story.json("get", "taskrun", task, "-n", ns)), "the value is in the TaskRun"
    assert PASSPHRASE not in json.dumps(story.json("get", "lease", task, "-n", ns)), "the value is on the Lease"
    assert "write:granted" in script.seen["write"] and "ERROR" not in script.seen["write"], \
        (script.seen["write"], script.seen["write_request_tail"])
    assert "echo" not in script.seen, "the held call answered before any decision"
    approved = story.cli("--as", "alice", "task", "approve", task, pending["id"], "--digest", pending["digest"])
    assert approved.returncode == 0, approved.stderr
    assert script.done.wait(60), failed(f"echo did not answer after the approval: {script.seen}")
    assert script.seen["echo"] == f"Echo: {HELD}", script.seen
    assert story.model.error is None, story.model.error

    answered = time.time()
    tr = wait_until("the TaskRun to succeed", lambda: (lambda t: t if t.get("status", {}).get("phase") in (
        "Succeeded", "Failed") else None)(story.json("get", "taskrun", task, "-n", ns)), timeout=120, interval=0.5)
    assert tr["status"]["phase"] == "Succeeded", failed(json.dumps(tr["status"])[:3000])
    print(f"the approved echo answered -> TaskRun Succeeded: {time.time() - answered:.1f} s")
    assert tr["status"]["proxyMode"] == "shared" and tr["status"].get("result", {}).get("subtype") == "success", \
        tr["status"]
    states = {a["id"]: (a["state"], a.get("decidedBy")) for a in tr["status"].get("approvals", [])}
    assert states == {pending["id"]: ("Approved", "alice")}, states

    # The shared proxy's audit: this task's calls, under its uid, from Claude Code.
    uid = tr["metadata"]["uid"]
    mine = [r for r in audit_records(story) if r.get("taskUid") == uid and r.get("recordType") == "tool_call"]
    calls = [(r["server"], r["upstreamTool"], r["outcome"]) for r in mine]
    assert ("gamma", "read", "ok") in calls and ("gamma", "write", "ok") in calls, calls
    assert ("everything", "echo", "ok") in calls, calls
    assert all(r["task"] == task and r["proxyMode"] == "shared" for r in mine), mine[:3]

    # The model gateway in the shared proxy: every request came with the task's key (never the
    # pod's token), and status.usage is the stand-in's own count.
    keys = {r.headers.get("x-api-key") for r in story.model.requests}
    assert keys == {api_key}, f"the stand-in saw keys {[k[:16] if k else k for k in keys]}"
    counted = story.model.usage()
    usage = wait_until("status.usage to reach the stand-in's count", lambda: (
        u if (u := story.json("get", "taskrun", task, "-n", ns)["status"].get("usage", {})).get("requests")
        == counted["requests"] else None), timeout=30)
    assert (usage["inputTokens"], usage["outputTokens"]) == (counted["input_tokens"], counted["output_tokens"]), \
        (usage, counted)
    models = [r for r in audit_records(story) if r.get("taskUid") == uid and r.get("recordType") == "model_request"]
    assert len(models) == counted["requests"], (len(models), counted)
    print(f"shared mode, the model through the shared proxy: {counted['requests']} requests, "
          f"{usage['inputTokens']} tokens in, {usage['outputTokens']} out, as the stand-in counted them")
    assert api_key not in proxy_log(story), "the model key is in the shared proxy's log"
    assert {r["client"].split("/")[0] for r in mine} == {"claude-code"}, {r["client"] for r in mine}
    gamma = [json.loads(line)["text"] for line in story.records["gamma"].read_text().splitlines() if line.strip()]
    assert gamma[0] == "first" and "granted" in gamma, gamma

