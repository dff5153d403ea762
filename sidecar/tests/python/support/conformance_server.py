"""Our own MCP server for the conformance suite's server scenarios.

This is the orchestrator's fixture for `@modelcontextprotocol/conformance server`:
a server written on the official Python MCP SDK (`mcp` 2.x, lowlevel `Server`)
that offers the surface the suite's server scenarios test (the `test_*` tools,
the `test://` resources, the `test_*` prompts, ...). It is not the suite's own
reference fixture (a TypeScript program that lives only in the suite's
repository) nor derived from its code; CI runs the suite against this server
directly and through our proxy and compares the two check by check.

One endpoint serves both protocol generations, as the SDK's streamable HTTP
session manager does:

- the initialize-era revisions (2024-11-05 .. 2025-11-25): sessions with
  `Mcp-Session-Id`, SSE responses, the standalone GET stream, resumability with
  `Last-Event-ID` (an in-memory event store), DELETE;
- 2026-07-28: stateless requests carrying their own `_meta` envelope,
  `server/discover`, `subscriptions/listen`, `input_required` results with
  sealed `requestState`, caching hints.

Run:  python conformance_server.py [PORT]      (or PORT=... in the environment;
      0 picks a free port).  It binds 127.0.0.1 only and prints
      `listening on http://127.0.0.1:PORT/mcp` to stderr once it accepts.
      python conformance_server.py --stdio     serves one client on stdio.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import socket
import struct
import sys
import warnings
import wave
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, PromptsListChanged, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

# Logging, sampling, roots and server-to-client requests are deprecated at 2026-07-28
# but are exactly what the initialize-era scenarios exercise.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

NAME = "orchestrator-conformance-server"
VERSION = "1.0.0"



def tiny_png() -> str:
    """A 1x1 red PNG, base64."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def tiny_wav() -> str:
    """One silent 16-bit mono sample at 8 kHz as a WAV file, base64."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(b"\x00\x00")
    return base64.b64encode(buffer.getvalue()).decode()


PNG = tiny_png()
WAV = tiny_wav()

NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}

Ctx = ServerRequestContext[Any, Any]
Result = dict[str, Any] | types.Result


def is_modern(ctx: Ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def text_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if is_error:
        result["isError"] = True
    return result


# ---------------------------------------------------------------------------
# Tools: a small registry. `era` says on which protocol generation a tool is
# offered: "legacy" tools need the server-to-client back-channel (or the SSE
# stream machinery) that only initialize-era sessions have; "modern" tools are
# the 2026-07-28 diagnostics (input_required flows, listen triggers, ...).
# ---------------------------------------------------------------------------

ToolHandler = Callable[[Ctx, types.CallToolRequestParams], Awaitable[Result]]


@dataclass
class ToolDef:
    name: str
    description: str
    handler: ToolHandler
    input_schema: dict[str, Any] = field(default_factory=lambda: dict(NO_ARGS))
    era: str = "both"

    def listed(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}


TOOLS: dict[str, ToolDef] = {}


def tool(name: str, description: str, *, schema: dict[str, Any] | None = None, era: str = "both"):
    def register(fn: ToolHandler) -> ToolHandler:
        TOOLS[name] = ToolDef(name, description, fn, schema or dict(NO_ARGS), era)
        return fn

    return register


def offered(entry: ToolDef, ctx: Ctx) -> bool:
    if entry.name == "test_dynamic_tool" and not DYNAMIC["tool"]:
        return False
    return entry.era == "both" or entry.era == ("modern" if is_modern(ctx) else "legacy")


@tool("test_simple_text", "Returns a simple text content block")
async def simple_text(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return text_result("This is a simple text response for testing.")


@tool("test_image_content", "Returns an image content block (base64 PNG)")
async def image_content(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return {"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}


@tool("test_audio_content", "Returns an audio content block (base64 WAV)")
async def audio_content(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return {"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]}


@tool("test_embedded_resource", "Returns an embedded resource content block")
async def embedded_resource(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    resource = {
        "uri": "test://embedded-resource",
        "mimeType": "text/plain",
        "text": "This is an embedded resource content.",
    }
    return {"content": [{"type": "resource", "resource": resource}]}


@tool("test_multiple_content_types", "Returns text, image and embedded resource content together")
async def multiple_content_types(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    resource = {
        "uri": "test://mixed-content-resource",
        "mimeType": "application/json",
        "text": json.dumps({"test": "data", "value": 123}),
    }
    return {
        "content": [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": resource},
        ]
    }


@tool("test_tool_with_logging", "Sends log messages while it runs")
async def tool_with_logging(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    for step, message in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
        if step:
            await anyio.sleep(0.05)
        # On 2026-07-28 the SDK sends these only if the request opted in via `_meta` logLevel.
        await ctx.session.send_log_message("info", message, logger=NAME, related_request_id=ctx.request_id)
    return text_result("Tool with logging executed successfully")


@tool("test_tool_with_progress", "Reports progress notifications while it runs")
async def tool_with_progress(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    for step in (0, 50, 100):
        if step:
            await anyio.sleep(0.05)
        # A no-op unless the caller asked for progress with a progressToken.
        await ctx.session.report_progress(step, 100, f"Completed step {step} of 100")
    token = ctx.meta.get("progress_token") if ctx.meta else None
    return text_result(str(token if token is not None else 0))


@tool("test_error_handling", "Always fails, reporting the error in the result")
async def error_handling(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return text_result("This tool intentionally returns an error for testing", is_error=True)


@tool("test_reconnection", "Closes its SSE stream mid-call; the result arrives after the client resumes", era="legacy")
async def reconnection(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    if ctx.close_sse_stream is not None:  # present only when the session has an event store
        await ctx.close_sse_stream()
    await anyio.sleep(0.1)
    return text_result(
        "Reconnection test completed successfully. "
        "If you received this, the client properly reconnected after stream closure."
    )


@tool(
    "test_sampling",
    "Asks the client's LLM for a completion (sampling/createMessage)",
    schema={
        "type": "object",
        "properties": {"prompt": {"type": "string", "description": "The prompt to send to the LLM"}},
        "required": ["prompt"],
    },
    era="legacy",
)
async def sampling(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    prompt = str((params.arguments or {}).get("prompt", ""))
    try:
        result = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=100,
            related_request_id=ctx.request_id,
        )
    except Exception as exc:  # the client may not support sampling
        return text_result(f"Sampling not supported or error: {exc}")
    content = result.content
    reply = content.text if isinstance(content, types.TextContent) else "No response"
    return text_result(f"LLM response: {reply}")


async def elicit(ctx: Ctx, message: str, schema: dict[str, Any], label: str) -> Result:
    """Run one form elicitation on the request's own stream and report what came back."""
    try:
        result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    except Exception as exc:  # the client may not support elicitation
        return text_result(f"Elicitation not supported or error: {exc}")
    return text_result(f"{label}: action={result.action}, content={json.dumps(result.content or {})}")


@tool(
    "test_elicitation",
    "Asks the user for input (elicitation/create)",
    schema={
        "type": "object",
        "properties": {"message": {"type": "string", "description": "The message to show the user"}},
        "required": ["message"],
    },
    era="legacy",
)
async def elicitation(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    schema = {
        "type": "object",
        "properties": {"response": {"type": "string", "description": "User's response"}},
        "required": ["response"],
    }
    return await elicit(ctx, str((params.arguments or {}).get("message", "")), schema, "User response")


@tool("test_elicitation_sep1034_defaults", "Elicitation whose fields carry default values (SEP-1034)", era="legacy")
async def elicitation_defaults(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    return await elicit(ctx, "Please review and update the form fields with defaults", schema, "Elicitation completed")


def titled(prefix: str, titles: tuple[str, ...]) -> list[dict[str, str]]:
    return [{"const": f"{prefix}{i}", "title": title} for i, title in enumerate(titles, 1)]


@tool("test_elicitation_sep1330_enums", "Elicitation with every enum schema variant (SEP-1330)", era="legacy")
async def elicitation_enums(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    options = ["option1", "option2", "option3"]
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "description": "Select one option", "enum": options},
            "titledSingle": {
                "type": "string",
                "description": "Select one option with titles",
                "oneOf": titled("value", ("First Option", "Second Option", "Third Option")),
            },
            "legacyEnum": {
                "type": "string",
                "description": "Select one option (legacy)",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "description": "Select multiple options",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "string", "enum": options},
            },
            "titledMulti": {
                "type": "array",
                "description": "Select multiple options with titles",
                "minItems": 1,
                "maxItems": 3,
                "items": {"anyOf": titled("value", ("First Choice", "Second Choice", "Third Choice"))},
            },
        },
        "required": [],
    }
    return await elicit(ctx, "Please select options from the enum fields", schema, "Elicitation completed")


# SEP-1613 / SEP-2106: an inputSchema using the JSON Schema 2020-12 vocabulary,
# which must reach the client unchanged.
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


@tool("json_schema_2020_12_tool", "Its inputSchema uses JSON Schema 2020-12 features", schema=JSON_SCHEMA_2020_12)
async def json_schema_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return text_result(f"JSON Schema 2020-12 tool called with: {json.dumps(params.arguments or {})}")


# --- 2026-07-28 diagnostics -------------------------------------------------


@tool("test_missing_capability", "Requires the client to have declared sampling", era="modern")
async def missing_capability(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    if not ctx.session.check_client_capability(types.ClientCapabilities(sampling=types.SamplingCapability())):
        raise MCPError(
            code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
            message="Missing required client capability: sampling",
            data={"requiredCapabilities": {"sampling": {}}},
        )
    return text_result("Success")


def elicit_request(message: str, properties: dict[str, Any], required: list[str]) -> types.ElicitRequest:
    schema = {"type": "object", "properties": properties, "required": required}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def sampling_request(text: str, max_tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))
    params = types.CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    return types.CreateMessageRequest(params=params)


def roots_request() -> types.ListRootsRequest:
    return types.ListRootsRequest(params=types.RequestParams())


def input_required(requests: dict[str, types.InputRequest], state: dict[str, Any] | None = None) -> Result:
    # The state is plain JSON here: the SDK's RequestStateBoundary seals it on the
    # way out and verifies (and unseals) the client's echo on the way back in.
    return types.InputRequiredResult(input_requests=requests, request_state=json.dumps(state) if state else None)


def response(params: types.CallToolRequestParams | types.GetPromptRequestParams, key: str) -> Any:
    return (params.input_responses or {}).get(key)


def accepted(params: Any, key: str, name: str) -> Any:
    """A field of an accepted elicitation answer, or None."""
    answer = response(params, key)
    if isinstance(answer, types.ElicitResult) and answer.action == "accept" and answer.content:
        return answer.content.get(name)
    return None


def sampled_text(params: Any, key: str) -> str | None:
    answer = response(params, key)
    content = getattr(answer, "content", None)
    return content.text if isinstance(content, types.TextContent) else None


def state_of(params: Any) -> dict[str, Any]:
    try:
        state = json.loads(params.request_state) if params.request_state else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


NAME_QUESTION = ("What is your name?", {"name": {"type": "string"}}, ["name"])
CONFIRM_QUESTION = ("Please confirm", {"ok": {"type": "boolean"}}, ["ok"])


@tool("test_input_required_result_elicitation", "input_required with one elicitation", era="modern")
async def irr_elicitation(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    if (name := accepted(params, "user_name", "name")) is not None:
        return text_result(f"Hello, {name}!")
    return input_required({"user_name": elicit_request(*NAME_QUESTION)})


@tool("test_input_required_result_sampling", "input_required with one sampling request", era="modern")
async def irr_sampling(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    if response(params, "capital_question") is not None:
        return text_result(f"Sampling result: {sampled_text(params, 'capital_question') or 'no response'}")
    return input_required({"capital_question": sampling_request("What is the capital of France?", 100)})


@tool("test_input_required_result_list_roots", "input_required with one roots/list request", era="modern")
async def irr_list_roots(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    answer = response(params, "client_roots")
    if isinstance(answer, types.ListRootsResult):
        return text_result(f"Found {len(answer.roots)} root(s)")
    return input_required({"client_roots": roots_request()})


@tool("test_input_required_result_request_state", "input_required carrying requestState", era="modern")
async def irr_request_state(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    if state_of(params).get("kind") == "request-state" and accepted(params, "confirm", "ok") is True:
        return text_result("state-ok: requestState validated")
    return input_required({"confirm": elicit_request(*CONFIRM_QUESTION)}, {"kind": "request-state"})


@tool("test_input_required_result_multiple_inputs", "input_required with three kinds of request", era="modern")
async def irr_multiple_inputs(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    keys = ("user_name", "greeting", "client_roots")
    if state_of(params).get("kind") == "multiple-inputs" and all(response(params, k) is not None for k in keys):
        roots = response(params, "client_roots")
        count_roots = len(roots.roots) if isinstance(roots, types.ListRootsResult) else 0
        name = accepted(params, "user_name", "name") or "unknown"
        greeting = sampled_text(params, "greeting") or "Hello there!"
        return text_result(f"Name: {name}; Greeting: {greeting}; Roots: {count_roots}")
    requests: dict[str, types.InputRequest] = {
        "user_name": elicit_request(*NAME_QUESTION),
        "greeting": sampling_request("Generate a greeting", 50),
        "client_roots": roots_request(),
    }
    return input_required(requests, {"kind": "multiple-inputs"})


@tool("test_input_required_result_multi_round", "Two rounds of input_required before completing", era="modern")
async def irr_multi_round(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    state = state_of(params)
    if state.get("round") == 1 and (name := accepted(params, "step1", "name")) is not None:
        question = elicit_request("Step 2: What is your favorite color?", {"color": {"type": "string"}}, ["color"])
        return input_required({"step2": question}, {"round": 2, "name": name})
    if state.get("round") == 2 and (color := accepted(params, "step2", "color")) is not None:
        return text_result(f"Multi-round complete for {state.get('name', 'friend')} who likes {color}")
    name_question = elicit_request("Step 1: What is your name?", {"name": {"type": "string"}}, ["name"])
    return input_required({"step1": name_question}, {"round": 1})


@tool("test_input_required_result_tampered_state", "input_required with integrity-checked requestState", era="modern")
async def irr_tampered_state(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    # A tampered echo never gets here: the SDK's RequestStateBoundary answers -32602.
    if state_of(params).get("kind") == "tamper-test" and response(params, "confirm") is not None:
        return text_result("integrity-ok: state verified")
    return input_required({"confirm": elicit_request(*CONFIRM_QUESTION)}, {"kind": "tamper-test"})


@tool("test_input_required_result_capabilities", "Asks only for input kinds the client declared", era="modern")
async def irr_capabilities(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    if params.input_responses:
        return text_result(f"capabilities-ok: received {','.join(params.input_responses)}")
    caps = ctx.session.client_capabilities or types.ClientCapabilities()
    requests: dict[str, types.InputRequest] = {}
    if caps.elicitation is not None:
        requests["elicit_input"] = elicit_request("Elicitation input", {"value": {"type": "string"}}, ["value"])
    if caps.sampling is not None:
        requests["sample_input"] = sampling_request("Sample request", 50)
    if not requests:
        return text_result("No supported capabilities declared")
    return input_required(requests, {"kind": "capabilities-test"})


@tool("test_streaming_elicitation", "Streams progress (if asked for), then its result; never a request", era="modern")
async def streaming_elicitation(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    # At 2026-07-28 a response stream carries notifications and the result only;
    # input from the client is asked for with input_required results instead.
    await ctx.session.report_progress(50, 100, "halfway")
    return text_result("Streaming complete")


@tool("test_logging_tool", "Logs only when the request opted in with _meta logLevel", era="modern")
async def logging_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    await ctx.session.send_log_message("info", "Diagnostic trace logging activated", related_request_id=ctx.request_id)
    return text_result("Logging evaluated")


@tool(
    "test_custom_header",
    "Echoes a region that the client also sends as the Mcp-Param-Region header (SEP-2243)",
    schema={
        "type": "object",
        "properties": {"region": {"type": "string", "description": "A region name", "x-mcp-header": "Region"}},
        "required": ["region"],
    },
    era="modern",
)
async def custom_header(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    # The SDK checks the Mcp-Param-Region header against the argument before this runs.
    return text_result(f"Region: {(params.arguments or {}).get('region')}")


@tool(
    "greet",
    "Greets someone; a plain synchronous tool (the tasks scenarios' sync fixture)",
    schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    era="modern",
)
async def greet(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return text_result(f"Hello, {(params.arguments or {}).get('name')}!")


BUS = InMemorySubscriptionBus()


# What the list-change triggers toggle: the tool list really changes (a proxy in front tells its
# clients only about changes it can see when it re-lists).
DYNAMIC = {"tool": False, "prompt": False}


@tool("test_trigger_tool_change", "Adds or removes test_dynamic_tool and announces the change on subscriptions/listen streams", era="modern")
async def trigger_tool_change(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    DYNAMIC["tool"] = not DYNAMIC["tool"]
    await BUS.publish(ToolsListChanged())
    return text_result("Mutation triggered")


@tool("test_dynamic_tool", "Listed while test_trigger_tool_change has added it")
async def dynamic_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    return text_result("This tool comes and goes.")


@tool("test_trigger_prompt_change", "Adds or removes test_dynamic_prompt and announces the change on subscriptions/listen streams", era="modern")
async def trigger_prompt_change(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    DYNAMIC["prompt"] = not DYNAMIC["prompt"]
    await BUS.publish(PromptsListChanged())
    return text_result("Mutation triggered")


async def list_tools(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Result:
    tools = [entry.listed() for entry in TOOLS.values() if offered(entry, ctx)]
    return types.ListToolsResult.model_validate({"tools": tools})


async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Result:
    entry = TOOLS.get(params.name)
    if entry is None or not offered(entry, ctx):
        # Reported in the result, as the SDK's MCPServer (and the TypeScript SDK) do.
        return types.CallToolResult.model_validate(text_result(f"Unknown tool: {params.name}", is_error=True))
    result = await entry.handler(ctx, params)
    return types.CallToolResult.model_validate(result) if isinstance(result, dict) else result


# ---------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------

STATIC_RESOURCES: dict[str, dict[str, Any]] = {
    "test://static-text": {
        "listing": {"name": "static-text", "title": "Static Text Resource", "mimeType": "text/plain",
                    "description": "A static text resource for testing"},
        "contents": {"mimeType": "text/plain", "text": "This is the content of the static text resource."},
    },
    "test://static-binary": {
        "listing": {"name": "static-binary", "title": "Static Binary Resource", "mimeType": "image/png",
                    "description": "A static binary resource (image) for testing"},
        "contents": {"mimeType": "image/png", "blob": PNG},
    },
    "test://watched-resource": {
        "listing": {"name": "watched-resource", "title": "Watched Resource", "mimeType": "text/plain",
                    "description": "A resource clients can subscribe to"},
        "contents": {"mimeType": "text/plain", "text": "Watched resource content"},
    },
}
TEMPLATE = "test://template/{id}/data"
TEMPLATE_PATTERN = re.compile(r"^test://template/([^/]+)/data$")


async def list_resources(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Result:
    resources = [{"uri": uri, **entry["listing"]} for uri, entry in STATIC_RESOURCES.items()]
    return types.ListResourcesResult.model_validate({"resources": resources})


async def list_resource_templates(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Result:
    template = {
        "uriTemplate": TEMPLATE,
        "name": "template",
        "title": "Resource Template",
        "description": "A resource template with parameter substitution",
        "mimeType": "application/json",
    }
    return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": [template]})


async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> Result:
    uri = params.uri
    if uri in STATIC_RESOURCES:
        contents = [{"uri": uri, **STATIC_RESOURCES[uri]["contents"]}]
        return types.ReadResourceResult.model_validate({"contents": contents})
    if match := TEMPLATE_PATTERN.match(uri):
        ident = match.group(1)
        data = {"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"}
        contents = [{"uri": uri, "mimeType": "application/json", "text": json.dumps(data)}]
        return types.ReadResourceResult.model_validate({"contents": contents})
    # SEP-2164: an unknown resource is an error naming the uri, never empty contents.
    raise MCPError(code=types.INVALID_PARAMS, message=f"Resource not found: {uri}", data={"uri": uri})


SUBSCRIPTIONS: set[str] = set()


async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIPTIONS.add(params.uri)
    return types.EmptyResult()


async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIPTIONS.discard(params.uri)
    return types.EmptyResult()


# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------


def user_text(text: str) -> dict[str, Any]:
    return {"role": "user", "content": {"type": "text", "text": text}}


PROMPTS: dict[str, dict[str, Any]] = {
    "test_simple_prompt": {"title": "Simple Test Prompt", "description": "A simple prompt without arguments"},
    "test_prompt_with_arguments": {
        "title": "Prompt With Arguments",
        "description": "A prompt with required arguments",
        "arguments": [
            {"name": "arg1", "description": "First test argument", "required": True},
            {"name": "arg2", "description": "Second test argument", "required": True},
        ],
    },
    "test_prompt_with_embedded_resource": {
        "title": "Prompt With Embedded Resource",
        "description": "A prompt that includes an embedded resource",
        "arguments": [{"name": "resourceUri", "description": "URI of the resource to embed", "required": True}],
    },
    "test_prompt_with_image": {"title": "Prompt With Image", "description": "A prompt that includes image content"},
}
MODERN_PROMPTS: dict[str, dict[str, Any]] = {
    "test_input_required_result_prompt": {"description": "A prompt that first asks the user for context"},
}


def prompt_table(ctx: Ctx) -> dict[str, dict[str, Any]]:
    table = {**PROMPTS, **MODERN_PROMPTS} if is_modern(ctx) else dict(PROMPTS)
    if DYNAMIC["prompt"]:
        table["test_dynamic_prompt"] = {"description": "Listed while test_trigger_prompt_change has added it"}
    return table


async def list_prompts(ctx: Ctx, params: types.PaginatedRequestParams | None) -> Result:
    prompts = [{"name": name, **entry} for name, entry in prompt_table(ctx).items()]
    return types.ListPromptsResult.model_validate({"prompts": prompts})


async def get_prompt(ctx: Ctx, params: types.GetPromptRequestParams) -> Result:
    name, args = params.name, params.arguments or {}
    if name not in prompt_table(ctx):
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {name}")
    if name == "test_simple_prompt":
        messages = [user_text("This is a simple prompt for testing.")]
    elif name == "test_prompt_with_arguments":
        messages = [user_text(f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'")]
    elif name == "test_prompt_with_embedded_resource":
        resource = {"uri": args.get("resourceUri", ""), "mimeType": "text/plain",
                    "text": "Embedded resource content for testing."}
        messages = [
            {"role": "user", "content": {"type": "resource", "resource": resource}},
            user_text("Please process the embedded resource above."),
        ]
    elif name == "test_dynamic_prompt":
        messages = [user_text("This prompt comes and goes.")]
    elif name == "test_prompt_with_image":
        messages = [
            {"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}},
            user_text("Please analyze the image above."),
        ]
    else:  # test_input_required_result_prompt
        context = accepted(params, "user_context", "context")
        if context is None:
            question = elicit_request(
                "What context should the prompt use?",
                {"context": {"type": "string"}},
                ["context"],
            )
            return input_required({"user_context": question})
        messages = [user_text(f"Prompt with context: {context}")]
    description = prompt_table(ctx)[name]["description"]
    return types.GetPromptResult.model_validate({"description": description, "messages": messages})


# ---------------------------------------------------------------------------
# Logging (initialize era; 2026-07-28 opts in per request instead) and completion
# ---------------------------------------------------------------------------


async def set_logging_level(ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def complete(ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    return types.CompleteResult(completion=types.Completion(values=[], total=0, has_more=False))


# ---------------------------------------------------------------------------
# Resumability: an in-memory event store (the SDK defines the interface only).
# ---------------------------------------------------------------------------


class InMemoryEventStore(EventStore):
    """Keeps every event of every stream; event ids are `<stream>:<sequence>`."""

    def __init__(self) -> None:
        self._events: list[tuple[EventId, StreamId, types.JSONRPCMessage | None]] = []
        self._sequence = count(1)

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}:{next(self._sequence)}"
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        position = next((i for i, (eid, _, _) in enumerate(self._events) if eid == last_event_id), None)
        if position is None:
            return None
        stream_id = self._events[position][1]
        for event_id, stream, message in self._events[position + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


class ConformanceServer(Server[Any]):
    def create_initialization_options(self, notification_options=None, *args: Any, **kwargs: Any):
        # Initialize-era capabilities: announce list_changed like the 2026 discover does.
        notification_options = notification_options or NotificationOptions(True, True, True)
        return super().create_initialization_options(notification_options, *args, **kwargs)


def build_server() -> ConformanceServer:
    lists = CacheHint(ttl_ms=300_000, scope="public")
    server = ConformanceServer(
        NAME,
        version=VERSION,
        cache_hints={
            "tools/list": lists,
            "prompts/list": lists,
            "resources/list": lists,
            "resources/templates/list": lists,
            "resources/read": CacheHint(ttl_ms=300_000, scope="private"),
        },
        get_tool_input_schema=lambda name: TOOLS[name].input_schema if name in TOOLS else None,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=ListenHandler(BUS),
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
        on_set_logging_level=set_logging_level,
    )
    # Seal requestState (AES-GCM under a per-process key) and reject tampered echoes.
    server.middleware.append(RequestStateBoundary(RequestStateSecurity.ephemeral(), default_audience=NAME))
    return server


async def serve_http(sock: socket.socket) -> None:
    server = build_server()
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        event_store=InMemoryEventStore(),
        retry_interval=1000,  # ms; sent in each SSE priming event
        host="127.0.0.1",  # also turns on the SDK's DNS-rebinding protection for localhost
    )
    # Open streams (GET, subscriptions/listen) must not hold up a shutdown for long.
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    http = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(http.serve, [sock])
        while not http.started:
            if http.should_exit:
                return
            await anyio.sleep(0.02)
        print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", file=sys.stderr, flush=True)


async def serve_stdio() -> None:
    server = build_server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", nargs="?", type=int, default=int(os.environ.get("PORT", "3000")),
                        help="TCP port on 127.0.0.1 (default: $PORT, else 3000; 0 picks a free one)")
    parser.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout instead of HTTP")
    args = parser.parse_args()
    if args.stdio:
        anyio.run(serve_stdio)
        return
    # Bound here, loopback only, so a busy port is one clear error and port 0 works.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as exc:
        sys.exit(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror}")
    anyio.run(serve_http, sock)


if __name__ == "__main__":
    main()
