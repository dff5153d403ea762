"""The user's story, end to end, on the real control plane (issue: "End to end").

1. The chart is installed with Helm; the operator runs out of the cluster with a token of the
   chart's ServiceAccount and the env of the chart's Deployment (kwok runs no containers).
2. `kubectl apply -f config/samples/taskrun.yaml`: a task using two real catalog servers
   (everything, memory) with allow and deny patterns.
3. The Job's pod is created and bound to a kwok node; the kubelet stand-in (kubelet.py) runs its
   proxy sidecar from the pod spec and the ConfigMap volume.
4. The agent, played by the official MCP Python SDK, sees exactly the allowed tools, calls an
   allowed one, and is refused a denied one.
5. `orchestrator-cli task add-context` changes the tools; the operator re-renders the ConfigMap;
   the stand-in swaps it into the volume as the kubelet would; the agent receives
   `notifications/tools/list_changed` and sees the new list; the newly denied tool is refused.
6. The agent finishes; kwok completes the pod; the Job completes; the TaskRun is Succeeded;
   deleting it removes the Job and the ConfigMap.

`run()` is used by the test (e2e/tests/python/test_story.py) and by the demo (`./demo`): every
step checks what it shows and raises StoryError if the system does something else; the demo
prints the transcript as it goes. Nothing is left running afterwards.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import mcp_types as types
import yaml
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kubelet import ProxyContainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("ORCH_E2E_STATE", REPO / "e2e/.cluster"))
TOOLS = Path(os.environ.get("ORCH_TOOLS", Path.home() / ".cache/orchestrator/tools"))
SAMPLE = REPO / "config/samples/taskrun.yaml"
CATALOG = REPO / "config/catalog.yaml"
# kwok leaves the pod of this agent image Running until we say the agent finished
# (e2e/kwok/scripted-agent.yaml): the agent is played by this script.
SCRIPTED_AGENT_IMAGE = "e2e.orchestrator.invalid/scripted-agent:latest"
EXIT_ANNOTATION = "e2e.orchestrator.io/agent-exit-code"

ENABLE = "everything:get-env"
DISABLE = "everything:echo"


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


def cargo_binaries() -> dict[str, Path]:
    """Builds the three binaries (a no-op when up to date) and returns their paths."""
    env = dict(os.environ)
    if "CARGO_TARGET_DIR" not in env:  # this checkout's target directory (scripts/target-dir)
        env["CARGO_TARGET_DIR"] = subprocess.run(
            [REPO / "scripts/target-dir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    out = subprocess.run(
        ["cargo", "build", "--quiet", "--message-format=json-render-diagnostics",
         "-p", "orchestrator-operator", "-p", "orchestrator-mcp-proxy", "-p", "orchestrator-cli", "--bins"],
        cwd=REPO, env=env, check=True, stdout=subprocess.PIPE,
    ).stdout.decode()
    found = {}
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            found[msg["target"]["name"]] = Path(msg["executable"])
    for name in ("orchestrator-operator", "orchestrator-mcp-proxy", "orchestrator-cli"):
        check(name in found, f"cargo build did not produce {name}")
    return found


def wait_until(what: str, predicate, timeout: float = 60, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise StoryError(f"timed out after {timeout}s waiting for {what}")
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


def expected_tools(taskrun: dict, catalog: dict, prefix: str = "__") -> list[str]:
    """What the agent should see: each server's catalog tools through its allow/deny globs,
    computed here independently of the product's own glob code (crds/src/tools.rs)."""
    servers = {s["name"]: s for s in catalog["servers"]}
    seen = []
    for server in taskrun["spec"]["toolConfig"]["mcpServers"]:
        if not server.get("enabled", True):
            continue
        allow = server.get("tools", {}).get("allow") or ["*"]
        deny = server.get("tools", {}).get("deny") or []
        for tool in servers[server["name"]]["tools"]:
            name = tool["name"]
            if any(glob_match(name, p) for p in allow) and not any(glob_match(name, p) for p in deny):
                seen.append(f"{server['name']}{prefix}{name}")
    return sorted(seen)


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped by init does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@dataclass
class Story:
    say: callable = print
    system_ns: str = ""
    work_ns: str = ""
    figures: dict = field(default_factory=dict)

    def __post_init__(self):
        suffix = secrets.token_hex(3)
        self.system_ns = self.system_ns or f"orchestrator-system-{suffix}"
        self.work_ns = self.work_ns or f"story-{suffix}"
        # Release "orchestrator": its objects are then named orchestrator-operator,
        # orchestrator-catalog, ... (the CLI's defaults, when installed in orchestrator-system).
        self.release = "orchestrator"
        self.bins = bin_dir()
        self.kubeconfig = STATE / "kubeconfig"
        check(self.kubeconfig.exists(), f"{self.kubeconfig} is missing: is the cluster up? (e2e/cluster up)")

    # --- tools ---------------------------------------------------------------------------------

    def kubectl(self, *args: str, popen: bool = False, kubeconfig: Path | None = None, stdin: str | None = None):
        argv = [str(self.bins / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        if popen:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
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
                "--catalog-namespace", self.system_ns, "--catalog-name", "orchestrator-catalog",
                *args]
        return subprocess.run(argv, capture_output=True, text=True)

    # --- the story -----------------------------------------------------------------------------

    def run(self) -> dict:
        with ExitStack() as cleanup:
            self.cleanup = cleanup
            self.binaries = cargo_binaries()
            self.install()
            taskrun = self.apply_task()
            pod = self.pod_starts()
            proxy = self.run_proxy(pod)
            asyncio.run(self.agent(taskrun, proxy))
            self.finish(pod, proxy)
        self.say(f"\nDone: nothing left running. Figures: {json.dumps(self.figures)}")
        return self.figures

    def install(self) -> None:
        self.say(f"\n== 1. helm install the chart into {self.system_ns}; the operator runs with its ServiceAccount")
        self.kubectl("create", "namespace", self.work_ns)
        self.cleanup.callback(self.kubectl, "delete", "namespace", self.work_ns, "--wait=false")
        self.proxy_port = free_port()
        self.helm(
            "install", self.release, str(REPO / "charts/orchestrator"), "-n", self.system_ns, "--create-namespace",
            "--set", f"watchNamespace={self.work_ns}",
            "--set", f"agent.image={SCRIPTED_AGENT_IMAGE}",
            "--set", f"sidecar.port={self.proxy_port}",
            "--wait", "--timeout", "90s",
        )
        self.cleanup.callback(self.kubectl, "delete", "namespace", self.system_ns, "--wait=false")
        self.cleanup.callback(self.helm, "uninstall", self.release, "-n", self.system_ns)
        self.say(f"   helm: release {self.release} deployed (CRD, RBAC, catalog ConfigMap, operator Deployment)")

        deployment = self.json("get", "deployment", "orchestrator-operator", "-n", self.system_ns)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = self.kubectl("create", "token", sa, "-n", self.system_ns, "--duration", "1h").strip()
        workdir = Path(tempfile.mkdtemp(prefix="story-"))
        self.cleanup.callback(shutil.rmtree, workdir, True)
        self.workdir = workdir
        sa_kubeconfig = workdir / "operator.kubeconfig"
        admin = self.kubeconfig.read_text()
        server = next(l.split("server: ")[1] for l in admin.splitlines() if "server: " in l)
        sa_kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: e2e, cluster: {{server: {server}, certificate-authority: {STATE / 'pki/ca.crt'}}}}}]\n"
            f"users: [{{name: operator, user: {{token: {token}}}}}]\n"
            "contexts: [{name: operator, context: {cluster: e2e, user: operator}}]\ncurrent-context: operator\n"
        )
        # Exactly the Deployment's env; only what the kubelet would fill in differs.
        env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(sa_kubeconfig), "RUST_LOG": "info"}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
        env["POD_NAME"] = "story-operator-0"
        operator_port = free_port()
        env["ORCH_BIND"] = f"127.0.0.1:{operator_port}"
        env["ORCH_LOG_JSON"] = "false"
        self.operator_log = workdir / "operator.log"
        operator = subprocess.Popen(
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

    def apply_task(self) -> dict:
        self.say(f"\n== 2. kubectl apply -f config/samples/taskrun.yaml -n {self.work_ns}")
        self.say(self.kubectl("apply", "-n", self.work_ns, "-f", str(SAMPLE)).rstrip())
        taskrun = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)
        for s in taskrun["spec"]["toolConfig"]["mcpServers"]:
            tools = s.get("tools", {})
            self.say(f"   {s['name']}: allow {tools.get('allow', ['*'])} deny {tools.get('deny', [])}")
        return taskrun

    def pod_starts(self) -> dict:
        self.say("\n== 3. the operator renders a ConfigMap and a Job; the Job's pod runs on a kwok node")

        def running_pod():
            pods = self.json("get", "pods", "-n", self.work_ns, "-l", "job-name=task-1001")["items"]
            return next((p for p in pods if p.get("status", {}).get("phase") == "Running"), None)

        pod = wait_until("the Job's pod to run", running_pod, timeout=90)
        cm = self.json("get", "configmap", "task-1001-tools", "-n", self.work_ns)
        owner = cm["metadata"]["ownerReferences"][0]
        self.say(f"   ConfigMap task-1001-tools (owned by {owner['kind']} {owner['name']}): keys {sorted(cm['data'])}")
        init = [c["name"] for c in pod["spec"].get("initContainers", [])]
        main = [c["name"] for c in pod["spec"]["containers"]]
        self.say(f"   pod {pod['metadata']['name']} on {pod['spec']['nodeName']}: containers {main}, native sidecars {init}")
        return pod

    def run_proxy(self, pod: dict) -> ProxyContainer:
        self.say("   kubelet stand-in: materializing the ConfigMap volume and starting the proxy sidecar")
        proxy = ProxyContainer.from_pod(
            self.kubectl, self.work_ns, pod["metadata"]["name"],
            self.binaries["orchestrator-mcp-proxy"], cwd=TOOLS / "node",
        )
        self.cleanup.callback(proxy.cleanup)
        self.proxy_log = self.workdir / "proxy.log"
        started = time.monotonic()
        proxy.start(self.proxy_log)
        self.figures["proxy_ready_s"] = round(time.monotonic() - started, 3)
        shown = " ".join(proxy.argv[1:]).replace(str(proxy.root / "volumes"), "<volumes>")
        self.say(f"   proxy: orchestrator-mcp-proxy {shown} (ready in {self.figures['proxy_ready_s']}s)")
        return proxy

    async def agent(self, taskrun: dict, proxy: ProxyContainer) -> None:
        self.say("\n== 4. the agent (official MCP Python SDK) connects to the proxy")
        agent = next(c for c in proxy.pod["spec"]["containers"] if c["name"] == "agent")
        url = next(e["value"] for e in agent["env"] if e["name"] == "ORCHESTRATOR_MCP_URL")
        catalog = self.catalog()
        want = expected_tools(taskrun, catalog)

        changed = asyncio.Event()
        notified_at: list[float] = []

        async def on_message(message):
            if isinstance(message, types.ToolListChangedNotification):
                notified_at.append(time.monotonic())
                changed.set()

        async with Client(url, mode="legacy", message_handler=on_message) as client:
            seen = sorted(t.name for t in (await client.list_tools()).tools)
            self.say(f"   tools/list ({len(seen)}): {', '.join(seen)}")
            check(seen == want, f"the agent sees {seen}, but the TaskRun allows exactly {want}")

            result = await client.call_tool("everything__get-sum", {"a": 2, "b": 3})
            check(not result.is_error and "5" in text_of(result), f"get-sum failed: {text_of(result)}")
            self.say(f"   call everything__get-sum(2, 3) -> {text_of(result)!r}")
            result = await client.call_tool(
                "memory__create_entities",
                {"entities": [{"name": "todo-api", "entityType": "service", "observations": ["written in Rust"]}]},
            )
            check(not result.is_error, f"memory__create_entities failed: {text_of(result)}")
            self.say("   call memory__create_entities(todo-api) -> ok")
            refused = await client.call_tool("everything__get-env", {})
            check(refused.is_error, "everything__get-env is denied but the call was not refused")
            self.say(f"   call everything__get-env -> refused: {text_of(refused)}")

            self.say(f"\n== 5. orchestrator-cli task add-context --task-id 1001 --enable-tools {ENABLE} --disable-tools {DISABLE}")
            version_before = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)["status"].get("contextVersion")
            started = time.monotonic()
            cli = await asyncio.to_thread(
                self.cli, "task", "add-context", "--task-id", "1001",
                "--enable-tools", ENABLE, "--disable-tools", DISABLE, "--wait-synced",
            )
            check(cli.returncode == 0, f"add-context failed ({cli.returncode}):\n{cli.stdout}{cli.stderr}")
            self.say("   " + cli.stdout.rstrip().replace("\n", "\n   "))
            try:
                await asyncio.wait_for(changed.wait(), timeout=30)
            except TimeoutError:
                raise StoryError(f"no notifications/tools/list_changed within 30s; proxy log:\n{self.proxy_log.read_text()}")
            elapsed = notified_at[0] - started
            self.figures["add_context_to_notification_ms"] = round(elapsed * 1000)
            swap = next((t for t, _, _ in proxy.swaps if t > started), None)
            if swap is not None:
                self.figures["configmap_swap_to_notification_ms"] = round((notified_at[0] - swap) * 1000)
            self.say(f"   notifications/tools/list_changed received {elapsed * 1000:.0f} ms after the command started")

            version_after = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)["status"].get("contextVersion")
            check(version_after == (version_before or 0) + 1, f"contextVersion {version_before} -> {version_after}")
            taskrun = self.json("get", "taskrun", "task-1001", "-n", self.work_ns)
            want = expected_tools(taskrun, catalog)
            before, seen = seen, sorted(t.name for t in (await client.list_tools()).tools)
            check(seen == want, f"after add-context the agent sees {seen}, expected {want}")
            check("everything__get-env" in seen and "everything__echo" not in seen, f"unexpected list {seen}")
            diff = [f"+{n}" for n in seen if n not in before] + [f"-{n}" for n in before if n not in seen]
            self.say(f"   tools/list ({len(seen)}), context version {version_before} -> {version_after}: {', '.join(diff)}")
            refused = await client.call_tool("everything__echo", {"message": "hello"})
            check(refused.is_error, "everything__echo was disabled but the call was not refused")
            self.say(f"   call everything__echo -> refused: {text_of(refused)}")
            result = await client.call_tool("everything__get-env", {})
            check(not result.is_error, f"everything__get-env was enabled but failed: {text_of(result)}")
            self.say("   call everything__get-env -> ok")

    def catalog(self) -> dict:
        """The catalog the operator uses: the chart's ConfigMap."""
        text = self.kubectl(
            "get", "configmap", "orchestrator-catalog", "-n", self.system_ns,
            "-o", "jsonpath={.data.catalog\\.yaml}",
        )
        return yaml.safe_load(text)

    def finish(self, pod: dict, proxy: ProxyContainer) -> None:
        self.say("\n== 6. the agent finishes; kwok completes the pod; the Job and the TaskRun succeed")
        name = pod["metadata"]["name"]
        self.kubectl("annotate", "pod", name, "-n", self.work_ns, f"{EXIT_ANNOTATION}=0")
        wait_until("the Job to complete", lambda: any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in self.json("get", "job", "task-1001", "-n", self.work_ns).get("status", {}).get("conditions", [])
        ), timeout=60)
        # The pod's main container finished: the kubelet stops the sidecar (TERM, then KILL).
        upstreams = proxy.descendants()
        code = proxy.stop()
        check(code == 0, f"the proxy exited with {code} on SIGTERM; log:\n{self.proxy_log.read_text()}")
        wait_until(
            f"the proxy's upstream processes {upstreams} to exit after it stopped",
            lambda: not [pid for pid in upstreams if alive(pid)],
            timeout=10,
        )
        self.say(f"   pod Succeeded; the sidecar stopped on SIGTERM (exit code {code}), "
                 f"and with it its {len(upstreams)} upstream processes")
        wait_until("the TaskRun to be Succeeded", lambda: self.json(
            "get", "taskrun", "task-1001", "-n", self.work_ns).get("status", {}).get("phase") == "Succeeded", timeout=60)
        self.say("   " + self.kubectl("get", "taskrun", "task-1001", "-n", self.work_ns).rstrip().replace("\n", "\n   "))
        self.kubectl("delete", "taskrun", "task-1001", "-n", self.work_ns)

        def children_gone():
            out = self.kubectl("get", "jobs,configmaps", "-n", self.work_ns, "-l", "orchestrator.io/taskrun=task-1001", "-o", "name")
            return out.strip() == ""

        wait_until("the Job and ConfigMap to be garbage-collected", children_gone, timeout=60)
        self.say("   kubectl delete taskrun task-1001: the Job and the ConfigMap are gone (owner references)")


if __name__ == "__main__":
    try:
        Story(system_ns="orchestrator-system", work_ns="team-a").run()
    except StoryError as e:
        print(f"\nstory failed: {e}", file=sys.stderr)
        sys.exit(1)
