"""A scripted stand-in for the Anthropic Messages API: the MODEL behind the agent, and nothing else.

The agent in our tests and the demo is the real Claude Code (from npm, in the agent image); only
the model it talks to is replaced, by this small server on 127.0.0.1, so a run is offline,
repeatable and free. It answers `POST /v1/messages` (streaming SSE as the real API sends it, or
plain JSON) from a script, and records every request: the tools the agent offers the model, the
messages with their tool results, and when each request arrived.

A script is a generator function that receives each conversation request and yields the reply:

    def script(first):                       # the agent's first request
        second = yield tool_use("mcp__orchestrator__everything__get-sum", {"a": 2, "b": 3})
        assert "5" in tool_result_text(second)
        yield text("done")                   # end_turn: the agent finishes

    with ScriptedModel(script) as model:     # listens on 127.0.0.1:<free port> (or port=...)
        run_agent(env={"ANTHROPIC_BASE_URL": model.url, ...})
        first = model.wait_for(lambda r: r.offers("mcp__orchestrator__everything__echo"))

Requests that are not part of the conversation (the agent's side calls, e.g. a title or a topic
check: requests that offer no tools) get `side_reply` and are recorded with `side=True`. A request
the script does not expect (it ended, or raised) gets an API error (HTTP 500, `api_error`), which
Claude Code reports and which fails the test that waits for the script. Run as a program it
serves a script module: `python scripted_model.py --port 8089 --script mymodule:script`.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Generator, Iterable

MODEL_ID = "scripted-model-stand-in"


# --- replies -------------------------------------------------------------------------------------


@dataclass
class Reply:
    """What the model answers: content blocks, a stop reason, and an optional delay (seconds)
    before the answer starts (a slow model, or a turn that waits for something)."""

    blocks: list[dict]
    stop_reason: str
    delay: float = 0.0

    def after(self, seconds: float) -> "Reply":
        self.delay = seconds
        return self


_ids = itertools.count(1)


def text(t: str) -> Reply:
    """A final answer: the agent's turn ends (stop_reason end_turn)."""
    return Reply([{"type": "text", "text": t}], "end_turn")


def tool_use(name: str, arguments: dict | None = None, *more: tuple[str, dict], say: str = "") -> Reply:
    """Calls a tool (or several, as (name, arguments) pairs), optionally after some text."""
    blocks = [{"type": "text", "text": say}] if say else []
    for n, a in [(name, arguments or {}), *more]:
        blocks.append({"type": "tool_use", "id": f"toolu_stand_in_{next(_ids):04d}", "name": n, "input": a})
    return Reply(blocks, "tool_use")


# --- recorded requests ---------------------------------------------------------------------------


@dataclass
class Recorded:
    """One request the agent sent, as received."""

    seq: int
    at: float  # time.monotonic() when it arrived
    wall: float  # time.time() when it arrived
    path: str
    headers: dict[str, str]
    body: dict
    side: bool = False
    reply: dict | None = None  # what was answered (blocks, stop_reason) or the error
    raw_headers: list[tuple[str, str]] = field(default_factory=list)  # every header, as sent
    sent: bytes = b""  # the response body, byte for byte

    @property
    def tools(self) -> list[str]:
        """Names of the tools offered to the model in this request."""
        return [t.get("name", "") for t in self.body.get("tools", []) or []]

    def offers(self, name: str) -> bool:
        return name in self.tools

    def available(self) -> set[str]:
        """Every tool the agent makes available to the model in this request: those in `tools`,
        and the deferred ones. Claude Code offers MCP tools deferred (loaded with its ToolSearch
        tool): it names them in the conversation, in notes that say which became available and
        which are no longer available (after `notifications/tools/list_changed`), in order."""
        names = set(self.tools)
        for t in _texts(self.body.get("system")):
            _apply_deferred_note(t, names)
        for m in self.messages:
            for t in _texts(m.get("content")):
                _apply_deferred_note(t, names)
        return names

    def mcp_tools(self, server: str = "orchestrator") -> list[str]:
        """The MCP tools of one MCP server available to the model, offered directly or deferred
        (Claude Code names them mcp__<server>__<tool>), without that prefix."""
        prefix = f"mcp__{server}__"
        return sorted(t[len(prefix):] for t in self.available() if t.startswith(prefix))

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", []) or []

    def tool_results(self) -> list[dict]:
        """The tool_result blocks of the user messages after the last assistant message (the
        answers to the last tool calls). Claude Code may follow the results with a message of its
        own (a `system` note that an MCP server is still connecting), so not only the last one."""
        out = []
        for m in reversed(self.messages):
            if m.get("role") == "assistant":
                break
            content = m.get("content") if m.get("role") == "user" else None
            if isinstance(content, list):
                out[:0] = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        return out


# Claude Code's notes on the tools it offers (2.1.x): a header sentence, then the tool names (one
# per line, or joined on the header's line). Read from its binary's strings; whichever form a
# version uses, a note that adds names and one that takes them away are told apart here.
TOOLS_ADDED = (
    "The following deferred tools are now available",
    "The following deferred tools are available via",
    "The following tools just became available",
    "The following tools are now available",
    "The following tools are available again",
)
TOOLS_REMOVED = (
    "The following deferred tools are no longer available",
    "The following tools are no longer available",
    "The following tools are not offered right now",
)
# A tool taken away and then offered again: "1 deferred tool is available again in this session
# (announced earlier in this conversation): mcp__a__b. Load via ToolSearch as before."
_AGAIN = r"\d+ deferred tools? (?:is|are) available again"
_NOTE = re.compile("|".join([re.escape(h) for h in TOOLS_ADDED + TOOLS_REMOVED] + [_AGAIN]))
_MCP_NAME = re.compile(r"mcp__[A-Za-z0-9_.-]+")


def _texts(content) -> Iterable[str]:
    """The text of a message's content (a string or blocks, tool results included)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    yield block["text"]
                if "content" in block:
                    yield from _texts(block["content"])


def _apply_deferred_note(text: str, names: set[str]) -> None:
    """Applies Claude Code's notes on the tools it offers ("now available", "available again",
    "no longer available", ...) to `names`, in the order they appear. A note's names are the MCP
    tool names from its header to the first blank line after it."""
    for m in _NOTE.finditer(text):
        end = text.find("\n\n", m.end())
        section = text[m.end() : end if end >= 0 else len(text)]
        listed = {n.rstrip(".") for n in _MCP_NAME.findall(section)}
        listed = {n for n in listed if not n.endswith("__")}
        listed = {n for n in listed if f"{n}*" not in section}
        if not m.group(0).startswith(TOOLS_REMOVED):
            names |= listed
        else:
            names -= listed


def tool_result_text(request: Recorded) -> str:
    """The text of the tool results in a request (joined), with an ERROR: prefix for is_error."""
    parts = []
    for r in request.tool_results():
        content = r.get("content")
        if isinstance(content, list):
            t = "".join(c.get("text", "") for c in content if isinstance(c, dict))
        else:
            t = str(content or "")
        parts.append(("ERROR: " if r.get("is_error") else "") + t)
    return "\n".join(parts)


# --- the server ----------------------------------------------------------------------------------

Script = Callable[[Recorded], Generator[Reply, Recorded, None]]


@dataclass
class ScriptedModel:
    """The stand-in. Thread-safe: the agent's requests are served on their own threads while the
    test reads `requests` or waits with `wait_for`."""

    script: Script
    host: str = "127.0.0.1"
    port: int = 0
    side_reply: Callable[[Recorded], Reply] = lambda _r: text("ok")
    requests: list[Recorded] = field(default_factory=list)
    error: BaseException | None = None
    # HTTPS with a certificate of its own CA (`tls_pair`): (certificate file, key file).
    tls: tuple[str, str] | None = None

    def __post_init__(self):
        if not self.host.startswith("127."):
            raise ValueError("the model stand-in binds loopback only")
        self._cond = threading.Condition()
        self._gen: Generator[Reply, Recorded, None] | None = None
        self._turn = threading.Lock()  # one conversation step at a time
        self._server = ThreadingHTTPServer((self.host, self.port), self._handler())
        if self.tls is not None:
            import ssl
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def start(self) -> "ScriptedModel":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "ScriptedModel":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- reading what the agent sent --

    def conversation(self) -> list[Recorded]:
        with self._cond:
            return [r for r in self.requests if not r.side and r.path.startswith("/v1/messages") and "count_tokens" not in r.path]

    def wait_for(self, predicate: Callable[[Recorded], bool], timeout: float = 60, what: str = "a request") -> Recorded:
        """The first conversation request (already recorded or still to come) for which
        `predicate` holds; raises TimeoutError (naming `what`) or the script's error."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.error is not None:
                    raise AssertionError(f"the model script failed: {self.error!r}") from self.error
                for r in self.requests:
                    if not r.side and r.reply is not None and predicate(r):
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout}s waiting for {what}; "
                                       f"{len(self.requests)} requests so far")
                self._cond.wait(min(left, 0.5))

    def usage(self) -> dict:
        """The tokens the stand-in reported over every Messages request answered (the
        conversation and the agent's side requests): input, output, and how many requests."""
        with self._cond:
            used = [r.reply["usage"] for r in self.requests if r.reply and "usage" in r.reply]
        return {"input_tokens": sum(u["input_tokens"] for u in used),
                "output_tokens": sum(u["output_tokens"] for u in used), "requests": len(used)}

    def finished(self) -> bool:
        """Whether the script ran to its end."""
        with self._cond:
            return self._gen is not None and self._done

    # -- serving --

    _done = False

    def _answer(self, request: Recorded) -> Reply:
        """The next step of the script for a conversation request."""
        with self._turn:
            try:
                if self._gen is None:
                    self._gen = self.script(request)
                    reply = next(self._gen)
                else:
                    reply = self._gen.send(request)
                if not isinstance(reply, Reply):
                    raise TypeError(f"the script yielded {reply!r}, not a Reply")
                return reply
            except StopIteration:
                self._done = True
                raise RuntimeError(f"request {request.seq} came after the script ended") from None
            except BaseException as e:  # noqa: BLE001 - reported to the waiting test
                with self._cond:
                    self.error = self.error or e
                    self._cond.notify_all()
                raise

    def _record(self, r: Recorded) -> None:
        with self._cond:
            self.requests.append(r)
            self._cond.notify_all()

    def _replied(self, r: Recorded, reply: dict) -> None:
        with self._cond:
            r.reply = reply
            self._cond.notify_all()

    def _handler(model):  # noqa: N805 - the handler class closes over the model
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: the test prints what matters
                pass

            def _json(self, status: int, body: dict) -> bytes:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return data

            def do_GET(self):  # noqa: N802
                r = model._new_record(self, {})
                r.side = True
                model._record(r)
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": f"the model stand-in has no {self.path}"}})
                model._replied(r, {"status": 404})

            def do_HEAD(self):  # noqa: N802
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return self._json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "body is not JSON"}})
                r = model._new_record(self, body)
                path = self.path.split("?", 1)[0]
                if path.endswith("/count_tokens"):
                    r.side = True
                    model._record(r)
                    tokens = max(1, len(raw) // 4)
                    self._json(200, {"input_tokens": tokens})
                    return model._replied(r, {"input_tokens": tokens})
                if path != "/v1/messages":
                    r.side = True
                    model._record(r)
                    self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": f"the model stand-in has no {path}"}})
                    return model._replied(r, {"status": 404})
                r.side = not body.get("tools")
                model._record(r)
                try:
                    reply = model.side_reply(r) if r.side else model._answer(r)
                except BaseException as e:  # noqa: BLE001
                    self._json(500, {"type": "error", "error": {"type": "api_error", "message": f"model stand-in script: {e}"}})
                    return model._replied(r, {"error": repr(e)})
                if reply.delay:
                    time.sleep(reply.delay)
                if body.get("stream"):
                    r.sent = self._stream(body, reply)
                else:
                    r.sent = self._json(200, message(body, reply))
                model._replied(r, {"blocks": reply.blocks, "stop_reason": reply.stop_reason,
                                   "usage": _usage(body, reply)})

            def _stream(self, body: dict, reply: Reply) -> bytes:
                # As the API streams: chunked, an event per chunk, the connection kept.
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                sent = b""
                for event, data in stream_events(body, reply):
                    chunk = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    sent += chunk
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return sent

        return Handler

    _seq = itertools.count(1)

    def _new_record(self, handler: BaseHTTPRequestHandler, body: dict) -> Recorded:
        keep = {k.lower(): v for k, v in handler.headers.items()
                if k.lower() in ("anthropic-version", "anthropic-beta", "user-agent", "x-app", "x-api-key")}
        return Recorded(seq=next(self._seq), at=time.monotonic(), wall=time.time(),
                        path=handler.path, headers=keep, body=body, raw_headers=list(handler.headers.items()))


def _usage(body: dict, reply: Reply) -> dict:
    """The usage a reply reports: about a token per 4 bytes of the messages sent and of the blocks
    answered (what an agent sums into its own count and cost), the output never over the
    request's `max_tokens` (the API stops there)."""
    most = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None
    output = max(1, len(json.dumps(reply.blocks)) // 4)
    return {"input_tokens": max(1, len(json.dumps(body.get("messages", []))) // 4),
            "output_tokens": min(output, most) if most else output,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message(body: dict, reply: Reply) -> dict:
    """The non-streaming response body."""
    return {"id": f"msg_stand_in_{next(_ids):04d}", "type": "message", "role": "assistant",
            "model": body.get("model", MODEL_ID), "content": reply.blocks, "stop_reason": reply.stop_reason,
            "stop_sequence": None, "usage": _usage(body, reply)}


def stream_events(body: dict, reply: Reply) -> Iterable[tuple[str, dict]]:
    """The SSE events of a streamed response, as the Messages API sends them."""
    start = message(body, reply)
    start["content"], start["stop_reason"] = [], None
    start["usage"] = {**start["usage"], "output_tokens": 1}  # the final count comes in message_delta
    yield "message_start", {"type": "message_start", "message": start}
    for i, block in enumerate(reply.blocks):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}
            yield "content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": block["text"]}}
        else:
            shell = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield "content_block_start", {"type": "content_block_start", "index": i, "content_block": shell}
            yield "content_block_delta", {"type": "content_block_delta", "index": i,
                                          "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}
        yield "content_block_stop", {"type": "content_block_stop", "index": i}
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                            "usage": {"output_tokens": _usage(body, reply)["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--script", required=True, help="module:function, a script generator function")
    p.add_argument("--record", help="append every request as a JSON line to this file on exit")
    args = p.parse_args(argv)
    module, _, name = args.script.partition(":")
    script = getattr(importlib.import_module(module), name)
    model = ScriptedModel(script, host=args.host, port=args.port).start()
    print(f"model stand-in on {model.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        model.stop()
        if args.record:
            with open(args.record, "a") as f:
                for r in model.requests:
                    f.write(json.dumps({"seq": r.seq, "wall": r.wall, "path": r.path, "side": r.side,
                                        "tools": r.tools, "reply": r.reply}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def tls_pair(directory) -> tuple[str, str, str]:
    """A CA of its own and a certificate it signed for 127.0.0.1 (openssl), in `directory`:
    (the CA's PEM, the server's certificate, its key), for `ScriptedModel(tls=...)`."""
    import subprocess
    from pathlib import Path
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key, csr = (d / n for n in ("ca.pem", "ca.key", "cert.pem", "key.pem", "cert.csr"))
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", "/CN=scripted model stand-in CA", "-keyout", str(ca_key), "-out", str(ca),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-out", str(cert), "-extfile", str(ext))
    return str(ca), str(cert), str(key)
