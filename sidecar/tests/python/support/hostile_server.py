"""A stdio MCP server (plain JSON lines, no SDK: what it sends is exactly what is written here)
that sends what a hostile or broken upstream may, chosen by the first argument:

  schema     one tool whose inputSchema is ARG2 MB (default 7), and a tool `small`
  midschema  one tool `mid` whose inputSchema is 1 MB (listed, beyond the schema bound)
  many       ARG2 tools (default 100,000), in pages of ARG3 (default 1,000; 0: one page)
  fat        ARG2 tools (default 6), each with a 1 MB inputSchema, one to a page
  result     `flood` answers with a text of ARG2 MB (default 50); `small` answers "ok"; `unique`
             takes `items`, an array with `uniqueItems` (its calls answer how many came)
  benign     `echo` answers its `text`

Every tool answers at once; nothing else is served (pings are answered).
"""

import json
import sys

MODE = sys.argv[1]
ARGS = sys.argv[2:]


def arg(i: int, default: int) -> int:
    return int(ARGS[i]) if len(ARGS) > i else default


def send(message: dict) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def tool(name: str, schema: dict | None = None) -> dict:
    return {"name": name, "description": f"{name} tool", "inputSchema": schema or {"type": "object"}}


def big_schema(megabytes: float) -> dict:
    # Many properties with long descriptions: the size a generated schema of a large API reaches.
    count = max(1, int(megabytes * 1024 * 1024 / 1100))
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "d" * 1024} for i in range(count)},
    }


def tools(cursor: str | None) -> tuple[list, str | None]:
    if MODE == "schema":
        return [tool("huge", big_schema(arg(0, 7))), tool("small")], None
    if MODE == "midschema":
        return [tool("mid", big_schema(1))], None
    if MODE == "many":
        total, page = arg(0, 100_000), arg(1, 1000)
        start = int(cursor or 0)
        end = total if page == 0 else min(total, start + page)
        listed = [tool(f"t{i:06d}") for i in range(start, end)]
        return listed, (str(end) if end < total else None)
    if MODE == "fat":
        at = int(cursor or 0)
        return [tool(f"fat{at}", big_schema(1))], (str(at + 1) if at + 1 < arg(0, 6) else None)
    if MODE == "result":
        unique = {"type": "object", "properties": {"items": {"type": "array", "uniqueItems": True}}}
        return [tool("flood"), tool("small"), tool("unique", unique)], None
    return [tool("echo", {"type": "object", "properties": {"text": {"type": "string"}}})], None


def call(name: str, arguments: dict) -> dict:
    if name == "flood":
        text = "x" * (arg(0, 50) * 1024 * 1024)
    elif name == "unique":
        text = str(len(arguments.get("items", [])))
    elif name == "echo":
        text = str(arguments.get("text", ""))
    else:
        text = "ok"
    return {"content": [{"type": "text", "text": text}]}


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    method, id_ = message.get("method"), message.get("id")
    if id_ is None:
        continue
    if method == "initialize":
        version = message.get("params", {}).get("protocolVersion", "2025-06-18")
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": f"hostile-{MODE}", "version": "1"},
        }
    elif method == "tools/list":
        listed, next_cursor = tools(message.get("params", {}).get("cursor"))
        result = {"tools": listed, **({"nextCursor": next_cursor} if next_cursor else {})}
    elif method == "tools/call":
        params = message.get("params", {})
        result = call(params.get("name", ""), params.get("arguments") or {})
    elif method == "ping":
        result = {}
    else:
        send({"id": id_, "error": {"code": -32601, "message": f"{method} not found"}})
        continue
    send({"id": id_, "result": result})
