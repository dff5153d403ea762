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
Needs the cluster with its real node and pod network (e2e/cluster up).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "story"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted_agent import CLIENT  # noqa: E402
from story import MODEL_PORT, REAL_NODE, REPO, Story, wait_until  # noqa: E402

ALPHA_PORT = MODEL_PORT + 1
BETA_PORT = MODEL_PORT + 2
# helm --set takes dots as path separators: the label's dots escaped.
ESCAPED_NODE_LABEL = REAL_NODE[0].replace(".", "\\.")
TOKEN_FILE = "/var/run/secrets/orchestrator.io/mcp/token"
NODE_PLACEMENT = {
    "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
    "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
}

# The agents idle (their pods stay up); the test drives them with `kubectl exec`.
IDLE = CLIENT + "\nimport time\nwhile True: time.sleep(3600)\n"

# Run inside an agent container: the CLIENT's helpers, then what the test asks, as JSON on stdout.
PROBE = CLIENT + r"""
import time, urllib.error
what = json.loads(sys.argv[1])

def status_of(body, session=None, token=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    if session:
        headers.update({"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()[:2000]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:2000]

out = {}
def tools():
    global out
    session = connect("probe")
    _, msgs = post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session)
    out["tools"] = sorted(t["name"] for t in msgs[-1]["result"]["tools"])
    out["session"] = session
    for i, (name, args) in enumerate(what.get("calls", [])):
        _, msgs = post({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                        "params": {"name": name, "arguments": args}}, session)
        out.setdefault("calls", []).append(msgs[-1])

if what["do"] == "tools":
    try:
        tools()
    except urllib.error.HTTPError as e:
        out = {"status": e.code, "body": e.read().decode()[:2000]}
elif what["do"] == "raw":
    token = what.get("token")
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "thief", "version": "1"}}}
    body = what.get("body", init)
    out["status"], out["body"] = status_of(body, what.get("session"), token)
elif what["do"] == "listen":
    # Open a session and its GET stream; print when tools/list_changed arrives.
    session = connect("listener")
    headers = {"Accept": "text/event-stream", "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25",
               "Authorization": "Bearer " + open(token_file).read().strip()}
    request = urllib.request.Request(url, headers=headers, method="GET")
    with urllib.request.urlopen(request, timeout=what["timeout"]) as r:
        print(json.dumps({"listening": time.time()}), flush=True)
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and "notifications/tools/list_changed" in line:
                out["list_changed_at"] = time.time()
                break
print(json.dumps(out), flush=True)
"""


def exec_agent(story: Story, pod: str, what: dict, timeout: float = 60) -> dict:
    argv = [str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "exec", "-n", story.work_ns,
            pod, "-c", "agent", "--", "python3", "-c", PROBE, json.dumps(what)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"exec in {pod} failed: {out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def taskrun(name: str, task_id: int, server: str) -> dict:
    return {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name},
        "spec": {
            "taskId": task_id, "serviceName": "shared", "task": {"prompt": "prove the shared proxy"},
            "proxy": {"mode": "shared"},
            "agent": {"command": ["python3", "-c", IDLE]},
            "podTemplate": NODE_PLACEMENT,
            "activeDeadlineSeconds": 900,
            "toolConfig": {"mcpServers": [{"name": server, "tools": {"allow": ["read"]}}]},
        },
    }


def running_agent(story: Story, job: str) -> dict:
    def running():
        pods = story.json("get", "pods", "-n", story.work_ns, "-l", f"job-name={job}")["items"]
        if not pods:
            return None
        story.fail_if_pod_failed(pods[0])
        agent = next((s for s in pods[0]["status"].get("containerStatuses", []) if s["name"] == "agent"), {})
        return pods[0] if agent.get("state", {}).get("running") else None

    return wait_until(f"the agent of {job} to run", running, timeout=120, interval=0.2)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    # The node's pods have no cluster DNS: the Service gets a fixed address from the static band
    # of the service range, and the agents its URL.
    cluster_ip = f"10.96.15.{random.randrange(2, 250)}"
    story = Story(say=lambda *_: None, helm_values=[
        "sharedProxy.enabled=true",
        f"sharedProxy.service.clusterIP={cluster_ip}",
        f"sharedProxy.nodeSelector.{ESCAPED_NODE_LABEL}={REAL_NODE[1]}",
        f"sharedProxy.tolerations[0].key={REAL_NODE[0]}",
        "sharedProxy.tolerations[0].operator=Equal",
        f"sharedProxy.tolerations[0].value={REAL_NODE[1]}",
        "sharedProxy.tolerations[0].effect=NoSchedule",
    ])
    records = tmp_path_factory.mktemp("shared")
    with ExitStack() as cleanup:
        servers = {}
        for name, port in (("alpha", ALPHA_PORT), ("beta", BETA_PORT)):
            record = records / f"{name}.jsonl"
            record.touch()
            proc = subprocess.Popen([sys.executable, str(REPO / "e2e/story/http_tools_server.py"), str(port),
                                     str(record), "read", "write"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            cleanup.callback(proc.wait, 10)
            cleanup.callback(proc.terminate)
            servers[name] = record
        story.prepare(cleanup)
        # Both servers join the catalog (the operator watches its ConfigMap).
        cm = story.json("get", "configmap", "orchestrator-catalog", "-n", story.system_ns)
        catalog = yaml.safe_load(cm["data"]["catalog.yaml"])
        catalog["servers"] = [s for s in catalog["servers"] if s["name"] not in servers] + [
            {"name": name, "description": f"the {name} test server",
             "http": {"url": f"http://127.0.0.1:{port}/mcp"}}
            for name, port in (("alpha", ALPHA_PORT), ("beta", BETA_PORT))]
        cm["data"]["catalog.yaml"] = yaml.safe_dump(catalog)
        story.kubectl("apply", "-f", "-", stdin=json.dumps(cm))
        deployment = wait_until("the shared proxy Deployment", lambda: story.json(
            "get", "deployment", "-n", story.system_ns, "-l", "app.kubernetes.io/component=shared-mcp-proxy")["items"])[0]
        name = deployment["metadata"]["name"]
        wait_until("the shared proxy's replicas to be ready", lambda: story.json(
            "get", "deployment", name, "-n", story.system_ns)["status"].get("readyReplicas", 0)
            == deployment["spec"]["replicas"], timeout=180, interval=0.5)
        story.shared_proxy = name
        story.records = servers
        for tr in (taskrun("alpha", 1, "alpha"), taskrun("beta", 2, "beta")):
            story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(tr))
        story.pods = {job: running_agent(story, job) for job in ("alpha", "beta")}
        yield story


def proxy_log(story: Story) -> str:
    """The shared proxy's log lines that are not audit records (its warnings say why it refused)."""
    out = story.kubectl("logs", "-n", story.system_ns, "-l", "app.kubernetes.io/component=shared-mcp-proxy",
                        "--prefix", "--tail", "200")
    return "\n".join(line for line in out.splitlines() if '"recordType"' not in line)[-6000:]


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
    # Until the operator has bound the pod (its uid, then its IP, on the task's ConfigMap), the
    # proxy serves its token no task (403), then answers "not ready" (503, Retry-After).
    def served(job: str, pod: str, calls: list) -> dict | None:
        answer = exec_agent(story, pod, {"do": "tools", "calls": calls})
        if answer.get("status") in (403, 503) and ("PROXY.UNKNOWN_TASK" in answer["body"]
                                                    or "PROXY.TASK_NOT_READY" in answer["body"]):
            return None
        assert "tools" in answer, f"{job}: {answer}\nthe shared proxy's log:\n{proxy_log(story)}"
        return answer

    alpha = wait_until("alpha's tools through the shared proxy", lambda: served(
        "alpha", alpha_pod, [["alpha__read", {"text": "mine"}], ["beta__read", {"text": "theirs"}]]),
        timeout=60, interval=0.5)
    assert alpha["tools"] == ["alpha__read"], alpha
    ok, refused = alpha["calls"]
    assert ok["result"]["content"][0]["text"] == "read:mine", ok
    text = json.dumps(refused)
    assert "beta__read" in text and ("unknown" in text.lower() or "not" in text.lower()), refused
    assert [c["text"] for c in calls(story.records["alpha"])] == ["mine"]
    assert calls(story.records["beta"]) == [], "beta's server ran a call alpha made"

    beta = wait_until("beta's tools", lambda: served("beta", beta_pod, []), timeout=60, interval=0.5)
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
    assert alpha["tools"] == ["alpha__read", "alpha__write"], alpha
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
