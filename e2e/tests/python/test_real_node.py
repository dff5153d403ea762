"""The operator's pod spec, proven by a real kubelet (the e2e cluster's real node): the rendered
pod starts under the restricted security context, its proxy passes its probes and writes only
to its volumes, a Secret reaches only the container meant to get it, the pod's network holds
loopback addresses only, and a failing agent fails the TaskRun with its exit code and reason.

What a container runs as is read where the kernel says it: /proc/<pid>/status, environ and
mountinfo of each container's process on this machine (containerd's task list maps the pod's
container IDs to pids). Needs the cluster with its real node (`./test` provides it).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "story"))

from story import (  # noqa: E402
    REAL_NODE,
    Story,
    descendants,
    wait_until,
)

UID = 65532


@pytest.fixture(scope="module")
def cluster():
    """The chart installed and the operator running (as in the story), for this module's tasks."""
    story = Story(say=lambda *_: None)
    with ExitStack() as cleanup:
        story.prepare(cleanup)
        yield story


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


def in_pod_netns(pid: int, script: str) -> subprocess.CompletedProcess:
    """Runs a Python script (this interpreter, with the MCP SDK) in the pod's network namespace."""
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)


def test_the_pod_runs_restricted_and_each_secret_reaches_only_its_container(cluster: Story):
    story = cluster
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
    assert set(pids) == {"mcp-proxy", "agent"}, pids

    # Start both upstream servers: a tools/list from inside the pod's network namespace.
    listed = in_pod_netns(pids["mcp-proxy"], """
        import asyncio
        from mcp import Client
        async def main():
            async with Client("http://127.0.0.1:8080/mcp", mode="legacy") as c:
                print(sorted(t.name for t in (await c.list_tools()).tools))
        asyncio.run(main())
    """)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "github__get_file_contents" in listed.stdout and "everything__echo" in listed.stdout, listed.stdout
    children = {}
    for child in descendants(pids["mcp-proxy"]):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for server in ("mcp-server-github", "mcp-server-everything"):
            if server in cmdline and "exec-upstream" not in cmdline:
                children.setdefault(server, child)
    assert set(children) == {"mcp-server-github", "mcp-server-everything"}, children

    # Restricted: non-root, no capabilities, no privilege gain, seccomp filter, read-only root.
    for name, pid in [*pids.items(), *children.items()]:
        st = proc_status(pid)
        assert st["Uid"].split() == [str(UID)] * 4, f"{name}: Uid {st['Uid']}"
        assert st["Gid"].split() == [str(UID)] * 4, f"{name}: Gid {st['Gid']}"
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert int(st[cap], 16) == 0, f"{name}: {cap} {st[cap]}"
        assert st["NoNewPrivs"] == "1", f"{name}: NoNewPrivs {st['NoNewPrivs']}"
        assert st["Seccomp"] == "2", f"{name}: Seccomp {st['Seccomp']} (2 = filter: RuntimeDefault)"
        seen = mounts(pid)
        assert "ro" in seen["/"], f"{name}: root filesystem {seen['/']}"

    # Where the proxy writes: its tool-list cache is in /tmp, an emptyDir; the root is read-only,
    # so every file it or its servers write lands in a volume.
    proxy_mounts = mounts(pids["mcp-proxy"])
    assert "rw" in proxy_mounts["/tmp"], proxy_mounts.get("/tmp")
    cache = Path(f"/proc/{pids['mcp-proxy']}/root/tmp/orchestrator-mcp-proxy")
    cached = sorted(p.name for p in cache.iterdir())
    assert any(n.startswith("tools-") for n in cached), cached

    # Each Secret reaches only the container meant to get it: the API key the agent, the token
    # the proxy, which hands it to the github server only.
    agent_env, proxy_env = environ(pids["agent"]), environ(pids["mcp-proxy"])
    assert agent_env.get("ANTHROPIC_API_KEY") == api_key
    assert token not in json.dumps(agent_env)
    assert api_key not in json.dumps(proxy_env)
    assert environ(children["mcp-server-github"]).get("GITHUB_PERSONAL_ACCESS_TOKEN") == token
    everything_env = json.dumps(environ(children["mcp-server-everything"]))
    assert token not in everything_env and api_key not in everything_env
    config_maps = story.kubectl("get", "configmaps", "-n", story.work_ns, "-o", "json")
    assert token not in config_maps and api_key not in config_maps

    # The pod's network: loopback-range addresses only, and nothing outside 127.0.0.0/8 is
    # reachable (here: this machine's own non-loopback address, if it has one).
    probe = in_pod_netns(pids["agent"], f"""
        import json, subprocess
        addrs = subprocess.run([{shutil.which("ip")!r}, "-j", "addr"], capture_output=True, text=True).stdout
        print(json.dumps([a["local"] for i in json.loads(addrs) for a in i.get("addr_info", [])]))
    """)
    assert probe.returncode == 0, probe.stderr
    addresses = json.loads(probe.stdout)
    assert addresses and all(a.startswith("127.") or a == "::1" for a in addresses), addresses
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


def test_an_agent_that_fails_fails_the_taskrun_with_its_exit_code_and_reason(cluster: Story):
    story = cluster
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
