"""The model gateway of the real proxy binary (`/model`), in front of the scripted Messages API
stand-in (e2e/model/scripted_model.py) serving HTTPS with a CA of its own, which the proxy is
told to trust (`gateway.caFile`).

What a person running tasks would check: the agent's runtime reaches the model with the pod's
agent credential only, and the endpoint sees the real key on every request and never the agent's
token; a stream comes through byte for byte; the usage the gateway counts is the endpoint's own;
the agent's built-in tool uses are audited; a budget holds against parallel requests and a raised
one lets the task go on; and whatever else a process in the pod tries (no credential, other
paths, another host) reaches nothing.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "e2e" / "model"))

from conftest import to_yaml, wait_for  # noqa: E402
from scripted_model import ScriptedModel, text, tls_pair, tool_use  # noqa: E402

KEY = "sk-ant-api03-the-real-key-only-the-proxy-reads"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return tls_pair(tmp_path_factory.mktemp("model-ca"))


def start_model(tls, script=None) -> ScriptedModel:
    """The stand-in: by default a Bash tool use, then text, for ever."""

    def forever(first):
        r = first
        while True:
            r = yield tool_use("Bash", {"command": "git status --short"}, say="Checking.")
            r = yield text("done")

    return ScriptedModel(script or forever, tls=(tls[1], tls[2])).start()


def gateway_proxy(make_proxy, tools, tmp_path, model, tls, budget=None, include_arguments=True):
    key_file = tmp_path / "model-secret" / "api-key"
    key_file.parent.mkdir()
    key_file.write_text(KEY + "\n")
    token_dir = tmp_path / "agent-token"
    token_dir.mkdir()
    config = {
        "servers": [{"name": "everything", "stdio": tools.everything_stdio(), "tools": {"allow": ["echo"]}}],
        "gateway": {"endpoint": model.url, "keyFile": str(key_file), "caFile": tls[0],
                    "budget": budget or {}},
    }
    proxy = make_proxy(config, extra_args=["--client-token-file", str(token_dir / "token")])
    proxy.token = (token_dir / "token").read_text().strip()
    # The test reads /tools and /metrics as the agent may.
    plain = proxy.http
    proxy.http = lambda path, headers=None: plain(path, {"authorization": f"Bearer {proxy.token}", **(headers or {})})
    if include_arguments:
        proxy.swap({**config, "audit": {"path": str(proxy.audit_path), "includeArguments": True}, "contextVersion": 1})
        wait_for(lambda: proxy.tools()["contextVersion"] == 1, what="the config with includeArguments")
    proxy.gateway_config = config
    return proxy


def post(proxy, path="/model/v1/messages?beta=true", body=None, headers=None, token=True, raw=None):
    """(status, headers, body bytes) of one request to the proxy, as Claude Code sends it."""
    h = {"content-type": "application/json", "anthropic-version": "2023-06-01",
         "anthropic-beta": "claude-code-20250219", "x-app": "cli", "user-agent": "claude-cli/test",
         "accept-encoding": "gzip, br", "cookie": "session=agent-chosen", "x-forwarded-for": "10.0.0.1"}
    if token:
        h["x-api-key"] = proxy.token
        h["authorization"] = f"Bearer {proxy.token}"
    h.update(headers or {})
    data = raw if raw is not None else json.dumps(body or ask()).encode()
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        c.request("POST", path, body=data, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def ask(stream=True, max_tokens=1024, model="claude-sonnet-4-5", words="hello"):
    return {"model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": words}],
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]}


def test_the_agent_reaches_the_model_with_its_credential_and_the_endpoint_sees_only_the_real_key(
        make_proxy, tools, tmp_path, tls):
    model = start_model(tls)
    try:
        proxy = gateway_proxy(make_proxy, tools, tmp_path, model, tls)
        status, headers, streamed = post(proxy)
        assert status == 200, streamed
        assert headers["content-type"].startswith("text/event-stream")
        seen = model.requests[0]
        assert streamed == seen.sent, "the stream is passed on byte for byte"
        assert seen.path == "/v1/messages?beta=true"
        assert seen.headers["x-api-key"] == KEY, "the endpoint gets the real key"
        assert (seen.headers["anthropic-version"], seen.headers["anthropic-beta"], seen.headers["x-app"]) == (
            "2023-06-01", "claude-code-20250219", "cli")
        # Nothing of the agent's credential, cookies or forwarding headers reaches the endpoint.
        sent_headers = json.dumps(seen.raw_headers).lower()
        for leaked in (proxy.token, "authorization", "cookie", "x-forwarded-for", "accept-encoding"):
            assert leaked not in sent_headers, leaked

        # The same request without streaming: the whole message, byte for byte.
        status, _, whole = post(proxy, body=ask(stream=False))
        assert status == 200, whole
        assert whole == model.requests[1].sent

        # What the gateway counted is the endpoint's own count.
        records = proxy.audit(at_least=3)
        requests = [r for r in records if r["recordType"] == "model_request"]
        assert len(requests) == 2, records
        counted = {k: sum(r[k] for r in requests) for k in ("inputTokens", "outputTokens")}
        usage = model.usage()
        assert counted == {"inputTokens": usage["input_tokens"], "outputTokens": usage["output_tokens"]}, (counted, usage)
        assert [r["streamed"] for r in requests] == [True, False]
        assert requests[0]["model"] == "claude-sonnet-4-5" and requests[0]["status"] == 200
        # The Bash command the model asked the agent to run is in the audit, after its request.
        uses = [r for r in records if r["recordType"] == "agent_tool_use"]
        assert [u["tool"] for u in uses] == ["Bash"], records
        assert uses[0]["arguments"] == {"command": "git status --short"}
        assert records.index(uses[0]) > records.index(requests[0])
        assert proxy.metric("mcp_proxy_model_requests_total", model="claude-sonnet-4-5", outcome="ok") == 2
        assert proxy.metric("mcp_proxy_model_tokens_total", model="claude-sonnet-4-5", kind="output") == counted["outputTokens"]
        # The key is nowhere the agent can read: not in the answers, the log, the audit or the metrics.
        for where, text_ in (("answers", streamed + whole), ("log", proxy.log().encode()),
                             ("audit", proxy.audit_path.read_bytes()), ("metrics", proxy.metrics().encode())):
            assert KEY.encode() not in text_, where
    finally:
        model.stop()


def test_a_model_request_larger_than_mcps_limit_goes_through_and_one_over_the_apis_is_refused_in_its_shape(
        make_proxy, tools, tmp_path, tls):
    """A long conversation (or one with images) is larger than the 4 MiB an MCP message may be:
    the gateway takes what the Messages API takes (32 MB) and refuses more as the API would."""
    model = start_model(tls)
    try:
        proxy = gateway_proxy(make_proxy, tools, tmp_path, model, tls, include_arguments=False)
        words = "a long conversation " * (6 * 1024 * 1024 // 20)  # 6 MiB
        status, _, answer = post(proxy, body=ask(stream=False, words=words))
        assert status == 200, answer[:300]
        assert model.requests[-1].body["messages"][0]["content"] == words
        before = len(model.requests)
        # A body declared over 32 MiB is answered at once, before it is sent (as a client with
        # `expect: 100-continue` would see it): the socket sends the headers and a first KiB.
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as c:
            c.sendall((f"POST /model/v1/messages HTTP/1.1\r\nhost: 127.0.0.1:{proxy.port}\r\n"
                       f"content-type: application/json\r\nx-api-key: {proxy.token}\r\n"
                       f"content-length: {33 * 1024 * 1024}\r\n\r\n").encode() + b"{" + b" " * 1023)
            r = http.client.HTTPResponse(c)
            r.begin()
            status, headers, answer = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        assert status == 413, answer[:300]
        error = json.loads(answer)
        assert error["type"] == "error" and error["error"]["type"] == "request_too_large", error
        assert str(32 * 1024 * 1024) in error["error"]["message"], error
        assert headers["x-orchestrator-gateway"] == "refused"
        assert len(model.requests) == before, "nothing reached the endpoint"
    finally:
        model.stop()


def test_without_the_agents_credential_or_on_another_path_nothing_reaches_the_endpoint(
        make_proxy, tools, tmp_path, tls):
    model = start_model(tls)
    try:
        proxy = gateway_proxy(make_proxy, tools, tmp_path, model, tls, include_arguments=False)
        # Another process of the pod: no credential, a guessed one, the model key itself.
        for headers, token in (({}, False), ({"x-api-key": "0" * 64}, False), ({"x-api-key": KEY}, False),
                               ({"authorization": "Bearer nope"}, False)):
            status, got, body = post(proxy, headers=headers, token=token)
            assert status == 401, (headers, status, body)
            assert json.loads(body)["error"]["type"] == "authentication_error"
        # An open-proxy attempt: other paths, methods, an absolute URL, a path that climbs out.
        for path in ("/model/v1/models", "/model/v1/complete", "/model/v1/messages/batches", "/model",
                     "/model/../v1/messages", "/model/v1/messages/../../admin", "/model//v1/messages",
                     "/model/v1/messages?url=https://evil.example/", "https://evil.example/v1/messages"):
            status, _, body = post(proxy, path=path)
            # (an absolute URL naming another host is refused by the Host check: 403)
            assert status in (400, 403, 404), (path, status, body)
        c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        c.request("GET", "/model/v1/messages", headers={"x-api-key": proxy.token})
        assert c.getresponse().status == 404
        c.close()
        # A Host that is not the proxy's own name (DNS rebinding): refused before anything else.
        status, _, _ = post(proxy, headers={"host": "evil.example"})
        assert status in (403, 421), status
        # A body that is no Messages request.
        status, _, body = post(proxy, raw=b"{not json")
        assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
        # With the credential, a model the task's globs do not allow.
        proxy.swap({**proxy.gateway_config, "gateway": {**proxy.gateway_config["gateway"], "models": ["claude-haiku-*"]},
                    "contextVersion": 2})
        wait_for(lambda: proxy.tools()["contextVersion"] == 2, what="the config with models")
        status, _, body = post(proxy, body=ask(model="claude-opus-4-5"))
        error = json.loads(body)["error"]
        assert status == 403 and error["type"] == "permission_error", (status, body)
        assert "claude-opus-4-5" in error["message"] and "not allowed" in error["message"], error
        assert model.requests == [], [r.path for r in model.requests]
        status, _, body = post(proxy, body=ask(model="claude-haiku-4-5"))
        assert status == 200 and len(model.requests) == 1, body
        assert KEY.encode() not in proxy.log().encode()
    finally:
        model.stop()


def test_a_budget_holds_against_parallel_requests_and_a_raised_one_lets_the_task_go_on(
        make_proxy, tools, tmp_path, tls):
    # Each answer would be about 55 output tokens and takes half a second (the requests overlap);
    # the budget allows 100 in all.
    def slow(first):
        while True:
            yield text("x" * 200).after(0.5)

    model = start_model(tls, script=slow)
    try:
        proxy = gateway_proxy(make_proxy, tools, tmp_path, model, tls, budget={"outputTokens": 100},
                              include_arguments=False)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: post(proxy, body=ask(stream=True, max_tokens=64)), range(8)))
        statuses = sorted(a[0] for a in answers)
        # In flight at once, they were given what was left: 64, then 36, then nothing.
        assert statuses == [200, 200] + [429] * 6, statuses
        assert sorted(r.body["max_tokens"] for r in model.requests) == [36, 64]
        error = json.loads(next(a for a in answers if a[0] == 429)[2])["error"]
        assert error["type"] == "rate_limit_error" and "budget exceeded: outputTokens" in error["message"], error
        assert "spec.budget.outputTokens" in error["message"]
        # One at a time, each asks for what is left, until nothing is: the endpoint produced
        # exactly the budget, never more.
        while post(proxy, body=ask(max_tokens=64))[0] == 200:
            assert len(model.requests) < 20
        produced = sum(r.reply["usage"]["output_tokens"] for r in model.requests)
        assert produced == 100, [(r.body["max_tokens"], r.reply["usage"]) for r in model.requests]
        spent = len(model.requests)
        assert post(proxy)[0] == 429 and len(model.requests) == spent
        assert proxy.metric("mcp_proxy_model_budget_refusals_total", limit="outputTokens") >= 8
        # A person raises it (add-context renders a new config): the task goes on.
        raised = {**proxy.gateway_config, "contextVersion": 5,
                  "gateway": {**proxy.gateway_config["gateway"], "budget": {"outputTokens": 10_000}}}
        proxy.swap(raised)
        wait_for(lambda: proxy.tools()["contextVersion"] == 5, what="the raised budget")
        status, _, body = post(proxy)
        assert status == 200, body
        assert len(model.requests) == spent + 1
    finally:
        model.stop()


def test_a_wall_time_budget_stops_the_model_once_passed_and_a_raised_one_lets_the_task_go_on(
        make_proxy, tools, tmp_path, tls):
    model = start_model(tls)
    try:
        proxy = gateway_proxy(make_proxy, tools, tmp_path, model, tls, budget={"wallTimeSeconds": 3600},
                              include_arguments=False)
        assert post(proxy)[0] == 200
        # A person lowers it below the time the task has run (the clock started with the proxy).
        lowered = {**proxy.gateway_config, "contextVersion": 2,
                   "gateway": {**proxy.gateway_config["gateway"], "budget": {"wallTimeSeconds": 1}}}
        proxy.swap(lowered)
        wait_for(lambda: proxy.tools()["contextVersion"] == 2, what="the lowered budget")
        answer = wait_for(lambda: (a := post(proxy))[0] == 429 and a, what="a refusal for wall time", interval=0.2)
        error = json.loads(answer[2])["error"]
        assert error["type"] == "rate_limit_error", error
        assert "s of wall time have passed since the task started, of 1 allowed" in error["message"], error
        assert "spec.budget.wallTimeSeconds" in error["message"], error
        assert answer[1].get("x-orchestrator-gateway") == "refused"
        forwarded = len(model.requests)
        assert post(proxy)[0] == 429 and len(model.requests) == forwarded, "a refused request reached the endpoint"
        assert proxy.metric("mcp_proxy_model_budget_refusals_total", limit="wallTimeSeconds") >= 2
        raised = {**lowered, "contextVersion": 3,
                  "gateway": {**lowered["gateway"], "budget": {"wallTimeSeconds": 3600}}}
        proxy.swap(raised)
        wait_for(lambda: proxy.tools()["contextVersion"] == 3, what="the raised budget")
        status, _, body = post(proxy)
        assert status == 200, body
        assert len(model.requests) == forwarded + 1
    finally:
        model.stop()


def test_a_bad_gateway_config_names_the_field_and_the_proxy_keeps_serving(make_proxy, tools, tmp_path, tls):
    model = start_model(tls)
    try:
        proxy = gateway_proxy(make_proxy, tools, tmp_path, model, tls, include_arguments=False)
        bad = {**proxy.gateway_config, "contextVersion": 9,
               "gateway": {**proxy.gateway_config["gateway"], "endpoint": "http://api.example.com",
                           "budget": {"costUsd": "two dollars"}}}
        proxy.swap(bad)
        wait_for(lambda: "gateway.budget.costUsd" in proxy.log(), what="the config problems in the log")
        assert "gateway.endpoint" in proxy.log()
        assert proxy.tools()["contextVersion"] != 9, "the last good config stays in use"
        assert post(proxy)[0] == 200
    finally:
        model.stop()
