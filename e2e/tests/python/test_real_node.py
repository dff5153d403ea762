"""The operator's pod spec, proven by a real kubelet (the e2e cluster's real node): the rendered
pod starts under the restricted security context, its proxy passes its probes and writes only
to its volumes, a Secret reaches only the container meant to get it, the pod's network reaches
nothing of the machine's, a failing agent fails the TaskRun with its exit code and reason, and
`orchestrator-cli task audit` reads a running task's proxy records through the API server.

What a container runs as is read where the kernel says it: /proc/<pid>/status, environ and
mountinfo of each container's process on this machine (containerd's task list maps the pod's
container IDs to pids). Needs the cluster with its real node (`./test` provides it).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scripted_agent import CLIENT
from story import (
    NODE_SOCK,
    REAL_NODE,
    REPO,
    Story,
    descendants,
    wait_until,
)

UID = 65532
# The real node's pod network (e2e/node: a bridge in the node's own network namespace).
POD_NETWORK = ipaddress.ip_network("10.244.0.0/16")


def apply_task(story: Story, name: str, task_id: int, agent: dict, servers: list[dict]) -> None:
    taskrun = {
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "metadata": {"name": name},
        "spec": {
            "taskId": task_id,
            "serviceName": "pod-spec",
            "task": {"prompt": "prove the pod spec"},
            "agent": agent,
            "podTemplate": {
                "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
            },
            "toolConfig": {"mcpServers": servers},
        },
    }
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))


def secret(story: Story, name: str, key: str, value: str) -> None:
    story.kubectl("create", "secret", "generic", name, "-n", story.work_ns, f"--from-literal={key}={value}")


def running_pod(story: Story, job: str) -> dict:
    def both_running():
        pods = story.json("get", "pods", "-n", story.work_ns, "-l", f"job-name={job}")["items"]
        if not pods:
            return None
        story.fail_if_pod_failed(pods[0])
        statuses = pods[0]["status"].get("containerStatuses", [])
        agent = next((s for s in statuses if s["name"] == "agent"), {})
        return pods[0] if agent.get("state", {}).get("running") else None

    return wait_until(f"the pod of {job} to run both containers", both_running, timeout=120, interval=0.2)


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if item)


def mounts(pid: int) -> dict[str, set[str]]:
    """mount point -> its options (per-mount and per-superblock), as the process sees them."""
    out = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        out[fields[4]] = set(fields[5].split(",")) | set(fields[sep + 3].split(","))
    return out


# The head of a script for `in_pod_netns`: an MCP SDK client transport to the pod's proxy with the
# agent's credential (TOKEN replaced by it).
AUTHENTICATED = """
        import asyncio
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        def transport():
            return streamable_http_client("http://127.0.0.1:8080/mcp",
                                          http_client=httpx2.AsyncClient(headers={"Authorization": "Bearer TOKEN"}))
"""


def in_pod_netns(pid: int, script: str) -> subprocess.CompletedProcess:
    """Runs a Python script (this interpreter, with the MCP SDK) in the pod's network namespace."""
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)


def test_the_pod_runs_restricted_and_each_secret_reaches_only_its_container(story: Story):
    api_key, token = f"sk-ant-{secrets.token_hex(12)}", f"ghp_{secrets.token_hex(12)}"
    secret(story, "anthropic", "api-key", api_key)
    secret(story, "github", "token", token)
    apply_task(
        story, "pod-spec", 2001,
        # The agent only has to stay up while we look at it (the image's shell and sleep).
        agent={"command": ["sh", "-c", "exec sleep 600"],
               "env": [{"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": {"name": "anthropic", "key": "api-key"}}}]},
        servers=[{"name": "everything"}, {"name": "github", "tools": {"allow": ["get_file_contents"]}}],
    )
    pod = running_pod(story, "pod-spec")
    proxy_status = next(s for s in pod["status"]["initContainerStatuses"] if s["name"] == "mcp-proxy")
    assert proxy_status["started"] and proxy_status["ready"], f"the proxy's probes: {proxy_status}"
    pids = story.container_pids(pod)
    # Each stdio server in its own container (its zone), the proxy and the agent.
    assert set(pids) == {"mcp-proxy", "agent", "zone-everything", "zone-github"}, pids
    assert descendants(pids["zone-everything"]) == [] and descendants(pids["zone-github"]) == [], \
        "a server's process starts on its first use, not with the pod"

    # The proxy serves only the agent's credential, which it wrote into the volume only its
    # container and the agent's mount: from the pod's network namespace without it, 401.
    credential = f"/proc/{pids['agent']}/root/run/secrets/orchestrator.io/mcp/token"
    agent_token = Path(credential).read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", agent_token), "the agent's token: 32 random bytes in hex"
    bare = in_pod_netns(pids["mcp-proxy"], """
        import urllib.request, urllib.error
        for path in ("/mcp", "/tools", "/audit"):
            try:
                urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8080" + path, method="POST" if path == "/mcp" else "GET",
                    data=b"{}" if path == "/mcp" else None, headers={"Content-Type": "application/json"}), timeout=5)
                print(path, 200)
            except urllib.error.HTTPError as e:
                print(path, e.code)
    """)
    assert bare.stdout.split() == ["/mcp", "401", "/tools", "401", "/audit", "401"], bare.stdout + bare.stderr
    # The pod's first proxy lists the tools from the catalog's pinned definitions: a tools/list
    # from inside the pod's network namespace, with the agent's credential, starts no server.
    listed = in_pod_netns(pids["mcp-proxy"], AUTHENTICATED.replace("TOKEN", agent_token) + """
        async def main():
            async with Client(transport(), mode="legacy") as c:
                print(sorted(t.name for t in (await c.list_tools()).tools))
        asyncio.run(main())
    """)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "github__get_file_contents" in listed.stdout and "everything__echo" in listed.stdout, listed.stdout
    assert descendants(pids["zone-everything"]) == [] and descendants(pids["zone-github"]) == [], \
        "listing the catalog-pinned tools started a server"
    # Start both upstream servers: reading a resource no server is known to have starts every
    # server whose capabilities are not known yet, to ask it (the read itself fails).
    started = in_pod_netns(pids["mcp-proxy"], AUTHENTICATED.replace("TOKEN", agent_token) + """
        async def main():
            async with Client(transport(), mode="legacy") as c:
                try:
                    await c.read_resource("orchestrator-test://start-every-server")
                except Exception as e:
                    print("refused:", type(e).__name__)
        asyncio.run(main())
    """)
    assert started.returncode == 0, started.stderr[-2000:]
    children = {}
    for zone in ("zone-github", "zone-everything"):
        for child in descendants(pids[zone]):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            for server in ("mcp-server-github", "mcp-server-everything"):
                if server in cmdline:
                    children.setdefault(server, child)
    assert set(children) == {"mcp-server-github", "mcp-server-everything"}, children
    assert descendants(pids["mcp-proxy"]) == [], "the proxy runs alone in its container"

    # Restricted: non-root, no capabilities, no privilege gain, seccomp filter, read-only root;
    # each container as its own uid and gid (the agent as the images' user), the pod's fsGroup
    # as the one supplementary group they share.
    uids = {}
    for name, pid in [*pids.items(), *children.items()]:
        st = proc_status(pid)
        uid = st["Uid"].split()[0]
        assert st["Uid"].split() == [uid] * 4 and st["Gid"].split() == [uid] * 4, f"{name}: {st['Uid']} {st['Gid']}"
        assert int(uid) != 0 and str(UID) in st["Groups"].split(), f"{name}: groups {st['Groups']}"
        uids[name] = uid
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert int(st[cap], 16) == 0, f"{name}: {cap} {st[cap]}"
        assert st["NoNewPrivs"] == "1", f"{name}: NoNewPrivs {st['NoNewPrivs']}"
        assert st["Seccomp"] == "2", f"{name}: Seccomp {st['Seccomp']} (2 = filter: RuntimeDefault)"
        seen = mounts(pid)
        assert "ro" in seen["/"], f"{name}: root filesystem {seen['/']}"
    assert uids["agent"] == str(UID), uids
    assert uids["mcp-server-github"] == uids["zone-github"] and uids["mcp-server-everything"] == uids["zone-everything"]
    assert len({uids[c] for c in pids}) == len(pids), f"two containers share a uid: {uids}"

    # Where the proxy writes: its cache (tool lists, servers' capabilities) is in /tmp, an emptyDir;
    # the root is read-only, so every file it or its servers write lands in a volume.
    proxy_mounts = mounts(pids["mcp-proxy"])
    assert "rw" in proxy_mounts["/tmp"], proxy_mounts.get("/tmp")
    cache = Path(f"/proc/{pids['mcp-proxy']}/root/tmp/orchestrator-mcp-proxy")
    cached = sorted(p.name for p in cache.iterdir())
    assert any(n.startswith(("tools-", "capabilities-")) for n in cached), cached

    # Each Secret reaches only the container meant to get it: the API key the agent, the token
    # the github server's container.
    agent_env, proxy_env = environ(pids["agent"]), environ(pids["mcp-proxy"])
    assert agent_env.get("ANTHROPIC_API_KEY") == api_key
    assert token not in json.dumps(agent_env)
    assert api_key not in json.dumps(proxy_env) and token not in json.dumps(proxy_env)
    assert environ(children["mcp-server-github"]).get("GITHUB_PERSONAL_ACCESS_TOKEN") == token
    everything_env = json.dumps(environ(children["mcp-server-everything"]))
    assert token not in everything_env and api_key not in everything_env
    config_maps = story.kubectl("get", "configmaps", "-n", story.work_ns, "-o", "json")
    assert token not in config_maps and api_key not in config_maps

    # The pod's network: loopback and its pod IP on the node's own bridge (10.244.0.0/24, in the
    # node's network namespace), and nothing of this machine's is reachable (here: its own
    # non-loopback address, if it has one).
    probe = in_pod_netns(pids["agent"], f"""
        import json, subprocess
        addrs = subprocess.run([{shutil.which("ip")!r}, "-j", "addr"], capture_output=True, text=True).stdout
        print(json.dumps([a["local"] for i in json.loads(addrs) for a in i.get("addr_info", [])]))
    """)
    assert probe.returncode == 0, probe.stderr
    addresses = json.loads(probe.stdout)
    pod_ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in POD_NETWORK, pod_ip
    assert addresses and all(a.startswith("127.") or a in ("::1", pod_ip) for a in addresses), addresses
    host_addrs = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    for address in [a for a in host_addrs if ":" not in a and not a.startswith("127.")][:1]:
        reach = in_pod_netns(pids["agent"], f"""
            import socket
            s = socket.socket(); s.settimeout(2)
            try:
                s.connect(("{address}", 22)); print("connected")
            except OSError as e:
                print("refused", e.errno)
        """)
        assert reach.stdout.startswith("refused"), f"the pod reached {address}: {reach.stdout}{reach.stderr}"

    story.kubectl("delete", "taskrun", "pod-spec", "-n", story.work_ns, "--wait=true")
    gone = [*pids.values(), *children.values()]
    wait_until("the pod's processes to end", lambda: not [p for p in gone if Path(f"/proc/{p}").exists()], timeout=60)


def test_an_agent_that_fails_fails_the_taskrun_with_its_exit_code_and_reason(story: Story):
    apply_task(
        story, "agent-fails", 2002,
        agent={"command": ["sh", "-c", "echo 'no model configured' >/dev/termination-log; exit 3"]},
        servers=[{"name": "everything"}],
    )

    def failed():
        tr = story.json("get", "taskrun", "agent-fails", "-n", story.work_ns)
        return tr if tr.get("status", {}).get("phase") == "Failed" else None

    taskrun = wait_until("the TaskRun to fail", failed, timeout=120, interval=0.2)
    succeeded = next(c for c in taskrun["status"]["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "False" and succeeded["reason"] == "AgentFailed", succeeded
    assert "exited with code 3 (Error): no model configured" in succeeded["message"], succeeded["message"]
    story.kubectl("delete", "taskrun", "agent-fails", "-n", story.work_ns)


# A scripted agent (the agent image's Python, no model): calls the tools in argv[1] through the
# proxy at $ORCHESTRATOR_MCP_URL over one initialize-era session, prints "calls done", and waits
# until SIGTERM, then exits 0. Like a misbehaving agent, it calls tools the proxy refuses.
SCRIPTED_AGENT = CLIENT + r"""
session = connect("scripted-agent")
for i, (name, arguments) in enumerate(json.loads(sys.argv[1]), start=1):
    _, answer = post({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                      "params": {"name": name, "arguments": arguments}}, session)
    print(name, json.dumps(answer)[:300], flush=True)
print("calls done", flush=True)
signal.pause()
"""

# What `task audit` needs, and nothing more (docs/cli.md).
AUDIT_ROLE_RULES = [
    {"apiGroups": ["orchestrator.io"], "resources": ["taskruns"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    # kube-rs opens the port-forward as a WebSocket (a GET upgrade): "get"; Kubernetes 1.35 also
    # checks "create" on WebSocket upgrades. Either alone: 403 (tried).
    {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]},
    # The auditors' token the proxy asks for on its read-only endpoints.
    {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["orchestrator-task-auditor"], "verbs": ["get"]},
]


def proxy_audit_lines(story: Story, job: str) -> list[dict]:
    """The audit records the proxy wrote to its stdout (the audit stream; its logs are on stderr, and
    `kubectl logs` merges the two), in order."""
    records = []
    for line in story.kubectl("logs", "-n", story.work_ns, f"job/{job}", "-c", "mcp-proxy").splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "decision" in record and "requestId" in record:
                records.append(record)
    return records


def differences(got: list[dict], want: list[dict]) -> str:
    """What differs between two lists of records, field by field (pytest truncates whole records)."""
    out = [f"{len(got)} records, {len(want)} expected"]
    for i, (g, w) in enumerate(zip(got, want)):
        out += [f"[{i}] {k}: {g.get(k)!r} != {w.get(k)!r}" for k in sorted(set(g) | set(w)) if g.get(k) != w.get(k)]
    return "\n".join(out)


def kubeconfig_for(story: Story, account: str, path: Path) -> Path:
    """A kubeconfig for the work namespace's ServiceAccount `account` (a short-lived token)."""
    token = story.kubectl("create", "token", account, "-n", story.work_ns, "--duration", "10m").strip()
    admin = story.json("config", "view", "--raw", "--minify")
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "audit",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "audit", "context": {"cluster": "e2e", "user": account, "namespace": story.work_ns}}],
    }
    path.write_text(json.dumps(config))
    return path


def auditor_can_read_but_not_call(story: Story, pod: dict, kubeconfig: Path) -> None:
    """As the auditor (the documented Role): `kubectl port-forward` to the task pod's proxy, then
    the auditors' token (read with the auditor's own rights) on each endpoint."""
    secret_doc = json.loads(subprocess.run(
        [str(story.bins / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "secret", "orchestrator-task-auditor",
         "-n", story.work_ns, "-o", "json"], capture_output=True, text=True, check=True).stdout)
    token = base64.b64decode(secret_doc["data"]["token"]).decode().strip()
    forward = subprocess.Popen(
        [str(story.bins / "kubectl"), "--kubeconfig", str(kubeconfig), "port-forward", "-n", story.work_ns,
         f"pod/{pod['metadata']['name']}", ":8080"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = forward.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
        assert m, f"kubectl port-forward: {line}"
        port = int(m.group(1))

        def ask(method: str, path: str, bearer: str | None) -> int:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "auditor", "version": "1"}}}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}", method=method, data=body if method == "POST" else None,
                headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                         **({"Authorization": f"Bearer {bearer}"} if bearer else {})})
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        seen = {f"{m} {p} {who}": ask(m, p, t) for m, p, who, t in [
            ("GET", "/audit", "auditor", token), ("GET", "/tools", "auditor", token),
            ("POST", "/mcp", "auditor", token), ("POST", "/mcp", "none", None), ("GET", "/audit", "none", None)]}
        assert seen == {"GET /audit auditor": 200, "GET /tools auditor": 200, "POST /mcp auditor": 401,
                        "POST /mcp none": 401, "GET /audit none": 401}, seen
        print(f"\nport-forwarded auditor: {seen}")
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_task_audit_reads_the_running_proxys_records_through_the_api_server(story: Story, tmp_path: Path):
    """`orchestrator-cli task audit` against a task on the real node: each filter returns exactly
    the proxy's audit records that match it (its own log is the reference), through
    pods/portforward with only the documented RBAC; a task without a running pod is a clear error."""
    calls = [
        ["everything__get-sum", {"a": 2, "b": 3}],
        ["everything__get-env", {}],  # denied by the deny glob
        ["everything__echo", {"message": "audited"}],
        ["everything__get-tiny-image", {}],  # denied: no allow pattern matches
        ["everything__get-sum", {"a": 1, "b": 1}],
        ["nobody__anything", {}],  # no such server
    ]
    apply_task(
        story, "audited", 2003,
        agent={"command": ["python3", "-c", SCRIPTED_AGENT, json.dumps(calls)]},
        servers=[{"name": "everything", "tools": {"allow": ["get-sum", "echo", "get-env"], "deny": ["get-env"]}}],
    )
    pod = running_pod(story, "audited")

    def agent_done():
        log = story.kubectl("logs", "-n", story.work_ns, pod["metadata"]["name"], "-c", "agent")
        return log if "calls done" in log else None

    agent_log = wait_until("the scripted agent's calls", agent_done, timeout=120, interval=0.5)
    written = wait_until("the proxy's audit lines", lambda: (lambda r: r if len(r) == len(calls) else None)(
        proxy_audit_lines(story, "audited")), timeout=30, interval=0.2)
    assert [r["tool"] for r in written] == [c[0] for c in calls], (written, agent_log)

    def audit(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        if kubeconfig is None:
            return story.cli("task", "audit", "audited", *args)
        return subprocess.run([str(story.binaries["orchestrator-cli"]), "--kubeconfig", str(kubeconfig),
                               "task", "audit", "audited", *args], capture_output=True, text=True)

    def records(*args: str) -> dict:
        out = audit(*args, "-o", "json")
        assert out.returncode == 0, f"task audit {args} failed ({out.returncode}):\n{out.stdout}{out.stderr}"
        answer = json.loads(out.stdout)
        assert answer["pod"] == pod["metadata"]["name"] and answer["dropped"] == 0, answer
        return answer

    denied = records("--decision", "denied")["records"]
    assert denied == [r for r in written if r["decision"] == "denied"], differences(denied, written)
    assert [r["tool"] for r in denied] == ["everything__get-env", "everything__get-tiny-image"], denied
    # --tool matches the server's name for the tool too; filters combine.
    sums = records("--server", "everything", "--tool", "get-sum", "--decision", "allowed")["records"]
    assert sums == [written[0], written[4]], differences(sums, [written[0], written[4]])
    unknown = records("--decision", "unknown")["records"]
    assert unknown == [written[5]] and "server" not in unknown[0], unknown
    read = records("--risk", "read")["records"]
    assert read == [r for r in written if r.get("risk") == "read"] and read, read
    newest = records("--since", "1h", "--limit", "2")
    assert newest["records"] == written[-2:] and newest["matched"] == len(calls), newest
    assert records("--since", "2999-01-01T00:00:00Z")["records"] == []

    # The table a person reads: one row per call, the refusal's rule in the last column.
    table = audit("--decision", "denied")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["TIME", "DECISION", "RISK", "SERVER", "TOOL", "OUTCOME", "DURATION", "RULE/ERROR"], lines
    assert len(lines) == 3 and "everything__get-env" in lines[1] and "everything__get-tiny-image" in lines[2], lines
    assert 'servers[everything].tools.deny[0] "get-env"' in lines[1], lines[1]

    # A bad filter: exit 2, naming the flag and what it takes (--since is checked by the CLI,
    # with the grammar of every duration flag, before it reaches the proxy).
    bad = audit("--since", "yesterday")
    assert bad.returncode == 2 and "'--since" in bad.stderr and "RFC 3339" in bad.stderr, bad.stderr

    # The documented RBAC is enough; without pods/portforward the API server refuses, and the
    # error says what is missing.
    story.kubectl("create", "serviceaccount", "auditor", "-n", story.work_ns)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "task-auditor", "namespace": story.work_ns}, "rules": AUDIT_ROLE_RULES}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "task-auditor", "namespace": story.work_ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "task-auditor"},
               "subjects": [{"kind": "ServiceAccount", "name": "auditor", "namespace": story.work_ns}]}
    story.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]}))
    auditor = kubeconfig_for(story, "auditor", tmp_path / "auditor.kubeconfig")
    as_auditor = audit("--decision", "denied", "-o", "json", kubeconfig=auditor)
    assert as_auditor.returncode == 0, as_auditor.stderr
    assert json.loads(as_auditor.stdout)["records"] == denied
    # The auditor reads and never calls: through its own port-forward, its token reads /audit
    # and /tools, and /mcp answers 401 to it as to no token at all; nothing starts.
    auditor_can_read_but_not_call(story, pod, auditor)
    # Without get on the auditors' Secret, no token: the refusal names the Secret.
    role["rules"] = [r for r in AUDIT_ROLE_RULES if r["resources"] != ["secrets"]]
    story.kubectl("apply", "-f", "-", stdin=json.dumps(role))
    no_token = wait_until("the Role without the Secret to apply", lambda: (
        lambda out: out if out.returncode != 0 else None)(audit(kubeconfig=auditor)), timeout=30, interval=0.5)
    assert no_token.returncode == 1 and "orchestrator-task-auditor" in no_token.stderr \
        and "forbidden" in no_token.stderr, no_token.stderr
    role["rules"] = AUDIT_ROLE_RULES[:2] + AUDIT_ROLE_RULES[3:]
    story.kubectl("apply", "-f", "-", stdin=json.dumps(role))
    refused = wait_until("the Role without pods/portforward to apply", lambda: (
        lambda out: out if out.returncode != 0 else None)(audit(kubeconfig=auditor)), timeout=30, interval=0.5)
    assert refused.returncode == 1 and "pods/portforward" in refused.stderr and "RBAC" in refused.stderr, refused.stderr

    # The agent finishes: the pod and its proxy stop, and the records with them.
    pids = story.container_pids(pod)
    os.kill(pids["agent"], signal.SIGTERM)
    wait_until("the TaskRun to succeed", lambda: story.json("get", "taskrun", "audited", "-n", story.work_ns)
               .get("status", {}).get("phase") == "Succeeded", timeout=120, interval=0.5)
    gone = audit()
    assert gone.returncode == 3, (gone.returncode, gone.stderr)
    assert "task audited has no running pod" in gone.stderr and "kubectl logs" in gone.stderr, gone.stderr
    story.kubectl("delete", "taskrun", "audited", "-n", story.work_ns)


# A flooding agent (the agent image's Python, with its credential): argv[1] concurrent requests
# of just under 4 MiB each (an echo of 4 MiB), all let go at once, and meanwhile one small call;
# prints one JSON line of what it got, then waits for SIGTERM.
FLOODING_AGENT = CLIENT + r"""
import threading, time
n = int(sys.argv[1])
session = connect("flooding-agent")
message = "x" * (4 * 1024 * 1024 - 200)
got, gate = [], threading.Barrier(n + 1)

def big(i):
    body = {"jsonrpc": "2.0", "id": 1000 + i, "method": "tools/call",
            "params": {"name": "everything__echo", "arguments": {"message": message}}}
    gate.wait()
    try:
        post(body, session)
        got.append(200)
    except urllib.error.HTTPError as e:
        got.append(e.code)
        e.read()
    except Exception as e:
        got.append(type(e).__name__)

threads = [threading.Thread(target=big, args=(i,)) for i in range(n)]
[t.start() for t in threads]
gate.wait()
began = time.monotonic()
_, small = post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "everything__get-sum", "arguments": {"a": 2, "b": 3}}}, session)
small_s = time.monotonic() - began
[t.join() for t in threads]
print(json.dumps({"statuses": got, "small": small, "small_s": small_s}), flush=True)
signal.pause()
"""


def test_a_flood_of_large_bodies_leaves_the_proxy_alive_with_bounded_memory_and_the_agent_served(story: Story):
    """200 concurrent bodies of 4 MiB from the agent (who holds the credential) to its proxy,
    whose container is limited to 256 MiB: the bodies the budget cannot hold get 503 at once, the
    rest are served, a small call meanwhile is answered, and the proxy is neither killed nor
    restarted (its peak resident memory, VmHWM, is printed)."""
    n = 200
    apply_task(story, "flooded", 2004,
               agent={"command": ["python3", "-c", FLOODING_AGENT, str(n)]},
               servers=[{"name": "everything", "tools": {"allow": ["echo", "get-sum"]}}])
    pod = running_pod(story, "flooded")
    name = pod["metadata"]["name"]
    log = wait_until("the flood to end", lambda: (lambda l: l if '"statuses"' in l else None)(
        story.kubectl("logs", "-n", story.work_ns, name, "-c", "agent")), timeout=300, interval=1)
    seen = json.loads(next(l for l in log.splitlines() if l.startswith('{"statuses"')))
    statuses = seen["statuses"]
    pids = story.container_pids(story.json("get", "pod", name, "-n", story.work_ns))
    peak_kib = int(proc_status(pids["mcp-proxy"])["VmHWM"].split()[0])
    proxy = next(s for s in story.json("get", "pod", name, "-n", story.work_ns)["status"]["initContainerStatuses"]
                 if s["name"] == "mcp-proxy")
    print(f"\n{n} concurrent 4 MiB bodies on the real node: {statuses.count(200)} served, "
          f"{statuses.count(503)} got 503, other {[s for s in statuses if s not in (200, 503)]}; "
          f"the proxy's peak RSS {peak_kib / 1024:.0f} MiB (limit 256 MiB), restarts {proxy['restartCount']}; "
          f"a small call meanwhile {seen['small_s']:.2f} s")
    # Every request gets an HTTP answer. A body the budget admitted but that did not arrive
    # within 30 s gets 408 (docs/proxy.md): on a loaded machine the flood's own 200 uploads,
    # the refused ones drained before their 503, can leave an admitted one that slow.
    assert len(statuses) == n and set(statuses) <= {200, 503, 408}, statuses
    assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
    assert "is 5" in json.dumps(seen["small"]), seen["small"]
    assert proxy["restartCount"] == 0 and proxy["ready"], proxy
    assert peak_kib < 240 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    os.kill(pids["agent"], signal.SIGTERM)
    wait_until("the TaskRun to succeed", lambda: story.json("get", "taskrun", "flooded", "-n", story.work_ns)
               .get("status", {}).get("phase") == "Succeeded", timeout=120, interval=0.5)
    story.kubectl("delete", "taskrun", "flooded", "-n", story.work_ns)


# --- The pod network (e2e/node: a bridge and kube-proxy in the node's own network namespace) ---

# A backend: answers every GET with its pod's name and the peer address it sees, as JSON.
ECHO_SERVER = r"""
import http.server, json, os
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"backend": os.environ["HOSTNAME"], "peer": self.client_address[0]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Echo).serve_forever()
"""

# A client run in a pod: GETs URL (argv[1]) argv[2] times, one after another; prints one JSON
# line per request (the answer, or the error).
REPEAT_GET = r"""
import json, sys, urllib.request
for _ in range(int(sys.argv[2])):
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode(), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"""

# A client run in a pod while a backend goes: GETs URL (argv[1]) one request after another, for at
# most argv[2] seconds, and stops once backend argv[3] has answered and then not answered for
# argv[4] seconds; prints "started", then one JSON line per request (its time, the answer or the
# error).
WATCH_BACKEND_GO = r"""
import json, sys, time, urllib.request
url, budget, gone, quiet = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
start = time.time()
print(json.dumps({"started": start}), flush=True)
last_gone = None
while time.time() - start < budget:
    t = time.time()
    try:
        answer = json.loads(urllib.request.urlopen(url, timeout=1).read())
    except Exception as e:
        answer = {"error": repr(e)}
    answer["t"] = t
    print(json.dumps(answer), flush=True)
    if answer.get("backend") == gone:
        last_gone = t
    elif last_gone is not None and t - last_gone > quiet:
        break
"""

# Connects to each address in argv[1:] (port 80, 2 s timeout); prints address -> outcome.
EGRESS_PROBE = r"""
import json, socket, sys, time
out = {}
for address in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(2)
    t = time.monotonic()
    try:
        s.connect((address, 80))
        out[address] = {"connected": True}
    except OSError as e:
        out[address] = {"connected": False, "error": repr(e), "seconds": round(time.monotonic() - t, 3)}
    finally:
        s.close()
print(json.dumps(out))
"""


@pytest.fixture
def net_ns():
    """A namespace of this test's own on the real node's cluster, and the agent image (Debian with
    Python 3: the backends' and the client's runtime), without the chart or the operator."""
    story = Story(say=lambda *_: None)
    built = subprocess.run([str(REPO / "e2e/images/build"), "import", "--address", str(NODE_SOCK), "agent"],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    image = next(line.split()[1] for line in built.stdout.splitlines() if line.startswith("agent "))
    ns = f"pod-net-{secrets.token_hex(3)}"
    story.kubectl("create", "namespace", ns)
    try:
        yield story, ns, image
    finally:
        story.kubectl("delete", "namespace", ns, "--wait=false")


def real_node_pod_spec(image: str, command: list[str]) -> dict:
    return {
        "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
        "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}],
    }


def exec_python(story: Story, ns: str, pod: str, script: str, *args: str) -> str:
    return story.kubectl("exec", "-n", ns, pod, "--", "python3", "-c", script, *args)


def test_pods_reach_a_cluster_ip_service_and_nothing_outside_the_node(net_ns):
    """A 2-pod Deployment behind a ClusterIP Service answers a third pod, and each answer shows the
    client's pod IP (no masquerade between pods); a pod reaches another pod directly and itself
    through the Service (hairpin); deleting a backend moves all traffic to the remaining ones within
    2 s; and no pod reaches an address outside the node (the machine's gateway, the Internet)."""
    story, ns, image = net_ns
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "echo", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "echo"}},
                 "template": {"metadata": {"labels": {"app": "echo"}},
                              "spec": real_node_pod_spec(image, ["python3", "-c", ECHO_SERVER])}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": ns},
        "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    client = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": ns},
        "spec": real_node_pod_spec(image, ["sleep", "3600"]),
    }
    story.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                         "items": [deployment, service, client]}))
    story.kubectl("rollout", "status", "-n", ns, "deployment/echo", "--timeout=120s")
    story.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/client", "--timeout=120s")
    pods = story.json("get", "pods", "-n", ns)["items"]
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    backends = sorted(n for n in ips if n.startswith("echo-"))
    assert len(backends) == 2, ips
    assert all(ipaddress.ip_address(ip) in POD_NETWORK for ip in ips.values()), ips
    assert len(set(ips.values())) == len(ips), f"two pods share an address: {ips}"
    cluster_ip = story.json("get", "service", "echo", "-n", ns)["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network("10.96.0.0/16"), cluster_ip

    def answers(pod: str, url: str, requests: int) -> list[dict]:
        return [json.loads(line) for line in exec_python(story, ns, pod, REPEAT_GET, url, str(requests)).splitlines()]

    # Pod to pod, directly.
    direct = json.loads(exec_python(story, ns, "client", "import urllib.request,sys; print(urllib.request.urlopen("
                                    "sys.argv[1], timeout=5).read().decode())", f"http://{ips[backends[0]]}:8080/"))
    assert direct == {"backend": backends[0], "peer": ips["client"]}, direct

    # Through the Service: kube-proxy may need a moment for the Service's rules; then every answer
    # comes from a backend, shows the client's own address, and both backends answer.
    # (both backends' rules: the second endpoint can reach kube-proxy a moment after the first).
    wait_until("the Service to answer the client from both backends", lambda: (lambda got: all(
        "backend" in a for a in got) and {a["backend"] for a in got} == set(backends))(
        answers("client", f"http://{cluster_ip}/", 8)), timeout=30, interval=0.5)
    got = answers("client", f"http://{cluster_ip}/", 40)
    assert {a.get("backend") for a in got} == set(backends), got
    assert {a["peer"] for a in got} == {ips["client"]}, f"the backends saw another source than the client's pod IP: {got}"

    # Hairpin: a backend reaches the Service, itself included (the reply comes back over the bridge).
    hairpin = answers(backends[0], f"http://{cluster_ip}/", 30)
    assert {a.get("backend") for a in hairpin} == set(backends), hairpin

    # Deleting a backend: the client keeps asking (one request after another) while the pod goes;
    # within 2 s of the delete no answer comes from it, and every request after that succeeds.
    gone = backends[0]
    loop = subprocess.Popen(
        [str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "exec", "-n", ns, "client", "--",
         "python3", "-c", WATCH_BACKEND_GO, f"http://{cluster_ip}/", "60", gone, "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert loop.stdout is not None
    started = loop.stdout.readline()
    assert started.startswith('{"started"'), started + (loop.stderr.read() if loop.stderr else "")
    # The delete goes out once the client has had an answer from the backend it deletes.
    before = []
    while not before or before[-1].get("backend") != gone:
        line = loop.stdout.readline()
        assert line, f"the client stopped before {gone} answered: {before[-5:]}"
        before.append(json.loads(line))
    deleted_at = time.time()
    story.kubectl("delete", "pod", "-n", ns, gone, "--wait=false")
    rest, err = loop.communicate(timeout=90)
    assert loop.returncode == 0, err
    moved = before + [json.loads(line) for line in rest.splitlines()]
    from_gone = [a["t"] - deleted_at for a in moved if a.get("backend") == gone]
    assert from_gone, f"the deleted backend never answered before its delete: {moved[:5]}"
    assert max(from_gone) < 2.0, f"{gone} still answered {max(from_gone):.2f} s after its delete"
    after = [a for a in moved if a["t"] > deleted_at + 2.0]
    assert after, "the client stopped asking before the traffic had moved"
    assert all(a.get("backend") not in (None, gone) for a in after), [a for a in after if a.get("backend") in (None, gone)][:5]
    assert backends[1] in {a["backend"] for a in after}, after[:5]
    assert {a["peer"] for a in after} == {ips["client"]}, after[:5]
    print(f"pod network: {len(moved)} requests while {gone} went; its last answer {max(from_gone):.2f} s after the "
          f"delete; {len(after)} answers after 2 s, all from {sorted({a['backend'] for a in after})}")

    # Nothing outside the node: not the machine's gateway, not the Internet. The node's namespace
    # has no route off it, so the connect fails at once rather than timing out.
    probe = json.loads(exec_python(story, ns, "client", EGRESS_PROBE, "192.0.2.1", "1.1.1.1"))
    for address, outcome in probe.items():
        assert not outcome["connected"], f"a pod reached {address}"
        assert outcome["seconds"] < 2.5, outcome
