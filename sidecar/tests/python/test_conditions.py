"""CEL conditions on calls (policy.conditions, issue 44) against the real filesystem server, driven
by the official MCP Python SDK: a write outside the allowed path is refused naming the condition
and its message, and never reaches the server (its own record of the calls it received, and the
file system); a write inside passes; a condition that cannot be evaluated on a call refuses it; a
condition that costs too much is stopped by its budget and refuses; a config with a bad
expression is refused, keeping the conditions in force; a changed list (as add-context writes
it) applies to the next call; a requireApproval condition holds the call (no Lease here: refused
as unavailable, never forwarded)."""

from __future__ import annotations

import pytest
from mcp import Client

from conftest import await_for, proxy_meta, recorded, recorded_calls, text_of

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


def under(prefix: str, name: str = "writes-under-src") -> dict:
    return {"name": name, "tools": ["fs/write_file", "fs/edit_file"],
            "when": f'!args.path.startsWith("{prefix}")',
            "message": f"the filesystem server writes only under {prefix}"}


@BOTH
async def test_a_write_outside_the_allowed_path_is_refused_by_the_condition_and_inside_passes(make_proxy, tools, tmp_path, mode):
    workspace = tmp_path / "workspace"
    (workspace / "src").mkdir(parents=True)
    (workspace / "docs").mkdir()
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    server = {"name": "fs", "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace))}
    src = f"{workspace}/src/"
    config = {"servers": [server], "policy": {"conditions": [under(src)]}}
    proxy = make_proxy(config)
    outside, inside = workspace / "notes.txt", workspace / "src" / "main.rs"
    async with Client(proxy.url, mode=mode) as client:
        refused = await client.call_tool("fs__write_file", {"path": str(outside), "content": "x"})
        written = await client.call_tool("fs__write_file", {"path": str(inside), "content": "fn main() {}"})
        # Another tool of the server: the condition names write_file and edit_file only.
        read = await client.call_tool("fs__read_text_file", {"path": str(inside)})

        # The agent's view: a tool error naming the condition, its rule and its message.
        assert refused.is_error
        said = text_of(refused)
        assert 'condition "writes-under-src" (policy.conditions[0] "writes-under-src") holds' in said, said
        assert f"the filesystem server writes only under {src}" in said, said
        assert "the call was not made" in said
        meta = proxy_meta(refused)
        assert meta["code"] == "PROXY.CONDITION_DENIED"
        assert meta["condition"] == "writes-under-src" and meta["server"] == "fs"
        assert not outside.exists(), "the refused write never reached the server"
        assert not written.is_error, text_of(written)
        assert inside.read_text() == "fn main() {}"
        assert not read.is_error and "fn main() {}" in text_of(read)

        # add-context changes the list (here: the mounted config, as the operator renders it):
        # the next call is held to the new one.
        proxy.swap({**config, "contextVersion": 2,
                    "policy": {"conditions": [under(f"{workspace}/docs/", "writes-under-docs")]}})
        await await_for(lambda: proxy.tools()["contextVersion"] == 2, what="the new conditions to be served")
        now_refused = await client.call_tool("fs__write_file", {"path": str(inside), "content": "changed"})
        now_written = await client.call_tool("fs__write_file", {"path": f"{workspace}/docs/a.md", "content": "doc"})
    assert now_refused.is_error and 'condition "writes-under-docs"' in text_of(now_refused), text_of(now_refused)
    assert inside.read_text() == "fn main() {}", "the write the new condition refused did not happen"
    assert not now_written.is_error, text_of(now_written)

    # The server's side: only the allowed calls arrived.
    assert recorded_calls(stdin_log) == ["write_file", "read_text_file", "write_file"]
    # The audit: the refusals name the condition's rule; the allowed calls are as any other.
    records = proxy.audit(at_least=5)
    assert [r["decision"] for r in records] == ["denied", "allowed", "allowed", "denied", "allowed"]
    assert records[0]["rule"] == 'policy.conditions[0] "writes-under-src"'
    assert records[3]["rule"] == 'policy.conditions[0] "writes-under-docs"'
    assert proxy.metric("mcp_proxy_tool_calls_total", server="fs", tool="fs__write_file", outcome="denied") == 2


async def test_a_condition_that_cannot_say_refuses_and_a_bad_config_keeps_the_conditions_in_force(make_proxy, tools, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    server = {"name": "fs", "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace))}
    conditions = [
        # Reads an argument list_directory does not have: an error on that call (fail closed).
        {"name": "needs-mode", "tools": ["fs/list_directory"], "when": 'args.mode == "deep"'},
        # Quadratic in the arguments: a big list runs out of its budget.
        {"name": "no-duplicates", "tools": ["fs/read_multiple_files"],
         "when": "args.paths.exists(p, args.paths.exists(q, p == q + '/'))"},
    ]
    config = {"servers": [server], "policy": {"conditions": conditions}}
    proxy = make_proxy(config)
    async with Client(proxy.url) as client:
        failed = await client.call_tool("fs__list_directory", {"path": str(workspace)})
        many = [f"{workspace}/f{i}" for i in range(1000)]
        costly = await client.call_tool("fs__read_multiple_files", {"paths": many})
        few = await client.call_tool("fs__read_multiple_files", {"paths": [f"{workspace}/nothing"]})

        # A config whose condition does not parse is refused whole; the list in force stays.
        proxy.swap({**config, "contextVersion": 2, "policy": {"conditions": [
            {"name": "broken", "when": "args.path.startsWith("}]}})
        await await_for(lambda: "PROXY.BAD_CONDITION" in proxy.log(), what="the bad config to be refused")
        assert proxy.tools()["contextVersion"] == 0
        still = await client.call_tool("fs__list_directory", {"path": str(workspace)})

    assert failed.is_error and proxy_meta(failed)["code"] == "PROXY.CONDITION_FAILED", text_of(failed)
    assert 'condition "needs-mode"' in text_of(failed) and "could not be evaluated" in text_of(failed)
    assert "mode" in proxy_meta(failed)["error"], proxy_meta(failed)
    assert costly.is_error and proxy_meta(costly)["code"] == "PROXY.CONDITION_FAILED", text_of(costly)
    assert "it went over its budget" in proxy_meta(costly)["error"], proxy_meta(costly)
    assert "code" not in proxy_meta(few), "a short list is within the budget: forwarded"
    assert still.is_error and proxy_meta(still)["code"] == "PROXY.CONDITION_FAILED"
    log = proxy.log()
    assert "policy.conditions[0].when" in log and "at 1:" in log, log[-2000:]
    # Only the call every condition let through reached the server.
    assert recorded_calls(stdin_log) == ["read_multiple_files"]


async def test_a_require_approval_condition_holds_the_call_and_never_forwards_it_unapproved(make_proxy, tools, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    server = {"name": "fs", "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace))}
    proxy = make_proxy({"servers": [server], "policy": {"conditions": [
        {"name": "big-writes", "tools": ["fs/write_file"], "when": "size(args.content) > 10",
         "effect": "requireApproval"}]}})
    async with Client(proxy.url) as client:
        small = await client.call_tool("fs__write_file", {"path": f"{workspace}/a", "content": "short"})
        big = await client.call_tool("fs__write_file", {"path": f"{workspace}/b", "content": "x" * 100})
    assert not small.is_error, text_of(small)
    # This proxy has no Lease to ask on: the held call is refused as unavailable, not forwarded.
    assert big.is_error and proxy_meta(big)["code"] == "PROXY.APPROVAL_UNAVAILABLE", text_of(big)
    assert not (workspace / "b").exists()
    records = proxy.audit(at_least=2)
    assert records[1]["rule"] == 'policy.conditions[0] "big-writes"', records[1]
    assert recorded_calls(stdin_log) == ["write_file"]
