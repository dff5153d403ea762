"""The real Claude Code through the model gateway on this machine (issue 42): the agent's
runtime as a TaskRun with spec.model renders it (its base URL the proxy's /model, no model key in
its environment, its API key helper printing the pod's agent credential after the proxy's port
check) and the proxy with the sample's rendered config plus the gateway, in front of the scripted
model serving HTTPS with a CA of its own.

What a person running tasks would check: the task runs; the model API sees the real key on every
request and the agent never had it; what the gateway counted is the model's own count; and the
audit shows the Bash command the model asked for between the MCP calls.
"""

from __future__ import annotations

import json
import time

from host_agent import host_proxy, run_claude
from scripted_model import ScriptedModel, text, tls_pair, tool_use

KEY = "sk-ant-api03-held-by-the-proxy-only"
CONNECT_BUDGET_S = 60


def test_claude_code_runs_through_the_gateway_with_the_key_only_in_the_proxy(work):
    ca, cert, key = tls_pair(work / "ca")
    secret = work / "model-secret"
    secret.mkdir()
    (secret / "api-key").write_text(KEY)
    seen: dict = {}

    def script(first):
        r, deadline = first, time.monotonic() + CONNECT_BUDGET_S
        while not r.mcp_tools():
            assert time.monotonic() < deadline, "Claude Code offered no MCP tools"
            r = yield tool_use("Glob", {"pattern": "*.none"}).after(0.3)
        r = yield tool_use("Bash", {"command": "echo gateway-was-here > marker.txt"})
        r = yield tool_use("mcp__orchestrator__everything__echo", {"message": "after bash"})
        seen["done"] = True
        yield text("done")

    with ScriptedModel(script, tls=(cert, key)) as model:
        gateway = {"endpoint": model.url, "keyFile": str(secret / "api-key"), "caFile": ca}
        with host_proxy(work, work / "cache", gateway=gateway, audit_arguments=True) as proxy:
            run = run_claude(model, proxy, work, through_gateway=True,
                             env={"CLAUDE_CODE_MAX_RETRIES": "0"})
            records = proxy.audit_records()
            log = (work / "proxy.log").read_text()
    assert run.returncode == 0, f"claude exited {run.returncode}: {run.stdout[-2000:]} {run.stderr[-2000:]}"
    assert model.error is None and seen.get("done"), model.error
    assert (run.home / "workspace" / "marker.txt").read_text().strip() == "gateway-was-here"

    # Every request the model API got carried the real key, none the agent's credential.
    token = proxy.token_file.read_text().strip()
    assert model.requests and all(r.headers.get("x-api-key") == KEY for r in model.requests)
    for r in model.requests:
        assert token not in json.dumps(r.raw_headers), "the agent's credential reached the endpoint"

    # What the gateway counted is the model's own count.
    requests = [r for r in records if r["recordType"] == "model_request"]
    usage = model.usage()
    assert len(requests) == usage["requests"], (len(requests), usage)
    assert sum(r["inputTokens"] for r in requests) == usage["input_tokens"]
    assert sum(r["outputTokens"] for r in requests) == usage["output_tokens"]
    assert all(r["status"] == 200 and r["streamed"] for r in requests), requests

    # The Bash command, between the model's requests, before the MCP call the model asked next.
    kinds = [(r["recordType"], r.get("tool")) for r in records]
    bash = next(i for i, r in enumerate(records) if r["recordType"] == "agent_tool_use" and r["tool"] == "Bash")
    assert records[bash]["arguments"] == {"command": "echo gateway-was-here > marker.txt"}
    echo = next(i for i, r in enumerate(records) if r["recordType"] == "tool_call")
    assert bash < echo, kinds
    assert records[echo]["upstreamTool"] == "echo"

    # The key is nowhere the agent could read it: not in what Claude Code printed, not in the
    # proxy's log or audit.
    for where, text_ in (("agent output", run.stdout + run.stderr), ("proxy log", log),
                         ("audit", json.dumps(records))):
        assert KEY not in text_, where
