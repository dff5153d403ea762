"""Shared mode (`orchestrator-mcp-proxy shared`): one process serves two tasks, each chosen only by
the pod its bearer token was issued to, each isolated from the other.

Against the real API server ($KUBECONFIG, admin credentials for the proxy and the test): the
tasks' pods are Pod objects (a kwok node may or may not run them; only their uids matter), their
tokens come from the TokenRequest API bound to those pods with the proxy's audience, and the
API server's TokenReview is what the proxy asks. The upstream is our conformance fixture over
streamable HTTP, reached by each task through a relay of its own that records what it was sent.
The MCP client speaks plain HTTP (initialize-era sessions), so every status and header is seen.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from conftest import SUPPORT, free_port, wait_for
from kubeapi import Kube
from test_zone import make_tcp_zone  # noqa: F401 (a fixture)

sys.path.insert(0, str(SUPPORT.parents[3] / "e2e" / "model"))
from scripted_model import ScriptedModel, text, tls_pair  # noqa: E402

AUD = "orchestrator.io/mcp-proxy"
LABEL = "orchestrator.io/shared-proxy-config"
SERVED = "orchestrator.io/served-context-version"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}


class Recorder:
    """A TCP relay to `target` that keeps every byte its clients sent."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def text(self) -> str:
        with self.lock:
            return self.sent.decode(errors="replace")

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    with self.lock:
                        self.sent += data
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Shared:
    """The shared proxy's namespace, two tasks' pods, Leases and ConfigMaps, and the proxy."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.ns = f"sc-shared-{uuid.uuid4().hex[:8]}"
        kube.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        kube.ok("POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent"}})
        self.pods: dict[str, str] = {}

    def pod(self, name: str) -> str:
        pod = self.kube.ok(
            "POST",
            f"/api/v1/namespaces/{self.ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "serviceAccountName": "agent",
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "agent", "image": "agent:test"}],
                },
            },
        )
        self.pods[name] = pod["metadata"]["uid"]
        return self.pods[name]

    def token(self, pod: str | None, audience: str = AUD) -> str:
        spec: dict = {"audiences": [audience], "expirationSeconds": 3600}
        if pod is not None:
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": self.pods[pod]}
        answer = self.kube.ok(
            "POST",
            f"/api/v1/namespaces/{self.ns}/serviceaccounts/agent/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return answer["status"]["token"]

    def lease(self, task: str) -> None:
        self.kube.ok(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{self.ns}/leases",
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": task}, "spec": {}},
        )

    def served(self, task: str) -> str | None:
        lease = self.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{self.ns}/leases/{task}")
        return (lease["metadata"].get("annotations") or {}).get(SERVED)

    def cm_path(self, task: str) -> str:
        return f"/api/v1/namespaces/{self.ns}/configmaps/task.{self.ns}.{task}"

    @staticmethod
    def config(task: str, ns: str, version: int, server: str, url: str, allow: list[str] | None = None) -> str:
        entry: dict = {"name": server, "http": {"url": url}}
        if allow is not None:
            entry["tools"] = {"allow": allow}
        return json.dumps({"task": {"name": task, "namespace": ns, "uid": f"uid-{task}"}, "contextVersion": version, "servers": [entry]})

    def configmap(self, task: str, pod: str | None, proxy_yaml: str, pod_ip: str = "127.0.0.1") -> None:
        """`pod` None: the operator has not bound the task's pod yet (no pod uid, no IP)."""
        annotations = {
            "orchestrator.io/task-uid": f"uid-{task}",
            "orchestrator.io/task": f"{self.ns}/{task}",
            "orchestrator.io/task-phase": "Running" if pod else "Pending",
        }
        if pod is not None:
            annotations |= {"orchestrator.io/task-pod-uid": self.pods[pod], "orchestrator.io/task-pod-ip": pod_ip}
        self.kube.ok(
            "POST",
            f"/api/v1/namespaces/{self.ns}/configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"task.{self.ns}.{task}",
                    "labels": {LABEL: "true"},
                    "annotations": annotations,
                },
                "data": {"proxy.yaml": proxy_yaml},
            },
        )


class Mcp:
    """Plain HTTP to the shared proxy's /mcp with a bearer token."""

    def __init__(self, port: int, token: str):
        self.port, self.token = port, token
        self.session: str | None = None

    def headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "Authorization": f"Bearer {self.token}"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
            h["Mcp-Protocol-Version"] = "2025-11-25"
        return h

    def post(self, body: dict) -> tuple[int, list[dict], dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        conn.request("POST", "/mcp", json.dumps(body), self.headers())
        response = conn.getresponse()
        text = response.read().decode(errors="replace")
        conn.close()
        messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        if not messages and text.strip().startswith("{"):
            messages = [json.loads(text)]
        return response.status, messages, dict(response.headers)

    def initialize(self) -> int:
        status, _, headers = self.post(INIT)
        if status == 200:
            self.session = headers.get("mcp-session-id") or headers.get("Mcp-Session-Id")
            self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return status

    def result(self, method: str, params: dict | None = None, id: int = 2) -> dict:
        status, messages, _ = self.post({"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}})
        assert status == 200, (status, messages)
        answer = next(m for m in messages if m.get("id") == id)
        return answer

    def tools(self) -> list[str]:
        return sorted(t["name"] for t in self.result("tools/list")["result"]["tools"])

    def listen(self) -> list[dict]:
        """Opens the session's GET stream; returns the list its messages are appended to."""
        seen: list[dict] = []
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = {k: v for k, v in self.headers().items() if k != "Content-Type"}
        headers["Accept"] = "text/event-stream"
        conn.request("GET", "/mcp", headers=headers)
        response = conn.getresponse()
        assert response.status == 200, response.status

        def read() -> None:
            try:
                for line in response:
                    line = line.decode(errors="replace").strip()
                    if line.startswith("data:") and line[5:].strip():
                        seen.append(json.loads(line[5:]))
            except (OSError, ValueError):
                pass

        threading.Thread(target=read, daemon=True).start()
        return seen


@pytest.fixture
def shared(kube):
    s = Shared(kube)
    yield s
    kube.request("DELETE", f"/api/v1/namespaces/{s.ns}")


@pytest.fixture
def upstream(tools, tmp_path):
    """The conformance fixture over streamable HTTP; yields its port."""
    port = free_port()
    log = open(tmp_path / "fixture.log", "wb")
    process = subprocess.Popen([str(tools.python), str(SUPPORT / "conformance_server.py"), str(port)], stdout=log, stderr=log)
    try:
        wait_for(lambda: process.poll() is not None or "listening on" in (tmp_path / "fixture.log").read_text(), what="the fixture to listen")
        assert process.poll() is None, (tmp_path / "fixture.log").read_text()
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.fixture
def start_shared(proxy_bin, kube, tmp_path):
    started: list[subprocess.Popen] = []

    def start(ns: str, *args: str) -> tuple[int, subprocess.Popen]:
        port = free_port()
        log = open(tmp_path / "shared.log", "ab")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "KUBECONFIG": str(kube.path)}
        env["RUST_LOG"] = os.environ.get("RUST_LOG", "info")
        process = subprocess.Popen(
            [str(proxy_bin), "shared", "--listen", f"127.0.0.1:{port}", "--namespace", ns, "--pod-name", "shared-0", *args],
            stdout=log,
            stderr=log,
            env=env,
        )
        started.append(process)

        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "shared.log").read_text()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/readyz")
                return conn.getresponse().status == 200
            except OSError:
                return False

        wait_for(ready, what="the shared proxy to list the ConfigMaps")
        return port, process

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
    if os.environ.get("MCP_PROXY_TEST_LOGS") and (tmp_path / "shared.log").exists():
        print((tmp_path / "shared.log").read_text())


def error_code(messages: list[dict]) -> str | None:
    return next((m["error"]["data"]["code"] for m in messages if "error" in m), None)


def test_two_tasks_in_one_proxy_see_only_their_own_tools_sessions_and_config(shared, upstream, start_shared, tmp_path):
    ns = shared.ns
    relay_a, relay_b = Recorder(("127.0.0.1", upstream)), Recorder(("127.0.0.1", upstream))
    shared.pod("pod-a"), shared.pod("pod-b"), shared.pod("pod-c")
    for task in ("task-a", "task-b"):
        shared.lease(task)
    shared.configmap("task-a", "pod-a", Shared.config("task-a", ns, 1, "alpha", relay_a.url))
    shared.configmap("task-b", "pod-b", Shared.config("task-b", ns, 1, "beta", relay_b.url))
    metrics_port = free_port()
    port, process = start_shared(ns, "--metrics-listen", f"127.0.0.1:{metrics_port}")
    token_a, token_b = shared.token("pod-a"), shared.token("pod-b")

    def version_metric(task: str) -> str | None:
        conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        series = f'mcp_proxy_context_version{{namespace="{ns}",taskrun="{task}"}} '
        return next((line[len(series):] for line in text.splitlines() if line.startswith(series)), None)


    a, b = Mcp(port, token_a), Mcp(port, token_b)
    assert a.initialize() == 200 and b.initialize() == 200
    tools_a, tools_b = a.tools(), b.tools()
    assert tools_a and all(t.startswith("alpha__") for t in tools_a), tools_a
    assert tools_b and all(t.startswith("beta__") for t in tools_b), tools_b
    assert "alpha__test_simple_text" in tools_a

    # A calling B's tool: unknown to A's proxy, and B's upstream is never sent a call.
    calls_before = relay_b.text().count("tools/call")
    refused = a.result("tools/call", {"name": "beta__test_simple_text", "arguments": {}}, id=3)["result"]
    assert refused["isError"] and refused["_meta"]["io.orchestrator/proxy"]["code"] == "PROXY.UNKNOWN_TOOL", refused
    ok = a.result("tools/call", {"name": "alpha__test_simple_text", "arguments": {}}, id=4)["result"]
    assert not ok.get("isError"), ok
    assert "tools/call" in relay_a.text()
    assert relay_b.text().count("tools/call") == calls_before == 0

    # A's session id with B's token: B's session manager has no such session.
    stolen = Mcp(port, token_b)
    stolen.session = a.session
    status, _, _ = stolen.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}})
    assert status == 404, status

    # Refused tokens: none, not bound to a pod, another audience (401); a pod with no task (403).
    for token in ("", shared.token(None), shared.token("pod-a", audience="https://example.invalid")):
        status, messages, headers = Mcp(port, token).post(INIT)
        assert status == 401, (status, messages)
        assert headers.get("www-authenticate") == 'Bearer error="invalid_token"', headers
    status, messages, _ = Mcp(port, shared.token("pod-c")).post(INIT)
    assert (status, error_code(messages)) == (403, "PROXY.UNKNOWN_TASK"), messages
    # No /tools, /audit or /metrics on this listener; probes without a token.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for path, want in (("/tools", 404), ("/audit", 404), ("/metrics", 404), ("/healthz", 200)):
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        assert response.status == want, path

    # add-context on A: A's open session is told, B's is not; A's Lease gets the version.
    wait_for(lambda: shared.served("task-a") == "1" and shared.served("task-b") == "1", what="both Leases to report 1")
    # Open once their answers' headers are in (the proxy has registered them by then).
    seen_a, seen_b = a.listen(), b.listen()
    patched = time.monotonic()
    shared.kube.merge_patch(shared.cm_path("task-a"), {"data": {"proxy.yaml": Shared.config("task-a", ns, 2, "alpha", relay_a.url, ["test_simple_text"])}})
    wait_for(lambda: any(m.get("method") == "notifications/tools/list_changed" for m in seen_a), what="list_changed on A's session")
    notified = time.monotonic() - patched
    wait_for(lambda: shared.served("task-a") == "2", what="A's Lease to report 2")
    assert a.tools() == ["alpha__test_simple_text"]
    time.sleep(1)  # absence: B had as long as A and more to be (wrongly) told
    assert not any(m.get("method") == "notifications/tools/list_changed" for m in seen_b), seen_b
    assert shared.served("task-b") == "1" and len(b.tools()) == len(tools_b)
    assert (version_metric("task-a"), version_metric("task-b")) == ("2", "1")
    print(f"add-context: ConfigMap patch -> list_changed on A's session in {notified * 1000:.0f} ms")

    # Peer check: B's pod is elsewhere now (the connection still comes from 127.0.0.1).
    shared.kube.merge_patch(shared.cm_path("task-b"), {"metadata": {"annotations": {"orchestrator.io/task-pod-ip": "127.0.0.2"}}})
    wait_for(lambda: error_code(Mcp(port, token_b).post(INIT)[1]) == "PROXY.PEER_MISMATCH", what="B's token refused from another address")
    status, _, _ = Mcp(port, token_b).post(INIT)
    assert status == 403

    # Deleting A's ConfigMap ends A at once: its token is 403, its session is gone.
    deleted = time.monotonic()
    shared.kube.ok("DELETE", shared.cm_path("task-a"))
    wait_for(lambda: Mcp(port, token_a).post(INIT)[0] == 403, what="A's token refused", interval=0.01)
    delay = time.monotonic() - deleted
    status, messages, _ = Mcp(port, token_a).post(INIT)
    assert (status, error_code(messages)) == (403, "PROXY.UNKNOWN_TASK")
    status, _, _ = a.post({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {}})
    assert status == 403, status
    print(f"ConfigMap deleted -> A's token refused in {delay * 1000:.0f} ms")
    assert (version_metric("task-a"), version_metric("task-b")) == (None, "1")

    # The audit lines name the task and the mode.
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=20)
    records = [json.loads(line) for line in (tmp_path / "shared.log").read_text().splitlines() if line.startswith('{"recordType"')]
    calls = [r for r in records if r.get("recordType") == "tool_call"]
    assert {(r["task"], r["namespace"], r["taskUid"], r["proxyMode"]) for r in calls} == {("task-a", ns, "uid-task-a", "shared")}, calls


def test_a_stdio_server_is_refused_in_shared_mode(shared, start_shared):
    shared.pod("pod-a")
    shared.lease("task-a")
    yaml = json.dumps({"task": {"name": "task-a", "namespace": shared.ns}, "contextVersion": 1, "servers": [{"name": "local", "stdio": {"command": "/bin/true"}}]})
    shared.configmap("task-a", "pod-a", yaml)
    port, process = start_shared(shared.ns)
    a = Mcp(port, shared.token("pod-a"))
    assert a.initialize() == 200
    listed = a.result("tools/list")
    assert "error" in listed or listed["result"]["tools"] == [], listed
    assert shared.served("task-a") is None


def test_a_stdio_server_runs_in_its_tasks_zone_over_tcp_and_another_tasks_key_starts_nothing(shared, start_shared, make_tcp_zone, tools, tmp_path):
    """The task's stdio server runs in its zone (here a local `zone --listen`, as the operator
    runs it on the pod's IP), which the shared proxy reaches at the pod IP annotation and
    `zonePort`, proving the key it reads from the task's Secret (`zoneKey`). A second task whose
    config names the same zone but whose Secret holds another key is refused by the zone: its
    command never starts for that task."""
    ns = shared.ns
    key_a = secrets.token_bytes(32)
    zone = make_tcp_zone("every", tools.everything_stdio(), key=key_a)
    host, zone_port = zone.addr
    for task, pod, key in (("task-a", "pod-a", key_a), ("task-b", "pod-b", secrets.token_bytes(32))):
        shared.pod(pod)
        shared.lease(task)
        shared.kube.ok("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{task}-zone-keys"}, "stringData": {"every": key.hex()}})
        stdio = {"command": "node", "args": ["server-everything", "stdio"], "zonePort": zone_port, "zoneKey": {"name": f"{task}-zone-keys", "key": "every"}}
        config = {"task": {"name": task, "namespace": ns, "uid": f"uid-{task}"}, "contextVersion": 1, "servers": [{"name": "every", "stdio": stdio}]}
        shared.configmap(task, pod, json.dumps(config), pod_ip=host)
    port, _ = start_shared(ns)

    # Task b: the zone refuses its key; nothing starts.
    b = Mcp(port, shared.token("pod-b"))
    assert b.initialize() == 200
    listed = b.result("tools/list")
    assert "error" in listed or "every__echo" not in [t["name"] for t in listed["result"]["tools"]], listed
    called = b.result("tools/call", {"name": "every__echo", "arguments": {"message": "from b"}}, id=3)
    assert "error" in called or called["result"].get("isError"), called
    print("task b's call:", json.dumps(called)[:600])
    assert "refused a connection" in zone.log(), zone.log()
    assert zone.children() == [], "the zone started a process for the wrong key"
    assert "from b" not in zone.log()

    # Task a: its key opens its zone; tools/list and tools/call go through it.
    a = Mcp(port, shared.token("pod-a"))
    assert a.initialize() == 200
    assert "every__echo" in a.tools()
    called = a.result("tools/call", {"name": "every__echo", "arguments": {"message": "from a"}}, id=3)
    assert "from a" in json.dumps(called["result"]), called
    assert zone.children(), "the server runs in the zone"
    # Neither key reached the proxy's log.
    log = (tmp_path / "shared.log").read_text()
    assert key_a.hex() not in log


def test_each_task_reaches_its_http_upstream_with_its_own_secret(shared, upstream, start_shared, tmp_path):
    ns = shared.ns
    relays = {t: Recorder(("127.0.0.1", upstream)) for t in ("task-a", "task-b")}
    for task, pod in (("task-a", "pod-a"), ("task-b", "pod-b")):
        shared.pod(pod)
        shared.lease(task)
        # Written from a file: a trailing newline, which no header carries.
        shared.kube.ok("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{task}-api"}, "stringData": {"token": f"Bearer secret-of-{task}\n"}})
        config = json.loads(Shared.config(task, ns, 1, "api", relays[task].url))
        config["servers"][0]["http"]["headersFromSecret"] = {"Authorization": {"name": f"{task}-api", "key": "token"}}
        shared.configmap(task, pod, json.dumps(config))
    port, _ = start_shared(ns)
    for task, pod in (("task-a", "pod-a"), ("task-b", "pod-b")):
        client = Mcp(port, shared.token(pod))
        assert client.initialize() == 200
        assert client.tools(), task
    for task, other in (("task-a", "task-b"), ("task-b", "task-a")):
        sent = relays[task].text().lower()
        assert f"authorization: bearer secret-of-{task}\r\n" in sent, sent[:2000]
        assert f"secret-of-{other}" not in sent
    assert "secret-of-" not in (tmp_path / "shared.log").read_text()


def test_a_task_serves_its_pods_token_only_once_the_operator_has_bound_the_pod(shared, upstream, start_shared):
    ns = shared.ns
    shared.pod("pod-a")
    shared.lease("task-a")
    shared.configmap("task-a", None, Shared.config("task-a", ns, 1, "alpha", f"http://127.0.0.1:{upstream}/mcp"))
    port, _ = start_shared(ns)
    token = shared.token("pod-a")
    status, messages, _ = Mcp(port, token).post(INIT)
    assert (status, error_code(messages)) == (403, "PROXY.UNKNOWN_TASK"), messages
    # The operator binds the pod (as reconcile/placement/binding.rs does for the Lease).
    shared.kube.merge_patch(
        shared.cm_path("task-a"),
        {"metadata": {"annotations": {"orchestrator.io/task-pod-uid": shared.pods["pod-a"], "orchestrator.io/task-pod-ip": "127.0.0.1", "orchestrator.io/task-phase": "Running"}}},
    )
    wait_for(lambda: Mcp(port, token).post(INIT)[0] == 200, what="the bound pod's token to be served")
    client = Mcp(port, token)
    assert client.initialize() == 200
    assert client.tools() and all(t.startswith("alpha__") for t in client.tools())


def test_a_held_call_shows_the_tasks_secret_values_masked_in_shared_mode(shared, upstream, start_shared, tmp_path):
    """A shared proxy reads the task's Secret keys the operator lists (`mask-keys.json` in the
    task's ConfigMap) through the API when a call is held, and masks their values in what a
    person is shown, as a sidecar does with its mask volume; the call approved goes with the
    real value."""
    ns = shared.ns
    passphrase = "open sesame 4711"
    relay = Recorder(("127.0.0.1", upstream))
    shared.pod("pod-a")
    shared.lease("task-a")
    shared.kube.ok("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "task-a-deploy"}, "stringData": {"passphrase": passphrase}})
    tool = "json_schema_2020_12_tool"
    config = json.loads(Shared.config("task-a", ns, 1, "alpha", relay.url, [tool]))
    config["policy"] = {"requireApproval": {"tools": [f"alpha/{tool}"], "timeoutSeconds": 60}}
    shared.configmap("task-a", "pod-a", json.dumps(config))
    # As the operator writes it (render/shared.rs): every Secret key of the task.
    shared.kube.merge_patch(shared.cm_path("task-a"), {"data": {"mask-keys.json": json.dumps([{"secret": "task-a-deploy", "key": "passphrase"}])}})
    port, _ = start_shared(ns)
    client = Mcp(port, shared.token("pod-a"))
    assert client.initialize() == 200
    assert client.tools() == [f"alpha__{tool}"]
    arguments = {"contactMethod": "email", "email": f"ops+{passphrase}@example.com"}
    answer: list[dict] = []


    def call() -> None:
        answer.append(client.result("tools/call", {"name": f"alpha__{tool}", "arguments": arguments}, id=7))

    caller = threading.Thread(target=call, daemon=True)
    caller.start()

    def requests() -> list[dict] | None:
        lease = shared.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/task-a")
        text = (lease["metadata"].get("annotations") or {}).get("orchestrator.io/approval-requests")
        found = json.loads(text) if text else []
        return found or None

    wait_for(requests, what="the held call on the Lease")
    [request] = requests()
    text = json.dumps(request)
    assert passphrase not in text, text
    placeholder = f"<secret:task-a-deploy/passphrase:{request['maskNonce']}>"
    assert json.loads(request["params"])["arguments"] == {"contactMethod": "email", "email": f"ops+{placeholder}@example.com"}, request
    assert request["masked"] == [{"secret": "task-a-deploy", "key": "passphrase", "count": 1}], request
    assert request["paramsBytes"] == len(request["params"].encode())
    assert "tools/call" not in relay.text(), "the held call reached the upstream"
    # The operator's verdict, in the task's ConfigMap, naming the digest shown.
    verdict = [{"id": request["id"], "decision": "approve", "decidedBy": "alice@example.com", "digest": request["digest"]}]
    shared.kube.merge_patch(shared.cm_path("task-a"), {"data": {"approvals.json": json.dumps(verdict)}})
    caller.join(timeout=30)
    [result] = answer
    assert passphrase in json.dumps(result["result"]), result
    assert passphrase in relay.text(), "the upstream got the real value"
    assert passphrase not in (tmp_path / "shared.log").read_text()


def model_post(port: int, headers: dict, body: dict | None = None) -> tuple[int, dict, bytes]:
    """One Messages request to the shared proxy's /model, as Claude Code sends it."""
    h = {"content-type": "application/json", "anthropic-version": "2023-06-01", **headers}
    body = body or {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True,
                    "messages": [{"role": "user", "content": "hello"}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/model/v1/messages?beta=true", json.dumps(body), h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_each_task_reaches_the_model_with_its_own_key_budget_and_usage_in_shared_mode(shared, start_shared, tmp_path):
    """The shared proxy's model gateway: each task's agent, with its pod's token as the API key,
    reaches the model (HTTPS with the CA of the task's ConfigMap) with its own task's key, read
    through the API; its own budget holds, its usage goes on its own Lease; without a token, or
    with a pod that runs no task here, nothing reaches the endpoint, and no key is in the log."""
    ns = shared.ns
    ca, cert, key = tls_pair(tmp_path / "model-tls")

    def forever(first):
        while True:
            yield text("done")

    model = ScriptedModel(forever, tls=(cert, key)).start()
    try:
        keys = {t: f"sk-ant-key-of-{t}-{secrets.token_hex(6)}" for t in ("task-a", "task-b")}
        shared.kube.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "model-ca"}, "data": {"ca.crt": open(ca).read()}})
        for task, pod, budget in (("task-a", "pod-a", {}), ("task-b", "pod-b", {"requests": 1})):
            shared.pod(pod)
            shared.lease(task)
            shared.kube.ok("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{task}-model"}, "stringData": {"api-key": keys[task] + "\n"}})
            config = {"task": {"name": task, "namespace": ns, "uid": f"uid-{task}"}, "contextVersion": 1, "servers": [],
                      "gateway": {"endpoint": model.url, "keySecret": {"name": f"{task}-model", "key": "api-key"},
                                  "caConfigMap": {"name": "model-ca", "key": "ca.crt"}, "budget": budget}}
            shared.configmap(task, pod, json.dumps(config))
        shared.pod("pod-idle")
        port, _ = start_shared(ns)
        tokens = {t: shared.token(p) for t, p in (("task-a", "pod-a"), ("task-b", "pod-b"))}

        # Task a's agent sends its token as the API key (Claude Code's apiKeyHelper), b's as a
        # bearer token: each request goes out with its own task's key, never the token.
        status, headers, body = model_post(port, {"x-api-key": tokens["task-a"]})
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), body
        status, _, body = model_post(port, {"authorization": f"Bearer {tokens['task-b']}"})
        assert status == 200, body
        seen = [r.headers["x-api-key"] for r in model.requests]
        assert seen == [keys["task-a"], keys["task-b"]], seen
        sent = json.dumps([r.raw_headers for r in model.requests])
        assert tokens["task-a"] not in sent and tokens["task-b"] not in sent, "an agent's token reached the endpoint"

        # b's budget (one request) holds for b alone.
        status, _, body = model_post(port, {"x-api-key": tokens["task-b"]})
        error = json.loads(body)["error"]
        assert status == 429 and "spec.budget.requests" in error["message"], (status, body)
        assert model_post(port, {"x-api-key": tokens["task-a"]})[0] == 200
        assert len(model.requests) == 3

        # No token, a token that is not one, a pod that runs no task here: the API's error
        # shape, and nothing reaches the endpoint.
        for headers, want, kind in (({}, 401, "authentication_error"),
                                    ({"x-api-key": "sk-ant-guess"}, 401, "authentication_error"),
                                    ({"x-api-key": shared.token("pod-idle")}, 403, "permission_error")):
            status, _, body = model_post(port, headers)
            assert (status, json.loads(body)["error"]["type"]) == (want, kind), (headers.keys(), status, body)
        assert len(model.requests) == 3

        # Each task's usage is on its own Lease, as the endpoint counted it.
        def usage(task: str) -> dict | None:
            lease = shared.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{task}")
            text_ = (lease["metadata"].get("annotations") or {}).get("orchestrator.io/model-usage")
            return json.loads(text_) if text_ else None

        a = wait_for(lambda: (u := usage("task-a")) and u["requests"] == 2 and u, what="task-a's usage on its Lease")
        b = wait_for(lambda: (u := usage("task-b")) and u.get("refused") == 1 and u, what="task-b's usage on its Lease")
        per_request = model.requests[0].reply["usage"]["output_tokens"]
        assert (a["outputTokens"], b["outputTokens"], b["requests"], b["exceeded"]) == (2 * per_request, per_request, 1, "requests"), (a, b)
        log = (tmp_path / "shared.log").read_text()
        assert keys["task-a"] not in log and keys["task-b"] not in log, "a model key is in the shared proxy's log"
    finally:
        model.stop()
