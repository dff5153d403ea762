"""An MCP server (official Python SDK, stdio, both protocol generations) whose tools sit at the
edges of what the proxy must bound:

- `write_blocks`: its inputSchema is a tree of document blocks, a union of three object types
  whose `children` are blocks again (a recursive `$ref`), as document and page editors define
  them: checking a nested tree against it walks each level once per branch;
- `lookup`: fails with a JSON-RPC error whose message quotes the arguments it was sent, as many
  servers' validation errors do.

Every call it receives is appended to the file named by $EDGES_CALLS (one tool name per line),
so a test can check upstream-side which calls arrived."""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import mcp_types as types

from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError


def block_type(kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "kind": {"const": kind},
            "text": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/block"}},
        },
        "required": ["kind"],
    }


TOOLS = [
    {
        "name": "write_blocks",
        "description": "Writes a tree of document blocks.",
        "inputSchema": {
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/block"}},
            "required": ["root"],
            "$defs": {"block": {"oneOf": [block_type("paragraph"), block_type("list"), block_type("quote")]}},
        },
    },
    {
        "name": "lookup",
        "description": "Looks a record up with a token.",
        "inputSchema": {"type": "object", "properties": {"token": {"type": "string"}}, "required": ["token"]},
    },
]


def record(name: str) -> None:
    path = os.environ.get("EDGES_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(name + "\n")


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult.model_validate({"tools": TOOLS})


def count(block: Any) -> int:
    children = block.get("children", []) if isinstance(block, dict) else []
    return 1 + sum(count(c) for c in children)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    record(params.name)
    arguments = params.arguments or {}
    if params.name == "write_blocks":
        text = f"wrote {count(arguments.get('root'))} blocks"
        return types.CallToolResult.model_validate({"content": [{"type": "text", "text": text}]})
    if params.name == "lookup":
        raise MCPError(code=-32602, message=f"no record for the request {json.dumps(arguments)}")
    raise MCPError(code=-32602, message=f"unknown tool {params.name}")


async def main() -> None:
    server = Server("edges", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
