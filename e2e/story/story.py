"""The user's story, end to end, on the real control plane and the real node.

1. The chart is installed with Helm, its images set to the ones e2e/images built and the node
   imported; the operator runs out of the cluster with a token of the chart's ServiceAccount and
   the env of the chart's Deployment.
2. `kubectl apply` of config/samples/taskrun.yaml (a task using two real catalog servers,
   everything and memory, with allow and deny patterns, and its model key in spec.model) and its
   API-key Secret, with two things added: a nodeSelector + toleration that put the pod on the real
   node, and spec.model's endpoint set to the model stand-in (HTTPS, its CA in a ConfigMap).
3. The Job's pod runs on the real node (kubelet, containerd, runc), in a namespace that enforces
   the restricted Pod Security profile: the proxy and each MCP server in its own container (its
   zone: own uid, own Secrets) as native sidecars, then the agent, Claude Code from npm, all from
   the images built here.
4. Claude Code connects to the proxy over the pod's localhost, for MCP and for the model (the
   proxy's model gateway holds the key; the agent presents its own credential); the model behind
   it is the one thing we stand in for (e2e/model/scripted_model.py, HTTPS on 127.0.0.1, reached
   from the pod through the node's netns-portal). Its script checks the agent offers exactly the
   allowed tools, calls get-sum, has the agent run a Bash command, calls memory's
   create_entities, asks for the denied get-env (the agent has no such tool), then keeps the
   agent working (a call a second).
5. 20 s later, `orchestrator-cli task add-context` enables get-env and disables echo; the operator
   re-renders the ConfigMap and annotates the running pod with the new contextVersion, so the
   kubelet syncs the pod and updates its volume at once (not at its periodic sync, default about
   a minute); the proxy reloads and sends `notifications/tools/list_changed`;
   Claude Code re-lists, and its next request offers the model get-env and no longer echo. The
   model calls get-env (allowed now) and finishes.
6. The agent exits 0; the kubelet stops the native sidecars (SIGTERM, exit 0, the servers' processes
   gone with their containers); the Job completes; the TaskRun is Succeeded. The proxy's audit
   stream is its container's stdout: read line by line from the node's CRI log (stream `stdout`),
   every line one JSON record with a `recordType`.
7. What the agent did: `status.result` (Claude Code's own result, written to its termination
   message: turns, tokens, cost, its final text; the tokens are checked against what the model
   stand-in reported), `status.usage` (what the gateway counted, equal to the stand-in's own
   count), the audit's record of the Bash command between the MCP calls, and
   `orchestrator-cli task logs`; deleting the TaskRun removes the Job and the ConfigMap.

`run()` is used by the test (e2e/tests/python/test_story.py) and by the demo (`./demo`): every
step checks what it shows and raises StoryError if the system does something else; the demo
prints the transcript as it goes. Nothing is left running afterwards.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e/model"))
from scripted_model import Recorded, ScriptedModel, text, tls_pair, tool_result_text, tool_use  # noqa: E402

STATE = Path(os.environ.get("ORCH_E2E_STATE", REPO / "e2e/.cluster"))
PORT_BASE = int(os.environ.get("ORCH_E2E_PORT_BASE", "26000"))
# The node's pods reach 127.0.0.1:BASE+450..469 on the host at the same address (e2e/node/node):
# ten ports for each of the two test processes ./test runs side by side, the second with
# ORCH_E2E_MODEL_PORT_OFFSET=10 (its modules take MODEL_PORT..+9).
MODEL_PORT_OFFSET = int(os.environ.get("ORCH_E2E_MODEL_PORT_OFFSET", "0"))
MODEL_PORT = PORT_BASE + 450 + MODEL_PORT_OFFSET
# The chart's release name: it names the chart's cluster-wide objects (the approver ClusterRole,
# the admission policies), so two test processes side by side install under two names
# (ORCH_E2E_RELEASE), each taking over and deleting only its own.
RELEASE = os.environ.get("ORCH_E2E_RELEASE", "orchestrator")


def chart_object(suffix: str, release: str = RELEASE) -> str:
    """The name of the chart's object `suffix` (operator, catalog, approver) in release `release`:
    the chart's fullname (the release's name when it holds the chart's, else release-orchestrator)
    and the suffix."""
    full = release if "orchestrator" in release else f"{release}-orchestrator"
    return f"{full}-{suffix}"
# Where a pod on the real node reaches the API server (the node's portal, e2e/node/node): pods
# have no kube-proxy, so the kubernetes Service's address does not work from them.
POD_API_SERVER = "127.0.0.1:6443"
SAMPLE = REPO / "config/samples/taskrun.yaml"
SAMPLE_SECRET = REPO / "config/samples/anthropic-secret.yaml"
REAL_NODE = ("e2e.orchestrator.io/node", "real")
NODE_SOCK = STATE / "node/run/containerd/containerd.sock"
# The chart's monitoring kit, all of it (its PodMonitor, ServiceMonitor and PrometheusRule need
# the Prometheus Operator's CRDs: prometheus_operator_crds).
# Families the chart's rules and dashboard use whose series are per object and exist only once
# their event happened (none happens in the story), each asserted in a real scrape where it does:
EVENT_ONLY_FAMILIES = {
    # per tool whose definition changed: sidecar/tests/python/test_policy.py
    "mcp_proxy_tool_definition_changes",
    # per TaskRun with a call waiting, and per webhook delivery: e2e/tests/python/test_approval_webhook.py
    "orchestrator_operator_approvals_pending",
    "orchestrator_operator_approval_oldest_pending_timestamp_seconds",
    "orchestrator_operator_approval_notifications",
}
MONITORING_VALUES = ["monitoring.podMonitor.enabled=true", "monitoring.serviceMonitor.enabled=true",
                     "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"]

ENABLE = "everything:get-env"
DISABLE = "everything:echo"
MCP = "mcp__orchestrator__"  # how Claude Code names the tools of the MCP server "orchestrator"
BASH_COMMAND = "echo bash says $((6 * 7))"  # what the model has the agent run with its own Bash
# What the proxy's stdout carries: MCP calls, server definition changes, and the model gateway's
# requests and the agent's own tool uses the model asked for.
AUDIT_RECORD_TYPES = ("tool_call", "definition_change", "model_request", "agent_tool_use")
# What the agent declares to the proxy (and the proxy to the servers): Claude Code declares roots.
AGENT_DECLARES = {"roots"}
# How long the model keeps the agent busy waiting for the new tool (a safety net: the story
# checks OFFERED_WITHIN_S below).
ADD_CONTEXT_BUDGET = 180
# add-context -> the model offered the new tool, at most. The operator annotates the running pod
# with the new contextVersion, so the kubelet syncs the pod (and its ConfigMap volume) at once;
# left to its periodic pod sync (1 min, plus jitter) this took 20-65 s on the same node.
OFFERED_WITHIN_S = 30
# How long the agent works before the person's add-context (see agent_works).
SETTLE_S = 20


class StoryError(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise StoryError(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bin_dir() -> Path:
    out = subprocess.run([REPO / "e2e/controlplane/build"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


_FROZEN: dict = {}


def workspace_binaries(env: dict) -> dict[str, Path]:
    """The workspace's binaries (name -> path) as `cargo test --workspace` builds them: with the
    features the whole workspace's tests unify (a `cargo build -p` of one package resolves fewer,
    and rebuilt some 50 crates, tokio, hyper, kube and k8s-openapi among them: 100 s on a cold
    run). After ./test's unit tests this is a no-op."""
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run", "--quiet", "--message-format=json-render-diagnostics"],
        cwd=REPO, env=env, check=True, stdout=subprocess.PIPE,
    ).stdout.decode()
    found = {}
    for line in out.splitlines():
        msg = json.loads(line)
        if (msg.get("reason") == "compiler-artifact" and msg.get("executable")
                and msg["target"]["kind"] == ["bin"] and not msg["profile"]["test"]):
            found[msg["target"]["name"]] = Path(msg["executable"])
    return found


def cargo_binaries() -> dict[str, Path]:
    """Builds the host binaries (a no-op when up to date) and returns their paths; with
    ORCH_STORY_FREEZE set, once per process (bench.py's stories all run one build)."""
    if "bin" in _FROZEN:
        return _FROZEN["bin"]
    env = dict(os.environ)
    if "CARGO_TARGET_DIR" not in env:  # this checkout's target directory (scripts/target-dir)
        env["CARGO_TARGET_DIR"] = subprocess.run(
            [REPO / "scripts/target-dir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    found = workspace_binaries(env)
    for name in ("orchestrator-operator", "orchestrator-cli"):
        check(name in found, f"cargo build did not produce {name}")
    if os.environ.get("ORCH_STORY_FREEZE"):
        # One build for every story of this process (bench.py), copied so a build made while it
        # runs (another checkout state) cannot replace the binaries between stories.
        frozen = Path(tempfile.mkdtemp(prefix="story-bin-"))
        for name in ("orchestrator-operator", "orchestrator-cli"):
            shutil.copy2(found[name], frozen / name)
            found[name] = frozen / name
        _FROZEN["bin"] = found
    return found


def node_images() -> dict[str, str]:
    """The images of this checkout, built (cached: seconds when nothing changed) and imported into
    the real node's containerd when it does not have them yet: name -> ref."""
    if "images" in _FROZEN:
        return _FROZEN["images"]
    out = subprocess.run([REPO / "e2e/images/build", "import", "--address", str(NODE_SOCK), "proxy", "agent"],
                         check=True, capture_output=True, text=True)
    refs = {}
    for line in out.stdout.splitlines():
        name, ref, _archive = line.split()
        refs[name] = ref
    if os.environ.get("ORCH_STORY_FREEZE"):
        _FROZEN["images"] = refs
    return refs


# What a timed-out wait adds to its message: the state of the running story's cluster (set by
# Story.prepare), so a failure on a machine nobody can log in to says why.
DIAGNOSE: list = []


def diagnosis() -> str:
    out = []
    for diagnose in DIAGNOSE:
        try:
            out.append(diagnose())
        except Exception as e:  # noqa: BLE001 - a diagnosis must never hide the failure itself
            out.append(f"(no diagnosis: {e!r})")
    return "".join(out)


def wait_until(what: str, predicate, timeout: float = 60, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise StoryError(f"timed out after {timeout}s waiting for {what}{diagnosis()}")
        time.sleep(interval)


def expand_braces(pattern: str) -> list[str]:
    """`{a,b}` alternatives (which the product's globs take and fnmatch does not), expanded."""
    start = pattern.find("{")
    end = pattern.find("}", start + 1)
    if start < 0 or end < 0:
        return [pattern]
    head, tail = pattern[:start], pattern[end + 1 :]
    return [x for alt in pattern[start + 1 : end].split(",") for x in expand_braces(head + alt + tail)]


def glob_match(name: str, pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in expand_braces(pattern))


CONDITIONAL = re.compile(r"offered only to clients that declare ([\w.+]+)\)")


def expected_tools(taskrun: dict, catalog: dict, declares: set[str] = AGENT_DECLARES) -> list[str]:
    """What the agent should be offered: each server's catalog tools through its allow/deny globs
    (computed here independently of the product's own glob code, crds/src/tools.rs), without the
    tools a server offers only to clients declaring a capability the agent does not declare."""
    servers = {s["name"]: s for s in catalog["servers"]}
    seen = []
    for server in taskrun["spec"]["toolConfig"]["mcpServers"]:
        if not server.get("enabled", True):
            continue
        allow = server.get("tools", {}).get("allow") or ["*"]
        deny = server.get("tools", {}).get("deny") or []
        for tool in servers[server["name"]]["tools"]:
            name = tool["name"]
            needs = CONDITIONAL.search(tool.get("description", ""))
            if needs and not set(needs.group(1).split("+")) <= declares:
                continue
            if any(glob_match(name, p) for p in allow) and not any(glob_match(name, p) for p in deny):
                seen.append(f"{server['name']}__{name}")
    return sorted(seen)


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> list[int]:
    """The process's descendants, from /proc (children files)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for c in map(int, children):
            out.append(c)
            todo.append(c)
    return out


def pss_mib(pid: int) -> float:
    """The process's proportional set size: its private memory plus its share of pages it shares
    with other processes (the node binary two servers map counts once over both, unlike RSS)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cgroup_peak_mib(pid: int) -> float | None:
    """Peak memory of the container's memory cgroup (v1 max_usage, or v2 memory.peak)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.max_usage_in_bytes"
        elif controllers == "":
            f = Path("/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir() else "/sys/fs/cgroup") / path.lstrip("/") / "memory.peak"
        else:
            continue
        try:
            return int(f.read_text()) / 2**20
        except (OSError, ValueError):
            continue
    return None


def parse_time(stamp: str) -> float:
    """An RFC 3339 time (the API's, or kubectl logs --timestamps' with nanoseconds) as epoch seconds."""
    stamp = stamp.replace("Z", "+00:00")
    if "." in stamp:
        head, frac = stamp.split(".", 1)
        digits = re.match(r"\d+", frac).group(0)
        stamp = f"{head}.{digits[:6]}{frac[len(digits):]}"
    return datetime.fromisoformat(stamp).timestamp()


@dataclass
class AgentScript:
    """The model's side of the conversation, run by the stand-in for each request Claude Code
    sends; what it sees is kept for the story to report."""

    want_before: list[str]
    want_after: list[str] = field(default_factory=list)
    add_context_done: threading.Event = field(default_factory=threading.Event)
    ready_for_add_context: threading.Event = field(default_factory=threading.Event)
    # The story measures the pod idle (the agent connected and listed, no call) before the model
    # answers its first request with a call.
    idle_measured: threading.Event = field(default_factory=threading.Event)
    first_seen: threading.Event = field(default_factory=threading.Event)  # the first request came
    seen: dict = field(default_factory=dict)
    said: list[str] = field(default_factory=list)

    def __call__(self, first: Recorded):
        offered = first.mcp_tools()
        self.seen["first"] = first
        self.first_seen.set()
        check(offered == self.want_before,
              f"the model is offered {offered}, but the TaskRun allows exactly {self.want_before}")
        check(self.idle_measured.wait(timeout=120), "the story did not measure the idle pod within 120 s")
        r = yield tool_use(MCP + "everything__get-sum", {"a": 2, "b": 3})
        result = tool_result_text(r)
        check("5" in result and not result.startswith("ERROR"), f"get-sum failed: {result}")
        self.said.append(f"call everything__get-sum(2, 3) -> {result!r}")
        # One of the agent's own tools: the proxy never sees the command run, but the gateway
        # sees the model ask for it (its audit shows it between the MCP calls).
        r = yield tool_use("Bash", {"command": BASH_COMMAND, "description": "Count to the answer"})
        result = tool_result_text(r)
        # 42 only if a shell ran it: the command itself says $((6 * 7)).
        check("bash says 42" in result, f"the agent's Bash tool answered {result!r}")
        self.said.append(f"Bash {BASH_COMMAND!r} -> {result.strip()!r} (the agent's own tool)")
        r = yield tool_use(MCP + "memory__create_entities", {"entities": [
            {"name": "todo-api", "entityType": "service", "observations": ["written in Rust"]}]})
        result = tool_result_text(r)
        check(not result.startswith("ERROR"), f"memory__create_entities failed: {result}")
        self.said.append("call memory__create_entities(todo-api) -> ok")
        r = yield tool_use(MCP + "everything__get-env", {})
        result = tool_result_text(r)
        check(result.startswith("ERROR"), f"everything__get-env is denied but the call answered: {result}")
        self.said.append(f"call everything__get-env -> refused by the agent: {result.splitlines()[0]}")

        # The person grants get-env. The agent keeps working (a call a second) until its next
        # request offers the new tool: that is when the model can use it.
        self.ready_for_add_context.set()
        deadline = time.monotonic() + ADD_CONTEXT_BUDGET
        n = 0
        while True:
            r_tools = r.mcp_tools()
            if "everything__get-env" in r_tools and self.add_context_done.is_set():
                break
            check(time.monotonic() < deadline,
                  f"get-env not offered {ADD_CONTEXT_BUDGET}s after add-context; offered: {r_tools}")
            n += 1
            r = yield tool_use(MCP + "everything__get-sum", {"a": n, "b": 1}).after(1.0)
        self.seen["offered"] = r
        self.seen["busy_calls"] = n
        check(r.mcp_tools() == self.want_after,
              f"after add-context the model is offered {r.mcp_tools()}, expected {self.want_after}")
        r = yield tool_use(MCP + "everything__get-env", {})
        result = tool_result_text(r)
        check(not result.startswith("ERROR") and "PATH" in result, f"get-env was enabled but failed: {result[:300]}")
        self.said.append("call everything__get-env -> ok (the proxy container's env)")
        self.seen["env"] = result
        r = yield tool_use(MCP + "everything__echo", {"message": "hello"})
        result = tool_result_text(r)
        check(result.startswith("ERROR"), f"everything__echo was disabled but the call answered: {result}")
        self.said.append(f"call everything__echo -> refused by the agent: {result.splitlines()[0]}")
        yield text("Done: the todo-api facts are in the knowledge graph; 2 + 3 = 5.")


def agent_task(name: str, task_id: int, service: str, prompt: str, tool_config: dict,
               gateway: bool = False) -> dict:
    """A TaskRun on the real node whose agent (Claude Code, the default) talks to the scripted
    model on MODEL_PORT, with the API key from the Secret `anthropic`: in its own env, or with
    `gateway` through its proxy (spec.model, the stand-in's plain http on the pod's loopback)."""
    model = {"model": {"secretKeyRef": {"name": "anthropic", "key": "api-key"},
                       "endpoint": f"http://127.0.0.1:{MODEL_PORT}"}} if gateway else {
        "agent": {"env": [
            {"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": {"name": "anthropic", "key": "api-key"}}},
            {"name": "ANTHROPIC_BASE_URL", "value": f"http://127.0.0.1:{MODEL_PORT}"}]}}
    return {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name},
        "spec": {
            "taskId": task_id, "serviceName": service, "task": {"prompt": prompt},
            **model,
            "podTemplate": {
                "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
            },
            "toolConfig": tool_config,
        },
    }


def metric_families(exposition: str) -> dict[str, bool]:
    """The families a /metrics text declares (`# TYPE name kind`) -> whether it has a sample."""
    families = {m: False for m in re.findall(r"^# TYPE (\S+) ", exposition, re.M)}
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, 1)[0]
            for suffix in ("", "_total", "_bucket", "_sum", "_count", "_created"):
                if suffix and name.endswith(suffix) and name[: -len(suffix)] in families:
                    families[name[: -len(suffix)]] = True
                elif not suffix and name in families:
                    families[name] = True
    return families


def result_line(r: dict) -> str:
    """status.result in one line, as a person reads it."""
    secs = f"{r['durationMs'] / 1000:.1f} s" if "durationMs" in r else "? s"
    return (f"{r.get('subtype', '?')}, {r.get('turns', '?')} turns, {r.get('inputTokens', '?')} tokens in / "
            f"{r.get('outputTokens', '?')} out, cost ${r.get('costUsd', '?')}, {secs}")


@dataclass
class Story:
    say: callable = print
    system_ns: str = ""
    work_ns: str = ""
    figures: dict = field(default_factory=dict)
    # The proxy watches its ConfigMap through the API and reports what it serves (chart value
    # sidecar.apiWatch); off: the mounted file only (the kubelet's volume update).
    api_watch: bool = True
    # More `--set` values for the chart.
    helm_values: list = field(default_factory=list)
    # The chart to install: this checkout's (with this checkout's images), or a released one
    # (`oci://...`, with `chart_args` such as `--version V --plain-http`) whose image defaults
    # are its release's.
    chart: str = ""
    chart_args: list = field(default_factory=list)

    def __post_init__(self):
        suffix = secrets.token_hex(3)
        self.system_ns = self.system_ns or f"orchestrator-system-{suffix}"
        self.work_ns = self.work_ns or f"story-{suffix}"
        # Release "orchestrator" (RELEASE): its objects are then named orchestrator-operator,
        # orchestrator-catalog, ... (the CLI's defaults, when installed in orchestrator-system).
        self.release = RELEASE
        self.bins = bin_dir()
        self.kubeconfig = STATE / "kubeconfig"
        check(self.kubeconfig.exists(), f"{self.kubeconfig} is missing: is the cluster up? (e2e/cluster up)")

    # --- tools ---------------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        argv = [str(self.bins / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        out = subprocess.run(argv, input=stdin, capture_output=True, text=True)
        if out.returncode != 0:
            raise subprocess.CalledProcessError(out.returncode, argv, out.stdout, out.stderr)
        return out.stdout

    def json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str) -> str:
        argv = [str(self.bins / "helm"), "--kubeconfig", str(self.kubeconfig), *args]
        out = subprocess.run(argv, capture_output=True, text=True)
        check(out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
        return out.stdout

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        argv = [str(self.binaries["orchestrator-cli"]), "--kubeconfig", str(self.kubeconfig),
                "-n", self.work_ns,
                "--catalog-namespace", self.system_ns, "--catalog-name", chart_object("catalog", self.release),
                *args]
        return subprocess.run(argv, capture_output=True, text=True)

    def ctr_tasks(self) -> dict[str, int]:
        """Running containers on the real node: container id -> pid of its process."""
        out = subprocess.run(["ctr", "--address", str(NODE_SOCK), "-n", "k8s.io", "tasks", "ls"],
                             capture_output=True, text=True, check=True).stdout
        tasks = {}
        for line in out.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "RUNNING":
                tasks[parts[0]] = int(parts[1])
        return tasks

    def diagnosis(self) -> str:
        """The cluster's state as far as a stuck pod goes: the real node's conditions and taints,
        the pods of the story's namespace (phase, conditions, each container's state), the
        namespace's last warnings, and the disk the node's eviction thresholds look at."""
        out = ["\n--- diagnosis ---"]
        for node in self.json("get", "nodes")["items"]:
            conds = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            taints = [f"{t['key']}:{t['effect']}" for t in node["spec"].get("taints", [])]
            out.append(f"node {node['metadata']['name']}: {conds} taints {taints}")
        for pod in self.json("get", "pods", "-n", self.work_ns)["items"]:
            status = pod.get("status", {})
            conds = [f"{c['type']}={c['status']}{'(' + c.get('reason', '') + ': ' + c.get('message', '') + ')' if c['status'] != 'True' else ''}"
                     for c in status.get("conditions", [])]
            out.append(f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: {status.get('phase')} {conds}")
            for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
                out.append(f"  {c['name']}: ready={c.get('ready')} started={c.get('started')} "
                           f"restarts={c.get('restartCount')} state={json.dumps(c.get('state'))} "
                           f"last={json.dumps(c.get('lastState'))}")
        events = self.json("get", "events", "-n", self.work_ns, "--sort-by=.lastTimestamp")["items"]
        for e in events[-15:]:
            out.append(f"event {e.get('type')} {e.get('reason')} {e.get('involvedObject', {}).get('name')}: "
                       f"{(e.get('message') or '').strip()[:300]}")
        disk = subprocess.run(["df", "-h", str(STATE)], capture_output=True, text=True).stdout.strip()
        out.append(f"disk: {disk.splitlines()[-1] if disk else '?'}")
        return "\n".join(out) + "\n"

    # --- the story -----------------------------------------------------------------------------

    def prepare(self, cleanup: ExitStack) -> None:
        """The real node, the binaries and the node's images, the chart installed and the operator
        running; `cleanup` undoes it all."""
        self.cleanup = cleanup
        DIAGNOSE.append(self.diagnosis)
        cleanup.callback(DIAGNOSE.remove, self.diagnosis)
        self.node = self.real_node()
        self.binaries = cargo_binaries()
        self.images = node_images()
        self.install()

    def run(self) -> dict:
        with ExitStack() as cleanup:
            self.prepare(cleanup)
            taskrun = self.apply_task()
            pod = self.pod_starts()
            self.agent_works(taskrun, pod)
            self.finish(pod)
        self.say(f"\nDone: nothing left running. Figures: {json.dumps(self.figures)}")
        return self.figures

    def real_node(self) -> str:
        nodes = self.json("get", "nodes", "-l", f"{REAL_NODE[0]}={REAL_NODE[1]}")["items"]
        check(len(nodes) == 1, "no real node in the cluster: `e2e/cluster up` starts one (ORCH_E2E_REAL_NODE=1, the default)")
        check(NODE_SOCK.exists(), f"the real node's containerd socket {NODE_SOCK} is missing")
        return nodes[0]["metadata"]["name"]

    def install(self) -> None:
        self.say(f"\n== 1. helm install the chart into {self.system_ns}; the operator runs with its ServiceAccount")
        self.kubectl("create", "namespace", self.work_ns)
        # The tasks' namespace admits only pods that meet Kubernetes' restricted Pod Security
        # profile (the API server's PodSecurity admission).
        self.kubectl("label", "namespace", self.work_ns, "pod-security.kubernetes.io/enforce=restricted",
                     "pod-security.kubernetes.io/enforce-version=latest")
        self.cleanup.callback(self.kubectl, "delete", "namespace", self.work_ns, "--wait=false")
        self.prometheus_operator_crds()
        self.helm(
            # --take-ownership: the CRDs are the chart's templates, kept on uninstall, so a cluster
            # that had a release before (another test's) holds them under that release's name.
            "install", self.release, self.chart or str(REPO / "charts/orchestrator"), *self.chart_args,
            "-n", self.system_ns, "--create-namespace",
            "--take-ownership",
            "--set", f"watchNamespace={self.work_ns}",
            *([] if self.chart else ["--set", f"agent.image={self.images['agent']}",
                                     "--set", f"sidecar.image={self.images['mcp-proxy']}"]),
            "--set", f"sidecar.apiWatch={str(self.api_watch).lower()}",
            "--set", f"sidecar.kubernetesService={POD_API_SERVER}",
            *[a for v in [*MONITORING_VALUES, *self.helm_values] for a in ("--set", v)],
            "--wait", "--timeout", "90s",
        )
        self.cleanup.callback(self.kubectl, "delete", "namespace", self.system_ns, "--wait=false")
        self.cleanup.callback(self.helm, "uninstall", self.release, "-n", self.system_ns)
        self.say(f"   helm: release {self.release} deployed (CRDs, RBAC, catalog ConfigMap, operator Deployment; "
                 "the monitoring kit: PodMonitor, ServiceMonitor, PrometheusRule, Grafana dashboard)")
        if self.chart:
            self.say(f"   chart {self.chart}: its release's images, which the node pulls")
        else:
            self.say(f"   images (built by e2e/images/build, imported into the node's containerd): "
                     f"sidecar {self.images['mcp-proxy']}, agent {self.images['agent']}")

        deployment = self.json("get", "deployment", chart_object("operator", self.release), "-n", self.system_ns)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = self.kubectl("create", "token", sa, "-n", self.system_ns, "--duration", "1h").strip()
        workdir = Path(tempfile.mkdtemp(prefix="story-"))
        self.cleanup.callback(shutil.rmtree, workdir, True)
        self.workdir = workdir
        sa_kubeconfig = workdir / "operator.kubeconfig"
        admin = self.kubeconfig.read_text()
        server = next(line.split("server: ")[1] for line in admin.splitlines() if "server: " in line)
        sa_kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: e2e, cluster: {{server: {server}, certificate-authority: {STATE / 'pki/ca.crt'}}}}}]\n"
            f"users: [{{name: operator, user: {{token: {token}}}}}]\n"
            "contexts: [{name: operator, context: {cluster: e2e, user: operator}}]\ncurrent-context: operator\n"
        )
        # Exactly the Deployment's env; only what the kubelet would fill in differs.
        # ORCH_STORY_OPERATOR_LOG: the operator's RUST_LOG, for debugging a run (default info).
        env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(sa_kubeconfig),
               "RUST_LOG": os.environ.get("ORCH_STORY_OPERATOR_LOG", "info")}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
        env["POD_NAME"] = "story-operator-0"
        self.operator_port = operator_port = free_port()
        env["ORCH_BIND"] = f"127.0.0.1:{operator_port}"
        env["ORCH_LOG_JSON"] = "false"
        self.operator_log = workdir / "operator.log"
        self.operator = operator = subprocess.Popen(
            [str(self.binaries["orchestrator-operator"])], env=env,
            stdout=self.operator_log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.cleanup.callback(lambda: (operator.terminate(), operator.wait(15)))

        def ready():
            check(operator.poll() is None, f"the operator exited:\n{self.operator_log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{operator_port}/readyz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until("the operator to be ready", ready, timeout=60)
        self.say(f"   operator: running as system:serviceaccount:{self.system_ns}:{sa}, watching {self.work_ns}")

    def prometheus_operator_crds(self) -> None:
        """The Prometheus Operator's PodMonitor, ServiceMonitor and PrometheusRule CRDs (from its
        Go module: e2e/tools/prometheus-operator-crds), so the chart's monitoring kit installs."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bins}:{os.environ['PATH']}"}
        out = subprocess.run([str(REPO / "e2e/tools/prometheus-operator-crds")], env=env, capture_output=True, text=True)
        check(out.returncode == 0, f"e2e/tools/prometheus-operator-crds failed:\n{out.stdout}{out.stderr}")

    def monitoring(self, pod: dict, pids: dict[str, int]) -> None:
        """Scrapes the task pod's proxy where the PodMonitor does (the pod IP, port `metrics`) and
        the operator's /metrics, and checks that every metric the chart's alert rules and
        dashboard use is a family of those real scrapes."""
        p = self.json("get", "pod", pod["metadata"]["name"], "-n", self.work_ns)
        proxy = next(c for c in p["spec"].get("initContainers", []) if c["name"] == "mcp-proxy")
        port = next((x["containerPort"] for x in proxy.get("ports", []) if x.get("name") == "metrics"), None)
        check(port is not None, f"the proxy container has no port named metrics: {proxy.get('ports')}")
        url = f"http://{p['status']['podIP']}:{port}/metrics"
        scrape = subprocess.run(
            ["nsenter", f"--net=/proc/{pids['mcp-proxy']}/ns/net", sys.executable, "-c",
             f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=5).read().decode())"],
            capture_output=True, text=True)
        check(scrape.returncode == 0, f"scraping the proxy at {url} in the pod's network failed: {scrape.stderr}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.operator_port}/metrics", timeout=5) as r:
            operator = r.read().decode()
        families = {**metric_families(scrape.stdout), **metric_families(operator)}
        manifest = self.helm("get", "manifest", self.release, "-n", self.system_ns)
        tool = subprocess.run([sys.executable, str(REPO / "e2e/tools/monitoring-metric-names"), "--families",
                               "--manifest", "-"], input=manifest, capture_output=True, text=True)
        check(tool.returncode == 0, f"monitoring-metric-names failed: {tool.stderr}")
        used = tool.stdout.split()
        missing = [m for m in used if m not in families and m not in EVENT_ONLY_FAMILIES]
        check(used and not missing, f"the chart's alert rules and dashboard use metrics no real scrape has: {missing}")
        present = [m for m in used if m in families]
        self.figures["monitoring_metrics_used"] = len(used)
        self.say(f"   the PodMonitor's target answers: {url} in the pod's network ({len(metric_families(scrape.stdout))} "
                 f"mcp_proxy families); the operator's /metrics {len(metric_families(operator))} families. Of the "
                 f"{len(used)} metrics the chart's alert rules and dashboard use, {len(present)} are in these real "
                 f"scrapes; the other {len(used) - len(present)} exist once their event happens (per tool or per "
                 f"waiting call: {', '.join(sorted(set(used) - set(present)))})")

    def apply_task(self) -> dict:
        self.say(f"\n== 2. kubectl apply -f config/samples/anthropic-secret.yaml -f config/samples/taskrun.yaml -n {self.work_ns}")
        self.say("   (the sample, with a nodeSelector + toleration for the real node and spec.model.endpoint "
                 f"= the model stand-in, HTTPS on 127.0.0.1:{MODEL_PORT}, its CA in ConfigMap model-ca)")
        # The stand-in checks the key every request brings: it must be the Secret's, which only
        # the task's proxy reads.
        self.api_key = f"sk-ant-stand-in-{secrets.token_hex(8)}"
        self.tls = tls_pair(self.workdir / "model-tls")
        ca = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "model-ca"},
              "data": {"ca.crt": Path(self.tls[0]).read_text()}}
        self.kubectl("apply", "-n", self.work_ns, "-f", "-", stdin=json.dumps(ca))
        secret = yaml.safe_load(SAMPLE_SECRET.read_text())
        key = next(iter(secret["stringData"]))
        secret["stringData"][key] = self.api_key
        self.kubectl("apply", "-n", self.work_ns, "-f", "-", stdin=json.dumps(secret))
        doc = yaml.safe_load(SAMPLE.read_text())
        spec = doc["spec"]
        spec["podTemplate"] = {
            "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
            "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
        }
        check(spec.get("model", {}).get("secretKeyRef", {}).get("name") == secret["metadata"]["name"],
              f"the sample's spec.model does not name the sample's Secret: {spec.get('model')}")
        spec["model"] = {**spec["model"], "endpoint": f"https://127.0.0.1:{MODEL_PORT}",
                         "caConfigMapKeyRef": {"name": "model-ca", "key": "ca.crt"}}
        self.applied_at = time.time()
        self.say("   " + self.kubectl("apply", "-n", self.work_ns, "-f", "-", stdin=json.dumps(doc)).rstrip())
        taskrun = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)
        for s in taskrun["spec"]["toolConfig"]["mcpServers"]:
            tools = s.get("tools", {})
            self.say(f"   {s['name']}: allow {tools.get('allow', ['*'])} deny {tools.get('deny', [])}")
        return taskrun

    def pod(self) -> dict | None:
        pods = self.json("get", "pods", "-n", self.work_ns, "-l", "job-name=task-1001")["items"]
        return pods[0] if pods else None

    def pod_starts(self) -> dict:
        self.say(f"\n== 3. the operator renders a ConfigMap and a Job; the Job's pod runs on the real node {self.node}")
        catalog = self.catalog()
        self.taskrun0 = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)
        self.script = AgentScript(want_before=expected_tools(self.taskrun0, catalog))
        # The model must be there before the agent starts.
        self.model = ScriptedModel(self.script, port=MODEL_PORT, tls=self.tls[1:]).start()
        self.cleanup.callback(self.model.stop)

        def proxy_ready():
            pod = self.pod()
            for s in (pod or {}).get("status", {}).get("initContainerStatuses", []):
                if s["name"] == "mcp-proxy" and s.get("ready"):
                    return pod
            self.fail_if_pod_failed(pod)
            return None

        pod = wait_until("the pod's proxy sidecar to be ready", proxy_ready, timeout=120, interval=0.2)
        self.figures["apply_to_proxy_ready_s"] = round(time.time() - self.applied_at, 1)
        cm = self.json("get", "configmap", "task-1001-tools", "-n", self.work_ns)
        owner = cm["metadata"]["ownerReferences"][0]
        self.say(f"   ConfigMap task-1001-tools (owned by {owner['kind']} {owner['name']}): keys {sorted(cm['data'])}")
        init = [c["name"] for c in pod["spec"].get("initContainers", [])]
        main = [c["name"] for c in pod["spec"]["containers"]]
        check(pod["spec"]["nodeName"] == self.node, f"the pod runs on {pod['spec']['nodeName']}, not the real node")
        self.say(f"   pod {pod['metadata']['name']} on {pod['spec']['nodeName']}: containers {main}, native sidecars {init}")
        self.say(f"   proxy ready (startup and readiness probes passed) {self.figures['apply_to_proxy_ready_s']} s after kubectl apply")
        return pod

    def fail_if_pod_failed(self, pod: dict | None) -> None:
        """A container that cannot start (image, config) or fails: stop with what the kubelet says."""
        for s in (pod or {}).get("status", {}).get("initContainerStatuses", []) + \
                (pod or {}).get("status", {}).get("containerStatuses", []):
            waiting = s.get("state", {}).get("waiting", {})
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError",
                                         "CreateContainerError", "CrashLoopBackOff", "InvalidImageName"):
                raise StoryError(f"container {s['name']}: {waiting.get('reason')}: {waiting.get('message', '')}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for c in ("mcp-proxy", "agent"):
            try:
                out.append(f"--- {c} ---\n" + self.kubectl("logs", "-n", self.work_ns, "job/task-1001", "-c", c, "--tail", "60"))
            except subprocess.CalledProcessError as e:
                out.append(f"--- {c}: no logs ({e.stderr.strip()})")
        return "\n".join(out)

    def container_pids(self, pod: dict) -> dict[str, int]:
        """name -> pid on this machine of each running container of the pod."""
        tasks = self.ctr_tasks()
        pod = self.json("get", "pod", pod["metadata"]["name"], "-n", self.work_ns)
        out = {}
        for s in pod["status"].get("initContainerStatuses", []) + pod["status"].get("containerStatuses", []):
            cid = s.get("containerID", "").removeprefix("containerd://")
            if cid in tasks:
                out[s["name"]] = tasks[cid]
        return out

    def agent_works(self, taskrun: dict, pod: dict) -> None:
        self.say("\n== 4. the agent (Claude Code) starts; the model behind it is the scripted stand-in")
        # The script holds its answer to the first request until the idle pod is measured, so the
        # request is waited for as the script sees it (the stand-in records it once answered).
        if not self.script.first_seen.wait(timeout=120):
            raise StoryError(f"timed out after 120s waiting for the agent's first request to the model\n{self.logs()}")
        first = self.script.seen["first"]
        if self.model.error is not None:
            raise StoryError(f"{self.model.error}\n{self.logs()}")
        check(first.headers.get("x-api-key") == self.api_key, "the model API got another API key than the Secret's")
        self.no_key_in_agent(pod)

        def agent_state():  # the kubelet reports the container's start in its next status update
            p = self.json("get", "pod", pod["metadata"]["name"], "-n", self.work_ns)
            agent = next(s for s in p["status"].get("containerStatuses", []) if s["name"] == "agent")
            return agent["state"].get("running") or agent["state"].get("terminated")

        started = parse_time(wait_until("the kubelet to report the agent's start", agent_state, timeout=30)["startedAt"])
        self.figures["agent_start_to_first_model_request_s"] = round(first.wall - started, 1)
        # The proxy and every server's container start before the agent (native sidecars, in order).
        self.figures["apply_to_agent_start_s"] = round(started - self.applied_at, 1)
        offered = first.mcp_tools()
        try:
            self.idle(pod)
        finally:
            self.script.idle_measured.set()  # the model answers the first request now
        self.say(f"   the agent's first request to the model, {self.figures['agent_start_to_first_model_request_s']} s "
                 f"after the container started (kubelet time, 1 s resolution), offers {len(offered)} tools of the proxy "
                 f"(deferred, loaded with ToolSearch): {', '.join(offered)}")
        try:
            self.model.wait_for(lambda r: self.script.ready_for_add_context.is_set(), timeout=60, what="the first calls")
        except TimeoutError as e:
            raise StoryError(f"{e}\n{self.logs()}") from None
        for line in self.script.said:
            self.say(f"   {line}")
        # A person grants a tool to an agent that has been working a while, not in its first
        # seconds: right after a pod starts, the kubelet syncs it again on its containers'
        # start-up events and a ConfigMap change gets in within a second whatever the operator
        # does; later only the operator's annotation of the pod brings the sync forward from the
        # periodic one (1 min). So the story lets the agent work on first, which is what shows the
        # annotation working (this is the scenario's time passing, not a wait for a condition).
        self.monitoring(pod, self.container_pids(pod))
        self.say(f"   ... the agent keeps working (a call a second); {SETTLE_S} s later a person grants it get-env:")
        time.sleep(SETTLE_S)

        self.say(f"\n== 5. orchestrator-cli task add-context --task-id 1001 --enable-tools {ENABLE} --disable-tools {DISABLE}")
        pids = self.container_pids(pod)
        self.memory(pids, when="before add-context")
        version_before = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)["status"].get("contextVersion")
        started = time.time()
        cli = self.cli("task", "add-context", "--task-id", "1001",
                       "--enable-tools", ENABLE, "--disable-tools", DISABLE, "--wait-synced")
        check(cli.returncode == 0, f"add-context failed ({cli.returncode}):\n{cli.stdout}{cli.stderr}")
        synced = time.time()
        self.say("   " + cli.stdout.rstrip().replace("\n", "\n   "))
        taskrun = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)
        version_after = taskrun["status"].get("contextVersion")
        check(version_after == (version_before or 0) + 1, f"contextVersion {version_before} -> {version_after}")
        if self.api_watch:
            # --wait-synced returned once the pod's proxy reported serving the new version.
            served = taskrun["status"].get("servedContextVersion")
            cond = next((c for c in taskrun["status"].get("conditions", []) if c["type"] == "ToolsSynced"), {})
            check(served == version_after and cond.get("status") == "True",
                  f"add-context --wait-synced returned, but servedContextVersion is {served} and ToolsSynced {cond}")
        self.script.want_after = expected_tools(taskrun, self.catalog())
        self.script.add_context_done.set()
        self.say(f"   add-context --wait-synced returned {synced - started:.2f} s after it started "
                 + ("(the pod's proxy serves the new version: it watches its ConfigMap through the API server "
                    "with the task's own identity); " if self.api_watch else "(the ConfigMap is re-rendered); ")
                 + "the operator also annotates the running pod with the new version, so the kubelet syncs the pod "
                 "and updates its config volume at once (not at its periodic sync, default every minute)")
        annotation = self.json("get", "pod", pod["metadata"]["name"], "-n", self.work_ns)["metadata"] \
            .get("annotations", {}).get("orchestrator.io/context-version")
        check(annotation == str(version_after),
              f"the running pod's orchestrator.io/context-version is {annotation!r}, not the new version {version_after}")
        try:
            offered = self.model.wait_for(lambda r: "offered" in self.script.seen, timeout=ADD_CONTEXT_BUDGET + 30,
                                          what="a request offering get-env")
        except TimeoutError as e:
            raise StoryError(f"{e}\n{self.logs()}") from None
        offered = self.script.seen["offered"]
        reload_at, notified_at = self.proxy_reload_times(started)
        if self.api_watch:
            check(reload_at <= synced, f"--wait-synced returned {reload_at - synced:.2f} s before the proxy reloaded")
            self.say(f"   the TaskRun said ToolsSynced for version {version_after} {synced - reload_at:.2f} s after "
                     "the proxy applied it (its report on the task's Lease)")
        self.figures["add_context_to_synced_s"] = round(synced - started, 2)
        self.figures["add_context_to_proxy_reload_s"] = round(reload_at - started, 1)
        self.figures["add_context_to_list_changed_s"] = round(notified_at - started, 1)
        self.figures["add_context_to_model_offered_s"] = round(offered.wall - started, 1)
        self.figures["list_changed_to_model_offered_s"] = round(offered.wall - notified_at, 2)
        source = {"api": "from its ConfigMap watch through the API", "file": "from the kubelet's volume update"}
        self.say(f"   the proxy reloaded {reload_at - started:.1f} s after add-context "
                 f"({source.get(self.reload_source, self.reload_source)}) and sent "
                 f"notifications/tools/list_changed {notified_at - reload_at:.2f} s later; the agent re-listed and "
                 f"its next request offered the model the new list {offered.wall - notified_at:.2f} s after that "
                 f"(the model kept the agent busy with {self.script.seen['busy_calls']} get-sum calls meanwhile)")
        check(offered.wall - started <= OFFERED_WITHIN_S,
              f"the model was offered the new tool {offered.wall - started:.1f} s after add-context "
              f"(at most {OFFERED_WITHIN_S} s when the kubelet syncs the annotated pod at once); "
              f"the proxy reloaded after {reload_at - started:.1f} s")
        before, after = self.script.want_before, offered.mcp_tools()
        diff = [f"+{n}" for n in after if n not in before] + [f"-{n}" for n in before if n not in after]
        self.say(f"   context version {version_before} -> {version_after}; offered now ({len(after)}): {', '.join(diff)}")
        self.model.wait_for(lambda r: r.reply and r.reply.get("stop_reason") == "end_turn", timeout=60,
                            what="the model's final answer")
        for line in self.script.said[3:]:
            self.say(f"   {line}")
        check("sk-ant-stand-in" not in self.script.seen["env"], "the API key reached the proxy container's env")
        self.pids = pids
        # The upstream servers' processes: under each server's container's zone launcher (and
        # under the proxy, for a server it starts itself).
        self.upstreams = [p for name, pid in pids.items() if name != "agent" for p in descendants(pid)]

    def proxy_reload_times(self, after: float) -> tuple[float, float]:
        """When the proxy applied the new config and sent list_changed (its log, kubelet timestamps);
        `self.reload_source`: where the config came from (`api`: its ConfigMap watch, `file`: the
        kubelet's volume update)."""
        logs = self.kubectl("logs", "-n", self.work_ns, "job/task-1001", "-c", "mcp-proxy", "--timestamps")
        reload_at = notified_at = None
        self.reload_source = "?"
        for line in logs.splitlines():
            stamp, _, message = line.partition(" ")
            t = parse_time(stamp)
            if t < after:
                continue
            if reload_at is None and "config changed" in message:
                reload_at = t
                found = re.search(r'source"?[=:]\s*"?(\w+)', message)
                self.reload_source = found.group(1) if found else "?"
            if reload_at is not None and notified_at is None and "sent list_changed" in message:
                notified_at = t
        check(reload_at is not None and notified_at is not None,
              f"no reload and list_changed in the proxy's log after add-context:\n{logs[-3000:]}")
        return reload_at, notified_at

    def no_key_in_agent(self, pod: dict) -> None:
        """The model key is the proxy's only: the agent's container spec names no Secret, and no
        process of the agent's container (its cgroup, read from this machine's /proc) has it in
        its environment or command line; the agent's runtime is pointed at the proxy."""
        spec = self.json("get", "pod", pod["metadata"]["name"], "-n", self.work_ns)["spec"]
        agent = next(c for c in spec["containers"] if c["name"] == "agent")
        from_secrets = [e["name"] for e in agent.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        check(not from_secrets and not agent.get("envFrom"), f"the agent's env comes from Secrets: {from_secrets}")
        base = next((e.get("value") for e in agent.get("env", []) if e["name"] == "ANTHROPIC_BASE_URL"), None)
        check(base and base.startswith("http://127.0.0.1:") and base.endswith("/model"),
              f"the agent's ANTHROPIC_BASE_URL is {base!r}, not the proxy's gateway")
        pid = self.container_pids(pod)["agent"]
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        seen, found = 0, []
        for p in Path("/proc").iterdir():
            try:
                if not p.name.isdigit() or (p / "cgroup").read_text() != cgroup:
                    continue
                seen += 1
                for what in ("environ", "cmdline"):
                    if self.api_key.encode() in (p / what).read_bytes():
                        found.append(f"/proc/{p.name}/{what}")
            except OSError:
                continue  # gone meanwhile
        check(seen and not found, f"the model key is readable in the agent's processes: {found}")
        self.say(f"   the agent's container: no env from a Secret, ANTHROPIC_BASE_URL={base}; none of its {seen} "
                 f"processes has the key in its env or command line; the model API got it on the first request")

    def idle(self, pod: dict) -> None:
        """The pod once the agent has connected and listed, before any call (the model holds its
        first answer meanwhile): lazy start means no server process anywhere, neither under the
        proxy nor under a zone's launcher, and no start in the proxy's log, whatever the agent
        sent at connect."""
        pids = self.container_pids(pod)
        started = {name: descendants(pid) for name, pid in pids.items() if name != "agent"}
        starts = self.server_starts(pod)
        check(not any(started.values()) and not starts,
              f"a server started before any call: processes per container {started}; the proxy's log: {starts}")
        self.figures["upstream_processes_idle"] = sum(len(p) for p in started.values())
        self.memory(pids, when="idle (the agent connected and listed, no call yet)", key="memory_idle_mib")
        self.say(f"   no server started: {', '.join(f'{n} 0' for n in started if n != 'mcp-proxy')} processes "
                 f"under the zones' launchers, none under the proxy, no start in its log")

    def memory(self, pids: dict[str, int], when: str, key: str = "memory_mib") -> None:
        """Per container of the pod: the PSS of its processes (the first one and its descendants)
        and its cgroup's peak; `proxy_pss`/`upstreams_pss` as before (the proxy alone, and every
        upstream process, wherever it runs: under the proxy or in a server's own container)."""
        proxy, agent = pids.get("mcp-proxy"), pids.get("agent")
        check(proxy is not None and agent is not None, f"containers running on the node: {pids}")
        containers = {}
        ups = descendants(proxy)
        for name, pid in sorted(pids.items()):
            procs = [pid, *descendants(pid)]
            containers[name] = {"pss": round(sum(pss_mib(p) for p in procs), 1),
                                "peak": round(cgroup_peak_mib(pid) or 0, 1)}
            if name not in ("mcp-proxy", "agent"):
                ups += procs[1:]  # a server's container: its launcher, then the server's processes
        self.figures[key] = {
            "proxy_pss": round(pss_mib(proxy), 1),
            "upstreams_pss": round(sum(pss_mib(p) for p in ups), 1),
            "proxy_container_peak": containers["mcp-proxy"]["peak"],
            "agent_container_peak": containers["agent"]["peak"],
            "pod_pss": round(sum(c["pss"] for c in containers.values()), 1),
            **{f"{n}_container_pss": c["pss"] for n, c in containers.items()},
        }
        m = self.figures[key]
        self.say(f"   memory {when} (PSS): proxy {m['proxy_pss']} MiB, {len(ups)} upstream processes "
                 f"{m['upstreams_pss']} MiB; per container (PSS/cgroup peak): "
                 + ", ".join(f"{n} {c['pss']}/{c['peak']} MiB" for n, c in containers.items()))

    def catalog(self) -> dict:
        """The catalog the operator uses: the chart's ConfigMap."""
        text = self.kubectl(
            "get", "configmap", chart_object("catalog", self.release), "-n", self.system_ns,
            "-o", "jsonpath={.data.catalog\\.yaml}",
        )
        return yaml.safe_load(text)

    def server_starts(self, pod: dict) -> dict[str, str]:
        """server -> why the proxy started it, from its log's `starting upstream server` lines
        (JSON by the chart's default, else text)."""
        log = self.kubectl("logs", "-n", self.work_ns, pod["metadata"]["name"], "-c", "mcp-proxy")
        out = {}
        for line in log.splitlines():
            if "starting upstream server" not in line:
                continue
            try:
                fields = json.loads(line).get("fields", {})
            except ValueError:  # text: `... starting upstream server server=NAME reason=WHY restart=B`
                found = re.search(r"server=(\S+) reason=(.*?) restart=", line)
                fields = {"server": found.group(1), "reason": found.group(2)} if found else {}
            server, reason = str(fields.get("server", "?")).strip('"'), str(fields.get("reason", "?")).strip('"')
            out.setdefault(server, reason)
        return out

    def audit_stream(self, pod: dict) -> list[dict]:
        """The proxy container's stdout as a log shipper reads it: the node's CRI log file
        (`<time> <stream> <P|F> <line>`), stream `stdout` only, one JSON record per line. Any
        line that is not a JSON object with a `recordType` fails the story."""
        meta = pod["metadata"]
        path = STATE / "node" / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "mcp-proxy" / "0.log"
        check(path.exists(), f"no CRI log of the proxy container at {path}")
        records, partial = [], ""
        with path.open(encoding="utf-8") as f:
            for raw in f:
                parts = raw.rstrip("\n").split(" ", 3)
                if len(parts) < 4 or parts[1] != "stdout":
                    continue
                partial += parts[3]
                if parts[2] == "P":  # the runtime split a long line; the rest follows
                    continue
                line, partial = partial, ""
                try:
                    record = json.loads(line)
                except ValueError:
                    raise StoryError(f"the proxy's stdout has a line that is not JSON: {line[:200]!r}") from None
                check(isinstance(record, dict) and record.get("recordType") in AUDIT_RECORD_TYPES,
                      f"the proxy's stdout has a line that is not an audit record: {line[:200]!r}")
                records.append(record)
        return records

    def audit(self, pod: dict) -> None:
        """The proxy's audit stream (its stdout): one record per call that reached it, all from one
        client identity, however many protocol sessions the agent opened."""
        stream = self.audit_stream(pod)
        records = [r for r in stream if r["recordType"] == "tool_call"]
        self.say(f"   the proxy's audit stream (its container's stdout in the node's CRI log, read line by line): "
                 f"{len(stream)} JSON records, {len(records)} of them calls")
        # get-sum, create_entities, the busy get-sums, get-env: the denied calls never left the agent.
        calls = 3 + self.script.seen["busy_calls"]
        check(len(records) == calls and all(r["decision"] == "allowed" for r in records),
              f"{calls} calls went through the proxy, its audit has {len(records)}: {records[:5]}")
        clients = {r["client"] for r in records}
        check(len(clients) == 1 and next(iter(clients)).startswith("claude-code/"),
              f"one agent run, one client identity in the audit; got {clients}")
        sessions = {r["session"] for r in records}
        first: dict[str, float] = {}
        for r in records:  # the first call of each server also started its process (lazy start)
            first.setdefault(r.get("server", "?"), round(float(r.get("durationMs", 0)), 1))
        self.figures["first_call_ms"] = first
        starts = self.server_starts(pod)
        check(sorted(starts) == sorted(first) and all(why.startswith("tools/call") for why in starts.values()),
              f"each server should start once, for its first call ({sorted(first)}); the proxy's log: {starts}")
        self.say(f"   the first call of each server, which started its process: "
                 + ", ".join(f"{s} {ms} ms ({starts[s]})" for s, ms in first.items()))
        self.say(f"   the proxy's audit: {len(records)} calls, one client identity {next(iter(clients))} "
                 f"across {len(sessions)} protocol session(s)")
        # The model's requests, and the Bash command it asked for between get-sum and
        # create_entities, in the order they happened.
        requests = [r for r in stream if r["recordType"] == "model_request"]
        used = self.model.usage()
        check(len(requests) == used["requests"],
              f"the stand-in answered {used['requests']} model requests, the audit has {len(requests)}")
        order = [r.get("tool") if r["recordType"] == "agent_tool_use" else r.get("upstreamTool")
                 for r in stream if r["recordType"] in ("tool_call", "agent_tool_use")]
        bash = [i for i, r in enumerate(stream) if r["recordType"] == "agent_tool_use" and r.get("tool") == "Bash"]
        check(len(bash) == 1, f"the audit should show the one Bash command the model asked for; tool order {order}")
        calls = [i for i, r in enumerate(stream) if r["recordType"] == "tool_call"]
        check(calls and calls[0] < bash[0] < calls[1] and stream[calls[1]].get("upstreamTool") == "create_entities",
              f"the Bash command should come between get-sum and create_entities: {order}")
        self.say(f"   the gateway's audit: {len(requests)} model requests (model {requests[0].get('model')}), and the "
                 f"agent's own Bash command between the MCP calls: {order[:4]} ...")

    def finish(self, pod: dict) -> None:
        self.say("\n== 6. the agent exits; the kubelet stops the sidecar; the Job and the TaskRun succeed")
        name = pod["metadata"]["name"]

        def done():
            p = self.json("get", "pod", name, "-n", self.work_ns)
            self.fail_if_pod_failed(p)
            return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

        pod = wait_until("the pod to finish", done, timeout=120, interval=0.2)
        statuses = {s["name"]: s for s in pod["status"].get("initContainerStatuses", []) + pod["status"]["containerStatuses"]}
        agent = statuses["agent"]["state"].get("terminated", {})
        proxy = statuses["mcp-proxy"]["state"].get("terminated", {})
        check(pod["status"]["phase"] == "Succeeded" and agent.get("exitCode") == 0,
              f"pod {pod['status']['phase']}, agent {agent}\n{self.logs()}")
        check(proxy.get("exitCode") == 0, f"the proxy ended with {proxy} after the agent exited\n{self.logs()}")
        agent_end = parse_time(agent["finishedAt"])
        proxy_end = parse_time(proxy["finishedAt"])
        left = [p for p in [*self.pids.values(), *self.upstreams] if alive(p)]
        check(not left, f"processes of the pod still running after it finished: {left}")
        self.audit(pod)
        self.say(f"   agent exited 0; the kubelet stopped the native sidecar: exit code {proxy['exitCode']} "
                 f"({proxy.get('reason')}) {proxy_end - agent_end:.0f} s later (kubelet times, 1 s resolution); "
                 f"the proxy's {len(self.upstreams)} upstream processes are gone")
        wait_until("the Job to complete", lambda: any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in self.json("get", "job", "task-1001", "-n", self.work_ns).get("status", {}).get("conditions", [])
        ), timeout=60)
        wait_until("the TaskRun to be Succeeded", lambda: self.json(
            "get", "taskrun", "task-1001", "-n", self.work_ns).get("status", {}).get("phase") == "Succeeded", timeout=60)
        self.figures["agent_exit_to_taskrun_succeeded_s"] = round(time.time() - agent_end, 1)
        self.say("   " + self.kubectl("get", "taskrun", "task-1001", "-n", self.work_ns).rstrip().replace("\n", "\n   "))
        self.say(f"   Job Complete and TaskRun Succeeded {self.figures['agent_exit_to_taskrun_succeeded_s']} s after the agent exited")
        self.result()
        self.kubectl("delete", "taskrun", "task-1001", "-n", self.work_ns)

        def children_gone():
            out = self.kubectl("get", "jobs,configmaps,pods", "-n", self.work_ns, "-l", "orchestrator.io/taskrun=task-1001", "-o", "name")
            return out.strip() == ""

        wait_until("the Job, its pod and the ConfigMap to be garbage-collected", children_gone, timeout=60)
        self.say("   kubectl delete taskrun task-1001: the Job, its pod and the ConfigMap are gone (owner references)")

    def result(self) -> None:
        """Step 7: what the agent did, from the TaskRun's status and the pod's log."""
        self.say("\n== 7. what the agent did: status.result (Claude Code's result, from its termination message) and task logs")

        def reported():
            return self.json("get", "taskrun", "task-1001", "-n", self.work_ns).get("status", {}).get("result")

        r = wait_until("status.result", reported, timeout=30)
        check(not r.get("error"), f"the operator could not read the agent's result: {r}")
        check(r.get("subtype") == "success" and r.get("isError") is False, f"the agent reported {r}")
        check((r.get("turns") or 0) >= 4, f"Claude Code took at least 4 turns (3 calls and the end): {r}")
        used = self.model.usage()
        # Claude Code sums the usage the Messages API reported: the stand-in counts what it reported.
        check((r.get("inputTokens"), r.get("outputTokens")) == (used["input_tokens"], used["output_tokens"]),
              f"the tokens in the result ({r}) are not what the model stand-in reported ({used})")
        check(float(r.get("costUsd") or 0) > 0, f"Claude Code reported no cost: {r}")
        # What the gateway counted, independent of the agent's own claim: the stand-in's count.
        keys = {r.headers.get("x-api-key") for r in self.model.requests}
        check(keys == {self.api_key}, f"every request to the model API must carry the Secret's key; got {len(keys)} keys")
        want = {"inputTokens": used["input_tokens"], "outputTokens": used["output_tokens"], "requests": used["requests"]}

        def usage():
            u = self.json("get", "taskrun", "task-1001", "-n", self.work_ns).get("status", {}).get("usage") or {}
            return u if {k: u.get(k) for k in want} == want else None

        try:
            u = wait_until("status.usage to be the model stand-in's count", usage, timeout=30)
        except StoryError as e:
            got = self.json("get", "taskrun", "task-1001", "-n", self.work_ns).get("status", {}).get("usage")
            raise StoryError(f"{e}: status.usage {got}, the stand-in counted {want}") from None
        self.figures["usage"] = u
        self.say(f"   status.usage (the proxy's gateway counted): {u['inputTokens']} tokens in / {u['outputTokens']} out "
                 f"over {u['requests']} requests, ${u.get('costUsd', '?')}: what the model stand-in counted")
        self.figures["result"] = {k: r.get(k) for k in ("turns", "inputTokens", "outputTokens", "costUsd", "durationMs")}
        self.say(f"   status.result: {result_line(r)} (as Claude Code reported; the model stand-in reported "
                 f"{used['input_tokens']} tokens in / {used['output_tokens']} out over {used['requests']} requests)")
        self.say(f"   final text: {r.get('text', '')!r}")
        logs = self.cli("task", "logs", "--task-id", "1001")
        check(logs.returncode == 0, f"orchestrator-cli task logs failed ({logs.returncode}): {logs.stderr}")
        check(r.get("text", "\0") in logs.stdout, f"the agent's log does not show its final text {r.get('text')!r}:\n{logs.stdout}")
        self.say("   $ orchestrator-cli task logs --task-id 1001\n   " + logs.stdout.rstrip().replace("\n", "\n   "))
        proxy = self.cli("task", "logs", "--task-id", "1001", "-c", "proxy")
        check(proxy.returncode == 0, f"orchestrator-cli task logs -c proxy failed: {proxy.stderr}")
        self.say(f"   $ orchestrator-cli task logs --task-id 1001 -c proxy: {len(proxy.stdout.splitlines())} lines (audit records and logs)")


if __name__ == "__main__":
    try:
        Story(system_ns="orchestrator-system", work_ns="team-a").run()
    except StoryError as e:
        print(f"\nstory failed: {e}", file=sys.stderr)
        sys.exit(1)
