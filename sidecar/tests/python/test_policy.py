"""The call policy against real MCP servers, driven by the official MCP Python SDK: argument
validation (server-filesystem), rate limits (server-everything), definition changes and pins (a
server of our own, built on the official SDK, that changes a tool's description mid-session).

Each row checks what the agent sees (the list, the tool error), what the server saw (its own record
of the calls it received), and what the proxy recorded (audit line, metric)."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from conftest import SUPPORT, await_for, names, proxy_meta, recorded, recorded_calls, text_of

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


def rug_pull(tools, calls: Path, **extra) -> dict:
    return {
        "name": "rug",
        "stdio": {
            "command": str(tools.python),
            "args": [str(SUPPORT / "rug_pull_server.py")],
            "env": {"RUG_PULL_CALLS": str(calls)},
        },
        **extra,
    }


def calls_received(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# --- argument validation -----------------------------------------------------------------------


@BOTH
async def test_invalid_arguments_are_refused_naming_the_field_and_never_reach_the_server(make_proxy, tools, tmp_path, mode):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    server = {"name": "fs", "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace))}
    proxy = make_proxy({"servers": [server]})
    target = workspace / "note.txt"
    async with Client(proxy.url, mode=mode) as client:
        assert "fs__write_file" in names(await client.list_tools())
        missing = await client.call_tool("fs__write_file", {"path": str(target)})
        wrong_type = await client.call_tool("fs__write_file", {"path": 42, "content": "x"})
        written = await client.call_tool("fs__write_file", {"path": str(target), "content": "hello"})
    assert missing.is_error
    assert '"content" is a required property' in text_of(missing), text_of(missing)
    assert proxy_meta(missing)["code"] == "PROXY.INVALID_ARGUMENTS"
    assert wrong_type.is_error
    assert "arguments.path: " in text_of(wrong_type), text_of(wrong_type)
    assert "the server was not called" in text_of(wrong_type)
    assert not written.is_error, text_of(written)
    assert target.read_text() == "hello"
    # Upstream side: only the valid call arrived.
    assert recorded_calls(stdin_log) == ["write_file"]
    records = proxy.audit(at_least=3)
    assert [r["decision"] for r in records] == ["invalid_arguments", "invalid_arguments", "allowed"]
    assert records[0]["rule"] == 'policy.validateArguments (servers[fs]: the inputSchema of "write_file")'
    assert "content" in records[0]["error"]
    assert proxy.metric("mcp_proxy_tool_calls_total", server="fs", tool="fs__write_file", outcome="invalid_arguments") == 2


async def test_with_validation_off_the_server_judges_the_arguments_itself(make_proxy, tools, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    server = {"name": "fs", "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace))}
    proxy = make_proxy({"policy": {"validateArguments": False}, "servers": [server]})
    async with Client(proxy.url, mode="legacy") as client:
        answer = await client.call_tool("fs__write_file", {"path": str(workspace / "x.txt")})
    assert answer.is_error
    assert "PROXY.INVALID_ARGUMENTS" not in str(answer.meta)
    assert recorded_calls(stdin_log) == ["write_file"]


# --- rate limits -------------------------------------------------------------------------------


@BOTH
async def test_a_rate_limit_is_hit_with_a_retryable_error_and_recovers_after_the_window(make_proxy, tools, mode):
    # 60 per minute with a burst of 2: two calls at once, then one per second.
    server = {
        "name": "every",
        "stdio": tools.everything_stdio(),
        "rateLimit": {"tools": {"echo": {"perMinute": 60, "burst": 2}}},
    }
    proxy = make_proxy({"servers": [server]})
    async with Client(proxy.url, mode=mode) as client:
        first = await client.call_tool("every__echo", {"message": "one"})
        second = await client.call_tool("every__echo", {"message": "two"})
        limited = await client.call_tool("every__echo", {"message": "three"})
        refused_at = time.monotonic()
        # Other tools have no limit of their own and the server none at all.
        other = await client.call_tool("every__get-sum", {"a": 1, "b": 2})
        retry_after = proxy_meta(limited).get("retryAfterSeconds")
        # Poll until the window lets a call through (each refused attempt is audited too).
        attempts = 0
        while (recovered := await client.call_tool("every__echo", {"message": "four"})).is_error:
            attempts += 1
            assert time.monotonic() - refused_at < 5, text_of(recovered)
            await anyio.sleep(0.1)
        recovered_after = time.monotonic() - refused_at
    assert not first.is_error and not second.is_error
    assert limited.is_error
    assert 'rate limited by servers[every].rateLimit.tools["echo"] (60/min, burst 2)' in text_of(limited), text_of(limited)
    assert proxy_meta(limited)["code"] == "PROXY.RATE_LIMITED"
    assert 0 < retry_after <= 1.0, retry_after
    assert not other.is_error, text_of(other)
    assert "four" in text_of(recovered)
    # It recovered once the window passed, not before.
    assert recovered_after >= retry_after * 0.8, (recovered_after, retry_after)
    records = proxy.audit(at_least=5 + attempts)
    decisions = [r["decision"] for r in records if r["tool"] == "every__echo"]
    assert decisions[:3] == ["allowed", "allowed", "rate_limited"]
    assert decisions[-1] == "allowed"
    assert decisions.count("rate_limited") == 1 + attempts
    limited_record = next(r for r in records if r["decision"] == "rate_limited")
    assert limited_record["rule"] == 'servers[every].rateLimit.tools["echo"] (60/min, burst 2)'
    assert proxy.metric("mcp_proxy_tool_calls_total", server="every", tool="every__echo", outcome="rate_limited") == 1 + attempts


# --- definition changes and pins ---------------------------------------------------------------


@pytest.mark.parametrize("on_change", ["block", "alert"])
async def test_a_tool_whose_definition_changes_mid_session_is_quarantined_under_block_and_reported_under_alert(
    make_proxy, tools, tmp_path, on_change
):
    calls = tmp_path / "calls.txt"
    proxy = make_proxy({"policy": {"onChange": on_change}, "servers": [rug_pull(tools, calls)]})

    def echo_known():
        return next(t for t in proxy.tools()["servers"][0]["tools"] if t["tool"] == "echo")

    async with Client(proxy.url, mode="legacy") as client:
        before = await client.list_tools()
        assert names(before) == ["rug__echo", "rug__rewrite"]
        first_hash = (await await_for(lambda: echo_known(), what="echo in GET /tools"))["definition"]
        assert not (await client.call_tool("rug__echo", {"text": "hi"})).is_error
        assert not (await client.call_tool("rug__rewrite", {})).is_error
        # The server announces its new list; the proxy re-lists and sees the new definition.
        changed = await await_for(lambda: echo_known().get("definitionChange"), what="the change to be seen")
        after = await client.list_tools()
        answer = await client.call_tool("rug__echo", {"text": "secret?"})
    assert changed["kind"] == "changedSinceFirstSeen"
    assert changed["first"] == first_hash and changed["seen"] != first_hash
    records = proxy.audit(at_least=4)
    change_records = [r for r in records if r["outcome"] == "definition_changed"]
    assert len(change_records) == 1, records
    record = change_records[0]
    assert (record["server"], record["upstreamTool"], record["tool"]) == ("rug", "echo", "rug__echo")
    assert "changed since first seen" in record["rule"]
    assert proxy.metric("mcp_proxy_tool_definition_changes_total", server="rug", tool="echo", action=on_change) == 1
    if on_change == "block":
        assert names(after) == ["rug__rewrite"]
        assert answer.is_error
        assert 'policy.onChange "block" (servers[rug]: the definition of "echo" changed since first seen' in text_of(answer)
        assert record["decision"] == "quarantined"
        assert calls_received(calls) == ["echo", "rewrite"], "the quarantined call never reached the server"
    else:
        assert names(after) == ["rug__echo", "rug__rewrite"]
        assert "~/.ssh" in next(t.description for t in after.tools if t.name == "rug__echo")
        assert not answer.is_error, text_of(answer)
        assert record["decision"] == "alerted"
        assert calls_received(calls) == ["echo", "rewrite", "echo"]


async def test_a_definition_that_differs_from_its_pin_is_quarantined_at_first_sight(make_proxy, tools, tmp_path):
    # The real hashes, as GET /tools reports them.
    probe = make_proxy({"servers": [rug_pull(tools, tmp_path / "probe-calls.txt")]})
    async with Client(probe.url, mode="legacy") as client:
        await client.list_tools()
    hashes = {t["tool"]: t["definition"] for t in probe.tools()["servers"][0]["tools"]}
    assert all(h.startswith("sha256:") and len(h) == 71 for h in hashes.values()), hashes
    probe.terminate()

    calls = tmp_path / "calls.txt"
    wrong = "sha256:" + "0" * 64
    proxy = make_proxy({"servers": [rug_pull(tools, calls, pins={"echo": wrong, "rewrite": hashes["rewrite"]})]})
    async with Client(proxy.url, mode="2026-07-28") as client:
        offered = names(await client.list_tools())
        refused = await client.call_tool("rug__echo", {"text": "hi"})
    assert offered == ["rug__rewrite"]
    assert refused.is_error
    assert f'servers[rug].pins["echo"] is {wrong[:19]} but the server offers {hashes["echo"][:19]}' in text_of(refused)
    assert calls_received(calls) == []
    known = {t["tool"]: t for t in proxy.tools()["servers"][0]["tools"]}
    assert known["echo"]["definitionChange"] == {"kind": "pinMismatch", "expected": wrong, "seen": hashes["echo"]}
    assert "definitionChange" not in known["rewrite"]
    change = next(r for r in proxy.audit(at_least=2) if r["outcome"] == "definition_changed")
    assert change["decision"] == "quarantined" and change["upstreamTool"] == "echo"
