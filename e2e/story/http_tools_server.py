"""A streamable-HTTP MCP server on the host (the official Python SDK's MCPServer) for tests whose
pods reach it through the node's portal (127.0.0.1:BASE+450..459). Its tools are named on the
command line; each call is appended to a JSON-lines record, so a test can say which task's calls
reached which server (and that a refused one never did).

    python3 http_tools_server.py PORT RECORD_FILE TOOL [TOOL...]

Each tool `T(text: str)` answers `T:<text>`; a tool named `slow` records its call, then takes
SLOW_S seconds to answer (a call a test can cut). Binds 127.0.0.1 only."""

from __future__ import annotations

import json
import sys
import time

import anyio
import mcp_types as types
from mcp.server.mcpserver import MCPServer

SLOW_S = 30


def main() -> None:
    port, record, tools = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    server = MCPServer(f"tools-{port}", log_level="WARNING")

    def make(name: str):
        async def tool(text: str) -> str:
            with open(record, "a") as f:
                f.write(json.dumps({"tool": name, "text": text, "time": time.time()}) + "\n")
            if name == "slow":
                await anyio.sleep(SLOW_S)
            return f"{name}:{text}"

        tool.__name__ = name
        tool.__doc__ = f"Answers {name}:<text>."
        return tool

    for name in tools:
        server.tool(name=name, annotations=types.ToolAnnotations(readOnlyHint=True))(make(name))
    server.run(transport="streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
