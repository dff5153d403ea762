"""Who the proxy serves (issue 41; docs/proxy.md "Who may call", "Bounded request bodies"): every
container of a task pod shares the pod's loopback, so reaching the proxy proves nothing. With
`--client-token-file` the proxy writes a random token (the agent's credential) once it holds its
port, and `/mcp` takes only that; `/tools`, `/audit` and `/metrics` take it or the auditors' token
(`--auditor-token-file`, re-read at each request), which never calls. Anything else gets 401 and
starts nothing. A process that took the port first keeps the proxy from starting and fails its
probe. Large bodies share one budget: a flood gets 503s while the proxy's memory stays bounded and
an ordinary call is still served."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import RAW_HEADERS, RAW_INIT, free_port, tool_call, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def everything(t) -> dict:
    return {"name": "every", "stdio": t.everything_stdio(), "tools": {"allow": ["echo", "get-sum"]}}


def request(proxy, method: str, path: str, bearer: str | None = None, body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    h = {**RAW_HEADERS, **(headers or {})}
    if bearer is not None:
        h["Authorization"] = f"Bearer {bearer}"
    r = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{path}", method=method, data=body, headers=h)
    try:
        with urllib.request.urlopen(r, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def vm_hwm_kib(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def authed_proxy(make_proxy, tools, tmp_path, extra: list | None = None):
    token_file = tmp_path / "credential" / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    auditor_file = tmp_path / "auditor" / "token"
    auditor_file.parent.mkdir(parents=True, exist_ok=True)
    auditor_file.write_text("auditor-" + "a" * 40 + "\n")
    proxy = make_proxy({"servers": [everything(tools)]}, extra_args=[
        "--client-token-file", str(token_file), "--auditor-token-file", str(auditor_file), *(extra or [])])
    return proxy, token_file, auditor_file


async def test_only_the_agents_credential_calls_and_the_auditors_only_reads(make_proxy, tools, tmp_path):
    proxy, token_file, auditor_file = authed_proxy(make_proxy, tools, tmp_path)
    token = token_file.read_text()
    assert len(token) == 64 and all(c in "0123456789abcdef" for c in token), token
    assert token_file.stat().st_mode & 0o777 == 0o640, oct(token_file.stat().st_mode)
    auditor = auditor_file.read_text().strip()
    init = json.dumps(RAW_INIT).encode()

    # Another process of the pod, with no token, a made-up one or the auditors': 401 on /mcp
    # before any session exists, and no server starts.
    for bearer in (None, "", "0" * 64, token[:-1], auditor):
        status, headers, body = request(proxy, "POST", "/mcp", bearer, init)
        assert status == 401, (bearer, status, body)
        assert headers.get("www-authenticate", headers.get("WWW-Authenticate", "")).startswith("Bearer"), headers
        assert b"ORCHESTRATOR_MCP_TOKEN_FILE" in body, body
    for path in ("/tools", "/audit", "/metrics"):
        assert request(proxy, "GET", path)[0] == 401, path
        assert request(proxy, "GET", path, "0" * 64)[0] == 401, path
        assert request(proxy, "GET", path, auditor)[0] == 200, path
        assert request(proxy, "GET", path, token)[0] == 200, path
    for path in ("/healthz", "/readyz"):
        assert request(proxy, "GET", path)[0] == 200, path
    # "Basic", two headers, the token without its scheme: refused.
    assert request(proxy, "POST", "/mcp", None, init, {"Authorization": f"Basic {token}"})[0] == 401
    assert request(proxy, "POST", "/mcp", None, init, {"Authorization": token})[0] == 401
    assert proxy.children() == [], "a refused request started a server"
    assert "refused a request without the agent's credential" in proxy.log()

    # The agent: its client sends the token and is served.
    async def agent_calls() -> str:
        transport = streamable_http_client(proxy.url, http_client=httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}))
        async with Client(transport, mode="legacy") as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            assert names == ["every__echo", "every__get-sum"], names
            result = await client.call_tool("every__echo", {"message": "the agent"})
            return result.content[0].text

    assert "the agent" in await agent_calls()
    records = json.loads(request(proxy, "GET", "/audit", auditor)[2])["records"]
    assert [(r["tool"], r["decision"]) for r in records] == [("every__echo", "allowed")], records

    # A rotated auditors' Secret counts at once; the old token no longer reads.
    auditor_file.write_text("rotated-" + "b" * 40)
    assert request(proxy, "GET", "/audit", auditor)[0] == 401
    assert request(proxy, "GET", "/audit", "rotated-" + "b" * 40)[0] == 200

    # A restarted proxy (same volume) keeps the token, so the agent's client keeps working.
    assert proxy.terminate() == 0
    proxy.start()
    assert token_file.read_text() == token
    assert "the agent" in await agent_calls()


def test_a_process_that_took_the_port_keeps_the_proxy_from_starting_and_fails_its_probe(make_proxy, tools, proxy_bin, tmp_path):
    """As while the proxy restarts in a pod: another uid binds 127.0.0.1:PORT first."""
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another uid")
    port = free_port()
    squatter = subprocess.Popen(
        ["python3", "-c", "import socket, sys, time\n"
         f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('bound', flush=True)\n"
         "while True:\n    c, _ = s.accept()\n    c.recv(65536)\n"
         "    c.sendall(b'HTTP/1.1 200 OK\\r\\ncontent-length: 6\\r\\n\\r\\nready\\n'); c.close()"],
        user=65534, group=65534, stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        token_file = tmp_path / "token"
        config = tmp_path / "proxy.yaml"
        config.write_text(json.dumps({"task": {"name": "t", "namespace": "test"}, "servers": [everything(tools)]}))
        started = subprocess.run([str(proxy_bin), "--config", str(config), "--listen", f"127.0.0.1:{port}",
                                  "--client-token-file", str(token_file)], capture_output=True, text=True, timeout=30)
        assert started.returncode != 0
        assert f"cannot listen on 127.0.0.1:{port}: it is held by uid 65534" in started.stderr, started.stderr
        assert not token_file.exists(), "the token was written though the proxy does not hold the port"
        # The squatter answers 200 to anything; the probe still fails: the socket is not its uid's.
        probe = subprocess.run([str(proxy_bin), "probe", f"http://127.0.0.1:{port}/readyz"],
                               capture_output=True, text=True, timeout=10)
        assert probe.returncode == 1, probe
        assert f"127.0.0.1:{port} is held by uid 65534, not this container's uid 0" in probe.stderr, probe.stderr
    finally:
        squatter.kill()
        squatter.wait()


def test_a_flood_of_large_bodies_gets_503s_while_memory_stays_bounded_and_the_agent_is_served(make_proxy, tools, tmp_path):
    proxy, token_file, _ = authed_proxy(make_proxy, tools, tmp_path)
    token = token_file.read_text()
    session = dict(RAW_HEADERS, Authorization=f"Bearer {token}")
    r = urllib.request.Request(proxy.url, data=json.dumps(RAW_INIT).encode(), headers=session)
    with urllib.request.urlopen(r, timeout=10) as answer:
        session["Mcp-Session-Id"] = answer.headers["Mcp-Session-Id"]
    session["Mcp-Protocol-Version"] = "2025-11-25"
    urllib.request.urlopen(urllib.request.Request(proxy.url, data=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                                                  headers=session), timeout=10).read()
    # Each body just under the 4 MiB limit: an echo of 4 MiB less its envelope (each request
    # its own id: a session's ids must differ).
    message = "x" * (4 * 1024 * 1024 - 200)
    n = 40
    statuses, retry_after, errors = [], [], []
    gate = threading.Barrier(n)

    def send(i: int):
        big = json.dumps(tool_call("every__echo", {"message": message}, id=100 + i)).encode()
        assert len(big) <= 4 * 1024 * 1024
        gate.wait()
        try:
            with urllib.request.urlopen(urllib.request.Request(proxy.url, data=big, headers=session), timeout=120) as a:
                a.read()
                statuses.append(a.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
            retry_after.append(e.headers.get("Retry-After"))
            e.read()
        except OSError as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    # Meanwhile the agent's ordinary call is served.
    small = json.dumps(tool_call("every__get-sum", {"a": 2, "b": 3}, id=9)).encode()
    began = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(proxy.url, data=small, headers=session), timeout=60) as a:
        text = a.read().decode()
        assert a.status == 200 and "is 5" in text, text
    small_s = time.monotonic() - began
    for t in threads:
        t.join()
    assert errors == [], errors
    assert sorted(set(statuses)) == [200, 503], statuses
    assert set(retry_after) == {"1"}, retry_after
    peak = vm_hwm_kib(proxy.pid)
    print(f"\n{n} concurrent 4 MiB bodies: {statuses.count(200)} served, {statuses.count(503)} got 503; "
          f"the proxy's peak RSS {peak / 1024:.0f} MiB; a small call meanwhile took {small_s:.2f} s")
    # Eight bodies of 4 MiB at a time, each held a few times over, on top of the process itself.
    assert peak < 240 * 1024, f"peak RSS {peak / 1024:.0f} MiB (the pod's limit is 256 MiB)"
    assert proxy.process.poll() is None
    wait_for(lambda: request(proxy, "GET", "/readyz")[0] == 200, what="the proxy to stay ready")
