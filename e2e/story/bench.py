"""Figures of a task pod on the real node (docs/benchmarks.md, "The task pod on a real kubelet").

    python e2e/story/bench.py [--stories 3] [--changes 6]

1. Runs the story (story.py) --stories times and keeps its figures: kubectl apply -> proxy
   ready, agent start -> first model request, the pod's memory, agent exit -> TaskRun
   Succeeded, and one add-context each.
2. Then one long task (Claude Code kept busy by the model stand-in, one cheap call a second)
   takes --changes add-contexts, alternately enabling and disabling everything:get-env, each
   after a random pause of 5-45 s (so they fall at different points of the kubelet's 1-minute
   pod sync), and measures each: add-context -> `--wait-synced` returned (with the API watch:
   the proxy reported serving it) -> proxy reload -> list_changed sent -> the model offered the
   changed list. `--api-watch off`: the proxy reads the mounted file only.

Prints each sample and the medians (and min/max) as Markdown. Needs the cluster with its real
node (e2e/cluster up).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from story import (  # noqa: E402
    MCP,
    MODEL_PORT,
    ScriptedModel,
    Story,
    StoryError,
    agent_task,
    check,
    diagnosis,
    text,
    tool_use,
    wait_until,
)

DELAY = 1.0  # the model "thinks" this long before each busy call (the offered time's resolution)


class BusyAgent:
    """The model keeps the agent calling get-sum until told to stop."""

    def __init__(self):
        self.stop = threading.Event()

    def __call__(self, first):
        n = 0
        while not self.stop.is_set():
            n += 1
            yield tool_use(MCP + "everything__get-sum", {"a": n, "b": 1}).after(DELAY)
        yield text("done")


def start_busy_task(story: Story) -> BusyAgent:
    """A TaskRun on the real node whose agent (Claude Code) the model keeps busy (one cheap call a
    second) until `script.stop` is set: a long task to change tools on."""
    script = BusyAgent()
    story.model = ScriptedModel(script, port=MODEL_PORT).start()
    story.cleanup.callback(story.model.stop)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "anthropic"},
              "stringData": {"api-key": "sk-ant-stand-in-bench"}}
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(secret))
    taskrun = agent_task("task-1001", 1001, "bench", "stay busy",
                         {"mcpServers": [{"name": "everything", "tools": {"deny": ["get-env"]}}]})
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))
    try:
        story.model.wait_for(lambda r: True, timeout=120, what="the agent's first request")
    except TimeoutError as e:
        raise StoryError(f"{e}{diagnosis()}") from e
    return script


def change(story: Story, enable: bool, timeout: str = "2m") -> dict:
    """One add-context --wait-synced (giving up after `timeout`) toggling everything:get-env; when
    each step happened."""
    flag = "--enable-tools" if enable else "--disable-tools"
    started = time.time()
    cli = story.cli("task", "add-context", "--task-id", "1001", flag, "everything:get-env", "--wait-synced",
                    "--timeout", timeout)
    if cli.returncode != 0:
        status = story.json("get", "taskrun", "task-1001", "-n", story.work_ns).get("status", {})
        status.pop("tools", None)
        proxy = story.kubectl("logs", "-n", story.work_ns, "job/task-1001", "-c", "mcp-proxy", "--tail", "25")
        check(False, f"add-context failed: {cli.stdout}{cli.stderr}\nstatus: {json.dumps(status)}\n"
                     f"the proxy's log:\n{proxy}\nthe operator's log:\n"
                     + "\n".join(story.operator_log.read_text().splitlines()[-25:]))
    synced = time.time()
    try:
        offered = story.model.wait_for(
            lambda r: r.wall > started and ("everything__get-env" in r.mcp_tools()) == enable,
            timeout=240, what="the change to reach the model")
    except TimeoutError:
        last = story.model.conversation()[-1]
        print(f"the model's last request (its tools and last message): "
              f"{json.dumps({'tools': last.mcp_tools(), 'last': (last.body.get('messages') or [None])[-1]})[:4000]}")
        print(story.kubectl("logs", "-n", story.work_ns, "job/task-1001", "-c", "mcp-proxy", "--tail", "30"))
        raise
    reload_at, notified_at = story.proxy_reload_times(started)
    return {
        "wait_synced_s": synced - started,
        "reload_s": reload_at - started,
        "list_changed_s": notified_at - started,
        "offered_s": offered.wall - started,
    }


def changes(story: Story, count: int, say) -> list[dict]:
    samples = []
    script = start_busy_task(story)
    enabled = False
    for i in range(count):
        pause = random.uniform(5, 45)
        time.sleep(pause)
        enabled = not enabled
        sample = change(story, enabled)
        samples.append(sample)
        say(f"   change {i + 1} ({'enable' if enabled else 'disable'} get-env, after a {pause:.0f} s pause, "
            f"applied from {story.reload_source}): " + ", ".join(f"{k} {v:.2f}" for k, v in sample.items()))
    script.stop.set()
    return samples


def table(rows: list[dict], title: str) -> str:
    keys = list(rows[0])
    out = [f"| {title} (n={len(rows)}) | median | min | max |", "|---|---|---|---|"]
    for k in keys:
        values = [r[k] for r in rows]
        out.append(f"| {k} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stories", type=int, default=3)
    p.add_argument("--changes", type=int, default=6)
    p.add_argument("--api-watch", choices=["on", "off"], default="on",
                   help="off: the proxy reads the mounted file only (chart value sidecar.apiWatch=false)")
    args = p.parse_args()
    api_watch = args.api_watch == "on"
    stories = []
    for i in range(args.stories):
        print(f"story {i + 1}/{args.stories}", flush=True)
        figures = Story(say=lambda *_: None, api_watch=api_watch).run()
        flat = {k: v for k, v in figures.items() if not isinstance(v, dict)}
        flat.update({f"memory_{k}_mib": v for k, v in figures["memory_mib"].items()})
        flat.update({f"idle_{k}_mib": v for k, v in figures.get("memory_idle_mib", {}).items()})
        flat.update({f"first_call_{k}_ms": v for k, v in figures.get("first_call_ms", {}).items()})
        stories.append(flat)
        print("   " + ", ".join(f"{k} {v}" for k, v in flat.items()), flush=True)
    samples = []
    if args.changes:
        story = Story(say=lambda *_: None, api_watch=api_watch)
        with ExitStack() as cleanup:
            story.prepare(cleanup)
            print(f"one task, {args.changes} add-contexts", flush=True)
            samples = changes(story, args.changes, lambda s: print(s, flush=True))
            wait_until("the bench task to succeed", lambda: story.json(
                "get", "taskrun", "task-1001", "-n", story.work_ns).get("status", {}).get("phase") == "Succeeded",
                timeout=120)
    print()
    if stories:
        print(table(stories, "story runs"))
        print()
    if samples:
        print(table(samples, "add-context -> (seconds)"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StoryError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(1)
