"""Definitions from the catalog and pins that last (issue 28, point 2), against real MCP servers of
our own built on the official Python SDK, and, for the baseline that outlives the proxy, the real
API server that ./test brings up:

- a pod's first proxy lists a server's tools from the definitions pinned in the catalog
  (`servers[].definitions`) without starting the server, and the first call starts it;
- on a server that pins its tools, a tool that appears under a new name is a changed definition
  (blocked), not a first sight;
- a definition that changed stays blocked when the proxy restarts with the same cache directory:
  the first-seen hashes are recorded on the task's Lease, not taken from the disk cache (which
  holds the changed list).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from mcp import Client

from conftest import SUPPORT, await_for, names, text_of

pytestmark = pytest.mark.anyio

BASELINE = "orchestrator.io/tool-baseline"
LEASE = "task-p-served"
POD = "task-p-7xk2p"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def server(tools, name: str, script: str, env: dict, **extra) -> dict:
    return {
        "name": name,
        "stdio": {"command": str(tools.python), "args": [str(SUPPORT / script)], "env": env},
        **extra,
    }


def calls_received(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def upstream_tools(tools, script: str, env: dict) -> list[dict]:
    """The server's own tools/list answer (raw JSON-RPC over stdio): what `catalog pin --write`
    stores as each tool's definition."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "pin-test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    child = subprocess.Popen(
        [str(tools.python), str(SUPPORT / script)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", **env}, text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        for m in messages:
            child.stdin.write(json.dumps(m) + "\n")
            child.stdin.flush()
        for line in child.stdout:
            answer = json.loads(line)
            if answer.get("id") == 2:
                return answer["result"]["tools"]
        raise AssertionError("no tools/list answer")
    finally:
        child.kill()
        child.wait()


async def probe_pins(make_proxy, config: dict) -> dict[str, str]:
    """The definition hashes as the proxy computes them (GET /tools), from a throwaway proxy."""
    probe = make_proxy({"servers": [config]})
    async with Client(probe.url, mode="legacy") as client:
        await client.list_tools()
    pins = {t["tool"]: t["definition"] for t in probe.tools()["servers"][0]["tools"]}
    probe.terminate()
    return pins


async def test_a_first_proxy_lists_the_pinned_tools_with_no_server_started(make_proxy, tools, tmp_path):
    calls = tmp_path / "calls.txt"
    env = {"RUG_PULL_CALLS": str(calls)}
    rug = server(tools, "rug", "rug_pull_server.py", env)
    definitions = upstream_tools(tools, "rug_pull_server.py", env)
    pins = await probe_pins(make_proxy, rug)
    calls.unlink(missing_ok=True)

    proxy = make_proxy({"servers": [{**rug, "pins": pins, "definitions": definitions}]})
    async with Client(proxy.url, mode="legacy") as client:
        listed = await client.list_tools()
        assert names(listed) == ["rug__echo", "rug__rewrite"]
        echo = next(t for t in listed.tools if t.name == "rug__echo")
        assert echo.description == next(d["description"] for d in definitions if d["name"] == "echo")
        assert echo.input_schema == next(d["inputSchema"] for d in definitions if d["name"] == "echo")
        # Listed from the catalog's definitions: no server process, no start counted.
        assert proxy.server_pid("rug") is None
        assert "mcp_proxy_upstream_starts_total{" not in proxy.metrics()
        assert "taken from the catalog's pinned definitions" in proxy.log()
        # The first call starts it, and its own list matches the pins: the call goes through.
        answer = await client.call_tool("rug__echo", {"text": "hi"})
        assert not answer.is_error, text_of(answer)
        assert proxy.server_pid("rug") is not None
        assert names(await client.list_tools()) == ["rug__echo", "rug__rewrite"]
    assert calls_received(calls) == ["echo"]


async def test_a_definition_that_does_not_hash_to_its_pin_refuses_the_config(make_proxy, tools, tmp_path):
    env = {"RUG_PULL_CALLS": str(tmp_path / "calls.txt")}
    rug = server(tools, "rug", "rug_pull_server.py", env)
    definitions = upstream_tools(tools, "rug_pull_server.py", env)
    pins = await probe_pins(make_proxy, rug)
    tampered = [dict(d, description="Echoes. Also reads ~/.ssh.") if d["name"] == "echo" else d for d in definitions]
    proxy = make_proxy({"servers": [{**rug, "pins": pins, "definitions": tampered}]}, wait_ready=False)
    await await_for(lambda: "definitions[" in proxy.log(), what="the config to be refused")
    assert "hashes to sha256:" in proxy.log() and "not to its pin" in proxy.log()
    assert proxy.http("/readyz")[0] != 200


async def test_a_tool_that_appears_under_a_new_name_on_a_pinned_server_is_blocked(make_proxy, tools, tmp_path):
    dynamic = server(tools, "dyn", "dynamic_server.py", {})
    pins = await probe_pins(make_proxy, dynamic)
    assert list(pins) == ["add_tool"]
    proxy = make_proxy({"servers": [{**dynamic, "pins": pins}]})
    async with Client(proxy.url, mode="legacy") as client:
        assert names(await client.list_tools()) == ["dyn__add_tool"]
        assert not (await client.call_tool("dyn__add_tool", {"name": "exfiltrate"})).is_error
        # The server announces its new list; the proxy re-lists and sees a tool no pin names.
        await await_for(
            lambda: any(t.get("definitionChange") for t in proxy.tools()["servers"][0]["tools"]),
            what="the new tool to be seen",
        )
        offered = names(await client.list_tools())
        refused = await client.call_tool("dyn__exfiltrate", {})
    assert offered == ["dyn__add_tool"]
    assert refused.is_error
    assert 'servers[dyn] pins its tools and none is "exfiltrate"' in text_of(refused)
    known = {t["tool"]: t for t in proxy.tools()["servers"][0]["tools"]}
    assert known["exfiltrate"]["definitionChange"]["kind"] == "unpinned"
    change = next(r for r in proxy.audit(at_least=2) if r["outcome"] == "definition_changed")
    assert change["decision"] == "quarantined" and change["upstreamTool"] == "exfiltrate"


class Task:
    """A namespace with the task's Lease, as the operator creates it."""

    def __init__(self, kube):
        self.kube = kube
        self.namespace = f"sc-pins-{uuid.uuid4().hex[:8]}"
        kube.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        kube.ok(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE}, "spec": {}},
        )

    def baseline(self) -> dict:
        lease = self.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}")
        return json.loads((lease["metadata"].get("annotations") or {}).get(BASELINE, "{}"))

    def args(self) -> list[str]:
        return ["--served-lease", LEASE, "--namespace", self.namespace, "--pod-name", POD]


@pytest.fixture
def task(kube):
    task = Task(kube)
    yield task
    kube.request("DELETE", f"/api/v1/namespaces/{task.namespace}")


async def test_a_changed_definition_stays_blocked_when_the_proxy_restarts_with_the_same_cache(
    make_proxy, tools, tmp_path, kube, task
):
    calls = tmp_path / "calls.txt"
    # The rewrite lasts (a compromised package): a restarted server offers the new definition.
    rug = server(tools, "rug", "rug_pull_server.py", {"RUG_PULL_CALLS": str(calls), "RUG_PULL_STATE": str(tmp_path / "pulled")})
    config = {"servers": [rug]}
    workdir = tmp_path / "pod"  # the same cache directory for both proxies
    env = {"KUBECONFIG": str(kube.path)}

    first = make_proxy(config, env=env, extra_args=task.args(), workdir=workdir)
    async with Client(first.url, mode="legacy") as client:
        assert names(await client.list_tools()) == ["rug__echo", "rug__rewrite"]
        first_hash = next(t for t in first.tools()["servers"][0]["tools"] if t["tool"] == "echo")["definition"]
        recorded = await await_for(lambda: task.baseline().get("rug@legacy"), what="the baseline on the Lease")
        assert recorded["tools"]["echo"] == first_hash
        assert not (await client.call_tool("rug__rewrite", {})).is_error
        await await_for(
            lambda: any(t.get("definitionChange") for t in first.tools()["servers"][0]["tools"]),
            what="the change to be seen",
        )
        assert names(await client.list_tools()) == ["rug__rewrite"]
    first.terminate()
    assert (workdir / "cache").is_dir() and any((workdir / "cache").iterdir()), "the disk cache holds the changed list"

    second = make_proxy(config, env=env, extra_args=task.args(), workdir=workdir)
    async with Client(second.url, mode="legacy") as client:
        offered = names(await client.list_tools())
        refused = await client.call_tool("rug__echo", {"text": "secret?"})
    assert offered == ["rug__rewrite"], "the restarted proxy took the changed definition as its first"
    assert refused.is_error
    assert 'policy.onChange "block" (servers[rug]: the definition of "echo" changed since first seen' in text_of(refused)
    assert f"({first_hash[:19]} -> " in text_of(refused)
    assert "restored the tool-definition baseline" in second.log()
    assert calls_received(calls) == ["rewrite"], "the blocked call never reached the server"
