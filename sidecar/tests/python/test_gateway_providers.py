"""The model gateway of the real proxy binary speaking the OpenAI Responses API (Codex CLI) and the
Gemini API (Gemini CLI), each in front of a scripted stand-in for that API over HTTPS with a CA of
its own (`gateway.caFile`). The stand-in answers with the shapes the CLIs were seen to accept
(docs/design/agent-runtimes.md 1.4 and 2.4) and records every request as it arrived.

What a person running Codex or Gemini CLI tasks would check: the runtime reaches the model with
the pod's agent credential sent the way it sends an API key, and the endpoint sees the real key
in its API's header, never the agent's; a stream comes through event by event and byte for byte;
the usage counted is the endpoint's; the agent's built-in tool uses are audited and its MCP ones
are not (the proxy records those when they are called); a budget caps a request that asks for no
cap and refuses in the API's own error shape; and a process without the credential, another path,
method or query, or Gemini's key header on /mcp, reaches nothing.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "e2e" / "model"))

from conftest import RAW_HEADERS, RAW_INIT, raw_post, wait_for  # noqa: E402
from scripted_model import tls_pair  # noqa: E402

KEY = "sk-proj-the-real-key-only-the-proxy-reads"
CACHED = 4096


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return tls_pair(tmp_path_factory.mktemp("model-ca"))


# --- the stand-in ---------------------------------------------------------------------------------


@dataclass
class Seen:
    """One request the stand-in received, and what it sent back."""

    method: str
    path: str
    raw_headers: list[tuple[str, str]]
    body: bytes
    sent: bytes = b""
    usage: dict | None = None  # the counts it answered with: input (cached included), cached, output
    released: bool = False  # a held stream went on because the client had read its first event

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.raw_headers if k.lower() == name]
        return values[0] if len(values) == 1 else None

    @property
    def json(self) -> dict:
        return json.loads(self.body or b"{}")


@dataclass
class Reply:
    status: int
    content_type: str
    parts: list[bytes]
    usage: dict | None = None
    hold_after: int | None = None  # stream parts up to this one, then wait for the client


class Standin:
    """A scripted model API on 127.0.0.1 over HTTPS: `answer(seen)` makes each reply."""

    def __init__(self, tls, answer):
        self.answer = answer
        self.requests: list[Seen] = []
        self.go = threading.Event()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("content-length") or 0)
                seen = Seen(self.command, self.path, list(self.headers.items()), self.rfile.read(length) if length else b"")
                standin.requests.append(seen)
                reply = standin.answer(seen)
                seen.usage = reply.usage
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                if reply.content_type != "text/event-stream":
                    body = b"".join(reply.parts)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    seen.sent = body
                    return
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for i, part in enumerate(reply.parts):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                    seen.sent += part
                    if reply.hold_after == i:
                        seen.released = standin.go.wait(10)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls[1], tls[2])
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def counted(self) -> dict:
        """What the answers said they used, as the gateway counts it (cached input apart)."""
        used = [r.usage for r in self.requests if r.usage]
        return {"inputTokens": sum(u["input"] - u["cached"] for u in used),
                "cacheReadInputTokens": sum(u["cached"] for u in used),
                "outputTokens": sum(u["output"] for u in used)}


def sse(event: str | None, data: dict, end: str = "\n\n") -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}{end}".encode()


def responses_api(seen: Seen, output: int = 300, hold: bool = False) -> Reply:
    """The Responses API: the model catalog, and an answer that runs the shell, an MCP tool and
    apply_patch (streamed as Codex 0.171.0 accepted it, or whole)."""
    if seen.method == "GET":
        return Reply(200, "application/json", [json.dumps({"models": []}).encode()])
    body = seen.json
    cap = body.get("max_output_tokens")
    out = min(output, cap) if cap else output
    usage = {"input": CACHED + len(seen.body) // 4, "cached": CACHED, "output": out}
    wire_usage = {"input_tokens": usage["input"], "input_tokens_details": {"cached_tokens": CACHED},
                  "output_tokens": out, "output_tokens_details": {"reasoning_tokens": out // 2},
                  "total_tokens": usage["input"] + out}
    model = body["model"] + "-2025-08-07"
    items = [
        {"id": "fc_1", "type": "function_call", "status": "completed", "arguments": '{"cmd":"git status"}',
         "call_id": "call_shell", "name": "exec_command"},
        {"id": "fc_2", "type": "function_call", "status": "completed", "arguments": '{"text":"hi"}',
         "call_id": "call_mcp", "name": "echo", "namespace": "mcp__orchestrator"},
        {"id": "ctc_1", "type": "custom_tool_call", "status": "completed", "call_id": "call_patch",
         "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch\n"},
    ]
    response = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": model,
                "output": items, "usage": wire_usage}
    if not body.get("stream"):
        return Reply(200, "application/json", [json.dumps(response).encode()], usage)
    shell = {**response, "status": "in_progress", "output": [], "usage": None}
    parts = [sse("response.created", {"type": "response.created", "sequence_number": 0, "response": shell}),
             sse("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": shell})]
    for i, item in enumerate(items):
        parts.append(sse("response.output_item.added", {"type": "response.output_item.added", "output_index": i,
                                                         "item": {**item, "status": "in_progress"}}))
        if item["type"] == "function_call":
            parts.append(sse("response.function_call_arguments.delta",
                             {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                              "output_index": i, "delta": item["arguments"]}))
        parts.append(sse("response.output_item.done", {"type": "response.output_item.done", "output_index": i,
                                                        "item": item}))
    parts.append(sse("response.completed", {"type": "response.completed", "response": response}))
    return Reply(200, "text/event-stream", parts, usage, hold_after=1 if hold else None)


def gemini_api(seen: Seen, output: int = 300, hold: bool = False) -> Reply:
    """The Gemini API: chunks with cumulative usageMetadata (the last has the whole count), a
    built-in tool's call and an MCP tool's; a whole answer; a token count."""
    path = seen.path.split("?", 1)[0]
    model, _, verb = path.rpartition("/")[2].partition(":")
    if verb == "countTokens":
        return Reply(200, "application/json", [json.dumps({"totalTokens": 12}).encode()])
    cap = (seen.json.get("generationConfig") or {}).get("maxOutputTokens")
    out = min(output, cap) if cap else output
    prompt = CACHED + len(seen.body) // 4
    usage = {"input": prompt, "cached": CACHED, "output": out}
    thoughts = out // 2

    def meta(candidates, thinking):
        return {"promptTokenCount": prompt, "cachedContentTokenCount": CACHED, "candidatesTokenCount": candidates,
                "thoughtsTokenCount": thinking, "totalTokenCount": prompt + candidates + thinking}

    def chunk(parts, usage_, finish=None):
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        return {"candidates": [candidate], "usageMetadata": usage_, "modelVersion": model, "responseId": "r1"}

    calls = [{"functionCall": {"name": "run_shell_command", "args": {"command": "git status"}}},
             {"functionCall": {"name": "mcp_orchestrator_echo", "args": {"text": "hi"}}}]
    chunks = [chunk([{"text": "Let me look."}], {"promptTokenCount": prompt, "cachedContentTokenCount": CACHED,
                                                  "totalTokenCount": prompt}),
              chunk(calls, meta(1, thoughts)),
              chunk([{"text": ""}], meta(out - thoughts, thoughts), "STOP")]
    if verb == "generateContent":
        whole = chunk([{"text": "Let me look."}, *calls], meta(out - thoughts, thoughts), "STOP")
        return Reply(200, "application/json", [json.dumps(whole).encode()], usage)
    # As the API streams with alt=sse: `data:` lines, no event names, CRLF between events.
    return Reply(200, "text/event-stream", [sse(None, c, "\r\n\r\n") for c in chunks], usage,
                 hold_after=0 if hold else None)


# --- the proxy ----------------------------------------------------------------------------------

PROVIDERS = {
    "openai": {"answer": responses_api, "key": ("authorization", f"Bearer {KEY}"),
               "stream": ("POST", "/model/v1/responses", {"model": "gpt-5", "stream": True, "input": [],
                                                          "tools": [], "store": False}),
               "whole": ("POST", "/model/v1/responses", {"model": "gpt-5", "input": [], "store": False}),
               "endpoint": "/v1/responses", "model": "gpt-5-2025-08-07",
               "builtin": ["exec_command", "apply_patch"]},
    "gemini": {"answer": gemini_api, "key": ("x-goog-api-key", KEY),
               "stream": ("POST", "/model/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
                          {"contents": [{"role": "user", "parts": [{"text": "hello"}]}],
                           "generationConfig": {"temperature": 0}}),
               "whole": ("POST", "/model/v1beta/models/gemini-2.5-pro:generateContent",
                         {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}),
               "endpoint": "/v1beta/models/{model}:streamGenerateContent", "model": "gemini-2.5-pro",
               "builtin": ["run_shell_command"]},
}


def start_proxy(make_proxy, tools, tmp_path, provider, standin, tls, budget=None, models=None):
    key_file = tmp_path / "model-secret" / "api-key"
    key_file.parent.mkdir(exist_ok=True)
    key_file.write_text(KEY + "\n")
    token_dir = tmp_path / "agent-token"
    token_dir.mkdir(exist_ok=True)
    gateway = {"provider": provider, "endpoint": standin.url, "keyFile": str(key_file), "caFile": tls[0],
               "budget": budget or {}}
    if models:
        gateway["models"] = models
    config = {"servers": [{"name": "everything", "stdio": tools.everything_stdio(), "tools": {"allow": ["echo"]}}],
              "gateway": gateway}
    workdir = tmp_path / "proxy"
    proxy = make_proxy({**config, "audit": {"path": str(workdir / "audit.jsonl"), "includeArguments": True}},
                       extra_args=["--client-token-file", str(token_dir / "token")], workdir=workdir)
    assert proxy.audit_path == workdir / "audit.jsonl"
    proxy.token = (token_dir / "token").read_text().strip()
    plain = proxy.http
    proxy.http = lambda path, headers=None: plain(path, {"authorization": f"Bearer {proxy.token}", **(headers or {})})
    proxy.config = config
    return proxy


def runtime_headers(provider: str, token: str | None) -> dict:
    """The headers each CLI sends (docs/design/agent-runtimes.md), its credential where it puts
    an API key, and a few no endpoint may see."""
    hostile = {"cookie": "session=agent-chosen", "x-forwarded-for": "10.0.0.1", "accept-encoding": "zstd,gzip"}
    if provider == "openai":
        h = {"content-type": "application/json", "accept": "text/event-stream", "originator": "codex_exec",
             "user-agent": "codex_exec/0.171.0", "session-id": "s-1", "x-client-request-id": "c-1",
             "x-codex-turn-metadata": '{"workspaces":["/workspace/secret-project"]}',
             "openai-organization": "org-someone-else", **hostile}
        if token:
            h["authorization"] = f"Bearer {token}"
    else:
        h = {"content-type": "application/json", "user-agent": "GeminiCLI/0.61.0",
             "x-goog-api-client": "google-genai-sdk/1.30.0 gl-node/v20.20.2",
             "x-goog-user-project": "someone-elses-project", **hostile}
        if token:
            h["x-goog-api-key"] = token
    return h


def call(proxy, method, path, body=None, headers=None, raw=None):
    """(status, headers, body bytes) of one request to the proxy."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def read_first_event_then_rest(proxy, method, path, body, headers, standin) -> tuple[int, bytes]:
    """Reads a stream's first event, lets the stand-in go on, then reads the rest: the stand-in
    held the rest back until then, so the first event came through before the stream ended."""
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        c.request(method, path, body=json.dumps(body).encode(), headers=headers)
        r = c.getresponse()
        first = b""
        while not first.endswith(b"\n\n") and not first.endswith(b"\r\n\r\n"):
            line = r.readline()
            assert line, f"the stream ended before its first event: {first!r}"
            first += line
        standin.go.set()
        return r.status, first + r.read()
    finally:
        c.close()


# --- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_the_runtime_reaches_its_api_with_its_credential_and_the_endpoint_sees_only_the_real_key(
        make_proxy, tools, tmp_path, tls, provider):
    p = PROVIDERS[provider]
    standin = Standin(tls, lambda seen: p["answer"](seen, hold=True))
    try:
        proxy = start_proxy(make_proxy, tools, tmp_path, provider, standin, tls)
        headers = runtime_headers(provider, proxy.token)
        if provider == "openai":
            # Codex asks for the model catalog at start: forwarded with the key, its version only.
            status, _, catalog = call(proxy, "GET", "/model/v1/models?client_version=0.171.0", headers=headers)
            assert status == 200 and catalog == standin.requests[-1].sent, catalog
            assert (standin.requests[-1].method, standin.requests[-1].path) == ("GET", "/v1/models?client_version=0.171.0")
        else:
            status, _, counted = call(proxy, "POST", "/model/v1beta/models/gemini-2.5-pro:countTokens",
                                      {"contents": []}, headers)
            assert status == 200 and json.loads(counted) == {"totalTokens": 12}, counted
        method, path, body = p["stream"]
        status, streamed = read_first_event_then_rest(proxy, method, path, body, headers, standin)
        seen = standin.requests[-1]
        assert status == 200, streamed
        assert seen.released, "the first event did not reach the agent before the stream ended"
        assert streamed == seen.sent, "the stream is passed on byte for byte"
        # No budget: the body is the agent's, byte for byte (no cap added).
        assert seen.body == json.dumps(body).encode()
        assert seen.path == path.removeprefix("/model")
        method, path, body = p["whole"]
        status, _, whole = call(proxy, method, path, body, headers)
        assert status == 200 and whole == standin.requests[-1].sent, whole

        # The endpoint got the real key in its API's header on every request; nothing of the
        # agent's credential, cookies, forwarding headers, billing choices or workspace paths.
        for seen in standin.requests:
            assert seen.header(p["key"][0]) == p["key"][1], seen.raw_headers
            sent = json.dumps(seen.raw_headers).lower()
            for leaked in (proxy.token, "cookie", "x-forwarded-for", "accept-encoding", "openai-organization",
                           "x-codex-turn-metadata", "/workspace", "x-goog-user-project"):
                assert leaked not in sent, (leaked, seen.raw_headers)
        first = standin.requests[-2]
        if provider == "openai":
            assert (first.header("originator"), first.header("session-id")) == ("codex_exec", "s-1")
            assert first.header("x-goog-api-key") is None
        else:
            assert first.header("x-goog-api-client") == "google-genai-sdk/1.30.0 gl-node/v20.20.2"
            assert first.header("authorization") is None

        # What the gateway counted is the endpoint's own count, and says which API it was.
        records = proxy.audit(at_least=3 + 2 * len(p["builtin"]))
        requests = [r for r in records if r["recordType"] == "model_request"]
        assert len(requests) == 3, records
        assert {r["provider"] for r in requests} == {provider}
        answered = [r for r in requests if r["outputTokens"]]
        assert [r["streamed"] for r in answered] == [True, False]
        assert answered[0]["endpoint"] == p["endpoint"] and answered[0]["model"] == p["model"], answered[0]
        counted = {k: sum(r[k] for r in requests) for k in ("inputTokens", "cacheReadInputTokens", "outputTokens")}
        assert counted == standin.counted(), (counted, standin.counted())
        assert all(r["status"] == 200 and "usageUnknown" not in r for r in requests), requests
        # The agent's own tools the model asked for are audited, after their request; its MCP
        # tool is not (the proxy records that call when the agent makes it).
        uses = [r for r in records if r["recordType"] == "agent_tool_use"]
        assert [u["tool"] for u in uses] == p["builtin"] * 2, uses
        assert not [u for u in uses if "echo" in u["tool"]]
        shell = {"openai": {"cmd": "git status"}, "gemini": {"command": "git status"}}[provider]
        assert uses[0]["arguments"] == shell and uses[0]["provider"] == provider
        assert records.index(uses[0]) > records.index(answered[0])
        assert proxy.metric("mcp_proxy_model_requests_total", model=p["model"], outcome="ok") == 2
        assert proxy.metric("mcp_proxy_model_tokens_total", model=p["model"], kind="output") == counted["outputTokens"]
        # The key is nowhere the agent can read.
        for where, text_ in (("answers", streamed + whole), ("log", proxy.log().encode()),
                             ("audit", proxy.audit_path.read_bytes()), ("metrics", proxy.metrics().encode())):
            assert KEY.encode() not in text_, where
    finally:
        standin.go.set()
        standin.stop()


def error_of(provider: str, body: bytes) -> tuple[str, str]:
    """(kind, message) of an error body in the provider's own shape; fails on another shape."""
    error = json.loads(body)["error"]
    if provider == "openai":
        assert set(error) == {"message", "type", "param", "code"}, error
        return error["type"], error["message"]
    assert set(error) == {"code", "message", "status"} and isinstance(error["code"], int), error
    return error["status"], error["message"]


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_without_the_credential_or_outside_the_api_nothing_reaches_the_endpoint(
        make_proxy, tools, tmp_path, tls, provider):
    p = PROVIDERS[provider]
    standin = Standin(tls, p["answer"])
    try:
        proxy = start_proxy(make_proxy, tools, tmp_path, provider, standin, tls,
                            models=["gpt-5*", "gemini-2.5-*"])
        method, path, body = p["stream"]
        # Another process of the pod: no credential, a guessed one, the model key itself, each in
        # any header an API key may come in.
        for credential in ({}, {"authorization": "Bearer " + "0" * 64}, {"x-goog-api-key": "0" * 64},
                           {"x-api-key": KEY}, {"x-goog-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
            status, got, answer = call(proxy, method, path, body, {**runtime_headers(provider, None), **credential})
            assert status == 401, (credential, status, answer)
            assert error_of(provider, answer)[0] == {"openai": "invalid_request_error", "gemini": "UNAUTHENTICATED"}[provider]
            assert got["x-orchestrator-gateway"] == "refused"
        # Gemini's key header opens the model only: never /mcp, which wants the bearer token.
        for header in ("x-goog-api-key", "x-api-key"):
            assert raw_post(proxy, {**RAW_HEADERS, header: proxy.token}, RAW_INIT) == 401, header
        assert raw_post(proxy, {**RAW_HEADERS, "authorization": f"Bearer {proxy.token}"}, RAW_INIT) == 200

        headers = runtime_headers(provider, proxy.token)
        # An open-proxy attempt: other paths, methods, queries; another API's paths.
        refused_in_shape = {
            "openai": [("POST", "/model/v1/chat/completions"), ("GET", "/model/v1/responses/resp_1"),
                       ("POST", "/model/v1/files"), ("POST", "/model/v1/messages"),
                       ("POST", "/model/v1beta/models/gemini-2.5-pro:generateContent"),
                       ("GET", "/model/v1/responses"), ("DELETE", "/model/v1/responses"), ("POST", "/model/v1/models"),
                       ("POST", "/model/v1/responses?stream=true"),
                       ("GET", "/model/v1/models?client_version=1&url=https://evil.example/"),
                       ("GET", "/model/v1/models?client_version=../../x")],
            "gemini": [("POST", "/model/v1beta/models/gemini-2.5-pro:embedContent"), ("POST", "/model/v1beta/files"),
                       ("POST", "/model/v1beta/models/gemini%2F..%2Fx:generateContent"),
                       ("POST", "/model/v1beta/models/..:generateContent"),
                       ("POST", "/model/v1/responses"), ("GET", "/model/v1beta/models/gemini-2.5-pro:generateContent"),
                       ("POST", "/model/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=x"),
                       ("POST", "/model/v1beta/models/gemini-2.5-pro:generateContent?alt=sse")],
        }[provider]
        for method_, path_ in refused_in_shape:
            status, _, answer = call(proxy, method_, path_, body, headers)
            assert status in (400, 404), (method_, path_, status, answer)
            kind, message = error_of(provider, answer)
            assert message.startswith("orchestrator gateway: "), message
        for path_ in ("/model/../v1/responses", "/model//v1/responses", "/model/v1beta/models/../../admin:generateContent",
                      "https://evil.example/model/v1/responses"):
            status, _, answer = call(proxy, "POST", path_, body, headers)
            assert status in (400, 403, 404), (path_, status, answer)
        # A model the task's globs do not allow, named in the refusal.
        other = {"openai": ("POST", "/model/v1/responses", {**body, "model": "o3-pro"}),
                 "gemini": ("POST", "/model/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse", body)}
        method_, path_, body_ = other[provider]
        status, _, answer = call(proxy, method_, path_, body_, headers)
        kind, message = error_of(provider, answer)
        assert status == 403 and "not allowed" in message, (status, answer)
        assert ("o3-pro" if provider == "openai" else "gemini-3-pro-preview") in message
        # A body that is not the API's request.
        status, _, answer = call(proxy, method, path, headers=headers, raw=b"{not json")
        assert status == 400 and error_of(provider, answer)[0] in ("invalid_request_error", "INVALID_ARGUMENT")
        assert standin.requests == [], [(r.method, r.path) for r in standin.requests]
        # The same credential and request, allowed: it goes through (the refusals above were not
        # a broken proxy).
        status, _, answer = call(proxy, method, path, body, headers)
        assert status == 200 and len(standin.requests) == 1, answer
    finally:
        standin.stop()


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_a_budget_caps_a_request_that_asks_for_no_cap_and_refuses_in_the_apis_shape(
        make_proxy, tools, tmp_path, tls, provider):
    p = PROVIDERS[provider]
    standin = Standin(tls, p["answer"])
    cap_of = {"openai": lambda r: r.json.get("max_output_tokens"),
              "gemini": lambda r: (r.json.get("generationConfig") or {}).get("maxOutputTokens")}[provider]
    try:
        # Each answer would be 300 output tokens; the budget allows 500 in all.
        proxy = start_proxy(make_proxy, tools, tmp_path, provider, standin, tls, budget={"outputTokens": 500})
        headers = runtime_headers(provider, proxy.token)
        method, path, body = p["stream"]
        assert cap_of_request(body, provider) is None, "the runtimes ask for no cap"
        answers = [call(proxy, method, path, body, headers) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 429], [a[:1] + (a[2][:200],) for a in answers]
        # Each was sent asking for what was left; the endpoint produced exactly the budget.
        assert [cap_of(r) for r in standin.requests] == [500, 200]
        assert sum(r.usage["output"] for r in standin.requests) == 500
        kind, message = error_of(provider, answers[2][2])
        assert kind == {"openai": "insufficient_quota", "gemini": "RESOURCE_EXHAUSTED"}[provider], answers[2][2]
        assert "budget exceeded: outputTokens" in message and "spec.budget.outputTokens" in message, message
        assert answers[2][1]["x-orchestrator-gateway"] == "refused"
        assert proxy.metric("mcp_proxy_model_budget_refusals_total", limit="outputTokens") == 1
        # A cost budget cannot price a model the table does not know: refused, naming the fix.
        unpriced = {**proxy.config, "contextVersion": 2,
                    "gateway": {**proxy.config["gateway"], "budget": {"costUsd": "5"}}}
        proxy.swap({**unpriced, "audit": {"path": str(proxy.audit_path)}})
        wait_for(lambda: proxy.tools()["contextVersion"] == 2, what="the cost budget")
        private = {"openai": ("POST", "/model/v1/responses", {**body, "model": "my-private-model"}),
                   "gemini": ("POST", "/model/v1beta/models/my-private-model:streamGenerateContent?alt=sse", body)}
        method_, path_, body_ = private[provider]
        status, _, answer = call(proxy, method_, path_, body_, headers)
        kind, message = error_of(provider, answer)
        assert status == 400 and "has no price" in message and "prices" in message, answer
        assert len(standin.requests) == 2
        # A priced model under the cost budget goes through, its cap what $5 buys at most.
        status, _, answer = call(proxy, method, path, body, headers)
        assert status == 200, answer
        assert len(standin.requests) == 3
    finally:
        standin.stop()


def cap_of_request(body: dict, provider: str):
    if provider == "openai":
        return body.get("max_output_tokens")
    return (body.get("generationConfig") or {}).get("maxOutputTokens")


def test_a_cut_stream_is_charged_what_it_reserved_and_audited_as_unknown(make_proxy, tools, tmp_path, tls):
    """A Gemini stream that ends before its last chunk (no finishReason): its usage so far is not
    the whole count, so the task is charged the reservation, not the partial count."""

    def cut(seen):
        reply = gemini_api(seen)
        reply.parts = reply.parts[:2]
        return reply

    standin = Standin(tls, cut)
    try:
        proxy = start_proxy(make_proxy, tools, tmp_path, "gemini", standin, tls, budget={"outputTokens": 1000})
        method, path, body = PROVIDERS["gemini"]["stream"]
        status, _, _ = call(proxy, method, path, body, runtime_headers("gemini", proxy.token))
        assert status == 200
        records = proxy.audit(at_least=1)
        request = next(r for r in records if r["recordType"] == "model_request")
        assert request["usageUnknown"] is True, request
        assert standin.requests[0].json["generationConfig"]["maxOutputTokens"] == 1000
        # The whole reservation is spent: the next request finds nothing left.
        status, _, answer = call(proxy, method, path, body, runtime_headers("gemini", proxy.token))
        assert status == 429 and error_of("gemini", answer)[0] == "RESOURCE_EXHAUSTED", answer
        assert len(standin.requests) == 1
    finally:
        standin.stop()
