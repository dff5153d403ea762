"""Audit lines group an agent's calls: every record carries a `client` identity derived from the
declared clientInfo and the task, stable although a 2026-07-28 client makes each request its own
session. Upstream: server-everything; clients: the Python SDK."""

from __future__ import annotations

import mcp_types as types
import pytest
from mcp import Client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_audit_records_name_the_client_across_sessions(make_proxy, tools):
    proxy = make_proxy({"servers": [{"name": "every", "stdio": tools.everything_stdio()}]})
    clients = [
        ("a", "2026-07-28", types.Implementation(name="agent-a", version="1.0"), 3),
        ("b", "2026-07-28", types.Implementation(name="agent-b", version="1.0"), 2),
        # The same program as "a", over the initialize lifecycle.
        ("legacy", "legacy", types.Implementation(name="agent-a", version="1.0"), 2),
    ]
    for _, mode, info, calls in clients:
        async with Client(proxy.url, mode=mode, client_info=info) as client:
            for i in range(calls):
                await client.call_tool("every__get-sum", {"a": i, "b": 0})
    # One call at a time, so the lines are in call order.
    records = proxy.audit(at_least=7)
    assert len(records) == 7, records
    a, b, legacy = records[0:3], records[3:5], records[5:7]

    # One 2026-07-28 client: a new session per request, one and the same client identity.
    assert len({r["session"] for r in a}) == 3, a
    assert len({r["client"] for r in a}) == 1, a
    assert a[0]["client"].startswith("agent-a/1.0#"), a[0]
    # Another client program gets another identity.
    assert len({r["client"] for r in b}) == 1 and b[0]["client"] != a[0]["client"], b
    assert b[0]["client"].startswith("agent-b/1.0#"), b[0]
    # An initialize-era session keeps its session id, and names its client the same way.
    assert len({r["session"] for r in legacy}) == 1 and legacy[0]["session"] not in {r["session"] for r in a}, legacy
    assert legacy[0]["client"] == a[0]["client"], legacy
