"""The real agent against the proxy on this machine: Claude Code (the agent image's binary, run with
the pod's rendered command, env and files, as the pod's uid) and orchestrator-mcp-proxy (the
sample TaskRun's rendered proxy.yaml, real upstream servers); the model is the scripted stand-in.

What a person running tasks would check: connecting the agent starts no upstream server, neither
in the pod's first proxy (the catalog pins every tool's definition, which the proxy lists) nor in
a restarted proxy container (whose cache directory is the pod's /tmp emptyDir), a call starts
only the server it needs, the model is offered exactly the
allowed tools and not the denied built-in one, and the audit lines of one agent run can be told
apart from another's by one client identity.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from host_agent import host_proxy, rendered_files, run_claude
from scripted_model import ScriptedModel, text, tool_result_text, tool_use

MCP = "mcp__orchestrator__"
# Claude Code connects --mcp-config servers in the background: its first request may go out before
# the proxy's tools are listed. The model keeps it busy with a harmless built-in call meanwhile.
CONNECT_BUDGET_S = 60


def connected(first):
    """Delegating script step: the first request that offers the proxy's tools."""
    r, deadline = first, time.monotonic() + CONNECT_BUDGET_S
    while not r.mcp_tools():
        assert time.monotonic() < deadline, f"Claude Code offered no MCP tools within {CONNECT_BUDGET_S}s"
        r = yield tool_use("Glob", {"pattern": "*.none"}).after(0.3)
    return r


def conversation(model: ScriptedModel) -> str:
    """What the model saw, a line per request: for a failure message."""
    lines = []
    for r in model.requests:
        last = (r.body.get("messages") or [{}])[-1]
        lines.append(f"#{r.seq} {'side' if r.side else 'conv'} mcp={len(r.mcp_tools())} "
                     f"last={json.dumps(last)[:400]} reply={json.dumps(r.reply)[:200]}")
    return "\n".join(lines)


def agent(model: ScriptedModel, proxy, work: Path):
    # A failed script step is an API error: no retries (their backoff would take minutes).
    run = run_claude(model, proxy, work, env={"CLAUDE_CODE_MAX_RETRIES": "0"})
    assert run.returncode == 0, \
        f"claude exited {run.returncode}: {run.stdout[-2000:]} {run.stderr[-2000:]}\n{conversation(model)}"
    assert model.error is None, f"the model's script failed: {model.error!r}"
    return run


def test_connecting_starts_no_server_first_or_after_a_restart_and_one_runs_calls_share_one_identity(work):
    cache = work / "cache"
    seen: dict = {}

    # The pod's first proxy: an empty cache, yet listing the tools starts no server: the rendered
    # config carries the catalog's pinned definitions.
    with host_proxy(work, cache, "first") as proxy:
        def first_run(first):
            r = yield from connected(first)
            seen["first_offered"] = r.mcp_tools()
            seen["first_done"] = True
            yield text("done")

        with ScriptedModel(first_run) as model:
            agent(model, proxy, work)
        assert seen.get("first_done"), "Claude Code ended before the model's script did"
        allowed = proxy.exposed()
        assert seen["first_offered"] == allowed, "the model is offered exactly the tools the TaskRun allows"
        assert "everything__get-env" not in allowed and "memory__delete_entities" not in allowed
        assert proxy.starts() == {}, proxy.starts()
        assert proxy.upstream_processes() == [], "listing the pinned tools started no server"

    # The proxy container restarts (same pod, same /tmp): the tool lists are still known.
    with host_proxy(work, cache, "second") as proxy:
        def second_run(first):
            r = yield from connected(first)
            seen["offered"] = r.mcp_tools()
            seen["builtins"] = r.available()
            seen["at_connect"] = (proxy.running(), proxy.upstream_processes(), proxy.starts())
            r = yield tool_use(MCP + "everything__get-sum", {"a": 2, "b": 3})
            seen["sum"] = tool_result_text(r)
            r = yield tool_use(MCP + "everything__echo", {"message": "hello"})
            seen["echo"] = tool_result_text(r)
            seen["after_calls"] = (proxy.running(), proxy.starts())
            seen["second_done"] = True
            yield text("done")

        with ScriptedModel(second_run) as model:
            agent(model, proxy, work)
        assert seen.get("second_done"), "Claude Code ended before the model's script did"
        running, processes, starts = seen["at_connect"]
        assert seen["offered"] == allowed
        assert "WebFetch" not in seen["builtins"], "the TaskRun denies the built-in WebFetch"
        assert (running, processes, starts) == ([], [], {}), \
            "Claude Code connected (initialize, tools/list, prompts/list, resources/list) and no server started"
        assert "5" in seen["sum"] and not seen["sum"].startswith("ERROR"), seen["sum"]
        assert "hello" in seen["echo"], seen["echo"]
        # Only the server the calls needed, once; the memory server never ran in this pod.
        assert seen["after_calls"] == (["everything"], {("everything", "tools_call"): 1}), seen["after_calls"]
        assert proxy.starts() == {("everything", "tools_call"): 1}

    # The audit file is complete once the proxy has stopped (lines are written in batches).
    records = proxy.audit_records()
    assert [(r["server"], r["upstreamTool"], r["decision"], r["outcome"]) for r in records] == [
        ("everything", "get-sum", "allowed", "ok"), ("everything", "echo", "allowed", "ok")], records
    clients = {r["client"] for r in records}
    assert len(clients) == 1, f"one Claude Code run, one client identity in its audit lines: {clients}"
    assert next(iter(clients)).startswith("claude-code/"), clients


def test_the_model_is_offered_only_the_allowed_tools_fewer_bytes_than_directly():
    """The seed's promise, "agents only see relevant tools", measured as the model sees it: the
    first request Claude Code sends with MCP tools, through the proxy vs connected directly to
    the same servers, with its default tool search and with every definition sent."""
    from tool_bytes import ALL_DEFINITIONS, DEFERRED, DIRECT, INTENT, PROXIED, compare

    rows = {(label, mode): m for label, mode, m in compare()}
    for mode in (DEFERRED, ALL_DEFINITIONS):
        proxied, direct = rows[(PROXIED, mode)], rows[(DIRECT, mode)]
        # mcp__orchestrator__<server>__<tool> through the proxy; mcp__<server>__<tool> directly.
        through = {n.removeprefix("mcp__orchestrator__") for n in proxied["names"]}
        straight = {n.removeprefix("mcp__") for n in direct["names"]}
        assert through < straight, (mode, through - straight)
        assert "everything__get-env" in straight - through and "memory__delete_entities" in straight - through
    assert rows[(PROXIED, ALL_DEFINITIONS)]["definition_bytes"] < rows[(DIRECT, ALL_DEFINITIONS)]["definition_bytes"]
    assert rows[(PROXIED, DEFERRED)]["deferred_name_bytes"] < rows[(DIRECT, DEFERRED)]["deferred_name_bytes"]
    assert rows[(PROXIED, DEFERRED)]["definition_bytes"] == 0, "deferred: no MCP schema before ToolSearch"
    # Intent mode: the four fixed tools, whatever the TaskRun enables; retrieve_tools lists the
    # same tools as direct mode offers.
    four = {"retrieve_tools", "call_tool_read", "call_tool_write", "call_tool_destructive"}
    for mode in (DEFERRED, ALL_DEFINITIONS):
        assert {n.removeprefix("mcp__orchestrator__") for n in rows[(INTENT, mode)]["names"]} == four
    assert rows[(INTENT, ALL_DEFINITIONS)]["definition_bytes"] < rows[(PROXIED, ALL_DEFINITIONS)]["definition_bytes"]
    assert rows[(INTENT, DEFERRED)]["deferred_name_bytes"] < rows[(PROXIED, DEFERRED)]["deferred_name_bytes"]
    assert rows[(INTENT, DEFERRED)]["retrieve_every_tool"]["tools"] == len(rows[(PROXIED, DEFERRED)]["names"])


def test_the_agent_script_runs_as_root_then_as_the_pods_uid_and_leaves_nothing_in_tmp_or_dev(work):
    """The demo's byte count runs the rendered agent command as root; the tests run it as the
    pod's uid. One after the other in one process, both finish and report: each run writes its
    result and termination log below its own home, none in the host's /tmp or /dev."""
    files = rendered_files()
    settings = json.loads(files["settings.json"])
    settings["permissions"].pop("defaultMode", None)  # Claude Code refuses bypassPermissions as root
    host = {d: set(os.listdir(d)) for d in ("/tmp", "/dev")}
    reports = []
    for as_pod_user in (False, True):
        with ScriptedModel(lambda first: (yield text(f"done as pod user: {as_pod_user}"))) as model:
            run = run_claude(model, "http://127.0.0.1:9/mcp", work, settings=settings,
                             env={"CLAUDE_CODE_MAX_RETRIES": "0"}, as_pod_user=as_pod_user)
        assert run.returncode == 0, f"as pod user {as_pod_user}: {run.stdout[-2000:]} {run.stderr[-2000:]}"
        assert run.stdout.strip().endswith(f"done as pod user: {as_pod_user}"), run.stdout[-500:]
        report = json.loads((run.home / "termination-log").read_text())
        assert (report["subtype"], report["isError"]) == ("success", False), report
        reports.append(report)
        assert not list((run.home / "tmp").glob("claude-result.*")), "the script removes its result file"
    assert [r["text"] for r in reports] == ["done as pod user: False", "done as pod user: True"]
    if os.geteuid() == 0:
        added = {d: sorted(set(os.listdir(d)) - before) for d, before in host.items()}
        assert added == {"/tmp": [], "/dev": []}, f"new in the host's /tmp or /dev: {added}"
