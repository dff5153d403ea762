"""A scripted stand-in for the OpenAI Responses API, the model Codex CLI talks to (its
`wire_api = "responses"` provider), on the script model of scripted_model.py.

    def script(first):
        assert first.offers("echo")                        # offered in the mcp__orchestrator namespace
        second = yield tool_use(first.mcp_name("echo"), {"text": "hi"})
        assert "hi" in tool_result_text(second)
        yield text("done")

    with ScriptedResponses(script) as model:               # Codex's base_url: model.url + "/v1"
        ...

It answers `POST /v1/responses` streamed (SSE, the events Codex accepted in the study in
docs/design/agent-runtimes.md 1.4: response.created, in_progress, output_item.added,
content_part.added, output_text.delta/.done, content_part.done, function_call_arguments
.delta/.done, output_item.done, response.completed with the usage) or as one JSON response, and
`GET /v1/models` with `{"models": []}` (Codex then uses its fallback model metadata, which offers
MCP tools directly rather than deferred behind tool_search). Tools offered in a `namespace` tool
(Codex puts an MCP server's tools in one, `mcp__<server>`) are recorded flattened as
`<namespace>__<tool>`; a call of such a name goes out as a function_call with that `namespace` and
the tool's own name, as the real API answers. A request without tools is a side request.
"""

from __future__ import annotations

import json

from scripted_model import Events, Recorded, Reply, ScriptedModel, _ids, _list, _not_found, text, tokens, tool_use

__all__ = ["ScriptedResponses", "ResponsesRecorded", "text", "tool_use", "function_call"]


def function_call(name: str, arguments: dict | None = None, *more: tuple[str, dict], say: str = "") -> Reply:
    """A function call (or several), named as the request offered the tool: `tool_use`."""
    return tool_use(name, arguments, *more, say=say)


class ResponsesRecorded(Recorded):
    """A Responses request: `input` items instead of messages, tools possibly in namespaces."""

    kind = "responses"

    def _namespaces(self) -> dict[str, tuple[str, str]]:
        """Flattened name -> (namespace, tool name) of the tools offered in namespace tools."""
        out = {}
        for t in _list(self.body.get("tools")):
            if t.get("type") == "namespace":
                for f in _list(t.get("tools")):
                    out[f"{t.get('name', '')}__{f.get('name', '')}"] = (str(t.get("name", "")), str(f.get("name", "")))
        return out

    @property
    def tools(self) -> list[str]:
        """The tools offered: functions and custom tools by name, hosted tools (web_search, ...)
        by type, and the tools in a namespace as <namespace>__<name>."""
        names = []
        for t in _list(self.body.get("tools")):
            if t.get("type") == "namespace":
                names += [f"{t.get('name', '')}__{f.get('name', '')}" for f in _list(t.get("tools"))]
            else:
                names.append(str(t.get("name") or t.get("type", "")))
        return names

    @property
    def messages(self) -> list[dict]:
        """The `input` items (a string input is one user message)."""
        value = self.body.get("input")
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
        return _list(value)

    def available(self) -> set[str]:
        return set(self.tools)

    def tool_results(self) -> list[dict]:
        """The function_call_output items that answer the model's last calls: those after its
        last message, skipping messages the agent added after them."""
        out: list[dict] = []
        for item in reversed(self.messages):
            kind = item.get("type", "message")
            if kind in ("function_call_output", "custom_tool_call_output"):
                out.insert(0, item)
            elif kind == "message" and (out or item.get("role") == "assistant"):
                break
        return out

    def tool_outputs(self) -> list[tuple[str, bool]]:
        out = []
        for item in self.tool_results():
            value = item.get("output")
            if isinstance(value, list):
                value = "".join(str(c.get("text", "")) for c in value if isinstance(c, dict))
            elif not isinstance(value, str):
                value = json.dumps(value)
            out.append((value, False))
        return out


class ScriptedResponses(ScriptedModel):
    """The Responses API stand-in: base URL `model.url + "/v1"`. Its usage: input_tokens (a
    quarter of them reported as cached: input_tokens_details.cached_tokens), output_tokens
    (including output_tokens_details.reasoning_tokens, a reply's `thinks(n)`)."""

    recorded = ResponsesRecorded
    kept_headers = ("authorization", "user-agent", "originator", "session-id", "thread-id", "openai-beta")

    def _get(self, h, r: Recorded) -> None:
        if r.path.split("?", 1)[0] == "/v1/models":
            return self._side(h, r, 200, {"models": []})
        self._side(h, r, 404, _not_found(r.path))

    def _post(self, h, r: Recorded, raw: bytes) -> None:
        if r.path.split("?", 1)[0] != "/v1/responses":
            return self._side(h, r, 404, _not_found(r.path))
        r.side = not r.body.get("tools")
        self._turn_of(h, r, bool(r.body.get("stream")))

    def _error(self, e: BaseException) -> tuple[int, dict]:
        return 500, {"error": {"message": f"model stand-in script: {e}", "type": "server_error", "param": None, "code": None}}

    def _usage(self, r: Recorded, reply: Reply) -> dict:
        given = tokens(r.messages)
        output = tokens(reply.blocks) + reply.reasoning
        return {"input_tokens": given, "input_tokens_details": {"cached_tokens": given // 4},
                "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reply.reasoning},
                "total_tokens": given + output}

    def _counted(self, usage: dict) -> dict:
        return {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
                "cached_input_tokens": usage["input_tokens_details"]["cached_tokens"],
                "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"]}

    def _items(self, r: Recorded, reply: Reply) -> list[dict]:
        """The reply's output items, complete."""
        namespaces = r._namespaces() if isinstance(r, ResponsesRecorded) else {}
        items = []
        for block in reply.blocks:
            n = next(_ids)
            if block["type"] == "text":
                items.append({"id": f"msg_stand_in_{n:04d}", "type": "message", "status": "completed", "role": "assistant",
                              "content": [{"type": "output_text", "text": block["text"], "annotations": []}]})
            else:
                item = {"id": f"fc_stand_in_{n:04d}", "type": "function_call", "status": "completed",
                        "call_id": f"call_stand_in_{n:04d}", "name": block["name"], "arguments": json.dumps(block["input"])}
                if block["name"] in namespaces:
                    item["namespace"], item["name"] = namespaces[block["name"]]
                items.append(item)
        return items

    def _response(self, r: Recorded, status: str, output: list[dict], usage: dict | None) -> dict:
        return {"id": f"resp_stand_in_{r.seq:04d}", "object": "response", "created_at": int(r.wall), "status": status,
                "model": r.model, "output": output, "usage": usage}

    def _whole(self, r: Recorded, reply: Reply, usage: dict) -> dict:
        return self._response(r, "completed", self._items(r, reply), usage)

    def _events(self, r: Recorded, reply: Reply, usage: dict) -> Events:
        seq = iter(range(1_000_000))

        def event(kind: str, **data) -> tuple[str, dict]:
            return kind, {"type": kind, "sequence_number": next(seq), **data}

        items = self._items(r, reply)
        yield event("response.created", response=self._response(r, "in_progress", [], None))
        yield event("response.in_progress", response=self._response(r, "in_progress", [], None))
        for i, item in enumerate(items):
            where = {"item_id": item["id"], "output_index": i}
            if item["type"] == "message":
                whole = item["content"][0]
                yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []})
                yield event("response.content_part.added", **where, content_index=0, part={**whole, "text": ""})
                half = len(whole["text"]) // 2
                for piece in (whole["text"][:half], whole["text"][half:]):
                    if piece:
                        yield event("response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[])
                yield event("response.output_text.done", **where, content_index=0, text=whole["text"], logprobs=[])
                yield event("response.content_part.done", **where, content_index=0, part=whole)
            else:
                yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "arguments": ""})
                yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
                yield event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            yield event("response.output_item.done", output_index=i, item=item)
        yield event("response.completed", response=self._response(r, "completed", items, usage))
