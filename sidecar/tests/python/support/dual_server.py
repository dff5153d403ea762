"""An MCP server of our own (official Python SDK, stdio) that speaks both revisions, for the
transparency matrix. Its tools ask the client things the way an initialize-era server does
(server-to-client requests during the call) and the way the SDK does for either revision
(`Resolve` markers: requests on 2025-11-25, an `input_required` round on 2026-07-28):

- `ask_model(prompt)`: sampling, as a request during the call (`ctx.session.create_message`);
- `ask_defaults()`: elicitation whose schema has defaults (SEP-1034), as a request;
- `ask_enum()`: elicitation with enum choices, titled and untitled (SEP-1330), as a request;
- `ask_model_any(prompt)`: sampling through `Resolve(Sample)`, which follows the revision;
- `touch(uri)`: changes a resource and announces it (`resources/subscribe` subscribers on
  2025-11-25, `subscriptions/listen` streams on 2026-07-28);
- `add_tool(name)`: adds a tool and announces the changed list (both revisions' ways).

Usage: dual_server.py [both|legacy|modern]: `legacy` refuses `server/discover` (like an
initialize-era server), `modern` refuses `initialize` (a 2026-07-28-only server)."""

from __future__ import annotations

import sys
from typing import Annotated, Literal

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Resolve, Sample
from mcp.shared.exceptions import MCPError

MODE = sys.argv[1] if len(sys.argv) > 1 else "both"


class Refuse:
    """Middleware for `modern`: answers `initialize` as an unknown method."""

    async def __call__(self, ctx, call_next):
        if MODE == "modern" and ctx.method == "initialize":
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=ctx.method)
        return await call_next(ctx)


def run_initialize_era() -> None:
    """`legacy`: this server (in `both` mode, as a child) behind a filter on its stdio that
    answers what an initialize-era server does not know (`server/discover`, requests in the
    2026-07-28 envelope) with "Method not found". (The SDK decides a stdio connection's revision
    by its first message, so the refusal has to happen before the SDK sees it.)"""
    import json
    import subprocess
    import threading

    child = subprocess.Popen([sys.executable, __file__, "both"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    lock = threading.Lock()

    def write(line: bytes) -> None:
        with lock:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def pump_out() -> None:
        for line in child.stdout:
            write(line)

    threading.Thread(target=pump_out, daemon=True).start()
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            message = {}
        meta = (message.get("params") or {}).get("_meta") or {}
        modern = message.get("method") == "server/discover" or (
            message.get("method") != "initialize" and meta.get("io.modelcontextprotocol/protocolVersion") in MODERN_PROTOCOL_VERSIONS
        )
        if modern and "id" in message:
            error = {"code": types.METHOD_NOT_FOUND, "message": "Method not found"}
            write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}).encode() + b"\n")
            continue
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()
    child.wait()


server = MCPServer("dual", middleware=[Refuse()])
versions: dict[str, int] = {}
subscribed: set[str] = set()


def text(value) -> str:
    return getattr(value, "text", str(value))


@server.tool()
async def ask_model(prompt: str, ctx: Context) -> str:
    """Asks the client's model (sampling request during the call)."""
    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
        max_tokens=20,
        related_request_id=ctx.request_id,
    )
    return f"model said: {text(result.content)}"


class Defaults(BaseModel):
    name: str = Field(default="Ada", description="who")
    count: int = Field(default=3, description="how many")
    loud: bool = Field(default=True, description="shout?")


@server.tool()
async def ask_defaults(ctx: Context) -> str:
    """Elicits a form whose fields have defaults (SEP-1034)."""
    result = await ctx.elicit("Confirm the settings", Defaults)
    if result.action != "accept":
        return f"elicitation {result.action}"
    return f"got name={result.data.name} count={result.data.count} loud={result.data.loud}"


class Choice(BaseModel):
    color: Literal["red", "green", "blue"] = Field(description="a color")
    size: str = Field(
        description="a size",
        json_schema_extra={"oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}]},
    )


@server.tool()
async def ask_enum(ctx: Context) -> str:
    """Elicits choices from enums, untitled and titled (SEP-1330)."""
    result = await ctx.elicit("Pick", Choice)
    if result.action != "accept":
        return f"elicitation {result.action}"
    return f"picked color={result.data.color} size={result.data.size}"


async def sample_prompt(prompt: str) -> Sample:
    return Sample(messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))], max_tokens=20)


@server.tool()
async def ask_model_any(prompt: str, answer: Annotated[types.CreateMessageResult, Resolve(sample_prompt)]) -> str:
    """Asks the client's model the way the SDK does for either revision."""
    return f"model said: {text(answer.content)}"


@server.resource("note://{name}")
def note(name: str) -> str:
    return f"{name} v{versions.get(f'note://{name}', 0)}"


async def on_subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscribed.add(str(params.uri))
    return types.EmptyResult()


async def on_unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscribed.discard(str(params.uri))
    return types.EmptyResult()


server._lowlevel_server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
server._lowlevel_server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_unsubscribe)


@server.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Changes the resource `uri` and tells its subscribers."""
    versions[uri] = versions.get(uri, 0) + 1
    await ctx.notify_resource_updated(uri)
    if uri in subscribed:
        try:
            await ctx.session.send_resource_updated(uri)
        except Exception:  # no standalone notifications on 2026-07-28
            pass
    return f"{uri} is now v{versions[uri]}"


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Adds a tool called `name` that greets, and announces the change."""

    def greet() -> str:
        return f"hello from {name}"

    server.add_tool(greet, name=name, description=f"added at runtime: {name}")
    await ctx.notify_tools_changed()
    try:
        await ctx.session.send_tool_list_changed()
    except Exception:  # no standalone notifications on 2026-07-28
        pass
    return "added"


if __name__ == "__main__":
    if MODE == "legacy":
        run_initialize_era()
    else:
        server.run("stdio")
