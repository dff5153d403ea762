"""A small scripted MCP server (streamable HTTP, `POST /mcp`) for the host tests of the agent
runtimes: it stands where the task's proxy would, takes one bearer token, offers the tools a test
gives it, and records every request (method, headers, time).

    def echo(server, args):                      # a tool: (server, arguments) -> text
        server.add_tool("added_tool")            # changes the list during the call: the call's
        return "echo:" + args.get("text", "")    # SSE stream carries list_changed, then the result

    with ScriptedMCP({"echo": echo}, token="agent-token") as mcp:
        ... mcp.url ...
        mcp.wait_for(lambda r: r.method == "tools/list" and r.at > t)

A call during which the tool list changes is answered on an SSE stream:
`notifications/tools/list_changed` first, then the result (what the proxy does on add-context,
and how the study in docs/design/agent-runtimes.md drove each CLI). `GET /mcp` answers 405 (no
standalone stream), `DELETE /mcp` 200. A request without the token gets 401 and is recorded.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Callable

from scripted_model import Server

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MAX_BODY = 1 << 20


@dataclass
class McpRequest:
    seq: int
    at: float  # time.monotonic()
    http: str  # GET, POST, DELETE
    method: str  # the JSON-RPC method ("" for a GET or DELETE)
    params: dict
    headers: dict[str, str]
    status: int = 0


Tool = Callable[["ScriptedMCP", dict], str]


@dataclass
class ScriptedMCP:
    tools: dict[str, Tool]
    token: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[McpRequest] = field(default_factory=list)

    def __post_init__(self):
        self._cond = threading.Condition()
        self._changed = False
        self._seq = itertools.count(1)
        self._server = Server((self.host, self.port), self._handler())
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-mcp", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    def __enter__(self) -> "ScriptedMCP":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_tool(self, name: str, answer: str | None = None) -> None:
        """Adds a tool (answering `answer`, or `<name>:<text>`); if it is new, the call in
        progress, if any, sends list_changed before its result."""
        with self._cond:
            self._changed = self._changed or name not in self.tools
            self.tools[name] = lambda _s, args: answer if answer is not None else f"{name}:{args.get('text', '')}"

    def calls(self, name: str | None = None) -> list[McpRequest]:
        with self._cond:
            return [r for r in self.requests if r.method == "tools/call" and (name is None or r.params.get("name") == name)]

    def wait_for(self, predicate: Callable[[McpRequest], bool], timeout: float = 30, what: str = "a request") -> McpRequest:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self.requests:
                    if predicate(r):
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout}s waiting for {what}; MCP requests: "
                                       f"{[(r.http, r.method) for r in self.requests]}")
                self._cond.wait(min(left, 0.5))

    def _record(self, h, method: str, params: dict, status: int) -> McpRequest:
        r = McpRequest(next(self._seq), time.monotonic(), h.command, method, params,
                       {k.lower(): v for k, v in h.headers.items()}, status)
        with self._cond:
            self.requests.append(r)
            self._cond.notify_all()
        return r

    def _tool_list(self) -> list[dict]:
        with self._cond:
            names = sorted(self.tools)
        return [{"name": n, "description": f"Answers {n}:<text>.",
                 "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
                for n in names]

    def _call(self, params: dict) -> tuple[dict, bool]:
        """The result of a tools/call, and whether the tool list changed during it."""
        with self._cond:
            tool = self.tools.get(str(params.get("name")))
            self._changed = False
        if tool is None:
            result = {"content": [{"type": "text", "text": f"no tool {params.get('name')}"}], "isError": True}
        else:
            args = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
            result = {"content": [{"type": "text", "text": tool(self, args)}], "isError": False}
        with self._cond:
            changed, self._changed = self._changed, False
        return result, changed

    def _handler(mcp):  # noqa: N805
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict | None, headers: dict | None = None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                if body is not None:
                    self.send_header("content-type", "application/json")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                return mcp.token is None or self.headers.get("authorization") == f"Bearer {mcp.token}"

            def do_GET(self):  # noqa: N802
                mcp._record(self, "", {}, 405)
                self._send(405, {"error": "no standalone stream"})

            def do_DELETE(self):  # noqa: N802
                mcp._record(self, "", {}, 200)
                self._send(200, None)

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                if length > MAX_BODY:
                    return self._send(413, {"error": "too large"})
                try:
                    msg = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    return self._send(400, {"error": "not JSON"})
                msg = msg if isinstance(msg, dict) else {}
                method = str(msg.get("method", ""))
                params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
                if not self._authorized():
                    mcp._record(self, method, params, 401)
                    return self._send(401, {"error": "a bearer token is required"})
                session = {"mcp-session-id": "scripted-mcp-session"}
                if "id" not in msg:  # a notification or a response
                    mcp._record(self, method, params, 202)
                    return self._send(202, None, session)
                mcp._record(self, method, params, 200)
                reply = {"jsonrpc": "2.0", "id": msg["id"]}
                if method == "initialize":
                    asked = params.get("protocolVersion")
                    reply["result"] = {"protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
                                       "capabilities": {"tools": {"listChanged": True}},
                                       "serverInfo": {"name": "scripted-mcp", "version": "1"}}
                elif method == "tools/list":
                    reply["result"] = {"tools": mcp._tool_list()}
                elif method == "ping":
                    reply["result"] = {}
                elif method == "tools/call":
                    reply["result"], changed = mcp._call(params)
                    if changed:
                        return self._stream([{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}, reply], session)
                else:
                    reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
                self._send(200, reply, session)

            def _stream(self, messages: list[dict], headers: dict) -> None:
                data = b"".join(b"event: message\ndata: " + json.dumps(m).encode() + b"\n\n" for m in messages)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
