"""The proxy follows its task's ConfigMap through the Kubernetes API (--watch-config-map) besides
the mounted file, and reports the contextVersion it serves on the task's Lease (--served-lease).

Against the real API server that ./test brings up ($KUBECONFIG, else <repo>/e2e/.cluster/
kubeconfig; admin credentials: the least-privilege Role is tested by the operator's tests). The
config directory is never updated unless a case says so, so whatever arrives came through the API.
The client is the official MCP SDK in a legacy (initialize-era) session.
"""

from __future__ import annotations

import statistics
import time
import uuid
from urllib.parse import urlparse

import anyio
import mcp_types as types
import pytest
from mcp import Client

from conftest import SUPPORT, alive, await_for, free_port, to_yaml, wait_for
from kubeapi import Kube, Relay

SERVED = "orchestrator.io/served-context-version"
POD = "task-a-7xk2p"
CONFIGMAP = "task-a-tools"
LEASE = "task-a-served"


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Task:
    """A namespace with the task's ConfigMap and Lease, as the operator creates them."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.namespace = f"sc-api-{uuid.uuid4().hex[:8]}"
        kube.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        kube.ok(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE}, "spec": {}},
        )

    @property
    def configmap_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}"

    def create_configmap(self, text: str) -> None:
        self.kube.ok(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP}, "data": {"proxy.yaml": text}},
        )

    def put_config(self, text: str) -> None:
        self.kube.merge_patch(self.configmap_path, {"data": {"proxy.yaml": text}})

    def lease(self) -> dict:
        return self.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}")

    def served(self) -> str | None:
        return (self.lease()["metadata"].get("annotations") or {}).get(SERVED)

    def args(self) -> list[str]:
        return ["--watch-config-map", CONFIGMAP, "--served-lease", LEASE, "--namespace", self.namespace, "--pod-name", POD]


@pytest.fixture
def task(kube):
    task = Task(kube)
    yield task
    kube.request("DELETE", f"/api/v1/namespaces/{task.namespace}")


@pytest.fixture
def config(tools, tmp_path):
    """The proxy config at `version` offering the everything server's tools in `allow`."""

    def make(version: int, allow: list[str]) -> dict:
        return {
            "task": {"name": "task-a", "namespace": "test"},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
            "contextVersion": version,
            "servers": [{"name": "every", "stdio": tools.everything_stdio(), "tools": {"allow": allow}}],
        }

    return make


def names(result) -> list[str]:
    return sorted(t.name for t in result.tools)


def exposed(allow: list[str]) -> list[str]:
    return sorted(f"every__{t}" for t in allow)


def reloads(proxy, result: str, source: str) -> float:
    return proxy.metric("mcp_proxy_config_reloads_total", result=result, source=source)


def start(make_proxy, task: Task, first: dict, kubeconfig) -> object:
    task.create_configmap(to_yaml(first))
    return make_proxy(first, env={"KUBECONFIG": str(kubeconfig)}, extra_args=task.args())


@pytest.mark.anyio
async def test_a_configmap_change_through_the_api_reaches_a_connected_client_at_once_and_is_reported(make_proxy, kube, task, config):
    proxy = start(make_proxy, task, config(1, ["echo"]), kube.path)
    # Reported once the first config is served.
    await await_for(lambda: task.served() == "1", what="the Lease to report contextVersion 1")
    spec = task.lease()["spec"]
    assert spec["holderIdentity"] == POD and spec["renewTime"], spec

    notified: list[float] = []

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            notified.append(time.monotonic())

    to_client, to_lease = [], []
    async with Client(proxy.url, mode="legacy", message_handler=on_message) as client:
        assert names(await client.list_tools()) == ["every__echo"]
        for version in range(2, 7):
            allow = ["echo", "get-sum"] if version % 2 == 0 else ["echo"]
            seen = len(notified)
            sent = time.monotonic()
            task.put_config(to_yaml(config(version, allow)))
            await await_for(lambda: len(notified) > seen, timeout=10, what=f"list_changed for contextVersion {version}", interval=0.005)
            to_client.append(notified[seen] - sent)
            await await_for(lambda: task.served() == str(version), timeout=10, what=f"the Lease to report {version}", interval=0.01)
            to_lease.append(time.monotonic() - sent)
            assert names(await client.list_tools()) == exposed(allow)
    print(
        f"\nAPI watch, ConfigMap patched -> list_changed at the client: median {statistics.median(to_client) * 1000:.0f} ms,"
        f" max {max(to_client) * 1000:.0f} ms; -> Lease reports it: median {statistics.median(to_lease) * 1000:.0f} ms,"
        f" max {max(to_lease) * 1000:.0f} ms (n={len(to_client)})"
    )
    assert proxy.tools()["contextVersion"] == 6
    assert reloads(proxy, "ok", "api") == 5 and reloads(proxy, "ok", "file") == 0
    assert task.lease()["spec"]["holderIdentity"] == POD
    # The kubelet's periodic sync takes ~60 s; the watch must be far below that.
    assert max(to_client) < 5, to_client


@pytest.mark.anyio
async def test_the_higher_context_version_wins_from_either_source_and_an_invalid_one_keeps_the_last_good(make_proxy, kube, task, config):
    proxy = start(make_proxy, task, config(1, ["echo"]), kube.path)
    notified: list = []

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            notified.append(message)

    async with Client(proxy.url, mode="legacy", message_handler=on_message) as client:
        assert names(await client.list_tools()) == ["every__echo"]
        task.put_config(to_yaml(config(3, ["echo", "get-sum"])))
        await await_for(lambda: proxy.tools()["contextVersion"] == 3, what="contextVersion 3 from the API")
        await await_for(lambda: notified, what="list_changed for contextVersion 3")
        assert names(await client.list_tools()) == exposed(["echo", "get-sum"])
        quiet = len(notified)

        # Lower through the API, then lower and equal in the file (the kubelet catching up late):
        # ignored, the proxy never goes back.
        stale_api = reloads(proxy, "stale", "api")
        task.put_config(to_yaml(config(2, ["echo"])))
        await await_for(lambda: reloads(proxy, "stale", "api") == stale_api + 1, what="the lower version from the API to be ignored")
        proxy.swap(config(2, ["echo"]))
        await await_for(lambda: reloads(proxy, "stale", "file") == 1, what="the lower version in the file to be ignored")
        proxy.swap(config(3, ["echo"]))
        await await_for(lambda: reloads(proxy, "stale", "file") == 2, what="the equal version in the file to be ignored")
        assert proxy.tools()["contextVersion"] == 3
        assert names(await client.list_tools()) == exposed(["echo", "get-sum"])

        # Invalid through the API: the last good config stays, and the proxy stays ready.
        task.put_config(to_yaml({**config(9, ["echo"]), "servers": [{"name": "every", "stdio": {"comand": "typo"}}]}))
        await await_for(lambda: reloads(proxy, "failed", "api") == 1, what="the invalid config from the API to be rejected")
        task.put_config("contextVersion: [not yaml")
        await await_for(lambda: reloads(proxy, "failed", "api") == 2, what="the unparsable config from the API to be rejected")
        assert proxy.tools()["contextVersion"] == 3
        assert names(await client.list_tools()) == exposed(["echo", "get-sum"])
        assert proxy.http("/readyz")[0] == 200
        assert len(notified) == quiet, "a stale or invalid config made clients re-list"
        assert task.served() == "3"

        # The file can still move the proxy forward; the API's copy of that version is then stale.
        proxy.swap(config(4, ["echo", "get-sum", "get-env"]))
        await await_for(lambda: proxy.tools()["contextVersion"] == 4, what="contextVersion 4 from the file")
        assert names(await client.list_tools()) == exposed(["echo", "get-sum", "get-env"])
        await await_for(lambda: task.served() == "4", what="the Lease to report 4")
        task.put_config(to_yaml(config(4, ["echo"])))
        await await_for(lambda: reloads(proxy, "stale", "api") == stale_api + 2, what="the API's equal version to be ignored")
        assert names(await client.list_tools()) == exposed(["echo", "get-sum", "get-env"])
    log = proxy.log()
    assert "PROXY.UNKNOWN_KEY" in log and "keeping the last good config" in log


def test_with_the_api_unreachable_the_file_still_applies_a_change(make_proxy, kube, config, tmp_path):
    # A kubeconfig whose API server is a closed port: every request is refused.
    unreachable = kube.with_server(f"https://127.0.0.1:{free_port()}", tmp_path)
    args = ["--watch-config-map", CONFIGMAP, "--served-lease", LEASE, "--namespace", "sc-nowhere", "--pod-name", POD]
    proxy = make_proxy(config(1, ["echo"]), env={"KUBECONFIG": str(unreachable)}, extra_args=args)
    wait_for(lambda: "the ConfigMap watch failed" in proxy.log(), what="the watch to fail")
    proxy.swap(config(2, ["echo", "get-sum"]))
    wait_for(lambda: proxy.tools()["contextVersion"] == 2, what="the file's change to be served")
    assert reloads(proxy, "ok", "file") == 1
    # A proxy retrying the API still stops at once.
    wait_for(lambda: "cannot report the served contextVersion" in proxy.log(), what="the Lease report to fail")
    started = time.monotonic()
    assert proxy.terminate(timeout=10) == 0
    assert time.monotonic() - started < 5


@pytest.mark.anyio
async def test_the_watch_resumes_after_its_connection_is_dropped_and_loses_no_change(make_proxy, kube, task, config, tmp_path):
    api = urlparse(kube.server)
    relay = Relay((api.hostname, api.port or 443))
    try:
        relayed = kube.with_server(f"https://127.0.0.1:{relay.port}", tmp_path)
        proxy = start(make_proxy, task, config(1, ["echo"]), relayed)
        await await_for(lambda: "the ConfigMap watch is connected" in proxy.log(), what="the watch to connect")
        task.put_config(to_yaml(config(2, ["echo", "get-sum"])))
        await await_for(lambda: proxy.tools()["contextVersion"] == 2, what="contextVersion 2 through the relay")

        # The API server goes away: every connection is dropped and new ones are refused for a
        # while. A change made meanwhile must arrive once the server is back.
        relay.pause()
        assert relay.cut() >= 1, "the watch had no connection through the relay"
        attempts = relay.accepted
        task.put_config(to_yaml(config(3, ["echo"])))
        # Several attempts fail; the log says so once, not once per retry.
        await await_for(lambda: relay.accepted >= attempts + 2, what="the proxy to retry twice")
        assert proxy.tools()["contextVersion"] == 2
        assert proxy.log().count("the ConfigMap watch failed;") == 1, proxy.log()
        relay.resume()
        await await_for(lambda: proxy.tools()["contextVersion"] == 3, timeout=60, what="the change made while disconnected")
        await await_for(lambda: task.served() == "3", what="the Lease to report 3")
        assert "the ConfigMap watch resumed" in proxy.log()
        async with Client(proxy.url, mode="legacy") as client:
            assert names(await client.list_tools()) == ["every__echo"]

        # And the resumed watch keeps delivering.
        task.put_config(to_yaml(config(4, ["echo", "get-sum"])))
        await await_for(lambda: proxy.tools()["contextVersion"] == 4, what="a change after the watch resumed")
        assert reloads(proxy, "ok", "file") == 0
    finally:
        relay.close()


@pytest.mark.anyio
async def test_stopping_a_proxy_that_watches_the_api_leaves_nothing_behind(make_proxy, kube, task, config):
    proxy = start(make_proxy, task, config(1, ["echo"]), kube.path)
    await await_for(lambda: task.served() == "1", what="the Lease to report 1")
    async with Client(proxy.url, mode="legacy") as client:
        await client.call_tool("every__echo", {"message": "hi"})
    children = proxy.children()
    assert children, "the upstream server is not running"
    started = time.monotonic()
    assert proxy.terminate(timeout=15) == 0
    assert time.monotonic() - started < 10
    wait_for(lambda: not any(alive(p) for p in children), timeout=10, what="every upstream process to be gone")
    assert "all upstream servers stopped; bye" in proxy.log()


@pytest.mark.anyio
async def test_a_tool_definition_that_changes_is_told_as_an_event_on_the_taskrun(make_proxy, kube, task, tools, tmp_path):
    # The rug-pull server (support/rug_pull_server.py) rewrites echo's description when asked.
    uid = str(uuid.uuid4())
    first = {
        "task": {"name": "task-a", "namespace": task.namespace},
        "audit": {"path": str(tmp_path / "audit.jsonl")},
        "contextVersion": 1,
        "servers": [
            {
                "name": "rug",
                "stdio": {
                    "command": str(tools.python),
                    "args": [str(SUPPORT / "rug_pull_server.py")],
                    "env": {"RUG_PULL_CALLS": str(tmp_path / "calls.txt")},
                },
            }
        ],
    }
    task.create_configmap(to_yaml(first))
    proxy = make_proxy(first, env={"KUBECONFIG": str(kube.path)}, extra_args=[*task.args(), "--task-uid", uid])
    async with Client(proxy.url, mode="legacy") as client:
        assert names(await client.list_tools()) == ["rug__echo", "rug__rewrite"]
        await client.call_tool("rug__rewrite", {})

        def events() -> list[dict]:
            listed = kube.ok("GET", f"/apis/events.k8s.io/v1/namespaces/{task.namespace}/events")["items"]
            return [e for e in listed if e.get("reason") == "ToolDefinitionChanged"]

        found = await await_for(events, timeout=15, what="the ToolDefinitionChanged event")
    assert len(found) == 1, found
    event = found[0]
    assert event["type"] == "Warning" and event["action"] == "Quarantine"
    assert event["regarding"] == {
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "name": "task-a",
        "namespace": task.namespace,
        "uid": uid,
    }
    assert 'servers[rug]: the definition of "echo" changed since first seen' in event["note"], event["note"]
    assert event["reportingController"] == "orchestrator.io/mcp-proxy" and event["reportingInstance"] == POD
    # `kubectl describe taskrun` and `orchestrator-cli task describe` read core/v1 events.
    core = kube.ok(
        "GET",
        f"/api/v1/namespaces/{task.namespace}/events?fieldSelector=involvedObject.kind%3DTaskRun,involvedObject.name%3Dtask-a",
    )["items"]
    assert [e["reason"] for e in core] == ["ToolDefinitionChanged"]
