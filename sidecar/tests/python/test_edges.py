"""What a client or an upstream can make the proxy spend is bounded, and what the configuration
keeps out of the record stays out of it:

- argument validation has a budget: arguments that would take exponential time against a
  recursive schema are refused in bounded time, while `/healthz` and other clients are served;
- a server that exits at once is started no faster than the restart backoff, however many calls
  come, and a call inside the backoff gets a retryable error naming the time left;
- argument values an upstream echoes in its error stay out of the audit record and the log when
  `audit.includeArguments` is off.

Upstreams: support/edges_server.py (a recursive block schema, an error that quotes its
arguments) and support/faulty_server.py (`exit`)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import SUPPORT, HealthWatch, faulty, raw_exchange, raw_session, recorded_pids, tool_call, wait_for

pytestmark = pytest.mark.usefixtures("kill_recorded")


def edges(tools, calls: Path) -> dict:
    return {
        "name": "edges",
        "stdio": {"command": str(tools.python), "args": [str(SUPPORT / "edges_server.py")], "env": {"EDGES_CALLS": str(calls)}},
    }


def received(calls: Path) -> list[str]:
    return calls.read_text().split() if calls.exists() else []


def tree(levels: int, kind: str) -> dict:
    """A block nested `levels` deep, with a sibling at every level."""
    block: dict = {"kind": kind, "children": []}
    for _ in range(levels):
        block = {"kind": kind, "children": [block, {"kind": kind}]}
    return block


def test_arguments_too_costly_to_check_are_refused_in_bounded_time_and_others_are_served(make_proxy, tools, tmp_path):
    calls = tmp_path / "calls"
    proxy = make_proxy({"servers": [edges(tools, calls)]})
    headers = raw_session(proxy)
    # A shallow tree is checked in full, both ways.
    status, messages, text = raw_exchange(proxy, headers, tool_call("edges__write_blocks", {"root": tree(3, "paragraph")}, id=2))
    assert "wrote 7 blocks" in text, text
    status, messages, text = raw_exchange(proxy, headers, tool_call("edges__write_blocks", {"root": tree(3, "zzz")}, id=3))
    result = messages[-1]["result"]
    assert result["isError"] and "arguments.root" in result["content"][0]["text"], result

    # 40 levels: about 2 KiB of JSON, 3^40 evaluations for a validator without a budget.
    deep = tool_call("edges__write_blocks", {"root": tree(40, "zzz")}, id=4)
    assert len(json.dumps(deep, separators=(",", ":"))) < 2048
    other = raw_session(proxy)
    with HealthWatch(proxy.port) as health:
        answered = {}

        def call_deep() -> None:
            answered["deep"] = raw_exchange(proxy, headers, deep, timeout=60)

        worker = threading.Thread(target=call_deep)
        started = time.monotonic()
        worker.start()
        # Another client's call is answered meanwhile.
        _, _, text = raw_exchange(proxy, other, tool_call("edges__write_blocks", {"root": tree(2, "list")}, id=5))
        assert "wrote 5 blocks" in text, text
        worker.join(timeout=60)
        elapsed = time.monotonic() - started
    assert not worker.is_alive(), "the costly check never ended"
    _, messages, text = answered["deep"]
    result = messages[-1]["result"]
    assert result["isError"], result
    refusal = result["content"][0]["text"]
    assert "took more than its budget" in refusal and "less deeply nested" in refusal, refusal
    assert result["_meta"]["io.orchestrator/proxy"]["code"] == "PROXY.INVALID_ARGUMENTS"
    assert elapsed < 10, f"the refusal took {elapsed:.1f}s"
    print(f"during the costly check: {health.summary()}")
    health.assert_responsive()
    # The refused call never reached the server; the checked ones did.
    assert received(calls) == ["write_blocks", "write_blocks"], "the shallow valid tree and the other client's"
    record = [r for r in proxy.audit(at_least=4) if r["requestId"] == "4"][0]
    assert record["decision"] == "invalid_arguments", record


def test_a_server_that_exits_at_once_is_started_no_faster_than_the_backoff(make_proxy, tools, tmp_path):
    pids, times = tmp_path / "pids", tmp_path / "times"
    spec = faulty(tools, "exit", pids=pids)
    spec["env"]["FAULTY_TIMES"] = str(times)
    proxy = make_proxy({"servers": [{"name": "broken", "stdio": spec}]})
    headers = raw_session(proxy)
    backoffs = []
    for i in range(7):
        status, messages, text = raw_exchange(proxy, headers, tool_call("broken__anything", id=10 + i), timeout=30)
        error = messages[-1]["error"]
        code = error["data"]["code"]
        assert code in ("PROXY.UPSTREAM_START_FAILED", "PROXY.UPSTREAM_BACKOFF"), error
        if code == "PROXY.UPSTREAM_BACKOFF":
            # Retryable, with the time left.
            assert "retry in" in error["message"] and error["data"]["retryAfterSeconds"] > 0, error
            backoffs.append(error["data"]["retryAfterSeconds"])
    launches = [float(t) for t in times.read_text().split()]
    assert len(recorded_pids(pids)) == len(launches)
    # Seven calls in quick succession: each launch waited its backoff from the one before
    # (250 ms, doubling), whatever the number of calls and of revisions. Timed by the proxy's
    # log (when it started each), not by the children (whose interpreters start at their pace).
    starts = [
        datetime.fromisoformat(line.split()[0]).timestamp()
        for line in proxy.log().splitlines()
        if "starting upstream server" in line and "server=broken" in line
    ]
    assert len(starts) == len(launches), (starts, launches)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(launches) <= 3, f"{len(launches)} launches for 7 calls, gaps {gaps}"
    for n, gap in enumerate(gaps, start=1):
        assert gap >= 0.25 * 2 ** (n - 1) * 0.95, f"launch {n + 1} came {gap:.3f}s after the one before: {gaps}"
    assert backoffs, "no call landed inside the backoff"
    # The calls' starts did not leave processes behind.
    assert proxy.children() == []
    # Once the backoff has passed, the next call starts it again.
    wait_for(lambda: raw_exchange(proxy, headers, tool_call("broken__anything", id=99))[1][-1]["error"]["data"]["code"] == "PROXY.UPSTREAM_START_FAILED",
             timeout=20, interval=0.2, what="a start after the backoff")
    assert len(recorded_pids(pids)) == len(launches) + 1


def test_argument_values_an_upstream_echoes_stay_out_of_the_audit_and_the_log(make_proxy, tools, tmp_path):
    calls = tmp_path / "calls"
    secret = "ghp_s3cretT0kenValue0123456789"
    proxy = make_proxy({"servers": [edges(tools, calls)]})
    headers = raw_session(proxy)
    status, messages, text = raw_exchange(proxy, headers, tool_call("edges__lookup", {"token": secret}, id=7))
    error = messages[-1]["error"]
    # The client gets the upstream's answer unchanged (it sent the value itself).
    assert secret in error["message"], error
    assert received(calls) == ["lookup"]
    record = [r for r in proxy.audit() if r["requestId"] == "7"][0]
    assert record["outcome"] == "protocol_error", record
    assert "no record for the request" in record["error"] and "<redacted>" in record["error"], record
    assert secret not in json.dumps(record)
    wait_for(lambda: "tools/call failed" in proxy.log(), what="the failure in the log")
    assert secret not in proxy.log()

    # Where the configuration records arguments, the error is recorded as the upstream gave it.
    proxy.swap({"servers": [edges(tools, calls)], "audit": {"path": str(proxy.audit_path), "includeArguments": True}, "contextVersion": 2})
    wait_for(lambda: proxy.tools()["contextVersion"] == 2, what="the reload")
    raw_exchange(proxy, headers, tool_call("edges__lookup", {"token": secret}, id=8))
    record = [r for r in proxy.audit(at_least=2) if r["requestId"] == "8"][0]
    assert secret in record["error"] and record["arguments"] == {"token": secret}, record
    assert secret not in proxy.log(), "the log never carries argument values"
