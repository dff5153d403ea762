"""A lazily started server's first call on the real node (docs/benchmarks.md, "Trust zones").

    python e2e/story/bench_lazy.py [--rounds 5]

A fresh task pod's proxy has no tool lists cached, so it starts each server when the agent first
lists tools; a lazy start is what happens once it has them (its cache, in its emptyDir, outlives
a restart of its container). So: one task on the real node whose agent (a script, no model)
lists the tools, then, each round, the proxy container is restarted (its process killed; the
kubelet starts it again, a native sidecar), the agent reconnects and lists (served from the cache:
the test checks that no server process runs then), and calls `time`'s `get_current_time` and
`everything`'s `echo`: each call starts its server. Measured per call: the proxy's own figure
(the audit record's `durationMs`: from the call's arrival to its answer, which includes starting
the server and its MCP handshake) and the agent's (request to answer); and the task pod's memory
per container before and after. Prints the samples and the medians as Markdown. Needs the cluster
with its real node (e2e/cluster up); ORCH_STORY_FREEZE=1 as for bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import table  # noqa: E402
from scripted_agent import CLIENT  # noqa: E402
from story import REAL_NODE, Story, StoryError, cgroup_peak_mib, descendants, pss_mib, wait_until  # noqa: E402

# The agent: after each `go-N` file appears in its workspace, connects anew, lists, calls the two
# tools, and writes `done-N` with its own timings (a session per round: the proxy restarted).
AGENT = CLIENT + r"""
import time

def listed_session():
    session = connect("bench")
    _, listed = post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session)
    return session, len(listed[0]["result"]["tools"])

n = 0
while True:
    go = f"/workspace/go-{n}"
    while not os.path.exists(go):
        time.sleep(0.05)
    try:
        session, tools = listed_session()
        open(f"/workspace/listed-{n}", "w").write(str(tools))
        while not os.path.exists(go + "-call"):
            time.sleep(0.05)
        out = {"tools": tools}
        for i, (name, args) in enumerate([["time__get_current_time", {"timezone": "UTC"}],
                                          ["everything__echo", {"message": "hi"}]]):
            t0 = time.monotonic()
            _, answer = post({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                              "params": {"name": name, "arguments": args}}, session)
            out[name] = {"ms": (time.monotonic() - t0) * 1000, "error": "error" in answer[0]}
    except Exception as e:  # the proxy is restarting: try again on the next go file
        out = {"error": repr(e)}
    open(f"/workspace/done-{n}", "w").write(json.dumps(out))
    n += 1
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    story = Story(say=lambda *_: None)
    samples = []
    with ExitStack() as cleanup:
        story.prepare(cleanup)
        taskrun = {
            "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": "lazy"},
            "spec": {"taskId": 2700, "serviceName": "bench", "task": {"prompt": "bench"},
                     "agent": {"command": ["python3", "-c", AGENT]},
                     "podTemplate": {
                         "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                         "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1],
                                          "effect": "NoSchedule"}]},
                     "toolConfig": {"mcpServers": [{"name": "time"}, {"name": "everything", "tools": {"allow": ["echo"]}}]}},
        }
        story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))

        def running():
            pods = story.json("get", "pods", "-n", story.work_ns, "-l", "job-name=lazy")["items"]
            if not pods:
                return None
            story.fail_if_pod_failed(pods[0])
            agent = next((s for s in pods[0]["status"].get("containerStatuses", []) if s["name"] == "agent"), {})
            return pods[0] if agent.get("state", {}).get("running") else None

        pod = wait_until("the task pod", running, timeout=120, interval=0.2)
        pids = story.container_pids(pod)
        workspace = Path(f"/proc/{pids['agent']}/root/workspace")

        def servers() -> list[int]:
            return [p for name, pid in story.container_pids(pod).items() if name != "agent" for p in descendants(pid)
                    if "zone" in name or name == "mcp-proxy"]

        def memory() -> dict:
            out = {}
            for name, pid in story.container_pids(pod).items():
                procs = [pid, *descendants(pid)]
                out[name] = {"pss": round(sum(pss_mib(x) for x in procs), 1), "peak": round(cgroup_peak_mib(pid) or 0, 1)}
            return out

        def round_(n: int, restart: bool) -> dict:
            if restart:
                old = story.container_pids(pod)["mcp-proxy"]
                os.kill(old, signal.SIGKILL)
                wait_until("the proxy container to run again", lambda: (lambda p: p if p and p != old else None)(
                    story.container_pids(pod).get("mcp-proxy")), timeout=180, interval=0.1)
                wait_until("the proxy to be ready", lambda: all(
                    s.get("ready") for s in story.json("get", "pod", pod["metadata"]["name"], "-n", story.work_ns)
                    ["status"]["initContainerStatuses"] if s["name"] == "mcp-proxy"), timeout=60, interval=0.1)
                wait_until("the old servers to end", lambda: not servers(), timeout=30, interval=0.1)
            (workspace / f"go-{n}").write_text("")
            wait_until("the agent to list", lambda: (workspace / f"listed-{n}").exists(), timeout=60, interval=0.05)
            after_list = len(servers())
            before = memory()
            (workspace / f"go-{n}-call").write_text("")
            done = json.loads(wait_until("the agent's calls", lambda: (lambda f: f.read_text() if f.exists() else None)(
                workspace / f"done-{n}"), timeout=60, interval=0.05))
            if "error" in done:
                raise StoryError(f"round {n}: {done['error']}")
            records = [json.loads(line) for line in story.kubectl(
                "logs", "-n", story.work_ns, pod["metadata"]["name"], "-c", "mcp-proxy").splitlines()
                if line.startswith("{") and '"decision"' in line]
            last = {r["tool"]: r for r in records[-2:]}
            return {
                "servers_after_list": after_list,
                "time_proxy_ms": round(last["time__get_current_time"]["durationMs"], 1),
                "time_agent_ms": round(done["time__get_current_time"]["ms"], 1),
                "echo_proxy_ms": round(last["everything__echo"]["durationMs"], 1),
                "echo_agent_ms": round(done["everything__echo"]["ms"], 1),
                "memory_before_calls": before,
                "memory_after_calls": memory(),
            }

        first = round_(0, restart=False)
        print(f"cold pod (no cache: the servers start at the list): {json.dumps(first)}", flush=True)
        for n in range(1, args.rounds + 1):
            sample = round_(n, restart=True)
            samples.append(sample)
            print(f"round {n}: {json.dumps(sample)}", flush=True)
        os.kill(story.container_pids(pod)["agent"], signal.SIGTERM)
        story.kubectl("delete", "taskrun", "lazy", "-n", story.work_ns, "--wait=false")

    print()
    print(table([{k: v for k, v in s.items() if not k.startswith("memory_")} for s in samples],
                "lazy start, after a proxy restart"))
    containers = sorted(samples[0]["memory_before_calls"])
    print("\n| container PSS, MiB (median) | after the list, no server | after the first calls |\n|---|---|---|")
    for c in containers:
        b = statistics.median(s["memory_before_calls"][c]["pss"] for s in samples)
        a = statistics.median(s["memory_after_calls"][c]["pss"] for s in samples)
        print(f"| {c} | {b:.1f} | {a:.1f} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StoryError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(1)
