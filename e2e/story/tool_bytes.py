"""What the model is offered: the sample TaskRun's MCP tools through the proxy (direct and intent
mode) against Claude Code connected directly to the same servers (docs/benchmarks.md, "What the
model is offered").

    python3 e2e/story/tool_bytes.py [--markdown]

Runs the real Claude Code (the agent image's binary, e2e/story/host_agent.py) six times with the
pod's rendered command and files for config/samples/taskrun.yaml: through the proxy (the rendered
proxy.yaml), through the proxy in intent mode (the same with `policy.toolMode: intent`: four fixed
tools), and directly with the same two servers as stdio servers in its --mcp-config (the
rendered settings' permissions, with each server allowed instead of the proxy); each with Claude
Code's default tool search (MCP tools deferred: the model is told their names and loads a schema
with ToolSearch) and with ENABLE_TOOL_SEARCH=false (every definition in the request). The model is
the scripted stand-in: it answers the first request that offers MCP tools (Claude Code connects
them in the background; until then it keeps the agent busy with a harmless Glob) and that request
is measured: the MCP tools named, the bytes of their definitions in `tools`, the bytes of the
deferred names, the whole request. Both connections run as the caller (the directly connected
servers are the test tools under $HOME), without the rendered `defaultMode: bypassPermissions`
(Claude Code refuses it as root; it decides prompts, not what is offered). In intent mode the
model loads definitions later, from `retrieve_tools` answers: the bytes of the answer for every
tool (no query, the largest limit) are measured too, with the official Python SDK.

Needs the test tools (eval "$(e2e/setup env)"); builds the proxy and unpacks Claude Code if needed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_agent import ScriptedModel, host_proxy, rendered_files, run_claude  # noqa: E402
from scripted_model import text, tool_use  # noqa: E402

CONNECT_BUDGET_S = 60
PROXIED, INTENT, DIRECT = "through the proxy", "through the proxy, intent mode", "direct"
DEFERRED, ALL_DEFINITIONS = "default (deferred)", "ENABLE_TOOL_SEARCH=false"


def measure(first) -> dict:
    body = first.body
    mcp_defs = [t for t in body.get("tools", []) or [] if t.get("name", "").startswith("mcp__")]
    in_tools = {t["name"] for t in mcp_defs}
    deferred = sorted(n for n in first.available() if n.startswith("mcp__") and n not in in_tools)
    return {
        "mcp_tools": len(mcp_defs) + len(deferred),
        "definition_bytes": sum(len(json.dumps(t, separators=(",", ":"))) for t in mcp_defs),
        "deferred_name_bytes": sum(len(n) + 1 for n in deferred),
        "request_bytes": len(json.dumps(body, separators=(",", ":"))),
        "names": sorted(in_tools | set(deferred)),
    }


def offered(proxy, work: Path, mcp_config: dict | None, settings: dict, tool_search: bool) -> dict:
    seen = {}

    def script(first):
        r, deadline = first, time.monotonic() + CONNECT_BUDGET_S
        while not any(n.startswith("mcp__") for n in r.available()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no MCP tools offered within {CONNECT_BUDGET_S}s")
            r = yield tool_use("Glob", {"pattern": "*.none"}).after(0.3)
        seen["measured"] = measure(r)
        yield text("done")

    env = {"CLAUDE_CODE_MAX_RETRIES": "0"}
    if not tool_search:
        env["ENABLE_TOOL_SEARCH"] = "false"
    with ScriptedModel(script) as model:
        run = run_claude(model, proxy, work, mcp_config=mcp_config, settings=settings, env=env,
                         as_pod_user=False)
    if run.returncode != 0 or "measured" not in seen:
        sys.exit(f"claude exited {run.returncode} ({model.error!r}): {run.stdout[-1000:]} {run.stderr[-2000:]}")
    return seen["measured"]


def retrieve_every_tool(proxy) -> dict:
    """The `retrieve_tools` answer for every tool (no query, the largest limit), as the model
    would get it: its tools and the bytes of its text. The client declares roots, as Claude Code
    does (server-everything offers get-roots-list only then)."""
    import anyio
    import httpx2
    import mcp_types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def roots(context):
        return types.ListRootsResult(roots=[])

    async def ask() -> str:
        # With the agent's credential, as its headersHelper sends it.
        transport = streamable_http_client(proxy.url, http_client=httpx2.AsyncClient(headers=proxy.headers))
        async with Client(transport, mode="legacy", list_roots_callback=roots) as client:
            result = await client.call_tool("retrieve_tools", {"limit": 100})
            return "".join(getattr(c, "text", "") for c in result.content)

    text = anyio.run(ask)
    return {"tools": len(json.loads(text)["tools"]), "bytes": len(text.encode())}


def compare() -> list[tuple[str, str, dict]]:
    """(connection, tool search mode, measurement) for the six runs; the intent rows' measurement
    also has `retrieve_every_tool`."""
    files = rendered_files()
    work = Path(tempfile.mkdtemp(prefix="tool-bytes-"))
    settings = json.loads(files["settings.json"])
    settings["permissions"].pop("defaultMode", None)
    servers = yaml.safe_load(files["proxy.yaml"])["servers"]
    direct = {"mcpServers": {
        s["name"]: {"type": "stdio", "command": shutil.which(s["stdio"]["command"]) or s["stdio"]["command"],
                    "args": s["stdio"].get("args", []),
                    "env": {k: (str(work / "direct-memory.jsonl") if k == "MEMORY_FILE_PATH" else v)
                            for k, v in s["stdio"].get("env", {}).items()}}
        for s in servers}}
    direct_settings = {"permissions": {**settings["permissions"], "allow": [f"mcp__{n}" for n in direct["mcpServers"]]}}
    rows = []
    try:
        with host_proxy(work, None) as proxy, \
                host_proxy(work, None, "intent", policy={"toolMode": "intent"}) as intent:
            every = retrieve_every_tool(intent)
            for tool_search in (True, False):
                for label, target, mcp, sett in ((PROXIED, proxy, None, settings),
                                                 (INTENT, intent, None, settings),
                                                 (DIRECT, proxy, direct, direct_settings)):
                    m = offered(target, work, mcp, sett, tool_search)
                    if label == INTENT:
                        m["retrieve_every_tool"] = every
                    rows.append((label, DEFERRED if tool_search else ALL_DEFINITIONS, m))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="only the table (for docs/benchmarks.md)")
    args = ap.parse_args()
    rows = compare()
    print("| connection | tool search | MCP tools named | definition bytes | deferred-name bytes | whole first request |")
    print("|---|---|---|---|---|---|")
    for label, mode, m in rows:
        print(f"| {label} | {mode} | {m['mcp_tools']} | {m['definition_bytes']:,} | {m['deferred_name_bytes']:,} "
              f"| {m['request_bytes']:,} |")
    every = next(m["retrieve_every_tool"] for label, _, m in rows if label == INTENT)
    print(f"\nIntent mode: retrieve_tools for every tool answers {every['tools']} tools in {every['bytes']:,} bytes.")
    if not args.markdown:
        for label, mode, m in rows:
            print(f"\n{label}, {mode}: {', '.join(m['names'])}")


if __name__ == "__main__":
    main()
