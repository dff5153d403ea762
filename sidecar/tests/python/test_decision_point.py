"""The external decision point (policy.decisionPoints, issue 44) against a real Open Policy Agent
(built from its Go module: e2e/tools/opa) serving the shipped example policy
(config/policy/orchestrator.rego), driven by the official MCP Python SDK: a git push to a
protected branch is refused with the policy's reason, one to agent/* goes through; the
filesystem server's write outside /workspace/src is refused; with OPA stopped every call is
refused with a clear message and nothing reaches the upstream; a cached decision is reused for
the same input (and only for it)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from mcp import Client

from conftest import SUPPORT, free_port, proxy_meta, text_of, wait_for

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
POLICY = REPO / "config/policy/orchestrator.rego"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def opa_bin() -> Path:
    """The opa binary (built on first use, about two minutes cold; cached after)."""
    out = subprocess.run([str(REPO / "e2e/tools/opa")], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip())


class Opa:
    def __init__(self, binary: Path):
        self.port = free_port()
        self.process = subprocess.Popen(
            [str(binary), "run", "--server", "--addr", f"127.0.0.1:{self.port}", "--log-level", "error",
             "--disable-telemetry", str(POLICY)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(self.listening, what="opa to listen", timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/data/orchestrator/decision"

    def listening(self) -> bool:
        assert self.process.poll() is None, self.process.stderr.read().decode()[-2000:]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def opa(opa_bin):
    server = Opa(opa_bin)
    yield server
    if server.process.poll() is None:
        server.stop()


def push_server(tools, calls: Path) -> dict:
    return {"name": "git", "stdio": {"command": str(tools.python), "args": [str(SUPPORT / "push_server.py")],
                                     "env": {"PUSH_CALLS": str(calls)}}}


def pushed(calls: Path) -> list[str]:
    return calls.read_text().split() if calls.exists() else []


async def test_the_example_policy_refuses_a_protected_push_and_allows_agent_branches(make_proxy, tools, tmp_path, opa):
    calls = tmp_path / "pushes"
    proxy = make_proxy({"servers": [push_server(tools, calls)], "policy": {"decisionPoints": [{"url": opa.url}]}})
    async with Client(proxy.url) as client:
        main = await client.call_tool("git__git_push", {"branch": "main"})
        agent = await client.call_tool("git__git_push", {"branch": "agent/fix-1"})
    assert main.is_error, text_of(main)
    said = text_of(main)
    assert 'git push to "main": only branches named agent/* may be pushed' in said, said
    assert proxy_meta(main)["code"] == "PROXY.DECISION_DENIED"
    assert proxy_meta(main)["reason"].startswith('git push to "main"')
    assert not agent.is_error and "pushed agent/fix-1" in text_of(agent), text_of(agent)
    assert pushed(calls) == ["agent/fix-1"]
    records = proxy.audit(at_least=2)
    assert [r["decision"] for r in records] == ["denied", "allowed"]
    assert records[0]["rule"] == f"policy.decisionPoints[0] {opa.url}"
    assert "only branches named agent/* may be pushed" in records[0]["error"], records[0]


async def test_a_filesystem_write_outside_src_is_refused_by_the_policy(make_proxy, tools, tmp_path, opa):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = {"name": "filesystem", "stdio": {"command": str(tools.node), "args": [str(tools.filesystem), str(workspace)]}}
    proxy = make_proxy({"servers": [server], "policy": {"decisionPoints": [{"url": opa.url}]}})
    async with Client(proxy.url) as client:
        refused = await client.call_tool("filesystem__write_file", {"path": str(workspace / "x"), "content": "x"})
        listed = await client.call_tool("filesystem__list_allowed_directories", {})
    assert refused.is_error and "filesystem writes only under /workspace/src" in text_of(refused), text_of(refused)
    assert not (workspace / "x").exists()
    assert not listed.is_error, text_of(listed)


async def test_with_opa_stopped_every_call_is_refused_and_nothing_reaches_the_upstream(make_proxy, tools, tmp_path, opa):
    calls = tmp_path / "pushes"
    proxy = make_proxy({"servers": [push_server(tools, calls)],
                        "policy": {"decisionPoints": [{"url": opa.url, "timeoutMilliseconds": 300}]}})
    async with Client(proxy.url) as client:
        assert not (await client.call_tool("git__git_push", {"branch": "agent/a"})).is_error
        opa.stop()
        refused = [await client.call_tool("git__git_push", {"branch": f"agent/{n}"}) for n in range(3)]
    for r in refused:
        assert r.is_error and proxy_meta(r)["code"] == "PROXY.DECISION_FAILED", text_of(r)
        assert "the decision point could not be reached" in text_of(r), text_of(r)
        assert "refused" in text_of(r)
    assert pushed(calls) == ["agent/a"], "no call went on without a decision"


async def test_a_cached_decision_is_reused_for_the_same_input_only(make_proxy, tools, tmp_path, opa):
    calls = tmp_path / "pushes"
    proxy = make_proxy({"servers": [push_server(tools, calls)], "policy": {"decisionPoints": [
        {"url": opa.url, "timeoutMilliseconds": 300, "cache": {"entries": 16, "ttlSeconds": 600}}]}})
    async with Client(proxy.url) as client:
        first = await client.call_tool("git__git_push", {"branch": "agent/cached"})
        opa.stop()
        again = await client.call_tool("git__git_push", {"branch": "agent/cached"})
        other = await client.call_tool("git__git_push", {"branch": "agent/other"})
    assert not first.is_error and not again.is_error, (text_of(first), text_of(again))
    assert other.is_error and proxy_meta(other)["code"] == "PROXY.DECISION_FAILED", text_of(other)
    assert pushed(calls) == ["agent/cached", "agent/cached"]
