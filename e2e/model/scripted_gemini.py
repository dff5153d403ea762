"""A scripted stand-in for the Gemini API (generativelanguage v1beta), the model Gemini CLI talks
to (GOOGLE_GEMINI_BASE_URL, key in `x-goog-api-key`), on the script model of scripted_model.py.

    def script(first):
        assert first.offers("echo")                        # offered as mcp_orchestrator_echo
        second = yield tool_use(first.mcp_name("echo"), {"text": "hi"})
        assert "hi" in tool_result_text(second)
        yield text("done")

    with ScriptedGemini(script) as model:                  # GOOGLE_GEMINI_BASE_URL=model.url
        ...

It answers `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` as several `data:` chunks
(no event names; text in pieces, each chunk's usageMetadata the running total, so the last one is
the whole count, as the real API streams), `:generateContent` as one JSON response, and
`:countTokens`. A reply's tool calls are functionCall parts. The model comes from the path
(`r.model`). A request without tools is a side request (the CLI's router, next-speaker and loop
checks): its default answer is JSON that fits the request's response schema.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from scripted_model import Events, Recorded, Reply, ScriptedModel, _list, text, tokens, tool_use

__all__ = ["ScriptedGemini", "GeminiRecorded", "text", "tool_use", "function_call", "schema_reply"]

PATH = re.compile(r"^/v1(?:beta|alpha)?/models/([^/:]+):([A-Za-z]+)$")


def function_call(name: str, arguments: dict | None = None, *more: tuple[str, dict], say: str = "") -> Reply:
    """A functionCall part (or several), named as the request offered the tool: `tool_use`."""
    return tool_use(name, arguments, *more, say=say)


@dataclass
class GeminiRecorded(Recorded):
    """A Gemini request: `contents` instead of messages, functionDeclarations as tools, the model
    in the path. Gemini CLI names MCP tools mcp_<server>_<tool>."""

    mcp_prefix: str = "mcp_{server}_"
    kind = "gemini"

    @property
    def tools(self) -> list[str]:
        """The function declarations by name, and other tools (googleSearch, ...) by their key."""
        names = []
        for t in _list(self.body.get("tools")):
            for key, value in t.items():
                if key == "functionDeclarations":
                    names += [str(f.get("name", "")) for f in _list(value)]
                else:
                    names.append(key)
        return names

    @property
    def model(self) -> str:
        m = PATH.match(self.path.split("?", 1)[0])
        return m.group(1) if m else ""

    @property
    def messages(self) -> list[dict]:
        return _list(self.body.get("contents"))

    def available(self) -> set[str]:
        return set(self.tools)

    def tool_results(self) -> list[dict]:
        """The functionResponse parts after the model's last content."""
        out: list[dict] = []
        for content in reversed(self.messages):
            if content.get("role") == "model":
                break
            out[:0] = [p["functionResponse"] for p in _list(content.get("parts")) if isinstance(p.get("functionResponse"), dict)]
        return out

    def tool_outputs(self) -> list[tuple[str, bool]]:
        out = []
        for r in self.tool_results():
            response = r.get("response")
            if isinstance(response, dict) and "error" in response:
                out.append((_as_text(response["error"]), True))
            elif isinstance(response, dict) and "output" in response:
                out.append((_as_text(response["output"]), False))
            elif isinstance(response, dict) and isinstance(response.get("content"), list):
                out.append(("".join(str(c.get("text", "")) for c in _list(response["content"])), False))
            else:
                out.append((_as_text(response), False))
        return out


def _as_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _example(schema):
    """A value that fits a response schema (Gemini's Schema or JSON Schema): each property
    filled, the first of an enum, empty strings and lists, zeros."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if str(k).lower() != "null"), "null")
    kind = str(kind).lower()
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return {k: _example(v) for k, v in props.items()}
    return {"array": [], "string": "", "integer": 0, "number": 0, "boolean": False}.get(kind)


def schema_reply(r: Recorded) -> Reply:
    """The default answer to a side request: JSON fitting its response schema, else "ok"."""
    config = r.body.get("generationConfig") if isinstance(r.body.get("generationConfig"), dict) else {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    return text(json.dumps(_example(schema))) if schema else text("ok")


@dataclass
class ScriptedGemini(ScriptedModel):
    """The Gemini API stand-in: base URL `model.url`. Its usage: promptTokenCount (a quarter of
    it reported as cachedContentTokenCount), candidatesTokenCount, thoughtsTokenCount (a reply's
    `thinks(n)`); `usage()` counts output as candidates + thoughts, as both are billed."""

    side_reply: Callable[[Recorded], Reply] = schema_reply

    recorded = GeminiRecorded
    kept_headers = ("x-goog-api-key", "authorization", "user-agent", "x-goog-api-client")

    def _get(self, h, r: Recorded) -> None:
        self._side(h, r, 404, _error(404, f"the model stand-in has no {r.path}", "NOT_FOUND"))

    def _post(self, h, r: Recorded, raw: bytes) -> None:
        m = PATH.match(r.path.split("?", 1)[0])
        method = m.group(2) if m else ""
        if method == "countTokens":
            return self._side(h, r, 200, {"totalTokens": tokens(r.body.get("contents", []))})
        if method not in ("generateContent", "streamGenerateContent"):
            return self._side(h, r, 404, _error(404, f"the model stand-in has no {r.path}", "NOT_FOUND"))
        r.side = not r.tools
        self._turn_of(h, r, method == "streamGenerateContent")

    def _error(self, e: BaseException) -> tuple[int, dict]:
        return 500, _error(500, f"model stand-in script: {e}", "INTERNAL")

    def _usage(self, r: Recorded, reply: Reply) -> dict:
        prompt, candidates = tokens(r.messages), tokens(reply.blocks)
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": candidates,
                 "totalTokenCount": prompt + candidates + reply.reasoning}
        if prompt // 4:
            usage["cachedContentTokenCount"] = prompt // 4
        if reply.reasoning:
            usage["thoughtsTokenCount"] = reply.reasoning
        return usage

    def _counted(self, usage: dict) -> dict:
        thoughts = usage.get("thoughtsTokenCount", 0)
        return {"input_tokens": usage["promptTokenCount"], "output_tokens": usage["candidatesTokenCount"] + thoughts,
                "cached_input_tokens": usage.get("cachedContentTokenCount", 0), "reasoning_tokens": thoughts}

    @staticmethod
    def _parts(reply: Reply) -> list[dict]:
        return [{"text": b["text"]} if b["type"] == "text" else {"functionCall": {"name": b["name"], "args": b["input"]}}
                for b in reply.blocks]

    def _chunk(self, r: Recorded, parts: list[dict], usage: dict, last: bool) -> dict:
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
        if last:
            candidate["finishReason"] = "STOP"
        return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": r.model,
                "responseId": f"stand-in-{r.seq:04d}"}

    def _whole(self, r: Recorded, reply: Reply, usage: dict) -> dict:
        return self._chunk(r, self._parts(reply), usage, True)

    def _events(self, r: Recorded, reply: Reply, usage: dict) -> Events:
        # Text in two pieces, a function call whole: each chunk's usage the running total.
        pieces: list[dict] = []
        for part in self._parts(reply):
            half = len(part.get("text", "")) // 2
            pieces += [{"text": part["text"][:half]}, {"text": part["text"][half:]}] if half else [part]
        total = usage["candidatesTokenCount"]
        for i, part in enumerate(pieces, 1):
            so_far = dict(usage, candidatesTokenCount=total * i // len(pieces))
            so_far["totalTokenCount"] = usage["totalTokenCount"] - total + so_far["candidatesTokenCount"]
            yield None, self._chunk(r, [part], so_far, i == len(pieces))


def _error(code: int, message: str, status: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}
