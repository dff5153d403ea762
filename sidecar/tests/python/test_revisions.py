"""What the proxy says about protocol revisions and replies it cannot read: the revision a
session is logged and audited under is the one it speaks (answered, not offered), and an HTTP
upstream whose reply is not MCP is reported as a protocol error quoting its bytes (bounded), not
as an exit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mcp import Client

from conftest import RAW_HEADERS, SUPPORT, free_port, raw_exchange, raw_post, tool_call

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def open_session(proxy, offered: str, name: str = "raw") -> tuple[dict, dict]:
    """An initialize-era session offering `offered`: the initialize result and the headers that
    use the session."""
    import urllib.request

    headers = dict(RAW_HEADERS)
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": offered, "capabilities": {}, "clientInfo": {"name": name, "version": "1"}},
    }
    request = urllib.request.Request(proxy.url, data=json.dumps(init).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
        headers["Mcp-Session-Id"] = response.headers["Mcp-Session-Id"]
    answer = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    result = (answer or [json.loads(text)])[-1]["result"]
    headers["Mcp-Protocol-Version"] = result["protocolVersion"]
    raw_post(proxy, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return result, headers


@pytest.fixture
def garbled():
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SUPPORT / "garbled_http_server.py"), str(port)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    yield f"http://127.0.0.1:{port}/mcp"
    server.kill()
    server.wait()


def test_a_reply_that_is_not_mcp_is_a_protocol_error_quoting_its_bytes(make_proxy, garbled):
    proxy = make_proxy({"servers": [{"name": "g", "http": {"url": garbled}}]})
    _, headers = open_session(proxy, "2025-11-25")

    status, messages, _ = raw_exchange(proxy, headers, tool_call("g__garble"))
    assert status == 200
    error = messages[-1]["error"]
    assert error["data"]["code"] == "PROXY.UPSTREAM_PROTOCOL", error
    assert "502 Bad Gateway" in error["message"], error
    assert "TAIL-NOT-QUOTED" not in error["message"] and len(error["message"]) < 1024, error
    # The upstream did not go anywhere: the next call reaches it again, with the same answer.
    status, messages, _ = raw_exchange(proxy, headers, tool_call("g__garble", id=3))
    assert messages[-1]["error"]["data"]["code"] == "PROXY.UPSTREAM_PROTOCOL"
    assert proxy.metric("mcp_proxy_upstream_exits_total", server="g") == 0
    record = proxy.audit()[0]
    assert record["outcome"] == "protocol_error" and "502 Bad Gateway" in record["error"], record


def test_a_client_offering_2026_07_28_in_initialize_is_logged_and_audited_as_2025_11_25(make_proxy, tools):
    proxy = make_proxy({"servers": [{"name": "every", "stdio": tools.everything_stdio()}]})
    answer, headers = open_session(proxy, "2026-07-28", name="eager")
    assert answer["protocolVersion"] == "2025-11-25", answer
    _, messages, _ = raw_exchange(proxy, headers, tool_call("every__echo", {"message": "hi"}))
    assert messages[-1]["result"]["content"][0]["text"] == "Echo: hi"

    opened = [line for line in proxy.log().splitlines() if "client session opened" in line and "eager" in line]
    assert opened and all("protocol=2025-11-25" in line for line in opened), opened
    assert all("offered=2026-07-28" in line for line in opened), opened
    record = proxy.audit()[0]
    assert record["protocol"] == "2025-11-25", record


async def test_audit_records_name_the_revision_of_each_call(make_proxy, tools):
    proxy = make_proxy({"servers": [{"name": "every", "stdio": tools.everything_stdio()}]})
    for mode in ["legacy", "2026-07-28"]:
        async with Client(proxy.url, mode=mode) as client:
            await client.call_tool("every__echo", {"message": mode})
    records = proxy.audit(at_least=2)
    assert [r["protocol"] for r in records] == ["2025-11-25", "2026-07-28"], records


def test_a_call_stream_of_a_session_is_primed_and_resumable(make_proxy, tools):
    """tools/call on an initialize-era session goes the one request path (rmcp's streamable HTTP
    service): its SSE stream opens with a priming event that carries an event id and a `retry`
    time, and every event has an id a client can resume from (Last-Event-ID)."""
    proxy = make_proxy({"servers": [{"name": "every", "stdio": tools.everything_stdio()}]})
    _, headers = open_session(proxy, "2025-11-25")
    status, messages, text = raw_exchange(proxy, headers, tool_call("every__echo", {"message": "x"}))
    assert status == 200 and messages[-1]["result"]["content"][0]["text"] == "Echo: x", text
    events = [e for e in text.split("\n\n") if e.strip()]
    first = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in events[0].splitlines())
    assert first.get("data", "") == "" and first.get("id") and first.get("retry", "").isdigit(), events[0]
    assert all("\nid: " in "\n" + e for e in events), events


async def test_a_server_that_lists_different_tools_to_each_revision_is_listed_to_each_as_directly(make_proxy, tools):
    """The conformance fixture offers its server-to-client tools only to initialize-era sessions
    and its input_required ones only at 2026-07-28. Through one proxy, after a client of the
    other revision had its list, each revision's client sees what it sees directly, and a call to
    the other revision's tool is refused as unknown, never forwarded."""
    from mcp import StdioServerParameters

    fixture = StdioServerParameters(command=str(tools.python), args=[str(SUPPORT / "conformance_server.py"), "--stdio"])
    direct = {}
    for mode in ("legacy", "2026-07-28"):
        async with Client(fixture, mode=mode) as client:
            direct[mode] = sorted(t.name for t in (await client.list_tools()).tools)
    assert "test_sampling" in direct["legacy"] and "test_sampling" not in direct["2026-07-28"]
    assert "test_missing_capability" in direct["2026-07-28"] and "test_missing_capability" not in direct["legacy"]

    spec = {"command": fixture.command, "args": fixture.args}
    proxy = make_proxy({"toolPrefix": "none", "servers": [{"name": "fixture", "stdio": spec}]})
    async with Client(proxy.url, mode="legacy") as client:
        assert sorted(t.name for t in (await client.list_tools()).tools) == direct["legacy"]
    # A 2026-07-28 client that calls without listing first: the legacy list stands in for its
    # own until that is known, and decides nothing: its own list is fetched first.
    async with Client(proxy.url, mode="2026-07-28") as client:
        refused = await client.call_tool("test_sampling", {"prompt": "hi"})
        assert refused.is_error and "unknown tool" in "".join(c.text for c in refused.content), refused
        done = await client.call_tool("test_logging_tool", {})
        assert "Logging evaluated" in "".join(c.text for c in done.content), done
    for mode in ("legacy", "2026-07-28", "legacy"):
        async with Client(proxy.url, mode=mode) as client:
            assert sorted(t.name for t in (await client.list_tools()).tools) == direct[mode], mode
            other = "test_missing_capability" if mode == "legacy" else "test_sampling"
            refused = await client.call_tool(other, {})
            assert refused.is_error and "unknown tool" in "".join(c.text for c in refused.content), refused
    # One process per revision, each started once.
    assert proxy.metric("mcp_proxy_upstream_starts_total", server="fixture", reason="tools_list") == 2
