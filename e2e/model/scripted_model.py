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

The same script model serves the other runtimes' APIs, each in a module of its own built on this
one: the OpenAI Responses API for Codex (scripted_responses.py, `ScriptedResponses`) and the
Gemini API for Gemini CLI (scripted_gemini.py, `ScriptedGemini`). A script yields the same
`text(...)` and `tool_use(...)` replies to any of them (a tool call names the tool as the request
offered it; `r.mcp_name("echo")` gives that name for an MCP tool), and each records its requests
with the offered tools named alike: `r.offers("echo")`, `r.mcp_tools()`, `tool_result_text(r)`.
OpenCode speaks the Messages API: serve it with `ScriptedModel(script, mcp_prefix="{server}_")`
(it names MCP tools `<server>_<tool>`).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Generator, Iterable

from claude_notes import _apply_deferred_note, _texts

MODEL_ID = "scripted-model-stand-in"


# --- replies -------------------------------------------------------------------------------------


@dataclass
class Reply:
    """What the model answers: content blocks (Messages' `text` and `tool_use` blocks, which each
    API's stand-in renders in its own form), a stop reason, an optional delay (seconds) before the
    answer starts (a slow model, or a turn that waits for something), and reasoning tokens the
    answer reports besides its text (counted as output, as each API counts them)."""

    blocks: list[dict]
    stop_reason: str
    delay: float = 0.0
    reasoning: int = 0

    def after(self, seconds: float) -> "Reply":
        self.delay = seconds
        return self

    def thinks(self, tokens: int) -> "Reply":
        """The answer reports `tokens` reasoning (thinking) tokens in its usage."""
        self.reasoning = tokens
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
    """One request the agent sent, as received (a Messages request; the other APIs' stand-ins
    record theirs in a subclass that reads their body)."""

    seq: int
    at: float  # time.monotonic() when it arrived
    wall: float  # time.time() when it arrived
    path: str
    headers: dict[str, str]
    body: dict
    side: bool = False
    reply: dict | None = None  # what was answered (blocks, stop_reason, usage) or the error
    raw_headers: list[tuple[str, str]] = field(default_factory=list)  # every header, as sent
    sent: bytes = b""  # the response body, byte for byte
    # How the agent names an MCP server's tools for the model ({server} is the server's name):
    # Claude Code mcp__<server>__<tool>, OpenCode <server>_<tool>.
    mcp_prefix: str = "mcp__{server}__"

    kind = "messages"  # the API: messages, responses, gemini

    @property
    def tools(self) -> list[str]:
        """Names of the tools offered to the model in this request."""
        return [t.get("name", "") for t in _list(self.body.get("tools"))]

    @property
    def model(self) -> str:
        """The model the request asks for."""
        return str(self.body.get("model", ""))

    def offers(self, name: str) -> bool:
        """Whether the model is offered this tool: by the name it is offered under, or, for an
        MCP tool of the orchestrator server, by the tool's own name (`offers("echo")`)."""
        return name in self.tools or name in self.mcp_tools()

    def mcp_name(self, tool: str, server: str = "orchestrator") -> str:
        """The name the model calls an MCP tool by, in this agent's naming."""
        return self.mcp_prefix.format(server=server) + tool

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
        (named `mcp_prefix` + tool, e.g. mcp__<server>__<tool>), without that prefix."""
        prefix = self.mcp_prefix.format(server=server)
        return sorted(t[len(prefix):] for t in self.available() if t.startswith(prefix))

    def tool_outputs(self) -> list[tuple[str, bool]]:
        """The answers to the model's last tool calls: (text, is_error) each."""
        out = []
        for r in self.tool_results():
            content = r.get("content")
            if isinstance(content, list):
                t = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            else:
                t = str(content or "")
            out.append((t, bool(r.get("is_error"))))
        return out

    @property
    def messages(self) -> list[dict]:
        return _list(self.body.get("messages"))

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


def _list(value) -> list:
    """A body field that should be a list of objects: its objects, or none."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def tool_result_text(request: Recorded) -> str:
    """The text of the tool results in a request (joined), with an ERROR: prefix for is_error."""
    return "\n".join(("ERROR: " if error else "") + t for t, error in request.tool_outputs())


# --- the server ----------------------------------------------------------------------------------

Script = Callable[[Recorded], Generator[Reply, Recorded, None]]
Events = Iterable[tuple[str | None, dict]]  # SSE events: (event name or None, data)


class Server(ThreadingHTTPServer):
    """Quiet about a client that hung up before reading its answer (an agent exiting); any other
    error is printed as usual."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@dataclass
class ScriptedModel:
    """The stand-in. Thread-safe: the agent's requests are served on their own threads while the
    test reads `requests` or waits with `wait_for`. This class serves the Messages API; the other
    APIs' stand-ins subclass it and override `_get`, `_post` and the usage and rendering hooks."""

    script: Script
    host: str = "127.0.0.1"
    port: int = 0
    side_reply: Callable[[Recorded], Reply] = lambda _r: text("ok")
    requests: list[Recorded] = field(default_factory=list)
    error: BaseException | None = None
    # HTTPS with a certificate of its own CA (`tls_pair`): (certificate file, key file).
    tls: tuple[str, str] | None = None
    # How the agent names MCP tools (see Recorded.mcp_prefix); None: the API's usual naming.
    mcp_prefix: str | None = None

    recorded = Recorded  # the class of the requests this API records
    kept_headers = ("anthropic-version", "anthropic-beta", "user-agent", "x-app", "x-api-key")

    def __post_init__(self):
        if not self.host.startswith("127."):
            raise ValueError("the model stand-in binds loopback only")
        self._cond = threading.Condition()
        self._gen: Generator[Reply, Recorded, None] | None = None
        self._turn = threading.Lock()  # one conversation step at a time
        self._server = Server((self.host, self.port), self._handler())
        if self.tls is not None:
            import ssl
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
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
        """The conversation's requests (not the side ones), in order."""
        with self._cond:
            return [r for r in self.requests if not r.side]

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
        """The tokens the stand-in reported over every model request answered (the conversation
        and the agent's side requests), as the API counts them: input_tokens (all the input,
        cached included), output_tokens (reasoning included), and how many requests. The other
        APIs add the parts they report: cached_input_tokens, reasoning_tokens."""
        with self._cond:
            used = [self._counted(r.reply["usage"]) for r in self.requests if r.reply and "usage" in r.reply]
        total = {"input_tokens": 0, "output_tokens": 0}
        for u in used:
            for k, v in u.items():
                total[k] = total.get(k, 0) + v
        return {**total, "requests": len(used)}

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

    def _side(self, h, r: Recorded, status: int, body: dict) -> None:
        """Records a request that is not a model turn (side) and answers it with `body`."""
        r.side = True
        self._record(r)
        h.json(status, body, lambda _sent: self._replied(r, body if status == 200 else {"status": status}))

    def _turn_of(self, h, r: Recorded, stream: bool) -> None:
        """Records a model request and answers it: from the script (a conversation request) or
        with `side_reply` (r.side), as a stream or as one JSON body, with the usage it reports."""
        self._record(r)
        try:
            reply = self.side_reply(r) if r.side else self._answer(r)
        except BaseException as e:  # noqa: BLE001
            status, body = self._error(e)
            return h.json(status, body, lambda _sent: self._replied(r, {"error": repr(e)}))
        if reply.delay:
            time.sleep(reply.delay)
        usage = self._usage(r, reply)

        def answered(sent: bytes) -> None:
            r.sent = sent
            self._replied(r, {"blocks": reply.blocks, "stop_reason": reply.stop_reason, "usage": usage})

        if stream:
            h.sse(self._events(r, reply, usage), answered)
        else:
            h.json(200, self._whole(r, reply, usage), answered)

    # The Messages API: the hooks the other APIs' stand-ins override.

    def _get(self, h, r: Recorded) -> None:
        self._side(h, r, 404, _not_found(r.path))

    def _post(self, h, r: Recorded, raw: bytes) -> None:
        path = r.path.split("?", 1)[0]
        if path.endswith("/count_tokens"):
            return self._side(h, r, 200, {"input_tokens": max(1, len(raw) // 4)})
        if path != "/v1/messages":
            return self._side(h, r, 404, _not_found(path))
        r.side = not r.body.get("tools")
        self._turn_of(h, r, bool(r.body.get("stream")))

    def _error(self, e: BaseException) -> tuple[int, dict]:
        return 500, {"type": "error", "error": {"type": "api_error", "message": f"model stand-in script: {e}"}}

    def _usage(self, r: Recorded, reply: Reply) -> dict:
        return _usage(r.body, reply)

    def _counted(self, usage: dict) -> dict:
        """A reply's usage as `usage()` sums it."""
        return {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}

    def _events(self, r: Recorded, reply: Reply, usage: dict) -> Events:
        return stream_events(r.body, reply, usage)

    def _whole(self, r: Recorded, reply: Reply, usage: dict) -> dict:
        return message(r.body, reply, usage)

    def _handler(model):  # noqa: N805 - the handler class closes over the model
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: the test prints what matters
                pass

            # `answered(sent)` runs before the client can read the answer's last byte, so that a
            # test which has its answer finds the request's record holding it.

            def json(self, status: int, body: dict, answered: Callable[[bytes], None] | None = None) -> bytes:
                data = json.dumps(body).encode()
                if answered:
                    answered(data)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return data

            def sse(self, events: Events, answered: Callable[[bytes], None]) -> bytes:
                # As the APIs stream: chunked, an event per chunk, the connection kept.
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                sent = b""
                for event, data in events:
                    chunk = (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk.encode()), chunk.encode()))
                    self.wfile.flush()
                    sent += chunk.encode()
                answered(sent)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return sent

            def do_GET(self):  # noqa: N802
                model._get(self, model._new_record(self, {}))

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
                    return self.json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "body is not JSON"}})
                if not isinstance(body, dict):
                    return self.json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "body is not a JSON object"}})
                model._post(self, model._new_record(self, body), raw)

        return Handler

    _seq = itertools.count(1)

    def _new_record(self, handler: BaseHTTPRequestHandler, body: dict) -> Recorded:
        keep = {k.lower(): v for k, v in handler.headers.items() if k.lower() in self.kept_headers}
        r = self.recorded(seq=next(self._seq), at=time.monotonic(), wall=time.time(), path=handler.path,
                          headers=keep, body=body, raw_headers=list(handler.headers.items()))
        if self.mcp_prefix is not None:
            r.mcp_prefix = self.mcp_prefix
        return r


def _not_found(path: str) -> dict:
    return {"type": "error", "error": {"type": "not_found_error", "message": f"the model stand-in has no {path}"}}


def tokens(value) -> int:
    """About a token per 4 bytes of a value's JSON, at least 1: what the stand-ins report."""
    return max(1, len(json.dumps(value)) // 4)


def _usage(body: dict, reply: Reply) -> dict:
    """The usage a reply reports: about a token per 4 bytes of the messages sent and of the blocks
    answered (what an agent sums into its own count and cost), the output never over the
    request's `max_tokens` (the API stops there)."""
    most = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None
    output = tokens(reply.blocks) + reply.reasoning
    return {"input_tokens": tokens(body.get("messages", [])),
            "output_tokens": min(output, most) if most else output,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message(body: dict, reply: Reply, usage: dict | None = None) -> dict:
    """The non-streaming response body."""
    return {"id": f"msg_stand_in_{next(_ids):04d}", "type": "message", "role": "assistant",
            "model": body.get("model", MODEL_ID), "content": reply.blocks, "stop_reason": reply.stop_reason,
            "stop_sequence": None, "usage": usage or _usage(body, reply)}


def stream_events(body: dict, reply: Reply, usage: dict | None = None) -> Iterable[tuple[str, dict]]:
    """The SSE events of a streamed response, as the Messages API sends them."""
    usage = usage or _usage(body, reply)
    start = message(body, reply, usage)
    start["content"], start["stop_reason"] = [], None
    start["usage"] = {**usage, "output_tokens": 1}  # the final count comes in message_delta
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
                            "usage": {"output_tokens": usage["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


APIS = {"messages": ("scripted_model", "ScriptedModel"), "responses": ("scripted_responses", "ScriptedResponses"),
        "gemini": ("scripted_gemini", "ScriptedGemini")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--api", choices=sorted(APIS), default="messages", help="the API to serve")
    p.add_argument("--script", required=True, help="module:function, a script generator function")
    p.add_argument("--record", help="append every request as a JSON line to this file on exit")
    args = p.parse_args(argv)
    module, _, name = args.script.partition(":")
    script = getattr(importlib.import_module(module), name)
    api_module, api_class = APIS[args.api]
    model = getattr(importlib.import_module(api_module), api_class)(script, host=args.host, port=args.port).start()
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
