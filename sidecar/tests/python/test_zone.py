"""Servers in their own containers (zones, docs/proxy.md "Zones"): `orchestrator-mcp-proxy zone`
holds a server's environment and starts its process when the proxy asks through a unix socket,
handing over its pipes. Here each zone is a process of its own (in a pod, a container of its own)
on a socket in the test's directory, and the proxy's config names that socket.

Shown: the start is lazy and through the zone, on both protocol revisions; the server gets the
zone's environment and nothing of the proxy's; a server that exits shows its stderr and status
in the proxy's error; a proxy killed with SIGKILL leaves no process in the zone; SIGTERM ends the
zone and its processes; a peer of another uid starts nothing; a server that links its socket to
another zone's (a disabled server's) starts nothing there; a zone that is not there is named
with where to look; bytes that are not the protocol are cut off while the proxy is served; the
protocol itself, spoken by hand.

Over TCP (shared mode, `zone --listen`), spoken by hand here (an independent implementation of
the documented protocol): MCP through the frames, the process group gone with the connection; a
wrong key, a replayed answer, another zone's key and a silent peer start nothing; a short key
file is refused naming the flag."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import Client

from conftest import alive, descendants, faulty, free_port, raw_exchange, raw_session, recorded_pids, tool_call, wait_for

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
        command = [str(proxy_bin), "zone", "--socket", str(path), "--server", name, *args, "--", stdio["command"], *stdio.get("args", [])]
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


def zoned(name: str, stdio: dict, zone: Zone, enabled: bool = True) -> dict:
    """A server entry whose process runs in `zone` (command and args kept for display), a zone of
    this test's uid (the zones here run as the test)."""
    return {
        "name": name,
        "enabled": enabled,
        "stdio": {"command": stdio["command"], "args": stdio.get("args", []), "socket": str(zone.socket), "zoneUid": os.getuid()},
    }


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


def test_a_server_that_links_its_socket_to_another_zones_starts_nothing_there(make_zone, make_proxy, tools):
    """A zone's socket directory is writable by the server it runs: a hostile server replaces its
    socket with a link to another zone's (here a server listed `enabled: false`, whose zone holds
    its own Secrets) and exits, so the proxy starts it again on the next call. The proxy does not
    follow the link: the call fails naming the link, the other zone starts nothing (its log shows
    no start), and the hostile server's zone is not asked either."""
    stdio = tools.everything_stdio()
    hostile = make_zone("hostile", stdio)
    disabled = make_zone("github", stdio, env={"GITHUB_TOKEN": "only-for-github"}, args=("--peer-uid", str(os.getuid())))
    proxy = make_proxy({"servers": [zoned("hostile", stdio, hostile), zoned("github", stdio, disabled, enabled=False)]})
    headers = raw_session(proxy)
    first = raw_exchange(proxy, headers, tool_call("hostile__echo", {"message": "one"}))[1][-1]
    assert first["result"]["content"][0]["text"] == "Echo: one", first
    [server] = hostile.children()

    # What the hostile server does with its directory, then it exits.
    hostile.socket.unlink()
    hostile.socket.symlink_to(disabled.socket)
    os.kill(server, signal.SIGKILL)
    ids = iter(range(10, 1000))
    error = wait_for(
        lambda: (lambda e: e if e and e["data"]["code"] == "PROXY.UPSTREAM_START_FAILED" else None)(
            raw_exchange(proxy, headers, tool_call("hostile__echo", {"message": "two"}, id=next(ids)))[1][-1].get("error")
        ),
        timeout=20,
        interval=0.2,
        what="the restart to be refused",
    )
    assert (
        f"refused to start server hostile: {hostile.socket} is a symbolic link to {disabled.socket}, not the zone's socket"
    ) in error["message"], error
    assert "nothing was started" in error["message"], error
    assert disabled.children() == [] and hostile.children() == []
    assert "started the server" not in disabled.log(), disabled.log()
    assert "refused to start the server" in proxy.log() and str(disabled.socket) in proxy.log()


def test_a_zone_that_is_not_there_is_named_with_where_to_look(make_proxy, tools, tmp_path):
    missing = tmp_path / "zones/git/mcp.sock"
    proxy = make_proxy(
        {"servers": [{"name": "git", "stdio": {"command": "mcp-server-git", "socket": str(missing), "zoneUid": os.getuid()}}]},
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
    assert b"protocol version 99 is not spoken here (this end speaks 3)" in newer, newer
    strange = exchange(zone.socket, b'{"op":"exec","v":3,"command":"sh"}\n')
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
    """The documented exchange: the zone's hello naming its server, a start for that server, the
    three pipes with the pid, MCP over them, a signal, the exit status, the end of the
    connection."""
    zone = make_zone("every", tools.everything_stdio())
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(zone.socket))
        hello = b""
        while not hello.endswith(b"\n"):
            hello += s.recv(1)
        assert json.loads(hello) == {"event": "hello", "v": 3, "server": "every"}, hello
        s.sendall(b'{"op":"start","v":3,"server":"every"}\n')
        data, fds, _, _ = socket.recv_fds(s, 4096, 8)
        line, _, rest = data.partition(b"\n")
        started = json.loads(line)
        assert started["event"] == "started" and started["v"] == 3 and len(fds) == 3, (started, fds)
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


# Over TCP (docs/proxy.md "Zones", "Over TCP (shared mode)").

STDIN, STDOUT, STDERR, CONTROL = 0, 1, 2, 3


@dataclass
class TcpZone:
    process: subprocess.Popen
    addr: tuple[str, int]
    key: bytes
    log_path: Path

    def children(self) -> list[int]:
        return [p for p in descendants(self.process.pid) if alive(p)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def make_tcp_zone(proxy_bin, tmp_path):
    """Starts `zone --listen 127.0.0.1:<free port> --key-file ... --server NAME` processes."""
    zones: list[TcpZone] = []

    def make(name: str, stdio: dict, key: bytes | None = None) -> TcpZone:
        directory = tmp_path / "tcp-zones" / name
        directory.mkdir(parents=True)
        key = key or secrets.token_bytes(32)
        key_file, log_path = directory / "key", directory / "zone.log"
        key_file.write_text(key.hex() + "\n")
        port = free_port()
        command = [
            str(proxy_bin), "zone", "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file), "--server", name,
            "--grace-seconds", "1", "--", stdio["command"], *stdio.get("args", []),
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}, stdout=log, stderr=log)
        zone = TcpZone(process, ("127.0.0.1", port), key, log_path)
        zones.append(zone)
        wait_for(lambda: "zone listening" in zone.log() or process.poll() is not None, what="the zone to listen")
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


def proof(key: bytes, nonce: bytes, label: bytes, server: str) -> str:
    return hmac.new(key, nonce + label + server.encode(), hashlib.sha256).hexdigest()


class Conn:
    """One connection to a TCP zone, spoken by hand."""

    def __init__(self, addr):
        self.sock = socket.create_connection(addr, timeout=10)
        self.buf = b""

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def frame(self) -> tuple[int, bytes]:
        chan, length = struct.unpack(">BI", self.exact(5))
        return chan, self.exact(length)

    def send_frame(self, chan: int, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">BI", chan, len(payload)) + payload)

    def rest(self) -> bytes:
        """What the zone sends until it closes."""
        data = self.buf
        while chunk := self.sock.recv(65536):
            data += chunk
        return data


def start_line(key: bytes, nonce_hex: str, server: str) -> tuple[bytes, bytes]:
    ours = secrets.token_bytes(32)
    answer = {"op": "start", "v": 2, "nonce": ours.hex(), "proof": proof(key, bytes.fromhex(nonce_hex), b"orchestrator-zone/v1", server)}
    return json.dumps(answer).encode() + b"\n", ours


def group_gone(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return False
    return True


def test_over_tcp_by_hand_mcp_through_frames_and_the_group_ends_with_the_connection(make_tcp_zone, tools):
    zone = make_tcp_zone("every", tools.everything_stdio())
    conn = Conn(zone.addr)
    hello = json.loads(conn.line())
    assert hello["event"] == "hello" and hello["v"] == 2 and hello["server"] == "every" and len(hello["nonce"]) == 64, hello
    line, ours = start_line(zone.key, hello["nonce"], "every")
    conn.sock.sendall(line)
    started = json.loads(conn.line())
    assert started["event"] == "started" and started["v"] == 2, started
    # The zone proves it holds the key too: over our nonce, under its own label.
    assert hmac.compare_digest(started["proof"], proof(zone.key, ours, b"orchestrator-zone/v1 zone", "every"))
    pid = started["pid"]
    assert zone.children() == [pid]

    stdout = b""

    def request(message: dict) -> dict | None:
        nonlocal stdout
        conn.send_frame(STDIN, json.dumps(message).encode() + b"\n")
        if "id" not in message:
            return None
        while True:
            while b"\n" in stdout:
                line, _, stdout = stdout.partition(b"\n")
                answer = json.loads(line)
                if answer.get("id") == message["id"]:
                    return answer
            chan, payload = conn.frame()
            if chan == STDOUT:
                assert payload, "stdout ended"
                stdout += payload
            else:
                assert chan in (STDERR, CONTROL), chan

    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "by-hand", "version": "1"}}
    assert "serverInfo" in request({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})["result"]
    request({"jsonrpc": "2.0", "method": "notifications/initialized"})
    listed = request({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})["result"]["tools"]
    assert "echo" in [t["name"] for t in listed]
    called = request({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "over tcp"}}})
    assert called["result"]["content"][0]["text"] == "Echo: over tcp", called
    assert not group_gone(pid)

    conn.sock.close()
    wait_for(lambda: group_gone(pid) and zone.children() == [], timeout=10, what="the process group to end with the connection")
    assert "the proxy closed the connection; stopping the server" in zone.log()
    assert zone.process.poll() is None, "the zone serves on"


def test_over_tcp_a_wrong_key_a_replay_another_zones_key_and_a_silent_peer_start_nothing(make_tcp_zone, tools):
    git = make_tcp_zone("git", tools.everything_stdio())
    memory = make_tcp_zone("memory", tools.everything_stdio())
    refused = b'{"event":"error","message":"refused: authentication failed"}\n'

    conn = Conn(git.addr)
    nonce = json.loads(conn.line())["nonce"]
    conn.sock.sendall(start_line(secrets.token_bytes(32), nonce, "git")[0])
    assert conn.rest() == refused

    # git's key (a hostile server in zone git has it) does not open zone memory.
    conn = Conn(memory.addr)
    nonce = json.loads(conn.line())["nonce"]
    conn.sock.sendall(start_line(git.key, nonce, "memory")[0])
    assert conn.rest() == refused

    # A captured answer is worth nothing on the next connection: its nonce is new.
    first = Conn(git.addr)
    nonce = json.loads(first.line())["nonce"]
    captured = start_line(git.key, nonce, "git")[0]
    first.sock.sendall(captured)
    assert json.loads(first.line())["event"] == "started"
    replay = Conn(git.addr)
    assert json.loads(replay.line())["nonce"] != nonce
    replay.sock.sendall(captured)
    assert replay.rest() == refused
    assert len(git.children()) == 1, "only the first connection started a process"
    first.sock.close()
    wait_for(lambda: git.children() == [], timeout=10, what="the first process to end")

    # A peer that says nothing is closed after 5 seconds.
    silent = Conn(git.addr)
    silent.line()
    began = time.monotonic()
    assert b"no start request within 5s" in silent.rest()
    assert 4 <= time.monotonic() - began < 8
    assert git.children() == [] and memory.children() == []
    log = git.log()
    assert log.count("refused a connection") >= 3, log
    assert "its proof does not match this zone's key" in log
    assert git.key.hex() not in log and memory.key.hex() not in log + memory.log()


def test_a_short_or_missing_key_is_refused_naming_the_flag(proxy_bin, tmp_path):
    short = tmp_path / "short"
    short.write_text(secrets.token_bytes(16).hex())
    port = str(free_port())
    run = subprocess.run(
        [str(proxy_bin), "zone", "--listen", f"127.0.0.1:{port}", "--key-file", str(short), "--server", "git", "--", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert run.returncode == 1, run
    assert (
        f"--key-file {short}: the key is 16 bytes; a zone key is at least 32 random bytes, written as 64 hex digits "
        "(e.g. `openssl rand -hex 32`)"
    ) in run.stderr, run.stderr
    missing = subprocess.run([str(proxy_bin), "zone", "--listen", f"127.0.0.1:{port}", "--", "true"], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "--key-file" in missing.stderr and "--server" in missing.stderr, missing.stderr
    both = subprocess.run(
        [str(proxy_bin), "zone", "--socket", str(tmp_path / "s"), "--listen", f"127.0.0.1:{port}", "--key-file", str(short), "--server", "g", "--", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert both.returncode == 2 and "cannot be used with" in both.stderr, both.stderr
