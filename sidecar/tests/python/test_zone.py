"""Servers in their own containers (zones, docs/proxy.md "Zones"): `orchestrator-mcp-proxy zone`
holds a server's environment and starts its process when the proxy asks through a unix socket,
handing over its pipes. Here each zone is a process of its own (in a pod, a container of its own)
on a socket in the test's directory, and the proxy's config names that socket.

Shown: the start is lazy and through the zone, on both protocol revisions; the server gets the
zone's environment and nothing of the proxy's; a server that exits shows its stderr and status
in the proxy's error; a proxy killed with SIGKILL leaves no process in the zone; SIGTERM ends the
zone and its processes; a peer of another uid starts nothing; a zone that is not there is named
with where to look; bytes that are not the protocol are cut off while the proxy is served; the
protocol itself, spoken by hand."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import Client

from conftest import alive, descendants, faulty, raw_exchange, raw_session, recorded_pids, tool_call, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("kill_recorded")]

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


@dataclass
class Zone:
    process: subprocess.Popen
    socket: Path
    log_path: Path

    def children(self) -> list[int]:
        """The processes the zone runs now."""
        return [p for p in descendants(self.process.pid) if alive(p)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def make_zone(proxy_bin, tmp_path):
    """Starts `zone` processes for a server's stdio spec, each with only the env given (and
    PATH/HOME), as a zone container has only its own."""
    zones: list[Zone] = []

    def make(name: str, stdio: dict, env: dict | None = None, args: tuple = ()) -> Zone:
        directory = tmp_path / "zones" / name
        directory.mkdir(parents=True)
        path, log_path = directory / "mcp.sock", directory / "zone.log"
        command = [str(proxy_bin), "zone", "--socket", str(path), *args, "--", stdio["command"], *stdio.get("args", [])]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **(env or {})},
                stdout=log,
                stderr=log,
            )
        zone = Zone(process, path, log_path)
        zones.append(zone)
        wait_for(lambda: path.exists() or process.poll() is not None, what="the zone to listen")
        assert process.poll() is None, zone.log()
        return zone

    yield make
    for zone in zones:
        left = descendants(zone.process.pid)
        if zone.process.poll() is None:
            zone.process.kill()
            zone.process.wait()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def zoned(name: str, stdio: dict, zone: Zone) -> dict:
    """A server entry whose process runs in `zone` (command and args kept for display)."""
    return {"name": name, "stdio": {"command": stdio["command"], "args": stdio.get("args", []), "socket": str(zone.socket)}}


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def names(result) -> list[str]:
    return sorted(t.name for t in result.tools)


def call_error(proxy, tool: str, id: int = 2) -> dict:
    """A tools/call that fails: its JSON-RPC error."""
    messages = raw_exchange(proxy, raw_session(proxy), tool_call(tool, id=id), timeout=30)[1]
    assert messages and "error" in messages[-1], messages
    return messages[-1]["error"]


@BOTH
async def test_a_zoned_server_starts_lazily_in_its_zone_with_the_zones_env_only(make_zone, make_proxy, tools, tmp_path, mode):
    stdio = tools.everything_stdio()
    zone = make_zone("every", stdio, env={"ZONE_ONLY_SETTING": "from-the-zone"}, args=("--peer-uid", str(os.getuid())))
    config = {"servers": [zoned("every", stdio, zone)]}
    proxy_env = {"PROXY_ONLY_SECRET": "must-not-reach-the-server"}
    workdir = tmp_path / "proxy"
    # The first proxy learns (and caches) the tool list: the zone starts the server for it.
    first = make_proxy(config, workdir=workdir, env=proxy_env)
    assert zone.children() == [], "nothing starts with the proxy"
    async with Client(first.url, mode=mode) as client:
        assert "every__echo" in names(await client.list_tools())
        assert zone.children() and first.children() == [], "the zone ran the server, not the proxy"
    assert first.terminate() == 0
    wait_for(lambda: zone.children() == [], timeout=10, what="the stopped proxy's server to end in the zone")

    # The next proxy lists from its cache and starts nothing until a call needs the server.
    proxy = make_proxy(config, workdir=workdir, env=proxy_env)
    async with Client(proxy.url, mode=mode) as client:
        assert "every__echo" in names(await client.list_tools())
        assert zone.children() == [], "a cached list started a server"
        assert text_of(await client.call_tool("every__echo", {"message": "zoned"})) == "Echo: zoned"
        assert zone.children() == [proxy.server_pid("every")]
        env = json.loads(text_of(await client.call_tool("every__get-env", {})))
    assert env["ZONE_ONLY_SETTING"] == "from-the-zone"
    assert "PROXY_ONLY_SECRET" not in env and "MCP_PROXY_POD_NAME" not in env
    assert proxy.children() == []
    assert proxy.metric("mcp_proxy_upstream_starts_total", server="every", reason="tools_call") == 1
    log = zone.log()
    assert "zone listening" in log and "started the server" in log and "from-the-zone" not in log


def test_a_zoned_server_that_exits_shows_its_stderr_and_exit_status(make_zone, make_proxy, tools):
    stdio = faulty(tools, "exit")
    zone = make_zone("broken", stdio)
    proxy = make_proxy({"servers": [zoned("broken", stdio, zone)]})
    error = call_error(proxy, "broken__ping")
    assert error["data"]["code"] == "PROXY.UPSTREAM_START_FAILED", error
    assert "exited (exit status: 3)" in error["message"], error
    assert "last stderr line: cannot start: the configuration is broken" in error["message"], error
    wait_for(lambda: "status=exit status: 3" in zone.log(), what="the exit in the zone's log")
    assert zone.children() == []


def test_a_proxy_killed_with_sigkill_leaves_no_process_in_the_zone(make_zone, make_proxy, tools, tmp_path):
    pids = tmp_path / "pids"
    stdio = faulty(tools, "helper")  # its helper ignores SIGTERM
    zone = make_zone("h", stdio, env={"FAULTY_PIDS": str(pids)}, args=("--grace-seconds", "1"))
    proxy = make_proxy({"servers": [zoned("h", stdio, zone)]})
    messages = raw_exchange(proxy, raw_session(proxy), tool_call("h__ping"))[1]
    assert messages[-1]["result"]["content"][0]["text"] == "pong", messages
    started = recorded_pids(pids)
    assert len(started) == 2 and all(alive(p) for p in started)
    proxy.process.send_signal(signal.SIGKILL)
    proxy.process.wait(timeout=10)
    wait_for(lambda: not any(alive(p) for p in started), timeout=10, what="the server and its helper to end with the proxy")
    assert zone.process.poll() is None, "the zone serves on"
    assert "the proxy closed the connection; stopping the server" in zone.log()


def test_sigterm_ends_the_zone_and_its_processes_and_the_proxy_says_where_it_went(make_zone, make_proxy, tools, tmp_path):
    pids = tmp_path / "pids"
    stdio = faulty(tools, "helper")
    zone = make_zone("h", stdio, env={"FAULTY_PIDS": str(pids)}, args=("--grace-seconds", "1"))
    proxy = make_proxy({"servers": [zoned("h", stdio, zone)]})
    headers = raw_session(proxy)
    assert raw_exchange(proxy, headers, tool_call("h__ping"))[1][-1]["result"]["content"][0]["text"] == "pong"
    started = recorded_pids(pids)
    zone.process.send_signal(signal.SIGTERM)
    assert zone.process.wait(timeout=10) == 0
    wait_for(lambda: not any(alive(p) for p in started), timeout=5, what="the zone's processes to end")
    assert not zone.socket.exists(), "the zone removes its socket"
    assert "zone stopped" in zone.log()
    # The proxy saw the server go; its restart (after the backoff) finds no zone and says so.
    ids = iter(range(10, 1000))
    error = wait_for(
        lambda: (lambda e: e if e["data"]["code"] == "PROXY.UPSTREAM_START_FAILED" else None)(
            raw_exchange(proxy, headers, tool_call("h__ping", id=next(ids)))[1][-1]["error"]
        ),
        timeout=20,
        interval=0.2,
        what="a restart that fails",
    )
    assert f"is not accepting connections on {zone.socket} (No such file or directory)" in error["message"], error


def test_a_peer_of_another_uid_starts_nothing(make_zone, make_proxy, tools):
    stdio = tools.everything_stdio()
    zone = make_zone("every", stdio, args=("--peer-uid", str(os.getuid() + 1)))
    proxy = make_proxy({"servers": [zoned("every", stdio, zone)]})
    error = call_error(proxy, "every__echo")
    assert error["data"]["code"] == "PROXY.UPSTREAM_START_FAILED", error
    assert f"did not start the process: refused: peer uid {os.getuid()} may not start this server" in error["message"], error
    assert zone.children() == []
    assert "refused a connection" in zone.log()


def test_a_zone_that_is_not_there_is_named_with_where_to_look(make_proxy, tools, tmp_path):
    missing = tmp_path / "zones/git/mcp.sock"
    proxy = make_proxy(
        {"servers": [{"name": "git", "stdio": {"command": "mcp-server-git", "socket": str(missing)}}]},
        env={"MCP_PROXY_POD_NAME": "task-1001-x7k2p"},
    )
    error = call_error(proxy, "git__git_status")
    assert error["data"]["code"] == "PROXY.UPSTREAM_START_FAILED", error
    assert (
        f"server git's container is not accepting connections on {missing} (No such file or directory); "
        "its log: kubectl logs task-1001-x7k2p -c zone-git"
    ) in error["message"], error
    assert proxy.children() == []


def exchange(path: Path, data: bytes) -> bytes:
    """Sends `data` on a new connection and reads until the zone closes it."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(path))
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the zone stopped reading and closed: what is read below says why
        received = b""
        while True:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received


def test_bytes_that_are_not_the_protocol_are_cut_off_and_the_proxy_is_served(make_zone, make_proxy, tools):
    stdio = tools.everything_stdio()
    zone = make_zone("every", stdio)
    endless = exchange(zone.socket, b"x" * (1 << 20))
    assert b'"event":"error"' in endless and b"a line longer than 4096 bytes" in endless, endless
    garbage = exchange(zone.socket, b"\x00\xff garbage\n")
    assert b"not a JSON line" in garbage, garbage
    newer = exchange(zone.socket, b'{"op":"start","v":99}\n')
    assert b"protocol version 99 is not spoken here (this end speaks 1)" in newer, newer
    strange = exchange(zone.socket, b'{"op":"exec","v":1,"command":"sh"}\n')
    assert b"not a message of the zone protocol" in strange, strange
    with socket.socket(socket.AF_UNIX) as silent:
        # A peer that says nothing holds its own connection only.
        silent.connect(str(zone.socket))
        proxy = make_proxy({"servers": [zoned("every", stdio, zone)]})
        messages = raw_exchange(proxy, raw_session(proxy), tool_call("every__echo", {"message": "still here"}))[1]
        assert messages[-1]["result"]["content"][0]["text"] == "Echo: still here", messages
        assert zone.children() == [proxy.server_pid("every")], "nothing but the proxy's start ran"
    assert zone.process.poll() is None


def test_the_protocol_by_hand(make_zone, tools):
    """The documented exchange: a start, the three pipes with the pid, MCP over them, a signal,
    the exit status, the end of the connection."""
    zone = make_zone("every", tools.everything_stdio())
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(zone.socket))
        s.sendall(b'{"op":"start","v":1}\n')
        data, fds, _, _ = socket.recv_fds(s, 4096, 8)
        line, _, rest = data.partition(b"\n")
        started = json.loads(line)
        assert started["event"] == "started" and started["v"] == 1 and len(fds) == 3, (started, fds)
        assert zone.children() == [started["pid"]]
        with open(fds[0], "wb", buffering=0) as stdin, open(fds[1], "rb") as stdout, open(fds[2], "rb"):
            initialize = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "by-hand", "version": "1"}},
            }
            stdin.write(json.dumps(initialize).encode() + b"\n")
            answer = json.loads(stdout.readline())
            assert answer["id"] == 1 and "serverInfo" in answer["result"], answer
            s.sendall(b'{"op":"signal","signal":"kill"}\n')
            while not rest.endswith(b"\n") or b"exit" not in rest:
                chunk = s.recv(4096)
                assert chunk, f"the connection ended before the exit: {rest!r}"
                rest += chunk
        assert json.loads(rest) == {"event": "exit", "status": "signal: 9 (SIGKILL)"}
        assert s.recv(4096) == b"", "the zone closes after the exit"
    wait_for(lambda: zone.children() == [], timeout=5, what="the killed process to be reaped")
