"""The Responses and Gemini stand-ins (e2e/model) answer as the real APIs do in what a gateway
reads: the Responses stream's events in order with the usage in response.completed, a call of a
namespaced tool as a function_call with its namespace; the Gemini stream as several data-only
chunks whose usageMetadata is a running total (the last one the whole count, finishReason only
there), the model and key read from the path and header. Their `usage()` is what they sent.
(test_runtimes_host.py shows the real CLIs accept these answers.)"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from scripted_gemini import ScriptedGemini
from scripted_model import text, tool_result_text, tool_use
from scripted_responses import ScriptedResponses

ECHO = {"type": "function", "name": "echo", "parameters": {"type": "object"}}
NAMESPACE = {"type": "namespace", "name": "mcp__orchestrator", "tools": [ECHO]}


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def sse(raw: bytes) -> list[tuple[str | None, dict]]:
    events = []
    for block in raw.decode().strip().split("\n\n"):
        name = next((line[7:] for line in block.splitlines() if line.startswith("event: ")), None)
        data = next(line[6:] for line in block.splitlines() if line.startswith("data: "))
        events.append((name, json.loads(data)))
    return events


def test_responses_streams_a_namespaced_call_then_text_with_usage_in_completed():
    seen = {}

    def script(first):
        second = yield tool_use(first.mcp_name("echo"), {"text": "hi"})
        seen["result"] = tool_result_text(second)
        yield text("done").thinks(3)

    with ScriptedResponses(script) as model:
        status, raw = post(f"{model.url}/v1/responses", {"model": "m", "stream": True, "tools": [NAMESPACE],
                                                        "input": [{"type": "message", "role": "user", "content": "go"}]},
                           {"authorization": "Bearer k"})
        assert status == 200
        events = sse(raw)
        assert [n for n, _ in events] == [
            "response.created", "response.in_progress", "response.output_item.added",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.completed"]
        assert all(n == d["type"] for n, d in events) and [d["sequence_number"] for _, d in events] == list(range(7))
        call = events[-2][1]["item"]
        assert (call["type"], call["namespace"], call["name"], json.loads(call["arguments"])) == \
            ("function_call", "mcp__orchestrator", "echo", {"text": "hi"})
        first_usage = events[-1][1]["response"]["usage"]

        answer = {"type": "function_call_output", "call_id": call["call_id"],
                  "output": [{"type": "input_text", "text": "echo:hi"}]}
        status, raw = post(f"{model.url}/v1/responses", {"model": "m", "tools": [NAMESPACE],
                                                        "input": [{"type": "message", "role": "user", "content": "go"}, call, answer]})
        whole = json.loads(raw)
        assert (status, whole["status"], whole["output"][0]["content"][0]["text"]) == (200, "completed", "done")
        assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
        assert seen["result"] == "echo:hi"

        status, raw = urllib.request.urlopen(f"{model.url}/v1/models?client_version=1", timeout=10).status, b""
        second_usage = whole["usage"]
    assert status == 200 and model.requests[-1].side and model.requests[-1].reply == {"models": []}
    assert model.requests[0].offers("echo") and model.requests[0].tools == ["mcp__orchestrator__echo"]
    assert model.requests[0].headers["authorization"] == "Bearer k"
    assert model.usage() == {
        "input_tokens": first_usage["input_tokens"] + second_usage["input_tokens"],
        "cached_input_tokens": first_usage["input_tokens_details"]["cached_tokens"] + second_usage["input_tokens_details"]["cached_tokens"],
        "output_tokens": first_usage["output_tokens"] + second_usage["output_tokens"], "reasoning_tokens": 3, "requests": 2}


def test_responses_answers_a_failed_script_with_a_server_error_and_no_tools_as_a_side_request():
    def script(first):
        raise ValueError("no such step")
        yield text("unreached")

    with ScriptedResponses(script) as model:
        status, raw = post(f"{model.url}/v1/responses", {"model": "m", "input": "title?"})
        assert (status, json.loads(raw)["output"][0]["content"][0]["text"]) == (200, "ok")
        status, raw = post(f"{model.url}/v1/responses", {"model": "m", "input": "go", "tools": [ECHO]})
    assert status == 500 and json.loads(raw)["error"]["type"] == "server_error"
    assert [r.side for r in model.requests] == [True, False]


def test_gemini_streams_running_usage_totals_the_last_chunk_whole():
    def script(first):
        second = yield tool_use(first.mcp_name("echo"), {"text": "hi"}, say="calling")
        assert tool_result_text(second) == "echo:hi"
        yield text("all done here").thinks(4)

    declarations = {"functionDeclarations": [{"name": "mcp_orchestrator_echo", "parameters": {"type": "object"}}]}
    path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    with ScriptedGemini(script) as model:
        contents = [{"role": "user", "parts": [{"text": "go"}]}]
        status, raw = post(model.url + path, {"contents": contents, "tools": [declarations]}, {"x-goog-api-key": "k"})
        assert status == 200
        first = sse(raw)
        contents += [first[-1][1]["candidates"][0]["content"],
                     {"role": "user", "parts": [{"functionResponse": {"name": "mcp_orchestrator_echo", "response": {"output": "echo:hi"}}}]}]
        status, raw = post(model.url + path, {"contents": contents, "tools": [declarations]}, {"x-goog-api-key": "k"})
        second = sse(raw)
        status_count, raw_count = post(model.url + "/v1beta/models/gemini-2.5-pro:countTokens", {"contents": contents})
    for chunks in (first, second):
        assert len(chunks) >= 2 and all(name is None for name, _ in chunks), "data-only events, several"
        counts = [c["usageMetadata"]["candidatesTokenCount"] for _, c in chunks]
        assert counts == sorted(counts) and sum(counts) > counts[-1] > 0, f"running totals, summing over-counts: {counts}"
        assert len({c["usageMetadata"]["promptTokenCount"] for _, c in chunks}) == 1
        assert ["finishReason" in c["candidates"][0] for _, c in chunks] == [False] * (len(chunks) - 1) + [True]
        for _, c in chunks:
            u = c["usageMetadata"]
            assert u["totalTokenCount"] == u["promptTokenCount"] + u["candidatesTokenCount"] + u.get("thoughtsTokenCount", 0)
    assert first[-1][1]["candidates"][0]["content"]["parts"] == [{"functionCall": {"name": "mcp_orchestrator_echo", "args": {"text": "hi"}}}]
    assert "".join(c["candidates"][0]["content"]["parts"][0]["text"] for _, c in second) == "all done here"
    lasts = [chunks[-1][1]["usageMetadata"] for chunks in (first, second)]
    assert model.usage() == {"input_tokens": sum(u["promptTokenCount"] for u in lasts),
                             "output_tokens": sum(u["candidatesTokenCount"] + u.get("thoughtsTokenCount", 0) for u in lasts),
                             "cached_input_tokens": sum(u.get("cachedContentTokenCount", 0) for u in lasts),
                             "reasoning_tokens": 4, "requests": 2}
    assert (status_count, json.loads(raw_count)["totalTokens"] > 0, model.requests[-1].side) == (200, True, True)
    assert {(r.model, r.headers["x-goog-api-key"]) for r in model.requests[:2]} == {("gemini-2.5-pro", "k")}
    assert model.requests[0].offers("echo") and model.requests[0].mcp_tools() == ["echo"]


def test_gemini_side_requests_get_json_that_fits_their_schema_and_unknown_paths_404():
    with ScriptedGemini(lambda first: (yield text("unused"))) as model:
        schema = {"type": "OBJECT", "properties": {"reasoning": {"type": "STRING"},
                                                   "next_speaker": {"type": "STRING", "enum": ["user", "model"]}}}
        status, raw = post(f"{model.url}/v1beta/models/flash:generateContent",
                           {"contents": [], "generationConfig": {"responseSchema": schema}})
        answer = json.loads(json.loads(raw)["candidates"][0]["content"]["parts"][0]["text"])
        missing, _ = post(f"{model.url}/v1beta/models/flash:embedContent", {})
    assert (status, answer) == (200, {"reasoning": "", "next_speaker": "user"})
    assert missing == 404 and all(r.side for r in model.requests)


def test_a_request_s_record_holds_its_answer_by_the_time_its_client_has_read_it():
    """A test reads `requests` and `usage()` as soon as its client has the answer (CI once found
    the /v1/models reply not yet recorded). The stand-in records what it answers before the
    answer's last byte leaves; a slow bookkeeping thread here would otherwise lose that race."""
    def script(first):
        yield tool_use(first.mcp_name("echo"), {"text": "hi"})

    with ScriptedResponses(script) as model:
        replied = model._replied

        def slow_replied(r, reply):
            time.sleep(0.3)
            replied(r, reply)

        model._replied = slow_replied
        status = urllib.request.urlopen(f"{model.url}/v1/models", timeout=10).status
        assert status == 200 and model.requests[-1].reply == {"models": []}
        status, raw = post(f"{model.url}/v1/responses", {"model": "m", "stream": True, "tools": [NAMESPACE], "input": "go"})
        assert status == 200 and model.requests[-1].sent == raw and model.requests[-1].reply["usage"]
        status, raw = post(f"{model.url}/v1/responses", {"model": "m", "input": "title?"})
        assert status == 200 and model.requests[-1].sent == raw and model.requests[-1].reply["blocks"]
        status, _ = post(f"{model.url}/v1/nothing", {"model": "m"})
        assert status == 404 and model.requests[-1].reply == {"status": 404}
        assert model.usage()["requests"] == 2
