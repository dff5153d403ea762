"""Transparency across both MCP revisions: for every client revision x upstream revision pair,
what a client sees talking to the upstream directly it also sees through the proxy. The
upstream is our own (support/dual_server.py, official Python SDK) speaking both revisions, or
forced to one; the client is the official Python SDK in legacy or 2026-07-28 mode. Behaviours:
sampling and elicitation (defaults, SEP-1034; enums, SEP-1330) asked during a call, sampling the
SDK's revision-following way, a resource subscription, and a tool list that changes."""

from __future__ import annotations

import sys

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from conftest import SUPPORT

pytestmark = pytest.mark.anyio

CLIENTS = ["legacy", "2026-07-28"]
UPSTREAMS = ["both", "legacy", "modern"]
ASKS = [
    ("ask_model", {"prompt": "hello"}),
    ("ask_defaults", {}),
    ("ask_enum", {}),
    ("ask_model_any", {"prompt": "hello"}),
]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def server_args(upstream: str) -> list[str]:
    return [str(SUPPORT / "dual_server.py"), upstream]


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


class Observer:
    """A client's callbacks, recording what the server asked."""

    def __init__(self):
        self.schemas: list[dict] = []
        self.updated = anyio.Event()
        self.tools_changed = anyio.Event()

    async def sample(self, context, params):
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=f"echo {params.messages[0].content.text}"),
            model="test-model",
            stop_reason="endTurn",
        )

    async def elicit(self, context, params):
        schema = params.requested_schema
        self.schemas.append(schema)
        props = schema["properties"]
        if "color" in props:
            return types.ElicitResult(action="accept", content={"color": "green", "size": "l"})
        # Accept what the server proposed (SEP-1034 defaults).
        return types.ElicitResult(action="accept", content={k: v["default"] for k, v in props.items() if "default" in v})

    async def on_message(self, message):
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.set()
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed.set()


async def wait(event: anyio.Event, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await event.wait()
        return True
    return False


async def observe(target, mode: str, prefix: str, expect: dict | None) -> dict:
    """Runs the scenario; returns what was seen. With `expect` (what was seen directly), waits
    as long as needed for the notifications seen there, and only briefly for the others."""
    seen: dict = {}
    o = Observer()
    try:
        async with Client(
            target, mode=mode, sampling_callback=o.sample, elicitation_callback=o.elicit, message_handler=o.on_message
        ) as client:
            seen["tools"] = sorted(t.name.removeprefix(prefix) for t in (await client.list_tools()).tools)
            for tool, args in ASKS:
                try:
                    result = await client.call_tool(prefix + tool, args)
                    seen[tool] = ("error: " if result.is_error else "") + text_of(result)
                except Exception as e:  # a JSON-RPC error: not the tool's answer
                    seen[tool] = f"failed: {type(e).__name__}"
            seen["schemas"] = o.schemas

            patience = lambda key: 10 if expect is None or expect.get(key) is True else 2  # noqa: E731
            async def reads_new_version() -> bool:
                contents = (await client.read_resource("note://a")).contents
                return contents[0].text == "a v1"

            if mode == "legacy":
                await client.subscribe_resource("note://a")
                await client.call_tool(prefix + "touch", {"uri": "note://a"})
                seen["resource_updated"] = await wait(o.updated, patience("resource_updated")) and await reads_new_version()
                await client.call_tool(prefix + "add_tool", {"name": "fresh"})
                seen["tools_changed"] = await wait(o.tools_changed, patience("tools_changed"))
            else:
                async with client.listen(resource_subscriptions=["note://a"], tools_list_changed=True) as sub:
                    events: list = []

                    async def collect():
                        async for event in sub:
                            events.append(event)

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(collect)
                        await client.call_tool(prefix + "touch", {"uri": "note://a"})
                        # An update tells the client to re-read (the proxy may say so once more
                        # than the server did): it must come, and the read must show the change.
                        updated = False
                        with anyio.move_on_after(patience("resource_updated")):
                            while not updated:
                                while not any(type(e).__name__ == "ResourceUpdated" for e in events):
                                    await anyio.sleep(0.05)
                                events[:] = [e for e in events if type(e).__name__ != "ResourceUpdated"]
                                updated = await reads_new_version()
                        await client.call_tool(prefix + "add_tool", {"name": "fresh"})
                        with anyio.move_on_after(patience("tools_changed")):
                            while not any(type(e).__name__ == "ToolsListChanged" for e in events):
                                await anyio.sleep(0.05)
                        tg.cancel_scope.cancel()
                    seen["resource_updated"] = updated
                    seen["tools_changed"] = any(type(e).__name__ == "ToolsListChanged" for e in events)
            if seen["tools_changed"]:
                fresh = await client.call_tool(prefix + "fresh", {})
                seen["fresh"] = text_of(fresh)
    except Exception as e:  # the client could not connect at all
        seen.setdefault("connect", f"failed: {type(e).__name__}")
    return seen


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("mode", CLIENTS)
async def test_what_a_client_sees_directly_it_sees_through_the_proxy(make_proxy, tools, mode, upstream):
    direct = await observe(StdioServerParameters(command=str(tools.python), args=server_args(upstream)), mode, "", None)
    proxy = make_proxy({"servers": [{"name": "dual", "stdio": {"command": str(tools.python), "args": server_args(upstream)}}]})
    proxied = await observe(proxy.url, mode, "dual__", direct)
    print(f"\n{mode} x {upstream}\n  direct:  {direct}\n  proxied: {proxied}")
    assert "connect" not in proxied, proxied
    for key, value in direct.items():
        if key == "connect" or value is False or (isinstance(value, str) and value.startswith(("failed", "error"))):
            continue  # nothing seen directly: nothing to keep
        assert proxied.get(key) == value, f"{key}: directly {value!r}, through the proxy {proxied.get(key)!r}"
