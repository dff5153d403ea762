"""Audit lines group an agent's calls: every record carries a `client` identity derived from the
declared clientInfo and the task, stable although a 2026-07-28 client makes each request its own
session; and GET /audit answers the recent records, filtered. Upstream: server-everything and the
filesystem server; clients: the Python SDK."""

from __future__ import annotations

import json
import urllib.parse

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


def get_audit(proxy, **params) -> tuple[int, dict]:
    status, body = proxy.http("/audit?" + urllib.parse.urlencode(params))
    return status, json.loads(body)


async def test_get_audit_returns_exactly_the_records_each_filter_matches(make_proxy, tools, tmp_path):
    """GET /audit against real servers: allowed, denied (by a glob and by maxRisk), rate-limited
    and unknown calls; each filter answers exactly the audit file's records that match it, newest last."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello")
    proxy = make_proxy(
        {
            "policy": {"maxRisk": "write"},
            "servers": [
                {"name": "fs", "stdio": {"command": str(tools.node), "args": [str(tools.filesystem), str(workspace)]}, "tools": {"allow": ["*"]}},
                {"name": "every", "stdio": tools.everything_stdio(), "tools": {"allow": ["get-sum", "echo"], "deny": ["get-env"]},
                 "rateLimit": {"tools": {"echo": {"perMinute": 1, "burst": 1}}}},
            ],
        }
    )
    async with Client(proxy.url, mode="2026-07-28") as client:
        first = [
            ("fs__read_text_file", {"path": str(workspace / "hello.txt")}),
            ("fs__write_file", {"path": str(workspace / "no.txt"), "content": "no"}),  # destructive: denied
            ("every__get-sum", {"a": 1, "b": 2}),
        ]
        for name, arguments in first:
            await client.call_tool(name, arguments)
        mid = proxy.audit(at_least=3)[-1]["ts"]
        second = [
            ("every__get-env", {}),  # denied by the glob
            ("fs__create_directory", {"path": str(workspace / "made")}),
            ("nobody__x", {}),  # no such server: unknown
            ("every__echo", {"message": "hi"}),
            ("every__echo", {"message": "again"}),  # over its rate limit: a decision added after GET /audit
        ]
        for name, arguments in second:
            await client.call_tool(name, arguments)
    written = proxy.audit(at_least=8)
    assert [r["tool"] for r in written] == [n for n, _ in first + second]

    def expect(params: dict, predicate, tools_expected: list[str]) -> None:
        status, body = get_audit(proxy, **params)
        assert status == 200, body
        want = [r for r in written if predicate(r)]
        assert body["records"] == want, params
        assert [r["tool"] for r in body["records"]] == tools_expected, params
        assert body["dropped"] == 0

    expect({}, lambda r: True, [n for n, _ in first + second])
    expect({"decision": "denied"}, lambda r: r["decision"] == "denied", ["fs__write_file", "every__get-env"])
    expect({"decision": "allowed"}, lambda r: r["decision"] == "allowed",
           ["fs__read_text_file", "every__get-sum", "fs__create_directory", "every__echo"])
    expect({"decision": "unknown"}, lambda r: r["decision"] == "unknown", ["nobody__x"])
    expect({"decision": "rate_limited"}, lambda r: r["decision"] == "rate_limited", ["every__echo"])
    expect({"risk": "destructive"}, lambda r: r.get("risk") == "destructive", ["fs__write_file"])
    expect({"risk": "read"}, lambda r: r.get("risk") == "read",
           ["fs__read_text_file", "every__get-sum", "every__get-env", "every__echo", "every__echo"])
    expect({"server": "fs"}, lambda r: r.get("server") == "fs",
           ["fs__read_text_file", "fs__write_file", "fs__create_directory"])
    # The name the client called, or the server's name for the tool.
    expect({"tool": "every__get-sum"}, lambda r: r["tool"] == "every__get-sum", ["every__get-sum"])
    expect({"tool": "write_file"}, lambda r: r.get("upstreamTool") == "write_file", ["fs__write_file"])
    expect({"server": "every", "decision": "denied"}, lambda r: r.get("server") == "every" and r["decision"] == "denied",
           ["every__get-env"])
    expect({"since": mid}, lambda r: written.index(r) >= 2, [first[-1][0]] + [n for n, _ in second])
    expect({"since": "1h"}, lambda r: True, [n for n, _ in first + second])
    status, body = get_audit(proxy, limit=2)
    assert status == 200 and body["records"] == written[-2:] and body["matched"] == 8, body

    # Bad parameters: 400 naming the parameter and what it takes.
    for params, parameter, says in [
        ({"since": "yesterday"}, "since", "RFC 3339"),
        ({"limit": "0"}, "limit", "positive whole number"),
        ({"limit": "lots"}, "limit", "positive whole number"),
        ({"decison": "denied"}, "decison", "accepted: decision, risk, server, tool, since, limit"),
    ]:
        status, body = get_audit(proxy, **params)
        assert status == 400, (params, body)
        assert body["parameter"] == parameter and parameter in body["error"] and says in body["error"], body
    # Like /tools, not for other web pages.
    status, _ = proxy.http("/audit", headers={"Host": "evil.example"})
    assert status == 403
