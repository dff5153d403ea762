"""Shared-service mode on the real node, the pieces its test and its benchmark share
(e2e/tests/python/test_shared_mode.py, e2e/story/bench_shared.py): the chart with its shared proxy,
HTTP tools servers on the host, TaskRuns whose agents idle while a test drives them with
`kubectl exec` (the scripted client, PROBE), and the shared proxy's log."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted_agent import CLIENT  # noqa: E402
from story import MODEL_PORT, MODEL_PORT_OFFSET, REAL_NODE, REPO, Story, chart_object, wait_until  # noqa: E402

COMPONENT = "shared-mcp-proxy"
ALPHA_PORT = MODEL_PORT + 1
BETA_PORT = MODEL_PORT + 2
GAMMA_PORT = MODEL_PORT + 3
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
elif what["do"] == "bench":
    # tools/call round trips on one session, each timed here (ms), after a warm-up.
    session = connect("bench")
    name, args = what["call"]
    for i in range(what["warmup"] + what["calls"]):
        t = time.perf_counter()
        _, msgs = post({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                        "params": {"name": name, "arguments": args}}, session)
        ms = (time.perf_counter() - t) * 1000
        if "result" not in msgs[-1]:
            sys.exit(f"call failed: {msgs[-1]}")
        if i >= what["warmup"]:
            out.setdefault("ms", []).append(round(ms, 3))
elif what["do"] == "listen":
    # Open a session and its GET stream; print when tools/list_changed arrives.
    session = connect("listener")
    headers = {"Accept": "text/event-stream", "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    if token_file:
        headers["Authorization"] = "Bearer " + open(token_file).read().strip()
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


def taskrun(name: str, task_id: int, server: str, mode: str = "shared", more: list | None = None) -> dict:
    """A TaskRun allowed `read` of its HTTP server (and the servers in `more`), its agent idle."""
    return {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name},
        "spec": {
            "taskId": task_id, "serviceName": "shared", "task": {"prompt": "prove the shared proxy"},
            "proxy": {"mode": mode},
            "agent": {"command": ["python3", "-c", IDLE]},
            "podTemplate": NODE_PLACEMENT,
            "activeDeadlineSeconds": 900,
            "toolConfig": {"mcpServers": [{"name": server, "tools": {"allow": ["read"]}}, *(more or [])]},
        },
    }


def running_agent(story: Story, job: str) -> dict:
    def running():
        pods = story.json("get", "pods", "-n", story.work_ns, "-l", f"job-name={job}")["items"]
        if not pods:
            # A TaskRun the operator refuses gets no Job: say why at once.
            status = story.json("get", "taskrun", job, "-n", story.work_ns).get("status", {})
            refused = [c for c in status.get("conditions", []) if c["status"] == "False"
                       and c["type"] in ("Ready", "ConfigRendered", "JobCreated")]
            assert not refused or status.get("jobName"), f"TaskRun {job}: {refused}"
            return None
        story.fail_if_pod_failed(pods[0])
        agent = next((s for s in pods[0]["status"].get("containerStatuses", []) if s["name"] == "agent"), {})
        return pods[0] if agent.get("state", {}).get("running") else None

    try:
        return wait_until(f"the agent of {job} to run", running, timeout=120, interval=0.2)
    except AssertionError as e:
        status = story.json("get", "taskrun", job, "-n", story.work_ns).get("status", {})
        raise AssertionError(f"{e}\nTaskRun {job}'s status: {json.dumps(status)[:3000]}") from None


def shared_story(cleanup: ExitStack, records: Path, servers: list[tuple[str, int]]) -> Story:
    """The chart with its shared proxy on the real node (2 replicas, a fixed ClusterIP: the node's
    pods have no cluster DNS), and one HTTP tools server per (name, port[, tool...]) on the host
    (tools `read` and `write` unless named), in the catalog, each recording its calls in
    records/<name>.jsonl (story.records)."""
    # A block of its own for each of ./test's two e2e processes (their shared proxies run at once).
    block = 15 + MODEL_PORT_OFFSET // 10
    cluster_ip = f"10.96.{block}.{random.randrange(2, 250)}"
    story = Story(say=lambda *_: None, helm_values=[
        "sharedProxy.enabled=true",
        f"sharedProxy.service.clusterIP={cluster_ip}",
        f"sharedProxy.nodeSelector.{ESCAPED_NODE_LABEL}={REAL_NODE[1]}",
        f"sharedProxy.tolerations[0].key={REAL_NODE[0]}",
        "sharedProxy.tolerations[0].operator=Equal",
        f"sharedProxy.tolerations[0].value={REAL_NODE[1]}",
        "sharedProxy.tolerations[0].effect=NoSchedule",
    ])
    story.records = {}
    for name, port, *tools in servers:
        record = records / f"{name}.jsonl"
        record.touch()
        proc = subprocess.Popen([sys.executable, str(REPO / "e2e/story/http_tools_server.py"), str(port),
                                 str(record), *(tools or ["read", "write"])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        cleanup.callback(proc.wait, 10)
        cleanup.callback(proc.terminate)
        story.records[name] = record
    story.prepare(cleanup)
    # The servers join the catalog (the operator watches its ConfigMap).
    cm = story.json("get", "configmap", chart_object("catalog"), "-n", story.system_ns)
    catalog = yaml.safe_load(cm["data"]["catalog.yaml"])
    names = {name for name, *_ in servers}
    catalog["servers"] = [s for s in catalog["servers"] if s["name"] not in names] + [
        {"name": name, "description": f"the {name} test server",
         "http": {"url": f"http://127.0.0.1:{port}/mcp"}}
        for name, port, *_ in servers]
    cm["data"]["catalog.yaml"] = yaml.safe_dump(catalog)
    story.kubectl("apply", "-f", "-", stdin=json.dumps(cm))
    deployment = wait_until("the shared proxy Deployment", lambda: story.json(
        "get", "deployment", "-n", story.system_ns, "-l", f"app.kubernetes.io/component={COMPONENT}")["items"])[0]
    name = deployment["metadata"]["name"]
    wait_until("the shared proxy's replicas to be ready", lambda: story.json(
        "get", "deployment", name, "-n", story.system_ns)["status"].get("readyReplicas", 0)
        == deployment["spec"]["replicas"], timeout=180, interval=0.5)
    story.shared_proxy = name
    return story


def served(story: Story, job: str, pod: str, calls: list) -> dict | None:
    """The agent's tools (and the answers to `calls`) through its proxy; None while the shared
    proxy does not serve the pod yet (403 before the operator binds the pod, 503 until its IP)."""
    answer = exec_agent(story, pod, {"do": "tools", "calls": calls})
    if answer.get("status") in (403, 503) and ("PROXY.UNKNOWN_TASK" in answer["body"]
                                                or "PROXY.TASK_NOT_READY" in answer["body"]):
        return None
    assert "tools" in answer, f"{job}: {answer}\nthe shared proxy's log:\n{proxy_log(story)}"
    return answer


def proxy_log(story: Story) -> str:
    """The shared proxy's log lines that are not audit records (its warnings say why it refused)."""
    out = story.kubectl("logs", "-n", story.system_ns, "-l", f"app.kubernetes.io/component={COMPONENT}",
                        "--prefix", "--tail", "200")
    return "\n".join(line for line in out.splitlines() if '"recordType"' not in line)[-6000:]


