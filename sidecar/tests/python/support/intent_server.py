"""An MCP server (official Python SDK, stdio) whose tools carry each combination of the
annotations intent mode judges calls by. Every tool takes `text` and answers "<tool>: <text>";
every call it receives is appended to the file named by $INTENT_CALLS (one tool name per line),
so a test can check upstream-side which calls arrived.

- `look`: readOnlyHint only;
- `wipe`: destructiveHint (readOnlyHint false);
- `plain`: no annotations at all;
- `odd`: both readOnlyHint and destructiveHint (the more restrictive wins);
- `note`: readOnlyHint false, destructiveHint false (the server says it writes);
- `retag`: no annotations (the tests give it a `risk` override)."""

import os

from mcp_types import ToolAnnotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("intent-annotations")

TOOLS = {
    "look": ("Looks something up.", ToolAnnotations(readOnlyHint=True)),
    "wipe": ("Wipes a record for good.", ToolAnnotations(readOnlyHint=False, destructiveHint=True)),
    "plain": ("Does something it does not describe.", None),
    "odd": ("Says it only reads and that it destroys.", ToolAnnotations(readOnlyHint=True, destructiveHint=True)),
    "note": ("Adds a note.", ToolAnnotations(readOnlyHint=False, destructiveHint=False)),
    "retag": ("Renames a tag.", None),
}


def make(name: str):
    def tool(text: str) -> str:
        path = os.environ.get("INTENT_CALLS")
        if path:
            with open(path, "a") as f:
                f.write(name + "\n")
        return f"{name}: {text}"

    return tool


for name, (description, annotations) in TOOLS.items():
    server.add_tool(make(name), name=name, description=description, annotations=annotations)


if __name__ == "__main__":
    server.run("stdio")
