"""An upstream's stderr is drained whatever it contains: bytes that are not UTF-8 do not make the
proxy close the pipe (a child with default SIGPIPE would die on its next write), a line of 200 MB
without a newline costs bounded memory, and what is copied into the proxy's log is rate-limited.
Upstreams: support/faulty_server.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import faulty, raw_exchange, raw_session, tool_call

pytestmark = pytest.mark.usefixtures("kill_recorded")


def pong(proxy, headers, id: int) -> None:
    status, messages, text = raw_exchange(proxy, headers, tool_call("f__ping", id=id), timeout=30)
    assert status == 200 and messages and "result" in messages[-1], text
    assert messages[-1]["result"]["content"][0]["text"] == "pong"


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_stderr_that_is_not_utf8_does_not_break_the_upstream(make_proxy, tools, tmp_path):
    proxy = make_proxy({"servers": [{"name": "f", "stdio": faulty(tools, "stderr-garbage", pids=tmp_path / "pids")}]})
    headers = raw_session(proxy)
    # Every ping writes to stderr: the server lives only while the proxy keeps reading it.
    for id in range(2, 6):
        pong(proxy, headers, id)
    assert proxy.metric("mcp_proxy_upstream_exits_total", server="f") == 0
    assert "starting \ufffd\ufffd not utf-8 \ufffd" in proxy.log()


def test_a_huge_stderr_line_costs_bounded_memory_and_the_log_is_rate_limited(make_proxy, tools, tmp_path):
    # 200 MiB without a newline, then 5,000 short lines, then the server serves.
    spec = faulty(tools, "stderr-flood", "200", "5000", pids=tmp_path / "pids")
    proxy = make_proxy({"servers": [{"name": "f", "stdio": spec}]}, extra_args=["--start-timeout-seconds", "120"])
    headers = raw_session(proxy)
    pong(proxy, headers, 2)
    peak = peak_rss_kib(proxy.pid)
    assert peak < 64 * 1024, f"the proxy's peak RSS was {peak} KiB"
    log = proxy.log()
    assert "more bytes of this line not kept" in log
    copied = log.count("noise line")
    assert 0 < copied < 1000, f"{copied} of 5000 stderr lines copied into the log"
    assert "dropping lines until it slows down" in log
