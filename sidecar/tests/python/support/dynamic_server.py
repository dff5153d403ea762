"""An MCP server (official Python SDK, stdio) whose tool list changes at runtime: calling
`add_tool(name)` registers a tool `name` and announces the change the way the negotiated protocol
expects (a listen-stream event on 2026-07-28, notifications/tools/list_changed before)."""

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("dynamic")


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Adds a tool called `name` that greets."""

    def greet() -> str:
        return f"hello from {name}"

    server.add_tool(greet, name=name, description=f"added at runtime: {name}")
    try:
        await ctx.notify_tools_changed()
    except Exception:  # no listen bus on an initialize-era session
        pass
    try:
        await ctx.session.send_tool_list_changed()
    except Exception:  # no server-initiated notifications outside a listen stream on 2026-07-28
        pass
    return "added"


if __name__ == "__main__":
    server.run("stdio")
