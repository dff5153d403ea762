"""Shared mode, a replica killed mid-call (design docs/design/shared-mode.md §4, "No lost audit
record" and "No lost approval"): two `orchestrator-mcp-proxy shared` processes, replicas r1 and
r2, serve one task against the real API server; each replica is also a Pod object of that name
in the proxy's namespace (what the chart's Deployment makes), and killing a replica here is
`kill -9` of its process and the deletion of its Pod (a replica that is gone).

- A call held for approval by r1, r1 killed, the call approved, the same call sent again to r2:
  r2 adopts r1's request (same id) and forwards the call once. Another call (other arguments)
  sent to r2 after the approval is held anew and never forwarded, and the same call sent once
  more is not made again (the approved id is used once).
- A call forwarded by r1 to an upstream that never answers, r1 killed: its `tool_call_started`
  record is on r1's stdout, with no `tool_call` record.

`tool_call_started` is written when a call is forwarded, after any approval, not when it is held:
a held call is in the Lease's pending set (and the TaskRun's status), which outlives the replica.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import subprocess
import threading

import pytest

from conftest import free_port, wait_for
from test_shared import INIT, Mcp, Recorder, Shared, shared, upstream  # noqa: F401 (fixtures)

REQUESTS = "orchestrator.io/approval-requests"
TOOL = "json_schema_2020_12_tool"
CALLED = f"alpha__{TOOL}"
ARGS = {"name": "deploy", "email": "ops@example.com"}
OTHER = {"name": "deploy", "email": "attacker@example.com"}


class Stalling(Recorder):
    """A recording relay that, once `stall` is set, keeps every `tools/call` it is sent (recorded)
    and never passes it on: an upstream that never answers."""

    stall = False

    def _pump(self, source, sink, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    with self.lock:
                        self.sent += data
                    if self.stall and b"tools/call" in data:
                        threading.Event().wait()
                sink.sendall(data)
        except OSError:
            pass

    def calls(self, marker: str) -> int:
        """How many `tools/call`s holding `marker` (a value only those arguments have) the
        upstream was sent."""
        return self.text().count(marker)


class Replica:
    """One `orchestrator-mcp-proxy shared` process named `name`, its stdout (the audit stream)
    and stderr (logs) in files of their own."""

    def __init__(self, proxy_bin, kube, tmp_path, ns: str, name: str):
        self.name = name
        self.port = free_port()
        self.out_path = tmp_path / f"{name}.stdout"
        self.err_path = tmp_path / f"{name}.stderr"
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "KUBECONFIG": str(kube.path)}
        env["RUST_LOG"] = os.environ.get("RUST_LOG", "info")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [str(proxy_bin), "shared", "--listen", f"127.0.0.1:{self.port}", "--namespace", ns, "--pod-name", name],
                stdout=out,
                stderr=err,
                env=env,
            )

        def ready() -> bool:
            assert self.process.poll() is None, self.err_path.read_text()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/readyz")
                return conn.getresponse().status == 200
            except OSError:
                return False

        wait_for(ready, what=f"replica {name} to list the ConfigMaps")

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in self.out_path.read_text().splitlines() if line.strip()]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if os.environ.get("MCP_PROXY_TEST_LOGS"):
            print(f"--- {self.name}\n{self.err_path.read_text()}")


@pytest.fixture
def replicas(proxy_bin, kube, tmp_path):
    started: list[Replica] = []

    def start(ns: str, name: str) -> Replica:
        replica = Replica(proxy_bin, kube, tmp_path, ns, name)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()


def task(shared: Shared, relay: Recorder, require: dict | None) -> str:
    """Task alpha, bound to pod task-pod, its one server the fixture through `relay`; returns a
    token of its pod."""
    shared.pod("task-pod")
    for name in ("r1", "r2"):
        shared.pod(name)
    shared.lease("alpha")
    config = json.loads(Shared.config("alpha", shared.ns, 1, "alpha", relay.url, allow=[TOOL]))
    if require is not None:
        config["policy"] = {"requireApproval": require}
    shared.configmap("alpha", "task-pod", json.dumps(config))
    return shared.token("task-pod")


def send(port: int, token: str, arguments: dict, id: int, timeout: float = 90) -> dict:
    """A new session on `port`, then the call; returns the JSON-RPC answer (an `error` key for a
    connection cut or a client timeout)."""
    client = Mcp(port, token)
    assert client.initialize() == 200
    body = {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": CALLED, "arguments": arguments}}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/mcp", json.dumps(body), client.headers())
        text = conn.getresponse().read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return {"error": {"cut": str(e)}}
    messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    return next((m for m in messages if m.get("id") == id), {"error": {"none": text}})


def in_background(*args) -> dict:
    answer: dict = {}
    threading.Thread(target=lambda: answer.update(send(*args)), daemon=True).start()
    return answer


def entries(shared: Shared) -> list[dict]:
    lease = shared.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{shared.ns}/leases/alpha")
    return json.loads((lease["metadata"].get("annotations") or {}).get(REQUESTS) or "[]")


def delete_pod(shared: Shared, name: str) -> None:
    shared.kube.request("DELETE", f"/api/v1/namespaces/{shared.ns}/pods/{name}?gracePeriodSeconds=0")
    wait_for(lambda: shared.kube.request("GET", f"/api/v1/namespaces/{shared.ns}/pods/{name}")[0] == 404, what=f"pod {name} to be gone")


def of_call(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r.get("recordType") == kind and r.get("tool") == CALLED]


def test_a_call_held_by_a_killed_replica_is_adopted_by_another_and_made_once(shared, upstream, replicas):
    relay = Stalling(("127.0.0.1", upstream))
    token = task(shared, relay, {"tools": [f"alpha/{TOOL}"], "timeoutSeconds": 300})
    r1, r2 = replicas(shared.ns, "r1"), replicas(shared.ns, "r2")

    # r1 holds the call; its request names r1 as its holder.
    in_background(r1.port, token, ARGS, 7)
    wait_for(lambda: len(entries(shared)) == 1, what="the held call's request on the Lease")
    [held] = entries(shared)
    assert held["holder"] == "r1" and held["tool"] == TOOL, held
    assert of_call(r1.audit(), "tool_call_started") == [], "a held call is not started"

    # r1 dies, its pod with it; its request stays on the Lease (the operator keeps it Pending).
    r1.kill()
    delete_pod(shared, "r1")
    assert [e["id"] for e in entries(shared)] == [held["id"]]
    # Approved, as the operator writes a ToolApproval's verdict.
    verdict = [{"id": held["id"], "decision": "approve", "decidedBy": "alice", "digest": held["digest"]}]
    shared.kube.merge_patch(shared.cm_path("alpha"), {"data": {"approvals.json": json.dumps(verdict)}})

    # The attack: another call (other arguments) sent to r2 does not ride the approved id: it is
    # held anew, under r2, and not made.
    in_background(r2.port, token, OTHER, 8, 20)
    wait_for(lambda: any(e.get("holder") == "r2" for e in entries(shared)), what="the other call to be held by r2")
    other = next(e for e in entries(shared) if e.get("holder") == "r2")
    assert other["id"] != held["id"] and OTHER["email"] in other["params"], other
    assert next(e for e in entries(shared) if e["id"] == held["id"])["holder"] == "r1"

    # The same call sent again to r2: r2 adopts r1's request and makes the call, once.
    answer = send(r2.port, token, ARGS, 9)
    assert "result" in answer and not answer["result"].get("isError"), answer
    assert relay.calls(ARGS["email"]) == 1 and relay.calls(OTHER["email"]) == 0, relay.text()
    assert held["id"] not in [e["id"] for e in entries(shared)], "the approved request is off the Lease"
    # The tool_call record follows (written in batches); the started one was written first.
    wait_for(lambda: any(r.get("decision") == "approved" for r in of_call(r2.audit(), "tool_call")), what="r2's tool_call record")
    records = r2.audit()
    [started] = of_call(records, "tool_call_started")
    assert (started["approvalId"], started["replica"], started["requestId"]) == (held["id"], "r2", "9"), started
    assert started["argumentsDigest"] == "sha256:" + hashlib.sha256(json.dumps(ARGS, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert ARGS["email"] not in json.dumps(started)
    done = [r for r in of_call(records, "tool_call") if r.get("decision") == "approved"]
    assert [(r["approvalId"], r["replica"], r["requestId"], r["session"]) for r in done] == [
        (held["id"], "r2", "9", started["session"])
    ], records

    # Once: the same call sent once more is held anew (a new id), not made again.
    before = {e["id"] for e in entries(shared)}
    in_background(r2.port, token, ARGS, 10, 20)
    wait_for(lambda: len({e["id"] for e in entries(shared)} - before) == 1, what="the replayed call to be held anew")
    [again] = [e for e in entries(shared) if e["id"] not in before]
    assert again["id"] != held["id"] and again["holder"] == "r2"
    assert relay.calls(ARGS["email"]) == 1
    assert of_call(r1.audit(), "tool_call_started") == []


def test_a_call_cut_by_a_killed_replica_leaves_its_started_record(shared, upstream, replicas):
    relay = Stalling(("127.0.0.1", upstream))
    token = task(shared, relay, None)
    r1 = replicas(shared.ns, "r1")
    client = Mcp(r1.port, token)
    assert client.initialize() == 200
    assert CALLED in client.tools()
    relay.stall = True
    in_background(r1.port, token, ARGS, 5)
    wait_for(lambda: relay.calls(ARGS["email"]) == 1, what="the call to reach the upstream")
    r1.kill()
    records = r1.audit()
    [started] = of_call(records, "tool_call_started")
    assert (started["replica"], started["requestId"], started["proxyMode"], started["taskUid"]) == ("r1", "5", "shared", "uid-alpha"), started
    assert (started["server"], started["upstreamTool"]) == ("alpha", TOOL)
    assert ARGS["email"] not in json.dumps(started) and started["argumentsDigest"].startswith("sha256:")
    assert of_call(records, "tool_call") == [], "the call never ended: no tool_call record"
