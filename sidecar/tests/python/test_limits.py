"""What a client sends never becomes unbounded state in the proxy, and never locks out the next
client: sessions are capped (at the cap a new client is served by closing the least recently used
idle session; only when every session is busy does `initialize` get a clear JSON-RPC error),
request headers must arrive in time (slowloris), bodies are limited, `/audit` answers cost bounded
memory however their clients read, and the names a client makes up are clipped in audit lines and
log lines and never become metric labels."""

from __future__ import annotations

import json
import selectors
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from conftest import RAW_HEADERS, RAW_INIT, HealthWatch, await_for, raw_exchange, raw_session, tool_call, wait_for

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


def get_stream(proxy, headers: dict) -> socket.socket:
    """Opens a session's GET stream and keeps it open (reads only its response head)."""
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k != "Content-Type")
    sock.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n{head}Accept: text/event-stream\r\n\r\n".encode())
    sock.settimeout(10)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the GET stream did not open"
    return sock


async def test_at_the_session_cap_a_new_client_is_served_by_closing_the_least_recently_used_idle_one(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]}, extra_args=["--max-sessions", "2"])
    first, second = raw_session(proxy), raw_session(proxy)
    # `first` was used since: `second` is the least recently used.
    assert raw_exchange(proxy, first, tool_call("every__echo", {"message": "hi"}))[0] == 200
    third = raw_session(proxy)
    status, _, text = raw_exchange(proxy, second, tool_call("every__echo", {"message": "hi"}))
    assert status == 404, f"the evicted session answers the spec's 404 (its client initializes again): {status} {text}"
    for live in (first, third):
        assert raw_exchange(proxy, live, tool_call("every__echo", {"message": "still here"}))[0] == 200
    assert "closed the least recently used idle client session" in proxy.log()

    # Clients that come and go without DELETE (most do) never lock the next one out.
    for _ in range(20):
        async with Client(proxy.url, mode="legacy") as client:
            assert (await client.list_tools()).tools

    # A session with an open stream (a GET stream here; a call in flight alike) is never
    # closed for room: with every session busy, a new one is refused with a clear error.
    busy = [raw_session(proxy), raw_session(proxy)]
    streams = [get_stream(proxy, h) for h in busy]
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
    for h in busy:
        assert raw_exchange(proxy, h, tool_call("every__echo", {"message": "busy but served"}))[0] == 200
    # Once a stream ends, its session is idle again and makes room.
    streams[0].close()
    await await_for(lambda: raw_exchange(proxy, RAW_HEADERS, {**RAW_INIT, "id": 10})[0] == 200, what="room for a new session")
    streams[1].close()
    # DELETE of an unknown session is the spec's 404.
    delete = urllib.request.Request(proxy.url, method="DELETE", headers={**RAW_HEADERS, "Mcp-Session-Id": "no-such-session"})
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(delete, timeout=10)
    assert unknown.value.code == 404


def series(proxy) -> list[str]:
    return [line.rpartition(" ")[0] for line in proxy.metrics().splitlines() if line and not line.startswith("#")]


def test_metric_series_stay_the_same_whatever_names_clients_send(make_proxy, tools):
    """10,000 requests, each naming something made up: a tool (with a configured server's prefix
    or without), a prompt, a resource, the client itself, a method. Metric labels carry only
    configured servers and the tools upstreams listed, so the series are the same before and
    after."""
    # With an allow list, a made-up name under the server's prefix is refused by rule.
    server = {**everything(tools), "tools": {"allow": ["echo", "get-sum"]}}
    proxy = make_proxy({"servers": [server]}, extra_args=["--max-sessions", "8"])
    headers = raw_session(proxy)
    kinds = {
        "prefixed tool": (2500, lambda i: tool_call(f"every__x{i:06d}" + "z" * 40, id=i)),
        "bare tool": (1500, lambda i: tool_call(f"made_up_{i}", id=i)),
        "prompt": (1500, lambda i: {"jsonrpc": "2.0", "id": i, "method": "prompts/get", "params": {"name": f"every__p{i}"}}),
        "resource": (1500, lambda i: {"jsonrpc": "2.0", "id": i, "method": "resources/read", "params": {"uri": f"demo://made/up/{i}"}}),
        "client": (1500, None),
        "method": (1500, lambda i: {"jsonrpc": "2.0", "id": i, "method": f"made/up{i}", "params": {}}),
    }
    assert sum(n for n, _ in kinds.values()) == 10_000

    def send(kind: str, i: int) -> None:
        n, body = kinds[kind]
        if body is None:
            init = {**RAW_INIT, "params": {**RAW_INIT["params"], "clientInfo": {"name": f"client-{i}", "version": str(i)}}}
            status = raw_exchange(proxy, RAW_HEADERS, init)[0]
        else:
            status = raw_exchange(proxy, headers, body(i))[0]
        assert status == 200, (kind, i, status)

    # One of each first, so every label a refusal can have exists already.
    for kind in kinds:
        send(kind, 0)
    before = series(proxy)
    # The new clients last: at the cap, each closes the least recently used idle session.
    with HealthWatch(proxy.port) as health:
        for phase in ([k for k in kinds if k != "client"], ["client"]):
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda job: send(*job), [(k, i) for k in phase for i in range(1, kinds[k][0])]))
            after = series(proxy)
            assert after == before, f"{len(before)} series before, {len(after)} after: {sorted(set(after) - set(before))[:5]}"
    print(f"10,000 made-up names: {health.summary()}")
    health.assert_responsive()
    assert len(proxy.metrics()) < 20_000
    assert proxy.metric("mcp_proxy_tool_calls_total", server="every", tool="(unknown)", outcome="denied") == 2500
    assert proxy.metric("mcp_proxy_tool_calls_total", server="(none)", tool="(unknown)", outcome="tool_error") == 1500


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_audit_answers_cost_bounded_memory_however_many_clients_never_read_them(make_proxy, tools, tmp_path):
    audit = {"path": str(tmp_path / "audit.jsonl"), "includeArguments": True}
    proxy = make_proxy({"servers": [everything(tools)], "audit": audit})
    headers = raw_session(proxy)
    # Fill the kept records (8 MiB at most) with big ones.
    for i in range(150):
        assert raw_exchange(proxy, headers, tool_call("every__echo", {"message": f"{i:04d}" + "m" * 60_000}, id=i))[0] == 200
    status, body = proxy.http("/audit?limit=100000")
    assert status == 200 and len(body) > 4_000_000, (status, len(body))
    before = rss_kib(proxy.pid)
    request = f"GET /audit?limit=100000 HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n\r\n".encode()
    silent = []
    with HealthWatch(proxy.port) as health:
        for _ in range(100):
            sock = socket.create_connection(("127.0.0.1", proxy.port))
            sock.sendall(request)
            silent.append(sock)
        # Each was answered (or refused), and nobody reads.
        wait_for(lambda: proxy.metrics() != "", what="the proxy to answer")
        time.sleep(1)  # what the answers would hold, they hold by now
    grown = rss_kib(proxy.pid) - before
    print(f"100 silent /audit clients: the proxy grew by {grown} KiB; {health.summary()}")
    assert grown < 64 * 1024, f"100 clients that never read grew the proxy by {grown // 1024} MiB"
    health.assert_responsive()
    # A client that reads is not locked out: an answer stalled for a second makes room for it
    # (its connection is closed), and it gets the whole answer while the silent ones still wait
    # (it retries after a 503, as its Retry-After says).
    def read() -> bytes | None:
        status, body = proxy.http("/audit?limit=200")
        assert status in (200, 503), (status, body[:200])
        return body if status == 200 else None

    answer = json.loads(wait_for(read, timeout=10, interval=1, what="an /audit answer"))
    assert len(answer["records"]) == answer["matched"] > 100
    # The ended answer's connection was closed: reading what it had sent reaches its end.
    assert closed_within(silent, 10) >= 1, "no stalled answer was ended for the reading client"
    for sock in silent:
        sock.close()


def closed_within(socks: list[socket.socket], seconds: float) -> int:
    """Reads the sockets (all at once) until one of them ends or `seconds` pass; returns how many
    the other side closed."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        closed, deadline = 0, time.monotonic() + seconds
        while not closed and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                try:
                    data = key.fileobj.recv(1 << 20)
                except (BlockingIOError, ConnectionResetError) as e:
                    data = b"" if isinstance(e, ConnectionResetError) else None
                if data == b"":
                    closed += 1
                    selector.unregister(key.fileobj)
        return closed


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
