"""Upstream lifecycle through the proxy: concurrency, timeouts, start failures, crash/restart
without zombies, and SIGTERM with calls in flight and with a child that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from conftest import alive, await_for, descendants, faulty, raw_exchange, raw_session, recorded_pids, tool_call, wait_for

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


def everything(t, **extra) -> dict:
    return {"name": "every", "stdio": t.everything_stdio(), **extra}


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@BOTH
async def test_concurrent_calls_do_not_wait_for_each_other(make_proxy, tools, mode):
    proxy = make_proxy({"servers": [everything(tools)]})
    async with Client(proxy.url, mode=mode) as client:
        await client.call_tool("every__echo", {"message": "start it"})
        slow_done = anyio.Event()

        async def slow():
            await client.call_tool("every__trigger-long-running-operation", {"duration": 4, "steps": 4})
            slow_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await await_for(lambda: proxy.tools()["servers"][0]["callsInFlight"] == 1, what="the slow call")
            # Same upstream, same session: the quick call is answered while the slow one runs.
            quick = await client.call_tool("every__echo", {"message": "meanwhile"})
            assert text_of(quick) == "Echo: meanwhile"
            assert not slow_done.is_set(), "the quick call had to wait for the slow one"
        assert slow_done.is_set()


async def test_a_hung_call_times_out_and_the_proxy_carries_on(make_proxy, tools):
    proxy = make_proxy({"callTimeoutSeconds": 2, "servers": [everything(tools)]})

    async def never_answers(context, params):
        await anyio.sleep_forever()

    async with Client(proxy.url, mode="legacy", elicitation_callback=never_answers) as client:
        # The server waits for the client's elicitation answer, which never comes, and sends no
        # progress: for the proxy the call hangs.
        with pytest.raises(MCPError) as hung:
            await client.call_tool("every__trigger-elicitation-request", {})
        assert "did not answer within 2s" in hung.value.message
        assert hung.value.error.data["code"] == "PROXY.UPSTREAM_TIMEOUT"
        assert text_of(await client.call_tool("every__echo", {"message": "next"})) == "Echo: next"
    timeouts = [r for r in proxy.audit(at_least=2) if r["tool"] == "every__trigger-elicitation-request"]
    assert timeouts[0]["outcome"] == "protocol_error"


async def test_a_call_the_client_gives_up_on_ends_at_once(make_proxy, tools):
    """The SDK sends notifications/cancelled when it stops waiting for a call; the proxy ends the
    call then (and tells the upstream), not when the upstream would have finished."""
    proxy = make_proxy({"servers": [everything(tools)]})
    async with Client(proxy.url, mode="legacy") as client:
        started = time.monotonic()
        with pytest.raises(MCPError) as abandoned:
            await client.call_tool(
                "every__trigger-long-running-operation", {"duration": 30, "steps": 30}, read_timeout_seconds=0.5
            )
        assert "timed out" in abandoned.value.message.lower()
        await await_for(
            lambda: proxy.tools()["servers"][0]["callsInFlight"] == 0, timeout=10, what="the proxy to end the call"
        )
        assert time.monotonic() - started < 15, "the call ran until the upstream finished it"
        assert text_of(await client.call_tool("every__echo", {"message": "after"})) == "Echo: after"
    records = [r for r in proxy.audit(at_least=2) if r["tool"] == "every__trigger-long-running-operation"]
    assert records[0]["outcome"] == "protocol_error"
    assert "cancelled by the client" in records[0]["error"]


async def test_a_server_that_cannot_start_is_reported_and_left_out(make_proxy, tools):
    crash = [
        str(tools.python),
        "-c",
        "import sys; sys.stderr.write('boom: DOCS_TOKEN is not set\\n'); sys.exit(3)",
    ]
    proxy = make_proxy(
        {"servers": [everything(tools), {"name": "broken", "stdio": {"command": crash[0], "args": crash[1:]}}]}
    )
    async with Client(proxy.url, mode="legacy") as client:
        listed = sorted(t.name for t in (await client.list_tools()).tools)
        assert listed and all(n.startswith("every__") for n in listed), "the healthy server is still listed"
        with pytest.raises(MCPError) as failed:
            await client.call_tool("broken__anything", {})
    message = failed.value.message
    # The call came right after the listing's failed start: inside the restart backoff it is not
    # started again, and the error says why it failed last and when to retry.
    assert 'upstream server "broken"' in message and ("could not be started" in message or "retry in" in message), message
    assert "exit status: 3" in message and "boom: DOCS_TOKEN is not set" in message
    assert proxy.metric("mcp_proxy_upstream_start_failures_total", server="broken") >= 1
    assert proxy.children() == [proxy.server_pid("every")]


async def test_a_crashed_server_is_restarted_and_reaped(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})
    async with Client(proxy.url, mode="legacy") as client:
        await client.call_tool("every__echo", {"message": "one"})
        first = proxy.server_pid("every")
        os.kill(first, signal.SIGKILL)
        await await_for(lambda: not os.path.exists(f"/proc/{first}"), what="the killed server to be reaped")
        assert text_of(await client.call_tool("every__echo", {"message": "two"})) == "Echo: two"
        second = proxy.server_pid("every")
        assert second != first and alive(second)
    zombies = [p for p in descendants(proxy.pid) if os.path.exists(f"/proc/{p}") and not alive(p)]
    assert zombies == []


async def test_sigterm_lets_calls_in_flight_finish(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})
    result = {}
    async with Client(proxy.url, mode="legacy") as client:
        await client.call_tool("every__echo", {"message": "start"})
        child = proxy.server_pid("every")

        async def slow():
            result["r"] = await client.call_tool(
                "every__trigger-long-running-operation", {"duration": 2, "steps": 2}
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await await_for(lambda: proxy.tools()["servers"][0]["callsInFlight"] == 1, what="the call")
            proxy.process.send_signal(signal.SIGTERM)
    assert "Long running operation completed" in text_of(result["r"])
    assert proxy.process.wait(timeout=30) == 0
    assert not os.path.exists(f"/proc/{child}")
    assert "waiting for calls in flight" in proxy.log()


async def test_a_child_ignoring_sigterm_is_killed_after_the_grace_time(make_proxy, tools):
    stubborn = [
        str(tools.python),
        "-c",
        # Serves MCP, and once its stdin closes hangs on "cleanup" with SIGTERM ignored.
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.call(sys.argv[1:]); time.sleep(3600)",
        str(tools.time),
    ]
    proxy = make_proxy(
        {"servers": [{"name": "stubborn", "stdio": {"command": stubborn[0], "args": stubborn[1:]}}]},
        extra_args=["--kill-grace-seconds", "1"],
    )
    async with Client(proxy.url, mode="legacy") as client:
        assert "UTC" in text_of(await client.call_tool("stubborn__get_current_time", {"timezone": "UTC"}))
    child = proxy.server_pid("stubborn")
    assert proxy.terminate() == 0
    assert not os.path.exists(f"/proc/{child}")
    assert "ignored SIGTERM; killing it" in proxy.log()


@BOTH
async def test_a_call_still_running_when_the_grace_runs_out_is_answered(make_proxy, tools, mode):
    """SIGTERM with --shutdown-grace-seconds 1 and a call that needs 30 s: the call gets a
    JSON-RPC error PROXY.SHUTTING_DOWN (not an empty answer), is audited, and the proxy exits."""
    proxy = make_proxy({"servers": [everything(tools)]}, extra_args=["--shutdown-grace-seconds", "1"])
    errors: list[MCPError] = []
    async with Client(proxy.url, mode=mode) as client:
        await client.call_tool("every__echo", {"message": "start"})

        async def slow():
            try:
                await client.call_tool("every__trigger-long-running-operation", {"duration": 30, "steps": 30})
            except MCPError as e:
                errors.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await await_for(lambda: proxy.tools()["servers"][0]["callsInFlight"] == 1, what="the call")
            proxy.process.send_signal(signal.SIGTERM)
    assert errors, "the call got no JSON-RPC error"
    assert errors[0].error.data["code"] == "PROXY.SHUTTING_DOWN", errors[0].error
    assert proxy.process.wait(timeout=30) == 0
    record = next(r for r in proxy.audit(at_least=2) if r["tool"] == "every__trigger-long-running-operation")
    assert record["outcome"] == "protocol_error" and record["error"] == "the proxy is shutting down"


@pytest.mark.usefixtures("kill_recorded")
def test_a_call_whose_server_is_still_starting_is_bounded_by_the_call_timeout(make_proxy, tools, tmp_path):
    """callTimeoutSeconds: 2 and a server that takes longer to start than that (it never finishes
    its handshake; the start timeout is 20 s): the call is answered after about 2 s."""
    pids = tmp_path / "pids"
    proxy = make_proxy(
        {"callTimeoutSeconds": 2, "servers": [{"name": "slow", "stdio": faulty(tools, "hang", pids=pids)}]},
        extra_args=["--start-timeout-seconds", "20"],
    )
    headers = raw_session(proxy)
    started = time.monotonic()
    status, messages, text = raw_exchange(proxy, headers, tool_call("slow__ping"), timeout=60)
    took = time.monotonic() - started
    error = messages[-1]["error"]
    assert error["data"]["code"] == "PROXY.UPSTREAM_TIMEOUT" and "within 2s" in error["message"], error
    assert took < 8, f"the call took {took:.1f}s"
    # The start goes on by itself (bounded by the start timeout), for the next call.
    assert all(alive(p) for p in recorded_pids(pids))
