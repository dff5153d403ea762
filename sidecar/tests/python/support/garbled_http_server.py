"""A streamable-HTTP MCP server of our own (initialize lifecycle, standard library only) whose
`tools/call` answer is not MCP: an HTML page served as `application/json`, the way a
misconfigured ingress answers. Everything before the call is well formed.

Usage: garbled_http_server.py PORT"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GARBAGE = b"<html><body><h1>502 Bad Gateway</h1>upstream said no</body></html>" + b" " * 4000 + b"TAIL-NOT-QUOTED"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep the test output quiet
        pass

    def reply(self, status: int, body: bytes = b"", content_type: str = "application/json", headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(405)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        method, mid = message.get("method"), message.get("id")

        def result(value) -> bytes:
            return json.dumps({"jsonrpc": "2.0", "id": mid, "result": value}).encode()

        if mid is None:
            return self.reply(202)
        if method == "server/discover":
            error = {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}}
            return self.reply(200, json.dumps(error).encode())
        if method == "initialize":
            init = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "garbled", "version": "1"},
            }
            return self.reply(200, result(init), headers={"Mcp-Session-Id": "garbled-1"})
        if method == "tools/list":
            tool = {"name": "garble", "description": "answers with HTML", "inputSchema": {"type": "object"}}
            return self.reply(200, result({"tools": [tool]}))
        if method == "tools/call":
            return self.reply(200, GARBAGE)
        return self.reply(200, result({}))


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()
