"""HTTP hygiene of the front: one Host header, Host and Origin checked on every endpoint that
reveals something, JSON-RPC errors for bodies that are not messages, and no ERROR in the log when
a client simply ends its session."""

from __future__ import annotations

import json
import socket

import anyio
import pytest
from mcp import Client

from conftest import raw_exchange, raw_session

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def everything(t) -> dict:
    return {"name": "every", "stdio": t.everything_stdio()}


def raw_request(port: int, head: str, body: bytes = b"") -> int:
    """Sends a request written by hand; returns the status code."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + body)
        sock.settimeout(10)
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    return int(status_line.split()[1])


def test_a_request_with_two_host_headers_is_refused(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})
    two_hosts = "Host: 127.0.0.1\nHost: evil.example\n"
    assert raw_request(proxy.port, f"GET /tools HTTP/1.1\n{two_hosts}\n") == 400
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    head = (
        f"POST /mcp HTTP/1.1\n{two_hosts}Content-Type: application/json\n"
        f"Accept: application/json, text/event-stream\nContent-Length: {len(body)}\n\n"
    )
    assert raw_request(proxy.port, head, body) == 400
    assert raw_request(proxy.port, "GET /tools HTTP/1.1\nHost: 127.0.0.1\n\n") == 200


def test_tools_and_metrics_check_host_and_origin_like_mcp(make_proxy, tools):
    """A DNS-rebinding page must not read the task's servers, rules and pids, or its metrics."""
    proxy = make_proxy({"servers": [everything(tools)]})
    port = proxy.port
    for path in ("/tools", "/metrics"):
        assert proxy.http(path)[0] == 200
        assert proxy.http(path, {"Host": f"evil.example:{port}"})[0] == 403, path
        assert proxy.http(path, {"Origin": f"http://evil.example:{port}"})[0] == 403, path
        assert proxy.http(path, {"Origin": f"http://localhost:{port}"})[0] == 200, path
    # Health probes reveal nothing and stay open.
    assert proxy.http("/healthz", {"Host": "evil.example"})[0] == 200
    assert proxy.http("/readyz", {"Host": "evil.example"})[0] == 200


def test_bodies_that_are_not_messages_get_json_rpc_errors(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})
    headers = raw_session(proxy)

    status, messages, text = raw_exchange(proxy, headers, b'{"jsonrpc": "2.0", "id": 3, "method": ')
    assert status == 400 and messages[0]["error"]["code"] == -32700 and messages[0]["id"] is None, text

    # A request whose params do not fit its method is answered on its stream, like any JSON-RPC
    # error in a session; an unknown method likewise.
    bad_params = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": 5}}
    status, messages, text = raw_exchange(proxy, headers, bad_params)
    error = messages[-1]["error"]
    assert messages[-1]["id"] == 5 and error["code"] == -32602, text
    assert error["data"]["code"] == "PROXY.INVALID_PARAMS" and "tools/call" in error["message"]
    status, messages, text = raw_exchange(proxy, headers, {"jsonrpc": "2.0", "id": 8, "method": "no/such-method"})
    assert messages[-1]["error"]["code"] == -32601 and messages[-1]["error"]["data"]["code"] == "PROXY.UNKNOWN_METHOD", text

    status, messages, text = raw_exchange(proxy, headers, [1, 2, 3])
    assert status == 400 and messages[0]["error"]["code"] == -32600, text

    # Where rmcp decides before any JSON is read: a body that is not declared as JSON.
    status, _, _ = raw_exchange(proxy, {**headers, "Content-Type": "text/plain"}, {"jsonrpc": "2.0", "id": 6, "method": "ping"})
    assert status == 415
    # The session is fine afterwards.
    assert raw_exchange(proxy, headers, {"jsonrpc": "2.0", "id": 7, "method": "ping"})[0] == 200


async def test_a_client_ending_its_session_leaves_no_error_in_the_log(make_proxy, tools):
    """Claude Code ends every session with its listen stream open; that is no error."""
    proxy = make_proxy({"servers": [everything(tools)]})
    async with Client(proxy.url, mode="2026-07-28") as client:
        async with client.listen(tools_list_changed=True):
            assert (await client.list_tools()).tools
    async with Client(proxy.url, mode="legacy") as client:
        await client.call_tool("every__echo", {"message": "bye"})
    # Absence cannot be waited for: rmcp logged its error within milliseconds of the stream
    # closing; a second is ample.
    await anyio.sleep(1)
    errors = [line for line in proxy.log().splitlines() if " ERROR " in line]
    assert errors == []
