"""Human approval of risky calls, the proxy's side (policy.requireApproval): a call the policy
names is held; its request is published on the task's Lease (annotation
orchestrator.io/approval-requests), showing every byte of the call with the task's Secret values
masked and naming its digest; the operator's verdict arrives in the task ConfigMap's key
approvals.json (written here as the operator will, naming the digest) and the held call goes on,
or is refused.

Against the real API server that ./test brings up ($KUBECONFIG, else <repo>/e2e/.cluster/
kubeconfig), the real everything server as the upstream, the official MCP SDK as the client.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import time
import uuid

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from conftest import await_for, proxy_meta, recorded, recorded_calls, text_of, to_yaml, write_configmap
from kubeapi import Kube

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
REQUESTS = "orchestrator.io/approval-requests"
CONFIGMAP = "task-a-tools"
LEASE = "task-a"
# A value of the task's Secret deploy/token (in the mask dir): the request must not show it.
SECRET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcd"
# Not shaped like a credential at all: masked because it is a Secret's value, not by its looks.
PASSPHRASE = "open sesame 4711"
NO_DIGEST = "sha256:" + "0" * 64


def call_digest(namespace: str, task: str, id: str, server: str, definition: str, context_version: int, params: dict) -> str:
    """orchestrator_crds::approval::CallDigest::digest: sha256 of the RFC 8785 canonical JSON,
    which for ASCII keys and integers is Python's sorted, compact json.dumps."""
    text = json.dumps(
        {
            "v": 1,
            "namespace": namespace,
            "taskRun": task,
            "id": id,
            "server": server,
            "definition": definition,
            "contextVersion": context_version,
            "params": params,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_the_call_digest_is_the_contract_fixed_vector():
    """The digest this file computes is the contract's (crds and the operator assert the same)."""
    params = {"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234}}
    digest = call_digest("team-a", "held", "0a1b2c3d", "everything", "sha256:" + "1" * 64, 3, params)
    assert digest == "sha256:e1afe37203b00ff1c6bc666d39c20ba74fdf32752e80297c55f90aad034133a3"


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Task:
    """A namespace with the task's Lease and ConfigMap, as the operator creates them; `decide`
    writes a verdict into the ConfigMap as the operator will (all verdicts so far, one array)."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.namespace = f"sc-approval-{uuid.uuid4().hex[:8]}"
        self.verdicts: list[dict] = []
        kube.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        kube.ok(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE}, "spec": {}},
        )

    def create_configmap(self, text: str) -> None:
        self.kube.ok(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP}, "data": {"proxy.yaml": text}},
        )

    def verdict(self, id: str, decision: str, by: str, digest: str, reason: str | None = None) -> str:
        """Adds a verdict on request `id` naming `digest`; returns the document (approvals.json)
        with every verdict so far."""
        entry = {"id": id, "decision": decision, "decidedBy": by, "digest": digest}
        if reason is not None:
            entry["reason"] = reason
        self.verdicts.append(entry)
        return json.dumps(self.verdicts)

    def decide(self, request: dict, decision: str, by: str, reason: str | None = None, digest: str | None = None) -> None:
        """A verdict on `request`, naming its digest (or `digest`), written as the operator does."""
        document = self.verdict(request["id"], decision, by, digest or request.get("digest", NO_DIGEST), reason)
        self.kube.merge_patch(
            f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}", {"data": {"approvals.json": document}}
        )

    def digest(self, request: dict, params: dict) -> str:
        """The digest of `params` held as `request` (its id, server, definition, context version)
        in this task."""
        return call_digest(
            self.namespace, LEASE, request["id"], request["server"], request.get("definition", ""),
            request.get("contextVersion", 0), params,
        )

    def annotation(self) -> str | None:
        lease = self.kube.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}")
        return (lease["metadata"].get("annotations") or {}).get(REQUESTS)

    def requests(self) -> list[dict] | None:
        text = self.annotation()
        return None if text is None else json.loads(text)

    def watch_args(self) -> list[str]:
        return ["--watch-config-map", CONFIGMAP, *self.lease_args()]

    def lease_args(self) -> list[str]:
        return ["--served-lease", LEASE, "--namespace", self.namespace, "--pod-name", "task-a-x7k2p"]


@pytest.fixture
def task(kube):
    task = Task(kube)
    yield task
    kube.request("DELETE", f"/api/v1/namespaces/{task.namespace}")


def proxy_config(tools, workdir, namespace: str, require: dict, record=None) -> dict:
    """The everything server's echo and get-sum; `require` is policy.requireApproval. With
    `record`, what the upstream receives is written there (support/record_stdin.py)."""
    stdio = recorded(tools, record, str(tools.node), str(tools.everything), "stdio") if record else tools.everything_stdio()
    return {
        "task": {"name": "task-a", "namespace": namespace},
        "audit": {"path": str(workdir / "audit.jsonl")},
        "contextVersion": 1,
        "policy": {"requireApproval": require},
        "servers": [{"name": "every", "stdio": stdio, "tools": {"allow": ["echo", "get-sum"]}}],
    }


def start(make_proxy, kube, task: Task, config: dict, workdir, extra: list[str] | None = None, watch: bool = True,
          mask: dict[str, str] | None = None):
    """The proxy as the operator runs it: the same config in the ConfigMap and the mounted file,
    and the task's Secret values (`mask`: {"<secret>/<key>": value}) in its mask dir."""
    task.create_configmap(to_yaml(config))
    args = task.watch_args() if watch else task.lease_args()
    return make_proxy(config, env={"KUBECONFIG": str(kube.path)}, extra_args=[*args, *(extra or [])], workdir=workdir,
                      mask_secrets=mask if mask is not None else {})


def reloads(proxy) -> list[float]:
    return [
        proxy.metric("mcp_proxy_config_reloads_total", result=r, source=s)
        for r in ("ok", "stale", "failed")
        for s in ("api", "file")
    ]


def approvals(proxy, outcome: str) -> float:
    return proxy.metric("mcp_proxy_approvals_total", outcome=outcome)


def echo_records(proxy, at_least: int = 1) -> list[dict]:
    """The audit records of calls to echo, once `at_least` records of any call are written."""
    return [r for r in proxy.audit(at_least) if r["tool"] == "every__echo"]


def shown(request: dict) -> dict:
    """The params a request shows (every byte the proxy will send, Secret values masked)."""
    return json.loads(request["params"])


def unmasked(request: dict, values: dict[str, str]) -> dict:
    """The params a request shows with each placeholder of its nonce replaced by the value it
    masks (`values`: {"<secret>/<key>": value}): the params the proxy sends."""
    text = request["params"]
    for name, value in values.items():
        text = text.replace(f"<secret:{name}:{request['maskNonce']}>", json.dumps(value, ensure_ascii=False)[1:-1])
    return json.loads(text)


async def held(task: Task, count: int = 1) -> list[dict]:
    """The requests on the Lease, once `count` are there."""
    return await await_for(
        lambda: (lambda r: r if r is not None and len(r) == count else None)(task.requests()),
        what=f"{count} approval request(s) on the Lease",
    )


@BOTH
async def test_an_approved_call_is_forwarded_and_its_client_hears_while_it_waits(make_proxy, kube, task, tools, tmp_path, mode):
    workdir = tmp_path / "proxy"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"], "timeoutSeconds": 60})
    proxy = start(make_proxy, kube, task, config, workdir, mask={"deploy/token": SECRET})
    await await_for(lambda: task.requests() == [], what="the proxy to publish an empty set at start")
    # The ConfigMap's copy of the config is the file's: the watch finds it not newer.
    await await_for(lambda: reloads(proxy)[2] == 1, what="the watch to deliver the ConfigMap")
    heard: list[tuple[float, str]] = []

    async def on_progress(progress, total, message):
        heard.append((progress, message))

    results = []
    async with Client(proxy.url, mode=mode) as client:

        async def call():
            message = f"deploy with {SECRET}"
            results.append(await client.call_tool("every__echo", {"message": message}, progress_callback=on_progress))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            text = task.annotation()
            assert SECRET not in text
            assert request["server"] == "every" and request["tool"] == "echo"
            params = shown(request)
            assert re.fullmatch(r"[0-9a-f]{6}", request["maskNonce"]), request
            assert params["name"] == "echo" and params["arguments"] == {
                "message": f"deploy with <secret:deploy/token:{request['maskNonce']}>"
            }, request
            # The proxy's own lifecycle keys are not the client's to send.
            assert not {"progressToken", "io.modelcontextprotocol/protocolVersion"} & set(params.get("_meta", {})), params
            assert request["masked"] == [{"secret": "deploy", "key": "token", "count": 1}], request
            sent = unmasked(request, {"deploy/token": SECRET})
            assert sent["arguments"] == {"message": f"deploy with {SECRET}"}, sent
            # The length shown is the view's; the digest is salted (only the proxy can recompute
            # it), so neither confirms a guess of the masked value.
            assert request["paramsBytes"] == len(request["params"].encode())
            assert request["digest"] != task.digest(request, sent), request
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", request["digest"]), request
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", request["definition"]) and request["contextVersion"] == 1
            assert re.fullmatch(r"[0-9a-f]{8}", request["id"]), request["id"]
            span = time.mktime(time.strptime(request["expiresAt"], "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
                time.strptime(request["requestedAt"], "%Y-%m-%dT%H:%M:%SZ")
            )
            assert span == 60, request
            reloads_before = reloads(proxy)
            # Told at once, then every 5 s.
            await await_for(lambda: len(heard) >= 2, timeout=15, what="two progress notifications")
            waiting = rf"waiting for approval {request['id']} of every/echo \(expires in (\d+m)?\d+s\)"
            assert all(re.fullmatch(waiting, m) for _, m in heard), heard
            assert heard[0][1].endswith("(expires in 1m0s)") or heard[0][1].endswith("(expires in 59s)"), heard
            assert heard[0][0] < heard[1][0], heard
            assert not results, "the call went on before anyone decided"
            assert proxy.metric("mcp_proxy_approvals_pending") == 1
            task.decide(request, "approve", "alice@example.com")
    [result] = results
    assert not result.is_error and text_of(result) == f"Echo: deploy with {SECRET}"
    await await_for(lambda: task.requests() == [], what="the request to leave the Lease")
    # The verdict reloaded nothing.
    assert reloads(proxy) == reloads_before
    [record] = echo_records(proxy)
    assert record["decision"] == "approved" and record["outcome"] == "ok", record
    assert record["approvalId"] == request["id"] and record["decidedBy"] == "alice@example.com"
    assert record["approvalDigest"] == request["digest"]
    assert approvals(proxy, "approved") == 1 and proxy.metric("mcp_proxy_approvals_pending") == 0
    assert SECRET not in (workdir / "audit.jsonl").read_text() and SECRET not in proxy.log()


async def test_a_rejected_call_never_reaches_the_upstream_and_says_who_and_why(make_proxy, kube, task, tools, tmp_path):
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]}, record=record)
    proxy = start(make_proxy, kube, task, config, workdir)
    results = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call():
            results.append(await client.call_tool("every__echo", {"message": "rm -rf /"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            assert shown(request)["arguments"] == {"message": "rm -rf /"}
            # Calls the policy does not name go on meanwhile.
            assert "3" in text_of(await client.call_tool("every__get-sum", {"a": 1, "b": 2}))
            task.decide(request, "reject", "bob@example.com", "not on a Friday")
        [rejected] = results
    assert rejected.is_error
    assert text_of(rejected) == (
        f'tool "every__echo" was rejected by bob@example.com (approval {request["id"]}): not on a Friday; the call was not made'
    )
    assert proxy_meta(rejected) == {
        "code": "PROXY.APPROVAL_REJECTED",
        "server": "every",
        "approvalId": request["id"],
        "decidedBy": "bob@example.com",
        "reason": "not on a Friday",
    }
    assert recorded_calls(record) == ["get-sum"], "the rejected call reached the upstream"
    await await_for(lambda: task.requests() == [], what="the request to leave the Lease")
    [audited] = echo_records(proxy, at_least=2)
    assert audited["decision"] == "rejected" and audited["outcome"] == "denied", audited
    assert audited["approvalId"] == request["id"] and audited["decidedBy"] == "bob@example.com"
    assert audited["rule"] == 'policy.requireApproval.tools[0] "every/echo"'
    assert approvals(proxy, "rejected") == 1
    assert proxy.metric("mcp_proxy_tool_calls_total", server="every", tool="every__echo", outcome="rejected") == 1


async def test_an_approved_call_whose_tool_was_withdrawn_meanwhile_is_refused(make_proxy, kube, task, tools, tmp_path):
    """The wait can be long: what counts is the config when the approval comes, not before."""
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]}, record=record)
    proxy = start(make_proxy, kube, task, config, workdir)
    await await_for(lambda: reloads(proxy)[2] == 1, what="the watch to deliver the ConfigMap")
    results = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call():
            results.append(await client.call_tool("every__echo", {"message": "hello"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            # add-context takes echo away while the call waits.
            narrowed = dict(config, contextVersion=2)
            narrowed["servers"] = [dict(config["servers"][0], tools={"allow": ["get-sum"]})]
            kube.merge_patch(f"/api/v1/namespaces/{task.namespace}/configmaps/{CONFIGMAP}",
                             {"data": {"proxy.yaml": to_yaml(narrowed)}})
            await await_for(lambda: reloads(proxy)[0] >= 1, what="the narrowed config to apply")
            task.decide(request, "approve", "alice@example.com")
        [refused] = results
    assert refused.is_error, text_of(refused)
    assert "withdrawn or changed while its call waited for approval" in text_of(refused), text_of(refused)
    assert proxy_meta(refused)["code"] == "PROXY.TOOL_DENIED"
    assert "echo" not in recorded_calls(record), "the withdrawn tool's call reached the upstream"


async def test_an_undecided_call_expires_and_a_late_verdict_is_ignored(make_proxy, kube, task, tools, tmp_path):
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    config = proxy_config(tools, workdir, task.namespace, {"risk": "read", "timeoutSeconds": 2}, record=record)
    proxy = start(make_proxy, kube, task, config, workdir)
    async with Client(proxy.url, mode="legacy") as client:
        started = time.monotonic()
        expired = await client.call_tool("every__echo", {"message": "anyone?"})
        waited = time.monotonic() - started
        assert 2 <= waited < 10, waited
        assert expired.is_error and "was not approved within 2s" in text_of(expired), text_of(expired)
        meta = proxy_meta(expired)
        assert meta["code"] == "PROXY.APPROVAL_EXPIRED" and meta["timeoutSeconds"] == 2, meta
        await await_for(lambda: task.requests() == [], what="the expired request to leave the Lease")

        # A verdict on it now changes nothing; the one on a new call in the same document does.
        results = []

        async def call():
            results.append(await client.call_tool("every__echo", {"message": "again"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            task.verdict(meta["approvalId"], "approve", "late@example.com", NO_DIGEST)
            task.decide(request, "approve", "alice@example.com")
        assert text_of(results[0]) == "Echo: again"
    assert recorded_calls(record) == ["echo"]
    assert approvals(proxy, "expired") == 1 and approvals(proxy, "approved") == 1
    first, second = echo_records(proxy, at_least=2)
    assert first["decision"] == "expired" and first["approvalId"] == meta["approvalId"] and "decidedBy" not in first
    assert second["decision"] == "approved" and second["decidedBy"] == "alice@example.com"


async def test_beyond_max_pending_a_call_is_refused_at_once(make_proxy, kube, task, tools, tmp_path):
    workdir = tmp_path / "proxy"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/*"]})
    proxy = start(make_proxy, kube, task, config, workdir)
    results: list = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call(i: int):
            results.append(await client.call_tool("every__echo", {"message": f"m{i} " + "x" * 500}))

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(call, i)
            requests = await held(task, 16)
            # 16 requests of at most 12 KiB, with the brackets and commas.
            assert len(task.annotation().encode()) <= 16 * 12 * 1024 + 17
            started = time.monotonic()
            busy = await client.call_tool("every__get-sum", {"a": 1, "b": 2})
            assert time.monotonic() - started < 5
            assert busy.is_error and proxy_meta(busy)["code"] == "PROXY.APPROVAL_BUSY", text_of(busy)
            assert "16 calls already wait" in text_of(busy)
            # One document decides them all.
            for r in requests:
                task.verdict(r["id"], "reject", "bob@example.com", r["digest"], "too many")
            task.decide(requests[0], "reject", "bob@example.com", "too many")
    assert len(results) == 16 and all(proxy_meta(r)["code"] == "PROXY.APPROVAL_REJECTED" for r in results)
    await await_for(lambda: task.requests() == [], what="every request to leave the Lease")
    assert approvals(proxy, "busy") == 1 and approvals(proxy, "rejected") == 16


async def test_a_held_call_its_client_gives_up_on_is_withdrawn(make_proxy, kube, task, tools, tmp_path):
    workdir = tmp_path / "proxy"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]})
    proxy = start(make_proxy, kube, task, config, workdir)
    async with Client(proxy.url, mode="legacy") as client:
        with pytest.raises(MCPError) as abandoned:
            # The SDK sends notifications/cancelled when it stops waiting.
            await client.call_tool("every__echo", {"message": "never mind"}, read_timeout_seconds=1)
        assert "timed out" in abandoned.value.message.lower()
        await await_for(lambda: approvals(proxy, "withdrawn") == 1, what="the proxy to withdraw the request")
        await await_for(lambda: task.requests() == [], what="the withdrawn request to leave the Lease")
    [record] = echo_records(proxy)
    assert record["decision"] == "withdrawn" and "cancelled by the client" in record["error"], record
    assert record["approvalId"]


async def test_a_held_call_is_answered_when_shutdown_cuts_it_off(make_proxy, kube, task, tools, tmp_path):
    workdir = tmp_path / "proxy"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]})
    proxy = start(make_proxy, kube, task, config, workdir, extra=["--shutdown-grace-seconds", "1"])
    errors: list[MCPError] = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call():
            try:
                await client.call_tool("every__echo", {"message": "late"})
            except MCPError as e:
                errors.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await held(task)
            proxy.process.send_signal(signal.SIGTERM)
    assert errors and errors[0].error.data["code"] == "PROXY.SHUTTING_DOWN", errors
    assert proxy.process.wait(timeout=15) == 0
    [record] = echo_records(proxy)
    assert record["decision"] == "withdrawn" and record["outcome"] == "protocol_error", record


async def test_a_verdict_in_the_mounted_file_decides_too(make_proxy, kube, task, tools, tmp_path):
    """Without the ConfigMap watch the kubelet's copy of approvals.json still decides (the Lease
    is still needed to be seen)."""
    workdir = tmp_path / "proxy"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]})
    proxy = start(make_proxy, kube, task, config, workdir, watch=False)
    results = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call():
            results.append(await client.call_tool("every__echo", {"message": "via the file"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            document = task.verdict(request["id"], "approve", "alice@example.com", request["digest"])
            write_configmap(proxy.config_dir, to_yaml(proxy.complete(config)), {"approvals.json": document})
    assert text_of(results[0]) == "Echo: via the file"
    assert reloads(proxy) == [0.0] * 6, "the verdict reloaded the config"
    assert echo_records(proxy)[0]["decidedBy"] == "alice@example.com"


async def test_without_the_api_a_call_that_needs_approval_is_refused_at_once(make_proxy, tools, tmp_path):
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    proxy = make_proxy(proxy_config(tools, workdir, "test", {"tools": ["every/echo"]}, record=record), workdir=workdir)
    async with Client(proxy.url, mode="legacy") as client:
        refused = await client.call_tool("every__echo", {"message": "hi"})
        assert "3" in text_of(await client.call_tool("every__get-sum", {"a": 1, "b": 2}))
    assert refused.is_error and proxy_meta(refused)["code"] == "PROXY.APPROVAL_UNAVAILABLE"
    assert "approval needs the Kubernetes API" in text_of(refused)
    assert recorded_calls(record) == ["get-sum"]
    [audited] = echo_records(proxy, at_least=2)
    assert audited["decision"] == "approval_unavailable" and "approvalId" not in audited
    assert approvals(proxy, "unavailable") == 1


async def test_an_approval_of_call_a_does_not_run_call_b_with_the_same_id(make_proxy, kube, task, tools, tmp_path):
    """A person approved what they were shown as X (call A, say from a forged request); the proxy
    holds call B as X. The verdict names A's digest: B is taken out, never forwarded, and X
    decides nothing again."""
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]}, record=record)
    proxy = start(make_proxy, kube, task, config, workdir)
    results = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call():
            results.append(await client.call_tool("every__echo", {"message": "B: rm -rf /"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            x = request["id"]
            call_a = {"name": "echo", "arguments": {"message": "A: hello"}}
            task.decide(request, "approve", "alice@example.com", digest=task.digest(request, call_a))
        [result] = results
    assert recorded_calls(record) == [], "call B reached the upstream on an approval of call A"
    assert result.is_error, text_of(result)
    meta = proxy_meta(result)
    assert meta["code"] == "PROXY.APPROVAL_MISMATCH", meta
    # B's digest, recomputed here from what the request showed, is the one published.
    call_b = shown(request)
    assert call_b == {"name": "echo", "arguments": {"message": "B: rm -rf /"}}, call_b
    assert "masked" not in request, request
    assert request["digest"] == task.digest(request, call_b)
    assert meta == {
        "code": "PROXY.APPROVAL_MISMATCH",
        "server": "every",
        "approvalId": x,
        "named": task.digest(request, call_a),
        "held": request["digest"],
    }
    assert text_of(result).startswith(f"approval {x} names another call (sha256:"), text_of(result)
    # The Lease is written after the answer (as for every verdict), not before it.
    await await_for(lambda: task.requests() == [], what="the mismatched request to leave the Lease")
    # Once: a verdict naming B's own digest now changes nothing.
    task.decide(request, "approve", "alice@example.com")
    await anyio.sleep(1)
    assert recorded_calls(record) == [] and task.requests() == []
    [audited] = echo_records(proxy)
    assert audited["decision"] == "approval_mismatch" and audited["outcome"] == "denied", audited
    assert audited["approvalId"] == x and audited["approvalDigest"] == request["digest"] and "decidedBy" not in audited
    assert approvals(proxy, "mismatch") == 1 and approvals(proxy, "approved") == 0
    assert "a verdict names another call than the one held under its id" in proxy.log()


async def test_the_request_shows_every_byte_with_a_secret_value_masked(make_proxy, kube, task, tools, tmp_path):
    """deploy/passphrase is a value of the task's Secret, not credential-shaped: it is masked
    wherever it is, and the 3000 characters around it are shown whole."""
    workdir = tmp_path / "proxy"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"]})
    proxy = start(make_proxy, kube, task, config, workdir, mask={"deploy/passphrase": PASSPHRASE})
    message = PASSPHRASE + "".join(f" line {i}: nothing to see here" for i in range(110))
    assert len(message) >= 3000
    results = []
    async with Client(proxy.url, mode="legacy") as client:

        async def call():
            results.append(await client.call_tool("every__echo", {"message": message}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [request] = await held(task)
            assert PASSPHRASE not in task.annotation(), "the Lease shows the Secret's value"
            placeholder = f"<secret:deploy/passphrase:{request['maskNonce']}>"
            sent = {"name": "echo", "arguments": {"message": message}}
            assert shown(request) == {"name": "echo", "arguments": {"message": message.replace(PASSPHRASE, placeholder)}}
            # Byte for byte the JSON the proxy sends, except the masked span.
            assert request["params"] == json.dumps(sent, separators=(",", ":"), sort_keys=True).replace(PASSPHRASE, placeholder)
            assert request["masked"] == [{"secret": "deploy", "key": "passphrase", "count": 1}]
            assert unmasked(request, {"deploy/passphrase": PASSPHRASE}) == sent
            # Nothing a reader sees tests a guess of the value: the length is the view's, and
            # the digest of the call sent is salted with a value only the proxy knows.
            assert request["paramsBytes"] == len(request["params"].encode()) != len(json.dumps(sent, separators=(",", ":")).encode())
            assert request["digest"] != task.digest(request, sent)
            task.decide(request, "approve", "alice@example.com")
        [result] = results
    assert not result.is_error and text_of(result) == f"Echo: {message}"
    assert PASSPHRASE not in proxy.log()


async def test_arguments_too_large_to_show_are_refused_not_held(make_proxy, kube, task, tools, tmp_path):
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"], "timeoutSeconds": 5}, record=record)
    proxy = start(make_proxy, kube, task, config, workdir)
    await await_for(lambda: task.requests() == [], what="the proxy to publish an empty set at start")
    async with Client(proxy.url, mode="legacy") as client:
        started = time.monotonic()
        refused = await client.call_tool("every__echo", {"message": "x" * 20 * 1024})
        waited = time.monotonic() - started
    assert refused.is_error and proxy_meta(refused)["code"] == "PROXY.APPROVAL_TOO_LARGE", text_of(refused)
    assert waited < 3, f"the call waited {waited:.1f}s: it was held"
    meta = proxy_meta(refused)
    assert meta["limit"] == 12 * 1024 and meta["bytes"] > 20 * 1024, meta
    assert "more than the 12288 a request may hold; the call was not made: send smaller arguments" in text_of(refused)
    assert task.requests() == []
    assert recorded_calls(record) == []
    [audited] = echo_records(proxy)
    assert audited["decision"] == "approval_too_large" and "approvalId" not in audited, audited
    assert approvals(proxy, "too_large") == 1


def padded(guess: str, times: int, size: int) -> dict:
    """echo's arguments: `guess` `times`, then spaces, the params' compact JSON `size` bytes."""
    head = guess * times
    plain = len(json.dumps({"name": "echo", "arguments": {"message": head}}, separators=(",", ":")))
    return {"message": head + " " * (size - plain)}


async def test_a_padded_calls_refusal_is_the_same_whether_or_not_a_guess_matches_a_secret(make_proxy, kube, task, tools, tmp_path):
    """The agent pads a call with a guess of a Secret value, repeated: a right guess is masked
    with a placeholder longer than the value, which used to move the size the refusal reported,
    or move the call across the limit. Now what the agent sees follows from the call it sent
    only: the same refusal, byte for byte, and near the limit both calls are held (the right
    guess's view withheld, never shown nor refused)."""
    workdir, record = tmp_path / "proxy", tmp_path / "stdin.jsonl"
    config = proxy_config(tools, workdir, task.namespace, {"tools": ["every/echo"], "timeoutSeconds": 30}, record=record)
    pin = "4711"
    proxy = start(make_proxy, kube, task, config, workdir, mask={"deploy/pin": pin})
    await await_for(lambda: task.requests() == [], what="the proxy to publish an empty set at start")
    async with Client(proxy.url, mode="legacy") as client:
        # Over the limit: refused at once, in the same words and numbers.
        refusals = []
        for guess in ("0000", pin):
            refused = await client.call_tool("every__echo", padded(guess, 300, 12_400))
            assert refused.is_error and proxy_meta(refused)["code"] == "PROXY.APPROVAL_TOO_LARGE", text_of(refused)
            refusals.append((text_of(refused), json.dumps(proxy_meta(refused), sort_keys=True)))
        assert refusals[0] == refusals[1], refusals
        # Just under it: both held. The right guess's view (300 placeholders of 26 bytes) would
        # not fit: its params are withheld; it shows nothing of the value, nor its length.
        results = []

        async def call(guess: str):
            results.append((guess, await client.call_tool("every__echo", padded(guess, 300, 11_600))))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "0000")
            first = (await held(task))[0]
            tg.start_soon(call, pin)
            requests = await held(task, 2)
            wrong, right = first, next(r for r in requests if r["id"] != first["id"])
            assert "withheld" not in wrong and shown(wrong)["arguments"] == padded("0000", 300, 11_600)
            assert right["withheld"] == "tooLarge" and right["params"] == "", right
            assert right["masked"] == [{"secret": "deploy", "key": "pin", "count": 300}], right
            assert right["paramsBytes"] > 12 * 1024 and pin not in task.annotation()
            assert right["digest"] != task.digest(right, {"name": "echo", "arguments": padded(pin, 300, 11_600)})
            # An approval of a call nobody could see is a rejection, in the words of any.
            task.decide(right, "approve", "alice@example.com")
            task.decide(wrong, "reject", "alice@example.com")
    answers = dict(results)
    ids = {"0000": wrong["id"], pin: right["id"]}
    for guess, r in answers.items():
        assert text_of(r) == f'tool "every__echo" was rejected by alice@example.com (approval {ids[guess]}); the call was not made', text_of(r)
        assert proxy_meta(r) == {"code": "PROXY.APPROVAL_REJECTED", "server": "every", "approvalId": ids[guess], "decidedBy": "alice@example.com"}
    assert recorded_calls(record) == [], "a call reached the upstream"
    assert pin not in proxy.log()
