"""The proxy against real MCP servers (npm: server-everything, server-filesystem, server-memory;
PyPI: mcp-server-time), driven by the official MCP Python SDK as the client.

Each test starts the real proxy binary with its own config directory (laid out like a kubelet
ConfigMap mount), port and cache directory.
"""

from __future__ import annotations

import json
import os
import signal
import time

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from conftest import alive, await_for, recorded, recorded_calls

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


def names(result) -> list[str]:
    return sorted(t.name for t in result.tools)


def everything_server(t, **extra) -> dict:
    return {"name": "every", "stdio": t.everything_stdio(), **extra}


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


# --- filtered list, allowed call, denied call -------------------------------------------------


@BOTH
async def test_tools_list_shows_only_allowed_tools_with_definitions_unchanged(make_proxy, tools, tmp_path, mode):
    proxy = make_proxy(
        {
            "servers": [
                everything_server(tools, tools={"allow": ["echo", "get-*"], "deny": ["get-env", "get-tiny-*"]}),
                {
                    "name": "memory",
                    "stdio": {
                        "command": str(tools.node),
                        "args": [str(tools.memory)],
                        "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
                    },
                    "tools": {"allow": ["read_graph", "search_nodes"]},
                },
                {"name": "time", "stdio": {"command": str(tools.time)}},
            ]
        }
    )
    async with Client(proxy.url, mode=mode) as client:
        listed = await client.list_tools()
    assert names(listed) == [
        "every__echo",
        "every__get-annotated-message",
        "every__get-resource-links",
        "every__get-resource-reference",
        "every__get-structured-content",
        "every__get-sum",
        "memory__read_graph",
        "memory__search_nodes",
        "time__convert_time",
        "time__get_current_time",
    ]
    # The same tools straight from the server: schemas, titles and annotations pass unchanged.
    async with Client(StdioServerParameters(**tools.everything_stdio()), mode="legacy") as direct:
        originals = {t.name: t for t in (await direct.list_tools()).tools}
    for tool in listed.tools:
        if not tool.name.startswith("every__"):
            continue
        original = originals[tool.name.removeprefix("every__")]
        assert tool.input_schema == original.input_schema, tool.name
        assert tool.title == original.title, tool.name
        assert tool.description == original.description, tool.name
        assert tool.annotations == original.annotations, tool.name
        assert tool.output_schema == original.output_schema, tool.name


@BOTH
async def test_allowed_calls_reach_the_real_servers(make_proxy, tools, tmp_path, mode):
    proxy = make_proxy(
        {
            "servers": [
                everything_server(tools),
                {
                    "name": "memory",
                    "stdio": {
                        "command": str(tools.node),
                        "args": [str(tools.memory)],
                        "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
                    },
                },
                {"name": "time", "stdio": {"command": str(tools.time)}},
            ]
        }
    )
    async with Client(proxy.url, mode=mode) as client:
        echo = await client.call_tool("every__echo", {"message": "through the proxy"})
        assert text_of(echo) == "Echo: through the proxy"
        total = await client.call_tool("every__get-sum", {"a": 2, "b": 40})
        assert "42" in text_of(total)
        now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert json.loads(text_of(now))["timezone"] == "UTC"
        await client.call_tool(
            "memory__create_entities",
            {"entities": [{"name": "proxy", "entityType": "software", "observations": ["it forwards"]}]},
        )
        graph = await client.call_tool("memory__read_graph", {})
        assert "it forwards" in text_of(graph)
        # A tool error is the server's answer, passed through as a result, not a protocol error.
        failed = await client.call_tool("time__get_current_time", {"timezone": "Not/AZone"})
        assert failed.is_error
    assert (tmp_path / "memory.jsonl").exists(), "the real memory server wrote its file"
    outcomes = [(r["tool"], r["outcome"], r["decision"]) for r in proxy.audit(at_least=6)]
    assert ("every__echo", "ok", "allowed") in outcomes
    assert ("time__get_current_time", "tool_error", "allowed") in outcomes


@BOTH
async def test_denied_call_is_refused_naming_the_rule_and_never_reaches_the_server(make_proxy, tools, tmp_path, mode):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello from disk")
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    proxy = make_proxy(
        {
            "servers": [
                {
                    "name": "fs",
                    "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace)),
                    "tools": {"allow": ["read_*", "list_*", "write_file"], "deny": ["write_*"]},
                }
            ]
        }
    )
    target = workspace / "written-by-agent.txt"
    async with Client(proxy.url, mode=mode) as client:
        assert "fs__write_file" not in names(await client.list_tools())
        read = await client.call_tool("fs__read_text_file", {"path": str(workspace / "hello.txt")})
        assert text_of(read) == "hello from disk"
        refused = await client.call_tool("fs__write_file", {"path": str(target), "content": "nope"})
    # A tool error the agent can read, naming the rule; machine-readable details in _meta.
    assert refused.is_error
    assert "fs__write_file" in text_of(refused)
    assert 'servers[fs].tools.deny[0] "write_*"' in text_of(refused)
    assert refused.meta["io.orchestrator/proxy"]["code"] == "PROXY.TOOL_DENIED"
    # Upstream side: the file was not written, and the server never received the request.
    assert not target.exists()
    assert recorded_calls(stdin_log) == ["read_text_file"]
    # GET /tools: every upstream tool known, with its verdict and the deciding rule.
    known = {t["tool"]: t for t in proxy.tools()["servers"][0]["tools"]}
    assert known["write_file"]["verdict"] == {
        "decision": "denied",
        "rule": {"kind": "deny", "index": 0, "pattern": "write_*"},
    }
    assert "exposedAs" not in known["write_file"]
    assert known["read_text_file"]["exposedAs"] == "fs__read_text_file"
    assert known["read_text_file"]["verdict"]["rule"] == {"kind": "allow", "index": 0, "pattern": "read_*"}
    assert known["directory_tree"]["verdict"] == {"decision": "denied", "rule": {"kind": "notAllowed"}}
    denied = [r for r in proxy.audit(at_least=2) if r["outcome"] == "denied"]
    assert denied and denied[0]["rule"] == 'servers[fs].tools.deny[0] "write_*"'
    assert proxy.metric("mcp_proxy_tool_calls_total", server="fs", tool="fs__write_file", outcome="denied") == 1


@BOTH
async def test_a_destructive_tool_under_max_risk_write_is_hidden_and_refused(make_proxy, tools, tmp_path, mode):
    # The real filesystem server annotates its tools: write_file and move_file destructiveHint,
    # create_directory neither read-only nor destructive, read_text_file readOnlyHint.
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello from disk")
    stdin_log = tmp_path / "filesystem-stdin.jsonl"
    proxy = make_proxy(
        {
            "policy": {"maxRisk": "write"},
            "servers": [
                {
                    "name": "fs",
                    "stdio": recorded(tools, stdin_log, str(tools.node), str(tools.filesystem), str(workspace)),
                    # The glob lets everything through; the policy still holds.
                    "tools": {"allow": ["*"]},
                    "risk": {"list_directory": "destructive"},
                }
            ],
        }
    )
    target = workspace / "written-by-agent.txt"
    async with Client(proxy.url, mode=mode) as client:
        offered = names(await client.list_tools())
        assert {"fs__read_text_file", "fs__create_directory"} <= set(offered)
        assert not {"fs__write_file", "fs__move_file", "fs__edit_file", "fs__list_directory"} & set(offered)
        created = await client.call_tool("fs__create_directory", {"path": str(workspace / "made")})
        assert not created.is_error, text_of(created)
        refused = await client.call_tool("fs__write_file", {"path": str(target), "content": "nope"})
        overridden = await client.call_tool("fs__list_directory", {"path": str(workspace)})
    assert refused.is_error
    assert 'policy.maxRisk "write" (servers[fs]: the tool is destructive)' in text_of(refused)
    assert refused.meta["io.orchestrator/proxy"]["code"] == "PROXY.TOOL_DENIED"
    assert overridden.is_error and "the tool is destructive" in text_of(overridden)
    # Upstream side: nothing written, and the server saw only the allowed call.
    assert not target.exists()
    assert (workspace / "made").is_dir()
    assert recorded_calls(stdin_log) == ["create_directory"]
    # GET /tools: each tool's class, from its annotations or the config's override.
    known = {t["tool"]: t for t in proxy.tools()["servers"][0]["tools"]}
    assert known["read_text_file"]["risk"] == "read"
    assert known["create_directory"]["risk"] == "write"
    assert known["write_file"]["risk"] == "destructive"
    assert known["list_directory"]["risk"] == "destructive"
    assert known["write_file"]["verdict"] == {
        "decision": "denied",
        "rule": {"kind": "aboveMaxRisk", "risk": "destructive", "maxRisk": "write"},
    }
    # Audit: every record carries the class.
    records = {r["tool"]: r for r in proxy.audit(at_least=3)}
    assert records["fs__create_directory"]["risk"] == "write"
    assert records["fs__create_directory"]["decision"] == "allowed"
    assert records["fs__write_file"]["risk"] == "destructive"
    assert records["fs__write_file"]["decision"] == "denied"
    assert records["fs__write_file"]["rule"] == 'policy.maxRisk "write" (servers[fs]: the tool is destructive)'


@BOTH
async def test_unknown_tool_is_a_clear_tool_error(make_proxy, tools, mode):
    proxy = make_proxy({"servers": [everything_server(tools)]})
    async with Client(proxy.url, mode=mode) as client:
        unknown = await client.call_tool("every__no-such-tool", {})
    assert unknown.is_error
    assert 'unknown tool "every__no-such-tool"' in text_of(unknown)
    assert unknown.meta["io.orchestrator/proxy"]["code"] == "PROXY.UNKNOWN_TOOL"


# --- lazy start ---------------------------------------------------------------------------------


async def test_servers_start_lazily_and_a_restarted_proxy_answers_from_its_cache(make_proxy, tools, tmp_path):
    config = {
        "servers": [
            everything_server(tools),
            {"name": "time", "stdio": {"command": str(tools.time)}},
            {"name": "off", "enabled": False, "stdio": tools.everything_stdio()},
            {"name": "all-denied", "stdio": tools.everything_stdio(), "tools": {"deny": ["*"]}},
        ]
    }
    workdir = tmp_path / "lazy"
    proxy = make_proxy(config, workdir=workdir)
    assert proxy.children() == [], "nothing starts with the proxy"
    async with Client(proxy.url, mode="legacy") as client:
        listed = names(await client.list_tools())
        # tools/list needed both lists: both startable servers run now, the others never.
        assert len(proxy.children()) == 2
        states = {s["name"]: s["state"] for s in proxy.tools()["servers"]}
        assert states == {"every": "running", "time": "running", "off": "stopped", "all-denied": "stopped"}
        assert not any(name.startswith(("off__", "all-denied__")) for name in listed)
    assert proxy.terminate() == 0

    # Same cache directory: the new proxy lists tools without starting anything...
    again = make_proxy(config, workdir=workdir)
    async with Client(again.url, mode="legacy") as client:
        assert names(await client.list_tools()) == listed
        assert again.children() == []
        # ...and a call starts only the server it needs.
        await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert len(again.children()) == 1
        assert again.server_pid("time") in again.children()
    assert again.metric("mcp_proxy_upstream_starts_total", server="time", reason="tools_call") == 1
    assert again.metric("mcp_proxy_upstream_starts_total", server="every", reason="tools_list") == 0


@BOTH
async def test_list_requests_start_nothing_and_a_later_start_announces_its_prompts(make_proxy, tools, tmp_path, mode):
    """What Claude Code does right after connecting (tools, prompts, resources and templates
    listed) starts no server when the tool lists are cached; a server started later by a call
    offers its prompts, and the clients are told to re-list them."""
    config = {"servers": [everything_server(tools), {"name": "memory", "stdio": {"command": str(tools.node), "args": [str(tools.memory)]}}]}
    workdir = tmp_path / "warm"
    first = make_proxy(config, workdir=workdir)
    # The cache holds each revision's lists (a server may list differently to each): warmed by a
    # client of the same revision, as the agent of a restarted proxy container is.
    async with Client(first.url, mode=mode) as client:
        await client.list_tools()
    assert first.terminate() == 0

    proxy = make_proxy(config, workdir=workdir)
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.PromptListChangedNotification):
            changed.set()

    async with Client(proxy.url, mode=mode, message_handler=on_message) as client:
        assert "every__echo" in names(await client.list_tools())
        assert (await client.list_prompts()).prompts == []
        assert (await client.list_resources()).resources == []
        assert (await client.list_resource_templates()).resource_templates == []
        assert proxy.children() == [], "a list request started a server"
        assert {s["state"] for s in proxy.tools()["servers"]} == {"stopped"}

        if mode == "legacy":
            await client.call_tool("every__echo", {"message": "hi"})
            with anyio.fail_after(10):
                await changed.wait()
        else:
            async with client.listen(prompts_list_changed=True) as subscription:
                await client.call_tool("every__echo", {"message": "hi"})
                with anyio.fail_after(10):
                    event = await subscription.__anext__()
                assert type(event).__name__ == "PromptsListChanged", event
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"every__simple-prompt", "every__args-prompt"} <= prompts
        # Only the server the call needed runs.
        assert proxy.children() == [proxy.server_pid("every")]
    assert proxy.metric("mcp_proxy_upstream_starts_total", server="every", reason="passthrough") == 0
    assert proxy.metric("mcp_proxy_upstream_starts_total", server="memory", reason="passthrough") == 0


# --- hot reload ---------------------------------------------------------------------------------


@BOTH
async def test_config_swap_sends_list_changed_and_the_new_list(make_proxy, tools, mode):
    base = {"contextVersion": 1, "servers": [everything_server(tools, tools={"allow": ["echo"]})]}
    proxy = make_proxy(base)
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with Client(proxy.url, mode=mode, message_handler=on_message) as client:
        assert names(await client.list_tools()) == ["every__echo"]
        everything_pid = proxy.server_pid("every")
        swapped = {
            "contextVersion": 2,
            "servers": [
                everything_server(tools, tools={"allow": ["echo", "get-sum"]}),
                {"name": "time", "stdio": {"command": str(tools.time)}, "tools": {"allow": ["get_current_time"]}},
            ],
        }
        if mode == "legacy":
            proxy.swap(swapped)
            with anyio.fail_after(10):
                await changed.wait()
        else:
            async with client.listen(tools_list_changed=True) as subscription:
                proxy.swap(swapped)
                with anyio.fail_after(10):
                    event = await subscription.__anext__()
                assert type(event).__name__ == "ToolsListChanged"
        assert names(await client.list_tools()) == ["every__echo", "every__get-sum", "time__get_current_time"]
        # The unchanged server kept running; nothing was started eagerly for the swap itself.
        assert proxy.server_pid("every") == everything_pid
        assert proxy.tools()["contextVersion"] == 2
    assert proxy.metric("mcp_proxy_config_reloads_total", result="ok", source="file") == 1
    assert proxy.metric("mcp_proxy_context_version") == 2


async def test_disabling_a_server_stops_it_and_hides_its_tools(make_proxy, tools):
    config = {"servers": [everything_server(tools), {"name": "time", "stdio": {"command": str(tools.time)}}]}
    proxy = make_proxy(config)
    async with Client(proxy.url, mode="legacy") as client:
        await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        time_pid = proxy.server_pid("time")
        assert time_pid and alive(time_pid)
        config["servers"][1]["enabled"] = False
        proxy.swap(config)
        await await_for(lambda: not alive(time_pid), what="the disabled server to stop")
        assert not any(n.startswith("time__") for n in names(await client.list_tools()))
        refused = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert refused.is_error and "servers[time].enabled: false" in text_of(refused)


async def test_revoking_every_tool_serves_an_empty_tool_set(make_proxy, tools):
    """`deny: ["**"]` on every server (add-context --disable-tools SERVER:* for all) takes every
    tool away from a running task: the proxy serves the empty set and says so, instead of refusing
    the config and keeping the older, broader one."""
    config = {"contextVersion": 1, "servers": [everything_server(tools, tools={"allow": ["echo"]})]}
    proxy = make_proxy(config)
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with Client(proxy.url, mode="legacy", message_handler=on_message) as client:
        assert names(await client.list_tools()) == ["every__echo"]
        every_pid = proxy.server_pid("every")
        proxy.swap({"contextVersion": 2, "servers": [everything_server(tools, tools={"allow": ["echo"], "deny": ["**"]})]})
        with anyio.fail_after(10):
            await changed.wait()
        assert names(await client.list_tools()) == []
        refused = await client.call_tool("every__echo", {"message": "hi"})
        assert refused.is_error and refused.meta["io.orchestrator/proxy"]["code"] == "PROXY.TOOL_DENIED"
        await await_for(lambda: not alive(every_pid), what="the server with no tool left to stop")
    assert proxy.tools()["contextVersion"] == 2
    assert proxy.metric("mcp_proxy_config_reloads_total", result="ok", source="file") == 1
    assert "PROXY.NOTHING_ENABLED" in proxy.log()


async def test_invalid_swap_keeps_the_last_good_config(make_proxy, tools):
    good = {"contextVersion": 5, "servers": [everything_server(tools, tools={"allow": ["echo", "get-sum"]})]}
    proxy = make_proxy(good)
    notified = []

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            notified.append(message)

    async with Client(proxy.url, mode="legacy", message_handler=on_message) as client:
        before = names(await client.list_tools())
        proxy.swap({"contextVersion": 6, "servers": [{"name": "every", "stdio": {"comand": "typo"}}]})
        await await_for(lambda: proxy.metric("mcp_proxy_config_reloads_total", result="failed", source="file") == 1, what="the rejected reload")
        # Nothing changed: same tools, same contextVersion, calls still work, nobody was told to re-list.
        assert names(await client.list_tools()) == before
        assert proxy.tools()["contextVersion"] == 5
        assert text_of(await client.call_tool("every__echo", {"message": "still here"})) == "Echo: still here"
        assert notified == []
    assert proxy.http("/readyz")[0] == 200
    log = proxy.log()
    assert "PROXY.UNKNOWN_KEY" in log and "servers[0].stdio.comand" in log
    assert "keeping the last good config" in log


async def test_an_invalid_file_at_start_means_not_ready_until_fixed(make_proxy, tools):
    proxy = make_proxy({"servers": [{"name": "every", "stdio": {"comand": "typo"}}]}, wait_ready=False)
    assert proxy.http("/readyz")[0] == 503
    assert proxy.metric("mcp_proxy_config_reloads_total", result="failed", source="file") == 1
    assert "PROXY.UNKNOWN_KEY" in proxy.log()
    proxy.swap({"servers": [everything_server(tools, tools={"allow": ["echo"]})]})
    await await_for(proxy.ready, what="the fixed config to be loaded")
    async with Client(proxy.url, mode="legacy") as client:
        assert names(await client.list_tools()) == ["every__echo"]


# --- upstream crash, SIGTERM, environment -----------------------------------------------------


@BOTH
async def test_upstream_killed_mid_call_fails_cleanly_then_recovers(make_proxy, tools, mode):
    proxy = make_proxy({"servers": [everything_server(tools)]})
    async with Client(proxy.url, mode=mode) as client:
        await client.call_tool("every__echo", {"message": "warm up"})
        first_pid = proxy.server_pid("every")
        outcome: dict = {}

        async def long_call():
            try:
                outcome["result"] = await client.call_tool(
                    "every__trigger-long-running-operation", {"duration": 30, "steps": 30}
                )
            except MCPError as e:
                outcome["error"] = e

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            await await_for(lambda: proxy.tools()["servers"][0]["callsInFlight"] == 1, what="the call to be in flight")
            os.kill(first_pid, signal.SIGKILL)
        error = outcome.get("error")
        assert error is not None, f"the call should fail, got {outcome}"
        assert "every" in error.message and "exited" in error.message, error.message
        assert "SIGKILL" in error.message or "signal: 9" in error.message, error.message
        # The next call restarts the server and works.
        assert text_of(await client.call_tool("every__echo", {"message": "back"})) == "Echo: back"
        second_pid = proxy.server_pid("every")
        assert second_pid and second_pid != first_pid
    assert proxy.metric("mcp_proxy_upstream_restarts_total", server="every") == 1
    assert proxy.metric("mcp_proxy_upstream_exits_total", server="every") == 1


async def test_sigterm_leaves_no_child_behind(make_proxy, tools, tmp_path):
    proxy = make_proxy(
        {
            "servers": [
                everything_server(tools),
                {"name": "time", "stdio": {"command": str(tools.time)}},
                {"name": "fs", "stdio": {"command": str(tools.node), "args": [str(tools.filesystem), str(tmp_path)]}},
            ]
        }
    )
    async with Client(proxy.url, mode="legacy") as client:
        await client.list_tools()
    children = proxy.children()
    assert len(children) == 3
    assert proxy.terminate() == 0
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}"), f"child {pid} outlived the proxy (or is a zombie)"
    assert "all upstream servers stopped" in proxy.log()


async def test_children_get_only_their_configured_environment(make_proxy, tools):
    proxy = make_proxy(
        {
            "servers": [
                everything_server(
                    tools,
                    stdio={**tools.everything_stdio(), "env": {"LITERAL_SETTING": "on"}, "passEnv": ["PASSED_TOKEN"]},
                )
            ]
        },
        env={"PASSED_TOKEN": "meant-for-the-server", "UNRELATED_SECRET": "must-not-leak"},
    )
    async with Client(proxy.url, mode="legacy") as client:
        env = json.loads(text_of(await client.call_tool("every__get-env", {})))
    assert env["PASSED_TOKEN"] == "meant-for-the-server"
    assert env["LITERAL_SETTING"] == "on"
    assert "UNRELATED_SECRET" not in env
    assert set(env) <= {"PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PASSED_TOKEN", "LITERAL_SETTING"}
    # The secret reached the server, but no log line or audit record.
    assert "meant-for-the-server" not in proxy.log()
    assert all("meant-for-the-server" not in json.dumps(r) for r in proxy.audit())


# --- front details ------------------------------------------------------------------------------


@BOTH
async def test_stdio_front_serves_the_same_tools(proxy_bin, tools, tmp_path, mode):
    from conftest import to_yaml, write_configmap

    write_configmap(tmp_path / "cm", to_yaml({"task": {"name": "t"}, "servers": [everything_server(tools, tools={"allow": ["echo"]})]}))
    params = StdioServerParameters(
        command=str(proxy_bin), args=["--stdio", "--config", str(tmp_path / "cm/proxy.yaml"), "--cache-dir", str(tmp_path / "c")]
    )
    async with Client(params, mode=mode) as client:
        assert names(await client.list_tools()) == ["every__echo"]
        assert text_of(await client.call_tool("every__echo", {"message": "stdio"})) == "Echo: stdio"


async def test_foreign_host_header_is_refused(make_proxy, tools):
    proxy = make_proxy({"servers": [everything_server(tools)]})
    status, _ = proxy.http("/mcp", headers={"Host": "evil.example:8080", "Accept": "text/event-stream"})
    assert status == 403
    status, _ = proxy.http("/healthz")
    assert status == 200
