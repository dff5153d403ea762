"""The proxy stays inside its container's memory limit whatever an agent or an upstream sends
(docs/proxy.md, "The memory budget").

One proxy runs in a memory cgroup of 256 MiB (the sidecar's default limit, passed to it as the
operator does: MCP_PROXY_MEMORY_LIMIT) with no swap. Hostile upstreams offer a 7 MB schema,
100,000 tools (paged, and in one message), a 1 MB schema and a 50 MB result; a hostile client
lists, calls those, sends large nested arguments and many large bodies at once; a benign client
calls a small tool throughout. The proxy must never be killed, its peak stay under the limit,
every request get an answer (an error is one), and every benign call a result.

The upstreams run outside the cgroup (each moves itself out before it starts): what is measured
is the proxy. (In a pod a stdio server shares the proxy's container unless it has a zone; what it
holds itself is its own doing.) cgroup v2 or v1's memory controller, as root; skipped otherwise.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import RAW_HEADERS, SUPPORT, raw_exchange, raw_session, tool_call

LIMIT = 256 * 1024 * 1024
ROOT = Path("/sys/fs/cgroup")


class MemoryCgroup:
    """A memory cgroup of LIMIT bytes without swap, made for one test (v2, or v1's controller)."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            pytest.skip("a memory cgroup needs root")
        own = Path("/proc/self/cgroup").read_text().splitlines()
        v1 = [line.split(":", 2)[2] for line in own if line.split(":")[1] == "memory"]
        controllers = ROOT / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            self.v2, self.parent = True, ROOT
        elif v1 and (ROOT / "memory").is_dir():
            self.v2, self.parent = False, ROOT / "memory" / v1[0].lstrip("/")
        else:
            pytest.skip("neither cgroup v2 with the memory controller nor v1's memory controller is mounted")
        self.path = self.parent / f"orch-test-{os.getpid()}"
        try:
            self.path.mkdir()
        except OSError as e:
            pytest.skip(f"cannot create a memory cgroup under {self.parent}: {e}")
        if self.v2:
            (self.path / "memory.max").write_text(str(LIMIT))
            (self.path / "memory.swap.max").write_text("0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(LIMIT))
            try:
                (self.path / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
            except OSError:
                pass  # no swap accounting: the machine has no swap to use
            (self.path / "memory.swappiness").write_text("0")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def escape(self) -> str:
        """A shell line that moves the shell running it out of this cgroup, to its parent."""
        return f"echo $$ > {self.parent / 'cgroup.procs'}"

    def peak(self) -> int:
        return int((self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")).read_text())

    def oom_kills(self) -> int:
        text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    def remove(self) -> None:
        # Whatever is left (nothing, once the proxy is gone) goes back to the parent first.
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


@pytest.fixture
def cgroup():
    group = MemoryCgroup()
    yield group
    group.remove()


def server(tools, group: MemoryCgroup, name: str, *args: str) -> dict:
    """A hostile_server.py upstream that leaves the proxy's cgroup before it starts."""
    line = f"{group.escape()}; exec {tools.python} {SUPPORT / 'hostile_server.py'} {' '.join(args)}"
    return {"name": name, "stdio": {"command": "/bin/sh", "args": ["-c", line]}}


def post(proxy, headers: dict, body: bytes, timeout: float = 60) -> tuple[int, str]:
    """POSTs `body`; (status, text). A status of 0: no answer."""
    request = urllib.request.Request(proxy.url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, repr(e)


def messages(text: str) -> list[dict]:
    found = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    return found or ([json.loads(text)] if text.strip().startswith("{") else [])


def call_body(name: str, arguments: dict, id: int = 2) -> bytes:
    return json.dumps(tool_call(name, arguments, id)).encode()


class AnonPeak:
    """The largest anonymous RSS of a process (its heap: what the limit is about; the binary's
    own pages are file pages), sampled every 20 ms."""

    def __init__(self, pid: int):
        self.pid, self.stop, self.peak = pid, threading.Event(), 0
        self.phases: list[tuple[str, int]] = []

    def phase(self, name: str) -> None:
        """Ends a phase: its peak is kept under `name`, and the next starts from nothing."""
        self.phases.append((name, self.peak))
        self.peak = 0

    def summary(self) -> str:
        return ", ".join(f"{name} {peak / 2**20:.0f}" for name, peak in self.phases)

    def run(self) -> None:
        path = Path(f"/proc/{self.pid}/status")
        while not self.stop.is_set():
            try:
                for line in path.read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(0.02)

    def __enter__(self) -> "AnonPeak":
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


class Benign:
    """Calls `benign__echo` every 50 ms from a thread of its own until stopped."""

    def __init__(self, proxy):
        self.proxy, self.stop, self.answers, self.failures = proxy, threading.Event(), 0, []

    def run(self) -> None:
        headers = raw_session(self.proxy)
        n = 0
        while not self.stop.is_set():
            n += 1
            status, text = post(self.proxy, headers, call_body("benign__echo", {"text": f"hi {n}"}, n), timeout=30)
            found = messages(text) if status == 200 else []
            if found and found[-1].get("result", {}).get("content", [{}])[0].get("text") == f"hi {n}":
                self.answers += 1
            else:
                self.failures.append((status, text[:300]))
            time.sleep(0.05)

    def __enter__(self) -> "Benign":
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_hostile_upstreams_and_clients_leave_the_proxy_within_its_memory_limit(tools, cgroup, make_proxy):
    # `cgroup` before `make_proxy`: the proxy is stopped before its cgroup is removed.
    config = {
        "servers": [
            server(tools, cgroup, "huge", "schema", "7"),
            server(tools, cgroup, "mid", "midschema"),
            server(tools, cgroup, "many", "many", "100000", "1000"),
            server(tools, cgroup, "fat", "fat", "6"),
            server(tools, cgroup, "onepage", "many", "100000", "0"),
            server(tools, cgroup, "hostile", "result", "50"),
            server(tools, cgroup, "benign", "benign"),
        ]
    }
    proxy = make_proxy(config, env={"MCP_PROXY_MEMORY_LIMIT": str(LIMIT)})
    cgroup.add(proxy.pid)
    started = time.monotonic()
    answers: dict[str, list[int]] = {}

    def seen(kind: str, status: int) -> int:
        answers.setdefault(kind, []).append(status)
        return status

    with Benign(proxy) as benign, AnonPeak(proxy.pid) as anon:
        headers = raw_session(proxy)
        # The lists: the 7 MB schema (beyond one message), 100,000 tools in pages and in one
        # message, six 1 MB schemas in pages are refused.
        status, text = post(proxy, headers, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode())
        listed = {t["name"] for t in messages(text)[-1]["result"]["tools"]}
        seen("tools/list", status)
        assert {"benign__echo", "hostile__flood", "hostile__unique", "mid__mid"} <= listed, sorted(listed)[:20]
        assert not any(n.startswith(("huge__", "many__", "onepage__", "fat__")) for n in listed), len(listed)
        refused = [line for line in proxy.log().splitlines() if "tool list unavailable" in line]
        for name, flag in [("huge", "result"), ("onepage", "result"), ("many", "list-tools"), ("fat", "list-bytes")]:
            assert any(f"server={name} " in line and f"--max-{flag}" in line for line in refused), (name, refused)

        anon.phase("lists")
        # A listed tool whose schema is beyond the schema bound: its calls are refused.
        status, text = post(proxy, headers, call_body("mid__mid", {}))
        assert seen("schema", status) == 200 and "--max-schema-bytes" in text, text[:500]

        # 50 MB results, four at once (and lists meanwhile): each answered with an error.
        def flood(i: int) -> str:
            status, text = post(proxy, headers, call_body("hostile__flood", {}, 100 + i))
            seen("flood", status)
            return text

        def relist(i: int) -> int:
            return seen("tools/list", post(proxy, headers, json.dumps({"jsonrpc": "2.0", "id": 200 + i, "method": "tools/list"}).encode())[0])

        with ThreadPoolExecutor(12) as pool:
            floods = list(pool.map(flood, range(4)))
            list(pool.map(relist, range(8)))
        for text in floods:
            assert "PROXY.RESULT_TOO_LARGE" in text and "--max-result-bytes" in text, text[:500]

        anon.phase("results")
        # Large nested arguments: 150,000 objects for a uniqueItems array, and a deep nest.
        wide = [{"a": i, "b": "xx"} for i in range(150_000)]
        status, text = post(proxy, headers, call_body("hostile__unique", {"items": wide}))
        assert seen("nested", status) == 413 and "--max-bodies-bytes" in text, (status, text[:500])
        status, text = post(proxy, headers, call_body("hostile__unique", {"items": wide[:40_000]}))
        assert seen("nested", status) == 200, (status, text[:500])
        deep = "[" * 200_000 + "]" * 200_000
        body = f'{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"hostile__unique","arguments":{{"items":{deep}}}}}}}'
        seen("nested", post(proxy, headers, body.encode())[0])

        anon.phase("nested")
        # Many large bodies at once: strings, numbers and objects of about 3.5 MB each.
        kinds = [
            lambda: {"items": ["x" * 3_500_000]},
            lambda: {"items": list(range(500_000))},
            lambda: {"items": [{"k": i} for i in range(200_000)]},
        ]

        def large(i: int) -> int:
            status, text = post(proxy, headers, call_body("hostile__unique", kinds[i % 3](), 1000 + i))
            if status == 0:
                print(f"body {i % 3}: no answer: {text}")
            return seen("bodies", status)

        with ThreadPoolExecutor(48) as pool:
            list(pool.map(large, range(96)))
        anon.phase("bodies")

    took = time.monotonic() - started
    peak, kills = cgroup.peak(), cgroup.oom_kills()
    alive = proxy.process.poll() is None
    hwm = next(
        (int(line.split()[1]) * 1024 for line in Path(f"/proc/{proxy.pid}/status").read_text().splitlines() if line.startswith("VmHWM:")),
        0,
    ) if alive else 0
    budget = [line for line in proxy.metrics().splitlines() if line.startswith("mcp_proxy_memory_")] if alive else []
    statuses = {k: {s: v.count(s) for s in sorted(set(v))} for k, v in answers.items()}
    print(
        f"\nmemory cgroup ({'v2' if cgroup.v2 else 'v1'}) limit {LIMIT >> 20} MiB: peak {peak / 2**20:.1f} MiB, "
        f"oom kills {kills}; proxy peak RSS (VmHWM, with the binary's pages) {hwm / 2**20:.1f} MiB, "
        f"peak anonymous RSS (sampled) {max(p for _, p in anon.phases) / 2**20:.1f} MiB ({anon.summary()}); {took:.1f} s"
        f"\nanswers by status: {statuses}\nbenign calls answered: {benign.answers}, failed: {len(benign.failures)}"
        f"\n" + "\n".join(budget)
    )
    assert alive, f"the proxy exited with {proxy.process.returncode}:\n{proxy.log()[-3000:]}"
    assert kills == 0
    assert peak < LIMIT
    unanswered = {k: v.count(0) for k, v in answers.items() if 0 in v}
    assert not unanswered, f"requests without an answer: {unanswered}"
    assert set(answers["bodies"]) <= {200, 413, 503}, statuses
    assert benign.answers >= 10 and not benign.failures, benign.failures[:5]


def test_a_call_to_a_server_whose_list_is_refused_is_told_why(tools, make_proxy):
    """A server that lists more tools than `--max-list-tools` (here 100,000 in pages of 1,000): its
    list is refused and its tools are not offered, and a call to one of them is answered with the
    refusal (the server, the bound, its flag), not as an unknown tool; the other server is served."""
    line = f"exec {tools.python} {SUPPORT / 'hostile_server.py'} many 100000 1000"
    proxy = make_proxy({"servers": [
        {"name": "many", "stdio": {"command": "/bin/sh", "args": ["-c", line]}},
        {"name": "fine", "stdio": {"command": str(tools.python), "args": [str(SUPPORT / "hostile_server.py"), "benign"]}},
    ]})
    headers = raw_session(proxy)
    status, text = post(proxy, headers, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode())
    listed = [t["name"] for m in messages(text) for t in m.get("result", {}).get("tools", [])]
    assert status == 200 and listed == ["fine__echo"], (status, listed, text[:500])
    status, text = post(proxy, headers, call_body("many__t000001", {}))
    error = next((m for m in messages(text) if "error" in m or m.get("result", {}).get("isError")), None)
    assert status == 200 and error is not None, (status, text[:500])
    said = json.dumps(error)
    assert "PROXY.LIST_TOO_LARGE" in said and "many" in said and "--max-list-tools" in said, said[:800]
    status, text = post(proxy, headers, call_body("fine__echo", {"text": "still here"}))
    assert status == 200 and "still here" in text, text[:500]
