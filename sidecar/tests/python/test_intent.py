"""Intent-declaration mode (`policy.toolMode: intent`), driven by the official MCP Python SDK:
the four tools it offers, `retrieve_tools`, and the two-key check of the validation matrix
(docs/design/approval-and-intent.md) row by row, against a server of our own whose tools carry
each combination of annotations (support/intent_server.py) and against the real filesystem
server (its own annotations).

Each row checks what the agent sees (the forwarded call's real result, or the refusal's text and
code), what the server saw (its own record of the calls it received: a refused call never
arrives) and what the proxy recorded (the audit line, with the declared intent)."""

from __future__ import annotations

import json
from pathlib import Path

import mcp_types as types
import pytest
from mcp import Client

from conftest import SUPPORT, await_for, names, proxy_meta, recorded, recorded_calls, text_of

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
FOUR = ["call_tool_destructive", "call_tool_read", "call_tool_write", "retrieve_tools"]
# The call tool each of the own server's tools is retrieved with (`retag` by its risk override).
CALL_WITH = {
    "look": "call_tool_read",
    "wipe": "call_tool_destructive",
    "plain": "call_tool_write",
    "odd": "call_tool_destructive",
    "note": "call_tool_write",
    "retag": "call_tool_destructive",
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def own(kit, calls: Path, **extra) -> dict:
    """The server of our own (`kit`: the `tools` fixture); `retag` is destructive by a risk
    override (the catalog's or TaskRun's word, which counts as the server's)."""
    return {
        "name": "own",
        "stdio": {
            "command": str(kit.python),
            "args": [str(SUPPORT / "intent_server.py")],
            "env": {"INTENT_CALLS": str(calls)},
        },
        "risk": {"retag": "destructive"},
        **extra,
    }


def intent_mode(*servers: dict, **policy) -> dict:
    return {"policy": {"toolMode": "intent", **policy}, "servers": list(servers)}


def received(calls: Path) -> list[str]:
    """The tool calls the own server received, in order."""
    return calls.read_text().split() if calls.exists() else []


async def call(client, variant: str, name: str, args: dict | None, operation: str | None, **intent):
    """A call through call_tool_<variant>, declaring `operation` (left out when None)."""
    declared = dict(intent)
    if operation is not None:
        declared["operation_type"] = operation
    arguments = {"name": name, "intent": declared}
    if args is not None:
        arguments["args"] = args
    return await client.call_tool(f"call_tool_{variant}", arguments)


async def retrieve(client, **arguments) -> dict:
    result = await client.call_tool("retrieve_tools", arguments)
    assert not result.is_error, text_of(result)
    return json.loads(text_of(result))


def listed(found: dict) -> list[str]:
    return [t["name"] for t in found["tools"]]


def refused(code: str, text: str) -> tuple[str, str]:
    return code, text


MISMATCH, REQUIRED, SERVER = "PROXY.INTENT_MISMATCH", "PROXY.INTENT_REQUIRED", "PROXY.INTENT_SERVER_MISMATCH"
DECISION = {MISMATCH: "intent_mismatch", REQUIRED: "intent_required", SERVER: "intent_mismatch"}


def destructive(tool: str):
    return refused(SERVER, f"Tool 'own__{tool}' is marked destructive by server, use call_tool_destructive")


def mismatch(variant: str, operation: str):
    return refused(MISMATCH, f"Intent mismatch: tool is call_tool_{variant} but intent declares {operation}")


REQUIRED_TEXT = refused(REQUIRED, "intent.operation_type is required")

# variant | intent.operation_type | tool (what its server says) | result (None: forwarded)
ROWS = [
    # read | read | readOnly -> forwarded
    # read | read | nothing -> refused: a tool no annotation marks read-only is write, the one
    # class the proxy gives it (retrieve_tools says call_tool_write; the reference trusted the agent)
    pytest.param("read", "read", "plain", refused(SERVER, "Tool 'own__plain' is not annotated as read-only by its server, so the proxy classes it write; use call_tool_write"), id="read-read-nothing-refused"),
    pytest.param("read", "read", "look", None, id="read-read-readOnly-forwarded"),
    # read | write or destructive | any -> intent mismatch
    pytest.param("read", "write", "look", mismatch("read", "write"), id="read-write-readOnly-mismatch"),
    pytest.param("read", "destructive", "plain", mismatch("read", "destructive"), id="read-destructive-nothing-mismatch"),
    pytest.param("read", "write", "wipe", mismatch("read", "write"), id="read-write-destructive-mismatch"),
    # any | missing | any -> intent required
    pytest.param("read", None, "look", REQUIRED_TEXT, id="read-missing-readOnly-required"),
    pytest.param("write", None, "plain", REQUIRED_TEXT, id="write-missing-nothing-required"),
    pytest.param("destructive", None, "wipe", REQUIRED_TEXT, id="destructive-missing-destructive-required"),
    # read or write | matching | destructiveHint, or class destructive by override -> refused
    pytest.param("read", "read", "wipe", destructive("wipe"), id="read-read-destructiveHint-refused"),
    pytest.param("write", "write", "wipe", destructive("wipe"), id="write-write-destructiveHint-refused"),
    pytest.param("read", "read", "odd", destructive("odd"), id="read-read-both-hints-refused"),
    pytest.param("write", "write", "retag", destructive("retag"), id="write-write-override-destructive-refused"),
    # destructive | destructive | readOnly -> forwarded (overly cautious is allowed)
    pytest.param("destructive", "destructive", "look", None, id="destructive-destructive-readOnly-forwarded"),
    # write or destructive | matching | no annotations -> forwarded (write is its class)
    pytest.param("write", "write", "plain", None, id="write-write-nothing-forwarded"),
    pytest.param("destructive", "destructive", "plain", None, id="destructive-destructive-nothing-forwarded"),
    # The reference's other rows.
    pytest.param("write", "write", "look", None, id="write-write-readOnly-forwarded"),
    pytest.param("write", "destructive", "plain", mismatch("write", "destructive"), id="write-destructive-nothing-mismatch"),
    pytest.param("destructive", "read", "wipe", mismatch("destructive", "read"), id="destructive-read-destructive-mismatch"),
    pytest.param("destructive", "destructive", "wipe", None, id="destructive-destructive-destructiveHint-forwarded"),
    # Beyond the matrix: the server says the tool writes (readOnlyHint: false), so not as a read.
    pytest.param("read", "read", "note", refused(SERVER, "Tool 'own__note' is marked write by server, use call_tool_write"), id="read-read-notReadOnly-refused"),
    pytest.param("write", "write", "note", None, id="write-write-notReadOnly-forwarded"),
]


@BOTH
@pytest.mark.parametrize("variant,operation,tool,refusal", ROWS)
async def test_the_validation_matrix_row_by_row(make_proxy, tools, tmp_path, mode, variant, operation, tool, refusal):
    calls = tmp_path / "calls.txt"
    proxy = make_proxy(intent_mode(own(tools, calls)))
    async with Client(proxy.url, mode=mode) as client:
        # As an agent would: find the tool first (this also starts its server).
        found = await retrieve(client, query=tool)
        assert found["tools"][0]["name"] == f"own__{tool}", found
        assert found["tools"][0]["call_with"] == CALL_WITH[tool]
        answer = await call(client, variant, f"own__{tool}", {"text": "hi"}, operation, data_sensitivity="internal", reason="row")
    record = proxy.audit(at_least=2)[1]
    declared = {"variant": f"call_tool_{variant}", "data_sensitivity": "internal", "reason": "row"}
    if operation is not None:
        declared["operation_type"] = operation
    assert record["intent"] == declared
    assert (record["tool"], record["server"], record["upstreamTool"]) == (f"own__{tool}", "own", tool)
    if refusal is None:
        assert not answer.is_error, text_of(answer)
        assert text_of(answer) == f"{tool}: hi"
        assert received(calls) == [tool]
        assert (record["decision"], record["outcome"]) == ("allowed", "ok")
    else:
        code, text = refusal
        assert answer.is_error
        assert text_of(answer).startswith(text), text_of(answer)
        assert proxy_meta(answer)["code"] == code
        assert received(calls) == [], "a refused call never reaches the server"
        assert (record["decision"], record["outcome"]) == (DECISION[code], "denied")
        assert record["rule"].startswith('policy.toolMode "intent"'), record["rule"]
        assert proxy.metric("mcp_proxy_tool_calls_total", server="own", tool=f"own__{tool}", outcome=DECISION[code]) == 1


@BOTH
async def test_tools_list_offers_the_four_tools_and_starts_nothing(make_proxy, tools, tmp_path, mode):
    proxy = make_proxy(intent_mode(own(tools, tmp_path / "calls.txt")))
    async with Client(proxy.url, mode=mode) as client:
        offered = await client.list_tools()
        assert proxy.children() == [], "tools/list started a server"
        assert names(offered) == FOUR
        by_name = {t.name: t for t in offered.tools}
        for variant in ("read", "write", "destructive"):
            schema = by_name[f"call_tool_{variant}"].input_schema
            assert schema["required"] == ["name", "intent"]
            assert schema["properties"]["intent"]["required"] == ["operation_type"]
            assert f'intent.operation_type "{variant}"' in by_name[f"call_tool_{variant}"].description
        assert by_name["call_tool_read"].annotations.read_only_hint is True
        assert by_name["call_tool_destructive"].annotations.destructive_hint is True
        assert "search again" in by_name["retrieve_tools"].description
        found = await retrieve(client)
    assert {t["name"]: t["call_with"] for t in found["tools"]} == {f"own__{k}": v for k, v in CALL_WITH.items()}
    look = next(t for t in found["tools"] if t["name"] == "own__look")
    assert look["risk"] == "read" and look["annotations"]["readOnlyHint"] is True
    assert look["inputSchema"]["required"] == ["text"]
    assert found["matched"] == 6 and "call_with" in found["usage_instructions"]


@BOTH
async def test_the_filesystem_servers_own_annotations_decide_and_args_are_validated(make_proxy, tools, tmp_path, mode):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello")
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    server = {
        "name": "fs",
        "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace)),
        "tools": {"deny": ["move_file"]},
    }
    proxy = make_proxy(intent_mode(server))
    new = workspace / "new.txt"
    async with Client(proxy.url, mode=mode) as client:
        assert names(await client.list_tools()) == FOUR
        found = await retrieve(client, query="file directory", limit=100)
        by_name = {t["name"]: t for t in found["tools"]}
        read = await call(client, "read", "fs__read_text_file", {"path": str(workspace / "hello.txt")}, "read")
        as_read = await call(client, "read", "fs__create_directory", {"path": str(workspace / "made")}, "read")
        made = await call(client, "write", "fs__create_directory", {"path": str(workspace / "made")}, "write")
        understated = await call(client, "write", "fs__write_file", {"path": str(new), "content": "no"}, "write")
        invalid = await call(client, "destructive", "fs__write_file", {"path": str(new)}, "destructive")
        written = await call(client, "destructive", "fs__write_file", {"path": str(new), "content": "written"}, "destructive")
        denied = await call(client, "destructive", "fs__move_file", {"source": str(new), "destination": str(workspace / "moved.txt")}, "destructive")
    # retrieve_tools: the enabled tools only, each with the call tool its annotations need.
    assert "fs__move_file" not in by_name, "denied by servers[fs].tools.deny"
    assert by_name["fs__read_text_file"]["call_with"] == "call_tool_read"
    assert by_name["fs__create_directory"]["call_with"] == "call_tool_write"
    assert by_name["fs__write_file"]["call_with"] == "call_tool_destructive"
    assert by_name["fs__write_file"]["annotations"]["destructiveHint"] is True
    assert {"path", "content"} <= set(by_name["fs__write_file"]["inputSchema"]["required"])
    # The calls: real effects for the forwarded ones, none for the refused ones.
    assert not read.is_error and "hello" in text_of(read), text_of(read)
    assert as_read.is_error and text_of(as_read) == "Tool 'fs__create_directory' is marked write by server, use call_tool_write"
    assert not made.is_error, text_of(made)
    assert (workspace / "made").is_dir()
    assert understated.is_error
    assert text_of(understated) == "Tool 'fs__write_file' is marked destructive by server, use call_tool_destructive"
    assert invalid.is_error and proxy_meta(invalid)["code"] == "PROXY.INVALID_ARGUMENTS"
    assert '"content" is a required property' in text_of(invalid), text_of(invalid)
    assert not written.is_error, text_of(written)
    assert new.read_text() == "written"
    assert denied.is_error and proxy_meta(denied)["code"] == "PROXY.TOOL_DENIED"
    assert 'servers[fs].tools.deny[0] "move_file"' in text_of(denied)
    assert not (workspace / "moved.txt").exists()
    # Upstream side: exactly the forwarded calls arrived.
    assert recorded_calls(stdin_log) == ["read_text_file", "create_directory", "write_file"]
    records = proxy.audit(at_least=8)
    assert [r["decision"] for r in records] == [
        "allowed", "allowed", "intent_mismatch", "allowed", "intent_mismatch", "invalid_arguments", "allowed", "denied"]
    assert records[2]["rule"] == 'policy.toolMode "intent" (servers[fs]: "create_directory" has readOnlyHint: false: use call_tool_write)'
    assert [r["intent"]["variant"] for r in records[1:]] == [
        "call_tool_read", "call_tool_read", "call_tool_write", "call_tool_write",
        "call_tool_destructive", "call_tool_destructive", "call_tool_destructive"]


async def test_max_risk_still_hides_and_refuses(make_proxy, tools, tmp_path):
    calls = tmp_path / "calls.txt"
    proxy = make_proxy(intent_mode(own(tools, calls), maxRisk="write"))
    async with Client(proxy.url, mode="legacy") as client:
        found = await retrieve(client)
        hidden = await call(client, "destructive", "own__wipe", {"text": "x"}, "destructive")
        by_override = await call(client, "destructive", "own__retag", {"text": "x"}, "destructive")
    assert listed(found) == ["own__look", "own__plain", "own__note"]
    assert hidden.is_error and proxy_meta(hidden)["code"] == "PROXY.TOOL_DENIED"
    assert 'policy.maxRisk "write" (servers[own]: the tool is destructive)' in text_of(hidden), text_of(hidden)
    assert by_override.is_error and proxy_meta(by_override)["code"] == "PROXY.TOOL_DENIED"
    assert received(calls) == []


async def test_rate_limits_and_direct_names_and_bad_arguments(make_proxy, tools, tmp_path):
    """The underlying tool's rate limit holds whichever call tool is used; calling a tool by its
    own name would skip the intent and is refused; the four tools' own arguments are checked."""
    calls = tmp_path / "calls.txt"
    proxy = make_proxy(intent_mode(own(tools, calls, rateLimit={"tools": {"look": {"perMinute": 1, "burst": 1}}})))
    async with Client(proxy.url, mode="legacy") as client:
        first = await call(client, "read", "own__look", {"text": "one"}, "read")
        limited = await call(client, "destructive", "own__look", {"text": "two"}, "destructive")
        direct = await client.call_tool("own__plain", {"text": "x"})
        misplaced = await client.call_tool("call_tool_write", {"name": "own__plain", "arguments": {"text": "x"}, "intent": {"operation_type": "write"}})
        bad_value = await call(client, "write", "own__plain", {"text": "x"}, "delete")
        bad_limit = await client.call_tool("retrieve_tools", {"query": "look", "limit": 500})
    assert text_of(first) == "look: one"
    assert limited.is_error and proxy_meta(limited)["code"] == "PROXY.RATE_LIMITED", text_of(limited)
    assert direct.is_error and proxy_meta(direct)["code"] == "PROXY.INTENT_REQUIRED"
    assert text_of(direct).startswith('tool "own__plain" is not called by its name in intent mode'), text_of(direct)
    assert misplaced.is_error and proxy_meta(misplaced)["code"] == "PROXY.INVALID_ARGUMENTS"
    assert 'unknown field "arguments": the tool\'s arguments go in "args"' in text_of(misplaced)
    assert 'intent.operation_type must be "read", "write" or "destructive" ("write" for call_tool_write), not "delete"' in text_of(bad_value)
    assert bad_limit.is_error and "limit must be a whole number from 1 to 100, not 500" in text_of(bad_limit)
    assert received(calls) == ["look"]
    records = proxy.audit(at_least=6)
    assert [r["decision"] for r in records] == [
        "allowed", "rate_limited", "intent_required", "invalid_arguments", "invalid_arguments", "invalid_arguments"]
    assert records[4]["intent"] == {"variant": "call_tool_write", "operation_type": "delete"}


async def test_a_grant_is_not_announced_and_retrieve_tools_sees_it_at_once(make_proxy, tools, tmp_path):
    calls = tmp_path / "calls.txt"

    def config(version: int, allow: list[str], tool_mode: str = "intent") -> dict:
        return {"contextVersion": version, "policy": {"toolMode": tool_mode}, "servers": [own(tools, calls, tools={"allow": allow})]}

    proxy = make_proxy(config(1, ["look"]))
    notified: list = []

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            notified.append(message)

    async with Client(proxy.url, mode="legacy", message_handler=on_message) as client:
        assert names(await client.list_tools()) == FOUR
        assert listed(await retrieve(client)) == ["own__look"]
        proxy.swap(config(2, ["look", "plain"]))
        await await_for(lambda: proxy.tools()["contextVersion"] == 2, what="contextVersion 2")
        # The next retrieve_tools has the grant; the four tools are the same.
        assert listed(await retrieve(client)) == ["own__look", "own__plain"]
        assert text_of(await call(client, "write", "own__plain", {"text": "granted"}, "write")) == "plain: granted"
        assert names(await client.list_tools()) == FOUR
        # Back to direct mode: the tools on offer change, and that is announced. The session's
        # stream is ordered, so a notification for the grant would have come first.
        proxy.swap(config(3, ["look", "plain"], tool_mode="direct"))
        await await_for(lambda: notified, what="list_changed for the change of mode")
        assert len(notified) == 1, notified
        assert names(await client.list_tools()) == ["own__look", "own__plain"]
    assert received(calls) == ["plain"]
    assert proxy.metric("mcp_proxy_list_changed_notifications_total", kind="tools") == 1


async def test_retrieve_tools_starts_servers_itself_and_names_one_that_fails(make_proxy, tools, tmp_path):
    broken = {"name": "broken", "stdio": {"command": str(tmp_path / "no-such-server")}}
    proxy = make_proxy(intent_mode(own(tools, tmp_path / "calls.txt"), broken))
    async with Client(proxy.url, mode="2026-07-28") as client:
        assert names(await client.list_tools()) == FOUR
        assert proxy.children() == []
        found = await retrieve(client, query="look")
    assert listed(found) == ["own__look"]
    assert len(found["unavailable"]) == 1 and '"broken"' in found["unavailable"][0], found["unavailable"]


@BOTH
async def test_direct_mode_is_unchanged(make_proxy, tools, tmp_path, mode):
    calls = tmp_path / "calls.txt"
    proxy = make_proxy({"policy": {"toolMode": "direct"}, "servers": [own(tools, calls)]})
    async with Client(proxy.url, mode=mode) as client:
        offered = names(await client.list_tools())
        answer = await client.call_tool("own__wipe", {"text": "x"})
        search = await client.call_tool("retrieve_tools", {})
    assert offered == sorted(f"own__{t}" for t in CALL_WITH)
    assert text_of(answer) == "wipe: x"
    assert search.is_error and proxy_meta(search)["code"] == "PROXY.UNKNOWN_TOOL"
    assert received(calls) == ["wipe"]
    records = proxy.audit(at_least=2)
    assert all("intent" not in r for r in records), records
