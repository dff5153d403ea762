"""An MCP server (official Python SDK, stdio) with a `git_push` tool that pushes nothing: it
appends each call's branch to the file named by $PUSH_CALLS (one per line), so a test can check
upstream-side which pushes the proxy let through. The tool is annotated as a write."""

import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("push")


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def git_push(branch: str, remote: str = "origin") -> str:
    """Pushes the branch to the remote."""
    with open(os.environ["PUSH_CALLS"], "a") as f:
        f.write(branch + "\n")
    return f"pushed {branch} to {remote}"


if __name__ == "__main__":
    server.run()
