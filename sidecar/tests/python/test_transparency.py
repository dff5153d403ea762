"""A client must not be able to tell the proxy is there, except by the tools it hides: what it
declares reaches the upstream, and what the upstream sends during a call (progress, log
messages, sampling, elicitation and roots requests) reaches the client, whose answers go back.
Prompts and resources are relayed too. Upstream: server-everything; client: the Python SDK."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anyio
import mcp_types as types
import pytest
from mcp import Client

from conftest import raw_post, raw_session

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


def everything(t, **extra) -> dict:
    return {"name": "every", "stdio": t.everything_stdio(), **extra}


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def sample(context, params):
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=f"sampled: {params.messages[0].content.text}"),
        model="test-model",
        stop_reason="endTurn",
    )


async def elicit(context, params):
    return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})


async def roots(context):
    return types.ListRootsResult(roots=[types.Root(uri="file:///workspace/project", name="project")])


@BOTH
async def test_progress_reaches_the_caller_with_its_own_token(make_proxy, tools, mode):
    proxy = make_proxy({"servers": [everything(tools)]})
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async with Client(proxy.url, mode=mode) as client:
        result = await client.call_tool(
            "every__trigger-long-running-operation", {"duration": 1, "steps": 4}, progress_callback=on_progress
        )
    assert "completed" in text_of(result)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


async def test_declared_capabilities_reach_the_upstream(make_proxy, tools):
    with_callbacks = make_proxy({"servers": [everything(tools)]})
    async with Client(
        with_callbacks.url, mode="legacy", sampling_callback=sample, elicitation_callback=elicit, list_roots_callback=roots
    ) as client:
        declared = {t.name for t in (await client.list_tools()).tools}
    plain = make_proxy({"servers": [everything(tools)]})
    async with Client(plain.url, mode="legacy") as client:
        undeclared = {t.name for t in (await client.list_tools()).tools}
    # server-everything registers these only for clients that declare sampling/elicitation/roots.
    conditional = {"every__trigger-sampling-request", "every__trigger-elicitation-request", "every__get-roots-list"}
    assert conditional <= declared
    assert not conditional & undeclared


@BOTH
async def test_sampling_elicitation_and_roots_requests_reach_the_client_and_answers_go_back(make_proxy, tools, mode):
    """server-everything speaks the initialize lifecycle and asks with server-to-client requests.
    A legacy client gets them as requests on its call's stream; a 2026-07-28 client, which takes
    no such requests, gets them as input_required rounds of its call (the proxy bridges)."""
    proxy = make_proxy({"servers": [everything(tools)]})
    logs: list[str] = []

    async def on_log(params):
        logs.append(str(params.data))

    async with Client(
        proxy.url,
        mode=mode,
        sampling_callback=sample,
        elicitation_callback=elicit,
        list_roots_callback=roots,
        logging_callback=on_log,
    ) as client:
        sampled = await client.call_tool("every__trigger-sampling-request", {"prompt": "hello", "maxTokens": 10})
        assert "sampled: Resource trigger-sampling-request context: hello" in text_of(sampled)
        elicited = await client.call_tool("every__trigger-elicitation-request", {})
        assert "Ada" in text_of(elicited)
        listed = await client.call_tool("every__get-roots-list", {})
        assert "file:///workspace/project" in text_of(listed)
        if mode == "legacy":
            # The server logs that it received the roots; the log message reaches the client.
            from conftest import await_for

            await await_for(lambda: any("Roots updated" in line for line in logs), what="the server's log message")


@pytest.mark.filterwarnings("ignore:The roots capability is deprecated")
async def test_a_request_the_upstream_sends_between_calls_reaches_the_client(make_proxy, tools):
    """Outside any call (here: the upstream re-reads the roots after the client says they
    changed) the upstream's request goes to the session, not to the stream of a finished call."""
    proxy = make_proxy({"servers": [everything(tools)]})
    asked: list[int] = []

    async def counting_roots(context):
        asked.append(1)
        return types.ListRootsResult(roots=[types.Root(uri=f"file:///workspace/{len(asked)}", name="project")])

    async with Client(proxy.url, mode="legacy", list_roots_callback=counting_roots) as client:
        assert text_of(await client.call_tool("every__echo", {"message": "first"})) == "Echo: first"
        from conftest import await_for

        # server-everything asks for the roots once it is initialized.
        await await_for(lambda: len(asked) >= 1, what="the upstream's first roots/list")
        before = len(asked)
        await client.send_roots_list_changed()
        await await_for(lambda: len(asked) > before, what="the upstream's roots/list after the change")


async def test_prompts_and_resources_are_relayed(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})
    async with Client(proxy.url, mode="legacy") as client:
        # List requests answer from running servers only (they never start one); a prompt asked
        # for by name is an explicit use and starts its server.
        assert (await client.list_prompts()).prompts == []
        prompt = await client.get_prompt("every__simple-prompt")
        assert prompt.messages[0].content.text == "This is a simple prompt without arguments."
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"every__simple-prompt", "every__args-prompt"} <= prompts
        prompt = await client.get_prompt("every__simple-prompt")
        assert prompt.messages[0].content.text == "This is a simple prompt without arguments."
        resources = (await client.list_resources()).resources
        assert resources, "server-everything lists static resources"
        first = resources[0]
        read = await client.read_resource(first.uri)
        assert read.contents[0].uri == first.uri
        dynamic = await client.read_resource("demo://resource/dynamic/text/7")
        assert "7" in dynamic.contents[0].text
        completion = await client.complete(
            types.PromptReference(type="ref/prompt", name="every__completable-prompt"),
            {"name": "department", "value": "E"},
        )
        assert "Engineering" in completion.completion.values


def test_unknown_methods_get_the_json_rpc_error(make_proxy, tools):
    proxy = make_proxy({"servers": [everything(tools)]})

    def post(body: dict, session: str | None = None) -> tuple[dict, str | None]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if session:
            headers["Mcp-Session-Id"] = session
            headers["Mcp-Protocol-Version"] = "2025-11-25"
        request = urllib.request.Request(proxy.url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            sid = response.headers.get("Mcp-Session-Id")
        messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        if not messages:
            messages = [json.loads(text)]
        return messages[-1], sid

    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    }
    _, session = post(init)
    reply, _ = post({"jsonrpc": "2.0", "id": 2, "method": "no/such-method", "params": {}}, session)
    assert reply["error"]["code"] == -32601


def test_a_session_delete_ends_the_session_with_a_success_status(make_proxy, tools):
    """Clients end a session with DELETE and expect 200 or 204 (the Python SDK logs
    "Session termination failed" for anything else); afterwards the session id is unknown."""
    proxy = make_proxy({"servers": [everything(tools)]})
    headers = raw_session(proxy, finish_handshake=False)

    delete = urllib.request.Request(proxy.url, method="DELETE", headers=headers)
    with urllib.request.urlopen(delete, timeout=10) as response:
        assert response.status in (200, 204)

    assert raw_post(proxy, headers, {"jsonrpc": "2.0", "id": 2, "method": "ping"}) == 404


def test_a_deleted_session_takes_its_calls_in_flight_with_it(make_proxy, tools):
    """A call still running when its client DELETEs the session is cancelled then (the upstream
    is told), its stream ends, and it is audited; it does not run on for nobody."""
    import threading
    import time

    from conftest import wait_for

    proxy = make_proxy({"servers": [everything(tools)]})
    headers = raw_session(proxy)
    long_call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "every__trigger-long-running-operation", "arguments": {"duration": 30, "steps": 30}},
    }
    ended: list[float] = []
    caller = threading.Thread(
        target=lambda: (raw_post(proxy, headers, long_call, timeout=60), ended.append(time.monotonic())), daemon=True
    )
    caller.start()
    wait_for(lambda: proxy.tools()["servers"][0]["callsInFlight"] == 1, what="the call to be in flight")

    deleted_at = time.monotonic()
    delete = urllib.request.Request(proxy.url, method="DELETE", headers=headers)
    with urllib.request.urlopen(delete, timeout=10) as response:
        assert response.status in (200, 204)
    caller.join(timeout=15)
    assert ended, "the call's stream did not end when its session was deleted"
    assert ended[0] - deleted_at < 10
    wait_for(lambda: proxy.tools()["servers"][0]["callsInFlight"] == 0, timeout=10, what="the call to end")
    records = [r for r in proxy.audit() if r["tool"] == "every__trigger-long-running-operation"]
    assert records[0]["outcome"] == "protocol_error" and "cancelled" in records[0]["error"]


def test_an_idle_session_is_closed_and_a_busy_one_is_not(make_proxy, tools):
    """Sessions with no message either way for --session-idle-seconds are closed by rmcp's own
    idle expiry (404 afterwards), also one that never finished its handshake; calls keep a
    session alive."""
    import time

    from conftest import wait_for

    proxy = make_proxy({"servers": [everything(tools)]}, extra_args=["--session-idle-seconds", "2"])

    idle, busy = raw_session(proxy), raw_session(proxy)
    # A session that never finishes its handshake (initialize only) is closed too.
    unfinished = raw_session(proxy, finish_handshake=False)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "every__echo", "arguments": {"message": "x"}}}
    started = time.monotonic()
    # Keep one session busy with calls for well over the idle time.
    while time.monotonic() - started < 5:
        assert raw_post(proxy, busy, call) == 200
        time.sleep(0.3)
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert raw_post(proxy, busy, ping) == 200, "a session in use was closed"
    wait_for(lambda: raw_post(proxy, idle, ping) == 404, timeout=10, what="the idle session to be closed")
    wait_for(lambda: raw_post(proxy, unfinished, ping) == 404, timeout=10, what="the unfinished session to be closed")


@BOTH
async def test_an_upstream_list_change_reaches_the_client(make_proxy, tools, mode):
    """The upstream (Python SDK, spoken to with 2026-07-28, so its change arrives on the listen
    stream the proxy opened) adds a tool; the proxy re-lists it and tells the client."""
    from conftest import SUPPORT

    proxy = make_proxy(
        {"servers": [{"name": "dyn", "stdio": {"command": str(tools.python), "args": [str(SUPPORT / "dynamic_server.py")]}}]}
    )
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with Client(proxy.url, mode=mode, message_handler=on_message) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["dyn__add_tool"]
        if mode == "legacy":
            assert text_of(await client.call_tool("dyn__add_tool", {"name": "fresh"})) == "added"
            with anyio.fail_after(10):
                await changed.wait()
        else:
            async with client.listen(tools_list_changed=True) as subscription:
                assert text_of(await client.call_tool("dyn__add_tool", {"name": "fresh"})) == "added"
                with anyio.fail_after(10):
                    await subscription.__anext__()
        assert sorted(t.name for t in (await client.list_tools()).tools) == ["dyn__add_tool", "dyn__fresh"]
        assert text_of(await client.call_tool("dyn__fresh", {})) == "hello from fresh"
