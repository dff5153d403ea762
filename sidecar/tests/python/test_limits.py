"""What a client sends never becomes unbounded state in the proxy: sessions are capped (over the
cap `initialize` gets a clear JSON-RPC error), request headers must arrive in time (slowloris),
bodies are limited, and the names a client makes up are clipped in audit lines, log lines and
metric labels."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from conftest import RAW_HEADERS, RAW_INIT, raw_exchange, raw_session, tool_call, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def everything(t) -> dict:
    return {"name": "every", "stdio": t.everything_stdio()}


def mcp_error(e: BaseException) -> MCPError:
    """The MCPError in what the SDK raised (it may come wrapped in exception groups)."""
    if isinstance(e, MCPError):
        return e
    for inner in getattr(e, "exceptions", ()):
        try:
            return mcp_error(inner)
        except AssertionError:
            pass
    raise AssertionError(f"no MCPError in {e!r}")


async def test_sessions_are_capped_with_a_clear_json_rpc_error(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]}, extra_args=["--max-sessions", "2"])
    first, second = raw_session(proxy), raw_session(proxy)

    status, messages, text = raw_exchange(proxy, RAW_HEADERS, {**RAW_INIT, "id": 9})
    assert status == 503, text
    assert messages[0]["id"] == 9
    assert messages[0]["error"]["data"]["code"] == "PROXY.TOO_MANY_SESSIONS"
    # What a real client shows its user.
    with pytest.raises(BaseException) as refused:
        async with Client(proxy.url, mode="legacy"):
            pass
    assert "too many client sessions (the limit is 2)" in mcp_error(refused.value).message
    # 2026-07-28 requests open no session: still served.
    async with Client(proxy.url, mode="2026-07-28") as modern:
        assert (await modern.list_tools()).tools

    # The sessions that exist work; once one ends, a new one may open.
    assert raw_exchange(proxy, first, tool_call("every__echo", {"message": "hi"}))[0] == 200
    delete = urllib.request.Request(proxy.url, method="DELETE", headers=second)
    with urllib.request.urlopen(delete, timeout=10):
        pass
    async with Client(proxy.url, mode="legacy") as client:
        assert (await client.list_tools()).tools


def test_a_client_that_sends_its_headers_slowly_is_cut_off(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]}, extra_args=["--header-read-timeout-seconds", "1"])
    slow = socket.create_connection(("127.0.0.1", proxy.port))
    silent = socket.create_connection(("127.0.0.1", proxy.port))
    slow.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    started = time.monotonic()
    for sock in (slow, silent):
        sock.settimeout(10)
        try:
            # Whatever the proxy answers, it then closes the connection.
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
        sock.close()
    assert time.monotonic() - started < 5, "a connection without complete headers was kept open"
    # Others are served meanwhile and afterwards.
    assert proxy.http("/healthz")[0] == 200


def test_a_body_over_the_limit_is_refused(make_proxy, tools):
    """Bodies over 4 MiB (the proxy's and rmcp's one limit) get 413, before they are read."""
    proxy = make_proxy({"servers": [everything(tools)]})
    headers = raw_session(proxy)
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {5 * 1024 * 1024}\r\n\r\n".encode())
        sock.sendall(b'{"jsonrpc":"2.0","id":2,')
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    assert raw_exchange(proxy, headers, tool_call("every__echo", {"message": "x" * (3 * 1024 * 1024)}), timeout=30)[0] == 200


def test_names_a_client_makes_up_are_clipped_in_audit_logs_and_metrics(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})
    long_client = {**RAW_INIT, "params": {**RAW_INIT["params"], "clientInfo": {"name": "c" * 50_000, "version": "1"}}}
    status, _, text = raw_exchange(proxy, RAW_HEADERS, long_client)
    assert status == 200, text
    headers = raw_session(proxy)
    name = "n" * 100_000
    status, messages, text = raw_exchange(proxy, headers, tool_call(name, id="i" * 10_000))
    result = messages[-1]["result"]
    assert result["isError"] and len(result["content"][0]["text"]) < 500
    for i in range(50):
        raw_exchange(proxy, headers, tool_call(f"made_up_{i}", id=100 + i))

    record = next(r for r in proxy.audit(at_least=51) if r["tool"].startswith("nnn"))
    assert len(record["tool"]) < 200 and len(record["requestId"]) < 200 and len(record["error"]) < 400, record
    assert len(json.dumps(record)) < 2000
    longest = max(len(line) for line in proxy.log().splitlines())
    assert longest < 2000, f"a log line of {longest} characters"
    series = [l for l in proxy.metrics().splitlines() if l.startswith("mcp_proxy_tool_calls_total{")]
    assert series == ['mcp_proxy_tool_calls_total{server="(none)",tool="(unknown)",outcome="tool_error"} 51'], series
