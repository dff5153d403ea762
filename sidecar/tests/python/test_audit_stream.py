"""The audit stream, the metrics listener and the OTLP export of audit records, with the real proxy
binary, real upstream servers (server-everything, the rug-pull server) and the official MCP Python
SDK as the client.

- Serving HTTP without `audit.path`, the proxy's stdout is the audit stream: one JSON object per
  line, each with a `recordType`, and nothing else; its logs are on stderr.
- `--metrics-listen` serves `GET /metrics` and nothing else on a second address (127.0.0.2
  stands in for the pod IP); the MCP port is not there.
- `--audit-otlp` sends each record as an OTLP log record (http/json) to a local receiver, with
  the resource of OTEL_RESOURCE_ATTRIBUTES; a collector that does not answer costs records
  (dropped and counted), never calls.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import SUPPORT, free_port, names, to_yaml, wait_for, write_configmap
from mcp import Client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@dataclass
class Streaming:
    """A proxy whose stdout is read line by line as it is written, stderr kept in a file."""

    process: subprocess.Popen
    port: int
    stderr_path: Path
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, b""):
            self.lines.append(line.decode())

    def records(self) -> list[dict]:
        return [json.loads(line) for line in list(self.lines)]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture
def streaming(proxy_bin, tmp_path):
    """Starts a proxy serving HTTP with stdout piped to the test; kills it after the test."""
    started: list[Streaming] = []

    def start(config: dict, extra_args: list[str] | None = None, env: dict | None = None) -> Streaming:
        workdir = tmp_path / f"streaming{len(started)}"
        write_configmap(workdir / "configmap", to_yaml(config))
        port = free_port()
        stderr_path = workdir / "stderr.log"
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [
                    str(proxy_bin),
                    "--config",
                    str(workdir / "configmap/proxy.yaml"),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--cache-dir",
                    str(workdir / "cache"),
                    *(extra_args or []),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **(env or {})},
            )
        proxy = Streaming(process=process, port=port, stderr_path=stderr_path)
        started.append(proxy)
        threading.Thread(target=proxy.read_stdout, daemon=True).start()
        wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, what="the proxy to be ready")
        return proxy

    yield start
    for proxy in started:
        if proxy.process.poll() is None:
            proxy.process.kill()
            proxy.process.wait()


def get(url: str, headers: dict | None = None, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def task_config(tools, tmp_path: Path) -> dict:
    """server-everything (get-env denied) and the rug-pull server; no audit.path."""
    return {
        "task": {"name": "stream-task", "namespace": "ns1"},
        "servers": [
            {"name": "every", "stdio": tools.everything_stdio(), "tools": {"deny": ["get-env"]}},
            {
                "name": "rug",
                "stdio": {"command": str(tools.python), "args": [str(SUPPORT / "rug_pull_server.py")]},
            },
        ],
    }


async def test_stdout_is_the_audit_stream_and_nothing_else(streaming, tools, tmp_path):
    proxy = streaming(task_config(tools, tmp_path))
    async with Client(proxy.url, mode="legacy") as client:
        assert "rug__rewrite" in names(await client.list_tools())
        await client.call_tool("every__echo", {"message": "hello"})
        denied = await client.call_tool("every__get-env", {})
        assert denied.is_error
        # An agent that tries to forge a line of the stream with a name it makes up.
        forged = await client.call_tool('nope\n{"recordType":"tool_call","tool":"forged","decision":"allowed"}\n', {})
        assert forged.is_error
        # A definition that changes under the agent: a definition_change record.
        await client.call_tool("rug__rewrite", {})
        wait_for(
            lambda: any(r.get("recordType") == "definition_change" for r in proxy.records()),
            timeout=15,
            what="the definition_change record on stdout",
        )
    assert proxy.stop() == 0
    # Every line, read as it came, is one JSON object with a recordType.
    assert proxy.lines, proxy.stderr()
    for line in proxy.lines:
        assert line.endswith("\n"), line
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert record["recordType"] in ("tool_call", "definition_change"), record
    records = proxy.records()
    calls = {r["tool"]: r for r in records if r["recordType"] == "tool_call"}
    assert calls["every__echo"]["decision"] == "allowed" and calls["every__echo"]["outcome"] == "ok", calls
    assert calls["every__get-env"]["decision"] == "denied", calls
    assert calls["rug__rewrite"]["outcome"] == "ok", calls
    assert "forged" not in calls and any(t.startswith("nope\n") for t in calls), calls
    change = next(r for r in records if r["recordType"] == "definition_change")
    assert change["upstreamTool"] == "echo" and change["outcome"] == "definition_changed", change
    # The logs are on stderr, none on stdout.
    log = proxy.stderr()
    assert "serving MCP at" in log and "shutting down" in log, log
    assert not any("serving MCP" in line or "shutting down" in line for line in proxy.lines)


async def test_audit_path_still_takes_the_records_off_stdout(streaming, tools, tmp_path):
    config = task_config(tools, tmp_path)
    config["audit"] = {"path": str(tmp_path / "audit.jsonl")}
    proxy = streaming(config)
    async with Client(proxy.url, mode="2026-07-28") as client:
        await client.call_tool("every__echo", {"message": "to the file"})
    wait_for(lambda: (tmp_path / "audit.jsonl").exists() and (tmp_path / "audit.jsonl").read_text(), timeout=5, what="the file")
    assert proxy.stop() == 0
    assert proxy.lines == []
    record = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])
    assert record["recordType"] == "tool_call" and record["tool"] == "every__echo", record


def test_the_metrics_listener_serves_metrics_only(make_proxy, tools):
    port = free_port()
    proxy = make_proxy(
        {"servers": [{"name": "every", "stdio": tools.everything_stdio()}]},
        extra_args=["--header-read-timeout-seconds", "1"],
        env={"MCP_PROXY_METRICS_LISTEN": f"127.0.0.2:{port}"},
    )
    base = f"http://127.0.0.2:{port}"
    status, body = get(f"{base}/metrics")
    assert status == 200, body
    text = body.decode()
    assert "mcp_proxy_config_loaded 1" in text and "mcp_proxy_audit_otlp_dropped_total 0" in text, text
    # The same families as the main /metrics.
    families = lambda t: sorted(line for line in t.splitlines() if line.startswith("# TYPE"))  # noqa: E731
    assert families(text) == families(proxy.metrics())
    # Nothing else is there, whatever the method.
    for path in ["/mcp", "/tools", "/audit", "/healthz", "/readyz", "/", "/metrics/x"]:
        assert get(f"{base}{path}")[0] == 404, path
    assert get(f"{base}/mcp", method="POST", data=b"{}", headers={"Content-Type": "application/json"})[0] == 404
    assert get(f"{base}/metrics", method="POST", data=b"")[0] == 404
    # A page on another site (a DNS name it controls) does not read the metrics.
    assert get(f"{base}/metrics", headers={"Host": f"evil.example:{port}"})[0] == 403
    # The MCP port is on loopback only: not on the metrics address.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", proxy.port), timeout=5).close()
    assert proxy.http("/healthz")[0] == 200
    # Bounded like the MCP listener: a connection that sends no request is closed.
    with socket.create_connection(("127.0.0.2", port), timeout=10) as idle:
        idle.sendall(b"GET /metrics HTTP/1.1\r\n")
        started = time.monotonic()
        # Held open, this would raise a timeout after 10 s.
        idle.recv(1024)
        assert time.monotonic() - started < 5


def test_a_metrics_listen_address_that_cannot_be_bound_is_named(proxy_bin, tmp_path):
    write_configmap(tmp_path / "configmap", to_yaml({"task": {"name": "t"}, "servers": []}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(proxy_bin), "--config", str(tmp_path / "configmap/proxy.yaml"), "--listen", f"127.0.0.1:{free_port()}",
             "--metrics-listen", f"127.0.0.2:{port}"],
            capture_output=True,
            timeout=30,
            env={"PATH": os.environ.get("PATH", "")},
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.2:{port} (--metrics-listen" in done.stderr.decode(), done.stderr
    assert done.stdout == b""


class Collector:
    """An OTLP/HTTP JSON receiver on 127.0.0.1: keeps what is posted to /v1/logs; with `hold`, it
    answers no export until released (a collector that does not keep up)."""

    def __init__(self, hold: bool = False):
        self.logs: list[dict] = []
        self.posts: list[str] = []
        self.release = threading.Event()
        if not hold:
            self.release.set()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                collector.posts.append(self.path)
                if self.path == "/v1/logs":
                    collector.release.wait(20)
                    collector.logs.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def records(self) -> list[tuple[dict, dict]]:
        """(resource attributes, log record) of every record received."""
        found = []
        for export in list(self.logs):
            for resource in export.get("resourceLogs", []):
                attributes = {a["key"]: a["value"].get("stringValue") for a in resource["resource"].get("attributes", [])}
                for scope in resource.get("scopeLogs", []):
                    for record in scope.get("logRecords", []):
                        found.append((attributes, record))
        return found

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


def body_map(record: dict) -> dict:
    """The record's body (a kvlist) as a dict of plain values."""

    def plain(value: dict):
        for kind in ("stringValue", "boolValue", "doubleValue"):
            if kind in value:
                return value[kind]
        if "intValue" in value:
            return int(value["intValue"])
        if "kvlistValue" in value:
            return {kv["key"]: plain(kv["value"]) for kv in value["kvlistValue"].get("values", [])}
        if "arrayValue" in value:
            return [plain(v) for v in value["arrayValue"].get("values", [])]
        return None

    return plain(record["body"])


OTLP_ENV = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=ns1,k8s.pod.name=task-a-xyz,orchestrator.taskrun.name=task-a",
    "OTEL_BLRP_SCHEDULE_DELAY": "100",
}


async def test_audit_records_are_exported_as_otlp_log_records(streaming, tools, tmp_path):
    collector = Collector()
    try:
        proxy = streaming(
            task_config(tools, tmp_path),
            env={**OTLP_ENV, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": f"{collector.endpoint}/v1/logs", "MCP_PROXY_AUDIT_OTLP": "true"},
        )
        async with Client(proxy.url, mode="legacy") as client:
            await client.call_tool("every__echo", {"message": "exported"})
            await client.call_tool("every__get-env", {})
            await client.call_tool("rug__rewrite", {})
            wait_for(lambda: any(r.get("recordType") == "definition_change" for r in proxy.records()), timeout=15, what="the change")
        assert proxy.stop() == 0
        # Shutdown flushed the export: every stdout record was also sent.
        received = collector.records()
        assert len(received) == len(proxy.records()), (received, proxy.lines)
        by_tool = {}
        for resource, record in received:
            assert resource["k8s.pod.name"] == "task-a-xyz" and resource["k8s.namespace.name"] == "ns1", resource
            assert resource["orchestrator.taskrun.name"] == "task-a", resource
            assert resource["service.name"] == "orchestrator-mcp-proxy", resource
            body = body_map(record)
            assert record["eventName"] == f"mcp.audit.{body['recordType']}", record
            by_tool.setdefault(body["tool"], []).append((record, body))
        (_, echo), = by_tool["every__echo"]
        assert echo["decision"] == "allowed" and echo["namespace"] == "ns1" and isinstance(echo["durationMs"], float), echo
        assert by_tool["every__get-env"][0][1]["decision"] == "denied"
        assert any(r["eventName"] == "mcp.audit.definition_change" for r, _ in by_tool["rug__echo"]), by_tool
        assert "/v1/logs" in collector.posts
    finally:
        collector.close()


async def test_without_the_flag_no_audit_record_is_exported(streaming, tools, tmp_path):
    collector = Collector()
    try:
        proxy = streaming(
            task_config(tools, tmp_path),
            env={**OTLP_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"},
        )
        async with Client(proxy.url, mode="2026-07-28") as client:
            await client.call_tool("every__echo", {"message": "not exported"})
        assert proxy.stop() == 0
        assert len(proxy.records()) == 1
        # The traces went out (the endpoint is set); no log record did.
        assert "/v1/traces" in collector.posts and "/v1/logs" not in collector.posts, collector.posts
    finally:
        collector.close()


async def test_a_collector_that_does_not_answer_costs_records_not_calls(streaming, tools, tmp_path):
    collector = Collector(hold=True)
    try:
        proxy = streaming(
            task_config(tools, tmp_path),
            extra_args=["--audit-otlp", "--shutdown-grace-seconds", "1"],
            env={
                **OTLP_ENV,
                "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
                "OTEL_BLRP_MAX_QUEUE_SIZE": "4",
                "OTEL_BLRP_EXPORT_TIMEOUT": "10000",
                "OTEL_SERVICE_NAME": "custom-proxy",
            },
        )
        started = time.monotonic()
        async with Client(proxy.url, mode="2026-07-28") as client:
            for i in range(10):
                await client.call_tool("every__get-sum", {"a": i, "b": 1})
        assert time.monotonic() - started < 10
        wait_for(lambda: len(proxy.records()) == 10, timeout=5, what="ten stdout records")
        # Four wait for the collector; the six past the bound were dropped and counted.
        status, body = get(f"http://127.0.0.1:{proxy.port}/metrics")
        assert status == 200
        assert "mcp_proxy_audit_otlp_dropped_total 6" in body.decode(), body.decode()
        collector.release.set()
        assert proxy.stop() == 0
        # The four that waited were sent (the last at shutdown), the six dropped never were.
        received = collector.records()
        assert len(received) == 4, received
        assert all(resource["service.name"] == "custom-proxy" for resource, _ in received), received
    finally:
        collector.close()


def test_audit_otlp_without_a_collector_is_refused_by_name(proxy_bin, tmp_path):
    write_configmap(tmp_path / "configmap", to_yaml({"task": {"name": "t"}, "servers": []}))
    done = subprocess.run(
        [str(proxy_bin), "--config", str(tmp_path / "configmap/proxy.yaml"), "--listen", f"127.0.0.1:{free_port()}", "--audit-otlp"],
        capture_output=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert done.returncode != 0
    assert "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT" in done.stderr.decode(), done.stderr
    assert done.stdout == b""


def test_with_stdio_stdout_is_mcp_only_and_the_records_go_to_stderr(proxy_bin, tools, tmp_path):
    config = {"task": {"name": "t"}, "servers": [{"name": "every", "stdio": tools.everything_stdio(), "tools": {"deny": ["get-env"]}}]}
    write_configmap(tmp_path / "cm", to_yaml(config))
    process = subprocess.Popen(
        [str(proxy_bin), "--stdio", "--config", str(tmp_path / "cm/proxy.yaml"), "--cache-dir", str(tmp_path / "c")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")},
    )
    assert process.stdin is not None and process.stdout is not None
    seen: list[bytes] = []

    def send(message: dict) -> None:
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()

    def answer(id: int) -> dict:
        while True:
            line = process.stdout.readline()
            assert line, "stdout closed"
            seen.append(line)
            message = json.loads(line)
            if message.get("id") == id:
                return message

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "every__echo", "arguments": {"message": "m"}}})
        assert answer(2)["result"]["content"][0]["text"] == "Echo: m"
        send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "every__get-env", "arguments": {}}})
        answer(3)
        # The client goes away: the proxy stops, flushing the audit lines.
        out, err = process.communicate(timeout=30)  # closes stdin
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    seen.extend(out.splitlines(keepends=True))
    for line in seen:
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0" and "recordType" not in message, line
    records = [json.loads(line) for line in err.decode().splitlines() if line.startswith('{"recordType"')]
    assert [(r["tool"], r["decision"]) for r in records] == [("every__echo", "allowed"), ("every__get-env", "denied")], err.decode()
