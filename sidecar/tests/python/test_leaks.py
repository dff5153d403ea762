"""No upstream process outlives its purpose: a start that times out takes its process group
with it, retries do not pile up children, `/tools` reports no pid for a server that is not
running, a proxy killed with SIGKILL leaves nothing behind, and stopping a server (shutdown,
reload) does not wait behind a start in progress. Upstreams: support/faulty_server.py."""

from __future__ import annotations

import http.client
import signal
import threading
import time

import pytest

from conftest import alive, faulty, raw_exchange, raw_session, recorded_pids, tool_call, wait_for


pytestmark = pytest.mark.usefixtures("kill_recorded")


def all_gone(pids: list[int]) -> bool:
    return bool(pids) and not any(alive(p) for p in pids)


def test_a_start_that_times_out_kills_its_process_group_and_retries_do_not_pile_up(make_proxy, tools, tmp_path):
    pids = tmp_path / "pids"
    proxy = make_proxy(
        {"servers": [{"name": "stuck", "stdio": faulty(tools, "hang", pids=pids)}]},
        extra_args=["--start-timeout-seconds", "1"],
    )
    headers = raw_session(proxy)
    for attempt in range(3):
        status, messages, text = raw_exchange(proxy, headers, tool_call("stuck__ping", id=10 + attempt), timeout=30)
        assert status == 200 and messages, text
        error = messages[-1]["error"]
        assert error["data"]["code"] in ("PROXY.UPSTREAM_START_FAILED", "PROXY.UPSTREAM_BACKOFF"), error
        # The server and its helper (same process group) are gone once the start gave up.
        started = recorded_pids(pids)
        assert len(started) == 2 * (attempt + 1), f"attempt {attempt}: {started}"
        wait_for(lambda: all_gone(started), timeout=10, what="every process of the failed starts to be gone")
        server = next(s for s in proxy.tools()["servers"] if s["name"] == "stuck")
        assert server["pid"] is None and server["state"] != "running", server
    assert proxy.children() == []


def test_a_proxy_killed_with_sigkill_leaves_no_upstream_behind(make_proxy, tools, tmp_path):
    working, stuck = tmp_path / "working-pids", tmp_path / "stuck-pids"
    proxy = make_proxy(
        {
            "servers": [
                # Serves; its helper ignores SIGTERM and never reads stdin.
                {"name": "h", "stdio": faulty(tools, "helper", pids=working)},
                # Never finishes its handshake and ignores stdin EOF.
                {"name": "stuck", "stdio": faulty(tools, "hang", pids=stuck)},
            ]
        },
        extra_args=["--start-timeout-seconds", "60"],
    )
    headers = raw_session(proxy)
    status, messages, text = raw_exchange(proxy, headers, tool_call("h__ping"))
    assert messages[-1]["result"]["content"][0]["text"] == "pong", text
    # A start in progress when the proxy dies (its connection breaks then: no answer to check).
    def doomed_call() -> None:
        try:
            raw_exchange(proxy, headers, tool_call("stuck__ping", id=3), timeout=60)
        except (OSError, http.client.HTTPException):
            pass

    threading.Thread(target=doomed_call, daemon=True).start()
    wait_for(lambda: len(recorded_pids(stuck)) == 2, what="the stuck server and its helper to run")
    everything = recorded_pids(working) + recorded_pids(stuck)
    assert all(alive(p) for p in everything)

    proxy.process.send_signal(signal.SIGKILL)
    proxy.process.wait(timeout=10)
    wait_for(lambda: all_gone(everything), timeout=10, what="every upstream process to be gone after the proxy's SIGKILL")


def test_stopping_a_server_does_not_wait_behind_its_start(make_proxy, tools, tmp_path):
    """A config change that removes a server, and SIGTERM, while that server's start is in
    progress (a start timeout of 120 s): the processes go at once and the proxy exits promptly."""
    reload_pids, term_pids = tmp_path / "reload-pids", tmp_path / "term-pids"
    config = {"servers": [{"name": "stuck", "stdio": faulty(tools, "hang", pids=reload_pids)}]}
    proxy = make_proxy(config, extra_args=["--start-timeout-seconds", "120", "--shutdown-grace-seconds", "1"])
    headers = raw_session(proxy)
    answers: list[dict] = []

    def call(id: int) -> None:
        messages = raw_exchange(proxy, headers, tool_call("stuck__ping", id=id), timeout=150)[1]
        answers.append(messages[-1] if messages else {})

    caller = threading.Thread(target=call, args=(3,), daemon=True)
    caller.start()
    wait_for(lambda: len(recorded_pids(reload_pids)) == 2, what="the first start to be under way")
    # Reload: the server's spec changes (so the running start is for a server no longer wanted).
    proxy.swap({"servers": [{"name": "stuck", "stdio": faulty(tools, "hang", pids=term_pids)}]})
    wait_for(lambda: all_gone(recorded_pids(reload_pids)), timeout=10, what="the replaced server's processes to go")

    # SIGTERM while the new spec's start is under way.
    caller.join(timeout=15)
    assert answers[0]["error"]["data"]["code"] == "PROXY.UPSTREAM_STOPPED", answers
    caller = threading.Thread(target=call, args=(4,), daemon=True)
    caller.start()
    wait_for(lambda: len(recorded_pids(term_pids)) == 2, what="the second start to be under way")
    signalled = time.monotonic()
    proxy.process.send_signal(signal.SIGTERM)
    assert proxy.process.wait(timeout=30) == 0
    assert time.monotonic() - signalled < 10, "shutdown waited behind the start"
    assert all_gone(recorded_pids(term_pids))
    caller.join(timeout=10)
