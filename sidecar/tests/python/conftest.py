"""Fixtures for driving the real proxy binary with the official MCP Python SDK against real
upstream servers from npm and PyPI (installed by e2e/setup into $ORCH_TOOLS).

The config directory is laid out the way the kubelet mounts a ConfigMap (a timestamped data
directory, a `..data` symlink swapped atomically, `proxy.yaml` pointing through it), so reload
tests exercise the same file events as a pod.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SUPPORT = Path(__file__).resolve().parent / "support"
TOOLS = Path(os.environ.get("ORCH_TOOLS", Path.home() / ".cache/orchestrator/tools"))


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is missing: run e2e/setup to install the MCP test tools (ORCH_TOOLS={TOOLS})")
    return path


@dataclass(frozen=True)
class Tools:
    node: Path
    everything: Path
    filesystem: Path
    memory: Path
    time: Path
    python: Path

    def everything_stdio(self) -> dict:
        return {"command": str(self.node), "args": [str(self.everything), "stdio"]}


@pytest.fixture(scope="session")
def tools() -> Tools:
    mods = TOOLS / "node/node_modules/@modelcontextprotocol"
    return Tools(
        node=_require(TOOLS / "node/node_modules/.bin/node"),
        everything=_require(mods / "server-everything/dist/index.js"),
        filesystem=_require(mods / "server-filesystem/dist/index.js"),
        memory=_require(mods / "server-memory/dist/index.js"),
        time=_require(TOOLS / "venv/bin/mcp-server-time"),
        python=_require(TOOLS / "venv/bin/python"),
    )


@pytest.fixture(scope="session")
def proxy_bin() -> Path:
    """The proxy binary: $MCP_PROXY_BIN, or a debug build made now."""
    if os.environ.get("MCP_PROXY_BIN"):
        return _require(Path(os.environ["MCP_PROXY_BIN"]))
    # This checkout's target directory (scripts/target-dir), unless the caller chose another.
    env = {**os.environ}
    if "CARGO_TARGET_DIR" not in env:
        env["CARGO_TARGET_DIR"] = subprocess.run(
            [REPO / "scripts/target-dir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    # As `cargo test --workspace` builds it (./test's unit tests did: a no-op then), with the
    # features the workspace's tests unify; a `cargo build -p` resolves fewer and rebuilds some
    # 50 dependencies.
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
    ).stdout
    for line in out.decode().splitlines():
        msg = json.loads(line)
        if (
            msg.get("reason") == "compiler-artifact"
            and msg.get("target", {}).get("name") == "orchestrator-mcp-proxy"
            and msg["target"].get("kind") == ["bin"]
            and not msg.get("profile", {}).get("test")
            and msg.get("executable")
        ):
            return Path(msg["executable"])
    pytest.fail("cargo test --no-run did not produce the orchestrator-mcp-proxy binary")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_configmap(directory: Path, text: str, other_keys: dict[str, str] | None = None) -> None:
    """Writes proxy.yaml (and `other_keys`, e.g. approvals.json) like the kubelet's AtomicWriter:
    new data dir, atomic `..data` swap, one symlink per key."""
    directory.mkdir(parents=True, exist_ok=True)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    data = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
    (directory / data).mkdir()
    files = {"proxy.yaml": text, **(other_keys or {})}
    for key, value in files.items():
        (directory / data / key).write_text(value)
    tmp = directory / "..data_tmp"
    os.symlink(data, tmp)
    os.rename(tmp, directory / "..data")
    for key in files:
        if not (directory / key).is_symlink():
            os.symlink(f"..data/{key}", directory / key)
    if old:
        shutil.rmtree(directory / old)


def write_projected(directory: Path, files: dict[str, str]) -> None:
    """Writes `files` ({"<secret>/<key>": value}) like the kubelet writes a projected volume of
    Secret items with paths "<secret>/<key>": a timestamped data directory, an atomic `..data`
    swap, and one link per top-level directory (`<secret>` -> `..data/<secret>`). Used for the
    proxy's --mask-secrets-dir."""
    directory.mkdir(parents=True, exist_ok=True)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    data = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
    for path, value in files.items():
        (directory / data / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / data / path).write_text(value)
    (directory / data).mkdir(exist_ok=True)
    tmp = directory / "..data_tmp"
    os.symlink(data, tmp)
    os.rename(tmp, directory / "..data")
    for top in {path.split("/", 1)[0] for path in files}:
        if not (directory / top).is_symlink():
            os.symlink(f"..data/{top}", directory / top)
    if old:
        shutil.rmtree(directory / old)


def to_yaml(config: dict) -> str:
    # JSON is YAML; keeps the tests free of a YAML dependency.
    return json.dumps(config, indent=2)


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (by walking /proc ppid links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents[int(entry.name)] = ppid
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def is_guardian(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return len(argv) >= 2 and argv[1] == b"guard"


def alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def await_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    """`wait_for` for async tests: sleeps without blocking the event loop."""
    import anyio

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(interval)


HEALTH_WATCH = """
import http.client, json, sys, threading, time
port, stop, took = int(sys.argv[1]), threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
while not stop.is_set():
    started = time.monotonic()
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    took.append(time.monotonic() - started)
    time.sleep(0.02)
took.sort()
print(json.dumps({"slowest": took[-1] if took else 0.0, "median": took[len(took) // 2] if took else 0.0, "answers": len(took)}))
"""


class HealthWatch:
    """Polls /healthz from a process of its own (so the test's own threads do not delay it) and
    keeps the slowest and the median answer (seconds)."""

    # The kubelet's probe gives the proxy 2 s (operator/src/render/sidecar.rs); a quarter of that
    # for the slowest answer leaves room for a 2-core machine running both suites, and a blocked
    # runtime (a check holding a worker for seconds) still fails it. The median says the proxy
    # stayed quick, not just alive.
    SLOWEST = 0.5
    MEDIAN = 0.02

    def __init__(self, port: int):
        self.port = port
        self.slowest = 0.0
        self.median = 0.0
        self.answers = 0

    def summary(self) -> str:
        return f"/healthz: {self.answers} answers, median {self.median * 1000:.1f} ms, slowest {self.slowest * 1000:.1f} ms"

    def assert_responsive(self) -> None:
        assert self.answers > 0 and self.median < self.MEDIAN and self.slowest < self.SLOWEST, self.summary()

    def __enter__(self) -> "HealthWatch":
        self.process = subprocess.Popen(
            [sys.executable, "-c", HEALTH_WATCH, str(self.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.process.communicate("", timeout=30)
        assert self.process.returncode == 0, "the /healthz watch failed"
        seen = json.loads(out)
        self.slowest, self.median, self.answers = seen["slowest"], seen["median"], seen["answers"]


@dataclass
class Proxy:
    binary: Path
    workdir: Path
    port: int
    env: dict = field(default_factory=dict)
    extra_args: list = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def config_dir(self) -> Path:
        return self.workdir / "configmap"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def log_path(self) -> Path:
        return self.workdir / "proxy.log"

    @property
    def audit_path(self) -> Path:
        return self.workdir / "audit.jsonl"

    @property
    def mask_dir(self) -> Path:
        """The proxy's --mask-secrets-dir (`make_proxy(mask_secrets=...)`): the task's Secret
        values, `<secret>/<key>`, as the operator mounts them."""
        return self.workdir / "mask"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, wait_ready: bool = True) -> "Proxy":
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **self.env}
        # RUST_LOG passes through, for debugging a test run.
        if "RUST_LOG" in os.environ:
            env.setdefault("RUST_LOG", os.environ["RUST_LOG"])
        # The child writes to its own copy of the descriptor; ours is closed right away.
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "--config",
                    str(self.config_dir / "proxy.yaml"),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--cache-dir",
                    str(self.workdir / "cache"),
                    *self.extra_args,
                ],
                stdout=log,
                stderr=log,
                env=env,
            )
        if wait_ready:
            wait_for(self.ready, what="the proxy to be ready")
        else:
            wait_for(lambda: self.http("/healthz")[0] == 200, what="the proxy to listen")
        return self

    def http(self, path: str, headers: dict | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the proxy exited with {self.process.returncode}:\n{self.log()}")
        return self.http("/readyz")[0] == 200

    def tools(self) -> dict:
        status, body = self.http("/tools")
        assert status == 200, body
        return json.loads(body)

    def metrics(self) -> str:
        return self.http("/metrics")[1].decode()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample (0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if key == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return 0.0

    def server_pid(self, name: str) -> int | None:
        for s in self.tools()["servers"]:
            if s["name"] == name:
                return s["pid"]
        return None

    def children(self) -> list[int]:
        """Live descendants, except the proxy's process-group guardian (`orchestrator-mcp-proxy guard`)."""
        return [p for p in descendants(self.pid) if alive(p) and not is_guardian(p)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def audit(self, at_least: int = 1) -> list[dict]:
        """The audit records, once `at_least` of them are written (lines are batched: ~50 ms)."""

        def read() -> list[dict]:
            if not self.audit_path.exists():
                return []
            return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]

        return wait_for(lambda: (lambda records: records if len(records) >= at_least else None)(read()), timeout=5, what="audit lines")

    def complete(self, config: dict) -> dict:
        """Adds what every test config shares: the task, and the audit file in the workdir."""
        config = {"task": {"name": "test-task", "namespace": "test"}, **config}
        config.setdefault("audit", {"path": str(self.audit_path)})
        return config

    def swap(self, config: dict) -> None:
        write_configmap(self.config_dir, to_yaml(self.complete(config)))

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


@pytest.fixture
def make_proxy(proxy_bin, tmp_path):
    """Starts proxies for a test and makes sure none outlives it."""
    started: list[Proxy] = []

    def make(
        config: dict,
        env: dict | None = None,
        extra_args: list | None = None,
        workdir: Path | None = None,
        wait_ready: bool = True,
        mask_secrets: dict[str, str] | None = None,
    ) -> Proxy:
        """`mask_secrets` ({"<secret>/<key>": value}): the Secret values the proxy masks in what
        a call held for approval shows (written to `mask_dir`, named by MCP_PROXY_MASK_SECRETS_DIR
        as the operator does)."""
        wd = workdir or tmp_path / f"proxy{len(started)}"
        wd.mkdir(parents=True, exist_ok=True)
        env = dict(env or {})
        proxy = Proxy(binary=proxy_bin, workdir=wd, port=free_port(), env=env, extra_args=extra_args or [])
        if mask_secrets is not None:
            write_projected(proxy.mask_dir, mask_secrets)
            env["MCP_PROXY_MASK_SECRETS_DIR"] = str(proxy.mask_dir)
        write_configmap(proxy.config_dir, to_yaml(proxy.complete(config)))
        started.append(proxy)
        return proxy.start(wait_ready)

    yield make
    for proxy in started:
        if proxy.process is not None and proxy.process.poll() is None:
            proxy.process.kill()
            proxy.process.wait()
        # Anything the proxy left behind would be a bug the SIGTERM test catches; don't leak it.
        for pid in descendants(proxy.pid) if proxy.process is not None else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if os.environ.get("MCP_PROXY_TEST_LOGS"):
            sys.stderr.write(proxy.log())


RAW_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}
RAW_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def raw_exchange(proxy: Proxy, headers: dict, body, timeout: float = 30) -> tuple[int, list[dict], str]:
    """POSTs a body (JSON-encoded unless bytes) over plain HTTP; returns the status, the JSON-RPC
    messages of the answer (SSE events or a JSON body) and the raw text."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(proxy.url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode(errors="replace")
    messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    if not messages and text.strip().startswith("{"):
        messages = [json.loads(text)]
    return status, messages, text


def raw_post(proxy: Proxy, headers: dict, body: dict, timeout: float = 10) -> int:
    """POSTs a JSON-RPC message over plain HTTP; returns the status (the body is read)."""
    return raw_exchange(proxy, headers, body, timeout)[0]


def raw_session(proxy: Proxy, finish_handshake: bool = True) -> dict:
    """Opens an initialize-era session over plain HTTP; returns the headers that use it."""
    headers = dict(RAW_HEADERS)
    request = urllib.request.Request(proxy.url, data=json.dumps(RAW_INIT).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
        headers["Mcp-Session-Id"] = response.headers["Mcp-Session-Id"]
    headers["Mcp-Protocol-Version"] = "2025-11-25"
    if finish_handshake:
        raw_post(proxy, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return headers


def tool_call(name: str, arguments: dict | None = None, id: int = 2) -> dict:
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments or {}}}


def faulty(tools: Tools, mode: str, *args: str, pids: Path | None = None) -> dict:
    """A stdio server spec for support/faulty_server.py in `mode`; it records its pids in `pids`."""
    spec = {"command": str(tools.python), "args": [str(SUPPORT / "faulty_server.py"), mode, *args]}
    if pids is not None:
        spec["env"] = {"FAULTY_PIDS": str(pids)}
    return spec


@pytest.fixture
def kill_recorded(tmp_path):
    """After the test, kills whatever faulty servers recorded in `tmp_path/*pids` and still runs
    (a proxy that leaks them fails the test; the machine should not keep them)."""
    yield
    for path in tmp_path.glob("*pids"):
        for pid in recorded_pids(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def recorded_pids(path: Path) -> list[int]:
    """Every pid a faulty server recorded so far."""
    if not path.exists():
        return []
    return [int(p) for p in path.read_text().split()]


def recorded(tools: Tools, log: Path, command: str, *args: str) -> dict:
    """A stdio server spec whose stdin is recorded in `log` (see support/record_stdin.py)."""
    return {"command": str(tools.python), "args": [str(SUPPORT / "record_stdin.py"), str(log), command, *args]}


def names(result) -> list[str]:
    """The sorted tool names of a tools/list result."""
    return sorted(t.name for t in result.tools)


def proxy_meta(result) -> dict:
    """What the proxy says about a call it answered itself: `_meta["io.orchestrator/proxy"]`."""
    return (result.meta or {}).get("io.orchestrator/proxy", {})


def text_of(result) -> str:
    """The text of a tools/call result."""
    return "".join(getattr(c, "text", "") for c in result.content)


def recorded_calls(log: Path) -> list[str]:
    """The tool names of the `tools/call` requests a `recorded` server received, in order."""
    received = [json.loads(line) for line in log.read_text().splitlines()]
    return [m["params"]["name"] for m in received if m.get("method") == "tools/call"]


@pytest.fixture(scope="module")
def kube():
    """The real API server that ./test brings up ($KUBECONFIG, else <repo>/e2e/.cluster/kubeconfig),
    with admin credentials; the module is skipped without one."""
    from kubeapi import Kube, kubeconfig_path

    path = kubeconfig_path()
    if not path.exists():
        pytest.skip(f"no Kubernetes API server: {path} does not exist (./test brings the cluster up; or set KUBECONFIG)")
    return Kube(path)
