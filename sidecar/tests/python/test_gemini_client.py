"""Gemini CLI's own MCP client (the TypeScript SDK its bundle carries, protocol 2025-06-18) through
the proxy, with the operator's Gemini CLI settings (operator/src/render/runtime/gemini-settings.json)
and a scripted Gemini API: it is offered the server's tools and a call goes through.

The proxy's SSE streams used to open with a priming event (SEP-1699, an event of empty data) for
every client; this SDK parses each event's data as JSON, fails on the empty one, calls that a
transport error and drops the server: Gemini CLI on the real node was offered no MCP tool. A
stream to a client of a revision before 2025-11-25 now starts without it (and one to a 2025-11-25
client still with it: test_revisions)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import RAW_HEADERS, raw_exchange, tool_call

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "e2e/model"))
from scripted_gemini import ScriptedGemini  # noqa: E402
from scripted_model import text, tool_result_text, tool_use  # noqa: E402

TOOLS = Path(os.environ.get("ORCH_TOOLS") or Path.home() / ".cache/orchestrator/tools")
GEMINI = TOOLS / "node/node_modules/@google/gemini-cli/bundle/gemini.js"
NODE_BIN = TOOLS / "node/node_modules/node/bin"


def test_gemini_clis_client_is_offered_the_tools_and_calls_one(make_proxy, tools, tmp_path):
    proxy = make_proxy({"servers": [{"name": "everything", "stdio": tools.everything_stdio(),
                                     "tools": {"allow": ["get-sum"]}}]})
    seen: dict = {}

    def script(first):
        seen["offered"] = first.tools
        r = yield tool_use(first.mcp_name("everything__get-sum"), {"a": 2, "b": 3})
        seen["sum"] = tool_result_text(r)
        yield text("done")

    # Gemini CLI reads system settings only below directories that are root's and writable by
    # nobody else: not below $TMPDIR (mode 1777 in ./test).
    config = Path(tempfile.mkdtemp(prefix="gemini-client-", dir=TOOLS))
    try:
        os.chmod(config, 0o755)
        settings = config / "settings.json"
        settings.write_text((REPO / "operator/src/render/runtime/gemini-settings.json").read_text())
        home = tmp_path / "home"
        home.mkdir()
        with ScriptedGemini(script) as model:
            run = subprocess.run(
                [str(NODE_BIN / "node"), str(GEMINI), "-p", "add 2 and 3", "-m", "gemini-2.5-pro", "-o", "json"],
                env={"PATH": f"{NODE_BIN}:/usr/bin:/bin", "HOME": str(home), "GEMINI_CLI_HOME": str(home),
                     "TMPDIR": str(tmp_path), "GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(settings),
                     "GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_API_KEY": "stand-in-key",
                     "GOOGLE_GEMINI_BASE_URL": model.url, "ORCHESTRATOR_MCP_URL": proxy.url,
                     "ORCHESTRATOR_MCP_TOKEN": "unused-here"},
                cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    finally:
        for f in config.iterdir():
            f.unlink()
        config.rmdir()
    assert run.returncode == 0, f"gemini exited {run.returncode}: {run.stderr[-3000:]}"
    assert "MCP error" not in run.stderr and "MCP issues detected" not in run.stderr, run.stderr[-3000:]
    assert "mcp_orchestrator_everything__get-sum" in seen["offered"], seen["offered"]
    assert "5" in seen["sum"] and not seen["sum"].startswith("ERROR"), seen["sum"]
    records = proxy.audit(at_least=1)
    assert [(r["tool"], r["decision"]) for r in records] == [("everything__get-sum", "allowed")], records


def test_a_2025_06_18_session_gets_no_priming_event(make_proxy, tools):
    """What the SDK above reads: a 2025-06-18 session's streams (the initialize answer, a call's
    answer) open with the message itself."""
    import json
    import urllib.request

    proxy = make_proxy({"servers": [{"name": "every", "stdio": tools.everything_stdio()}]})
    headers = dict(RAW_HEADERS)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}}
    request = urllib.request.Request(proxy.url, data=json.dumps(init).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        first = response.read().decode()
        headers["Mcp-Session-Id"] = response.headers["Mcp-Session-Id"]
    assert first.lstrip().startswith("data: {"), first
    headers["Mcp-Protocol-Version"] = "2025-06-18"
    status, messages, body = raw_exchange(proxy, headers, tool_call("every__echo", {"message": "x"}))
    assert status == 200 and messages[-1]["result"]["content"][0]["text"] == "Echo: x", body
    events = [e for e in body.split("\n\n") if e.strip()]
    assert all("data: {" in e for e in events), events
