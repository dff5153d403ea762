"""Shared-service mode against sidecar mode on the real node, in one sitting (docs/benchmarks.md,
"Shared-service mode (issue 31)").

    python e2e/story/bench_shared.py [--tasks 1,10,50] [--runs 3] [--calls 10] [--profile http|stdio]
                                     [--latency-rounds 4] [--changes 10] [--out FILE]
    python e2e/story/bench_shared.py --report FILE [FILE...]   # the tables of earlier runs, merged

One chart install with its shared proxy (2 replicas, shared_mode.shared_story) and one HTTP MCP
tools server on the host (the HTTP-only profile: the server is reached through the pods' portal
in both modes, so what differs is the proxy alone). The agents are idle Python scripts (the
image's Python, not Claude Code), driven with `kubectl exec` (shared_mode.PROBE).

1. Latency (--latency-rounds > 0): one sidecar task and one shared task at once.
   - Added per-call latency: --latency-rounds rounds, the two modes interleaved, each round 200
     `tools/call` round trips on one session after 20 warm-up calls (PROBE bench, timed in the
     agent's pod): the sidecar over the pod's loopback, shared over the ClusterIP Service
     (kube-proxy), the TokenReview cache warm. p50/p99.
   - Add-context latency: --changes samples per mode, interleaved, alternately enabling and
     disabling `tools:write`: the CLI's start (and its return) -> `notifications/tools/list_changed`
     on a session the agent's pod holds open (PROBE listen). p50/p95.
2. For each N of --tasks, each mode (the order alternating): N TaskRuns at once, their agents
   idle; each task connects and lists once (served); then
   - memory: PSS (/proc/<pid>/smaps_rollup) of every process of each container of the tasks'
     pods (the containers found by their containerd ids on the node), summed per container name;
     in shared mode plus the shared proxy replicas' PSS (they are measured before the tasks too,
     with no tenant);
   - idle CPU: the cgroup cpuacct.usage of the proxy containers (sidecar: every task's mcp-proxy
     container; shared: the replicas) over 20 s with nothing to do (the kubelet's exec probes
     run in those cgroups and count);
   - workload CPU, --runs times: every task connects, lists and makes --calls `tools/call`
     (10 tasks at a time), and the proxy containers' cpuacct.usage delta over it;
   - the TaskRuns are deleted and their pods waited out before the next phase.
   sidecar TaskRuns set spec.proxy.resources to a 10m CPU request (the default 50m would not fit
   50 pods on the 2 cores' allocatable; a request is no limit and changes no measured figure).
3. The crossover: each mode's proxy total fitted as a line over the measured N: sidecar
   a_s + s * N (a_s: the binary's pages the proxies share, which PSS splits among them), shared
   R + t * N (with the replicas' totals at 0 tenants); shared costs less from
   N > (R - a_s) / (s - t).

Prints the samples, Markdown tables and the machine's load at each phase; writes every figure as
JSON to --out. Needs the cluster with its real node and pod network (e2e/cluster up); hold
`flock /tmp/orch-e2e.lock` when the cluster is shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_mode import ALPHA_PORT, COMPONENT, PROBE, exec_agent, served, shared_story, taskrun  # noqa: E402
from story import Story, StoryError, descendants, pss_mib, wait_until  # noqa: E402

SERVER = "tools"
PHASE_LABEL = "bench.orchestrator.io/phase"
# The stdio profile: each task also has the everything server (Node.js), in its pod's zone
# container in both modes; the calls go to it.
STDIO = [{"name": "everything", "tools": {"allow": ["echo"]}}]
SIDECAR_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
IDLE_S = 20
PARALLEL = 10  # kubectl execs at a time (each is a kubectl, an API server stream and a runc exec)
BENCH_CALLS, BENCH_WARMUP = 200, 20


def machine(story: Story) -> dict:
    """Load average, available memory and the pods on the node, as the phase starts or ends."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    pods = story.json("get", "pods", "-A", "--field-selector", f"spec.nodeName={story.node}")["items"]
    return {"load": " ".join(load), "mem_available_gib": round(int(meminfo["MemAvailable"].split()[0]) / 2**20, 1),
            "node_pods": len(pods), "at": time.strftime("%H:%M:%S", time.gmtime())}


def anon_mib(pid: int) -> float:
    """The process's Pss_Anon (its heap and stacks; not the binary's file pages, which PSS
    splits among every process mapping them, the other mode's included)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_ns(pid: int) -> int:
    """The container's cgroup CPU time (cgroup v1 cpuacct.usage, v2 cpu.stat usage_usec), ns."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return int((Path("/sys/fs/cgroup") / controllers / path.lstrip("/") / "cpuacct.usage").read_text())
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            stat = (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat").read_text()
            return int(stat.split("usage_usec")[1].split()[0]) * 1000
    raise StoryError(f"no cpu accounting cgroup for pid {pid}")


def containers(story: Story, namespace: str, pods: set[str] | None, selector: str | None = None) -> list[tuple]:
    """(pod, container, pid) of the running containers of those pods (or of the selector's)."""
    tasks = story.ctr_tasks()
    items = story.json("get", "pods", "-n", namespace, *(["-l", selector] if selector else []))["items"]
    out = []
    for pod in items:
        if pods is not None and pod["metadata"]["name"] not in pods:
            continue
        for s in pod["status"].get("initContainerStatuses", []) + pod["status"].get("containerStatuses", []):
            cid = s.get("containerID", "").removeprefix("containerd://")
            if cid in tasks:
                out.append((pod["metadata"]["name"], s["name"], tasks[cid]))
    return out


def measure(story: Story, task_pods: set[str], mode: str) -> dict:
    """PSS (MiB) and CPU time (ms) per container name over the tasks' pods, and the proxy part:
    the tasks' mcp-proxy containers (sidecar) or the shared proxy's replicas (shared)."""
    found = containers(story, story.work_ns, task_pods)
    replicas = containers(story, story.system_ns, None, f"app.kubernetes.io/component={COMPONENT}")
    out: dict = {"pods_seen": len({p for p, _, _ in found}), "containers": {}}
    for _, name, pid in found:
        c = out["containers"].setdefault(name, {"pss": 0.0, "anon": 0.0, "cpu_ms": 0.0, "n": 0})
        c["pss"] += sum(pss_mib(p) for p in [pid, *descendants(pid)])
        c["anon"] += sum(anon_mib(p) for p in [pid, *descendants(pid)])
        c["cpu_ms"] += cpu_ns(pid) / 1e6
        c["n"] += 1
    out["replicas"] = {"pss": sum(pss_mib(p) for _, _, pid in replicas for p in [pid, *descendants(pid)]),
                       "anon": sum(anon_mib(p) for _, _, pid in replicas for p in [pid, *descendants(pid)]),
                       "cpu_ms": sum(cpu_ns(pid) / 1e6 for _, _, pid in replicas), "n": len(replicas)}
    proxy = out["replicas"] if mode == "shared" else out["containers"].get("mcp-proxy", {"pss": 0.0, "anon": 0.0,
                                                                                           "cpu_ms": 0.0})
    out["proxy_pss"], out["proxy_anon"], out["proxy_cpu_ms"] = proxy["pss"], proxy["anon"], proxy["cpu_ms"]
    out["agent_pss"] = out["containers"].get("agent", {}).get("pss", 0.0)
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Bench:
    def __init__(self, story: Story, args, say):
        self.story, self.args, self.say = story, args, say
        self.next_id = 5000

    def apply(self, names: list[str], mode: str, phase: str) -> None:
        items = []
        for name in names:
            self.next_id += 1
            tr = taskrun(name, self.next_id, SERVER, mode=mode, more=STDIO if self.args.profile == "stdio" else None)
            tr["metadata"]["labels"] = {PHASE_LABEL: phase}
            if mode == "sidecar":
                tr["spec"]["proxy"]["resources"] = SIDECAR_RESOURCES
            items.append(tr)
        self.story.kubectl("apply", "-n", self.story.work_ns, "-f", "-",
                           stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def running(self, names: list[str], timeout: float) -> dict[str, str]:
        """TaskRun name -> its pod's name, once every agent runs."""
        wanted = set(names)

        def all_running():
            pods = self.story.json("get", "pods", "-n", self.story.work_ns)["items"]
            out = {}
            for pod in pods:
                job = pod["metadata"].get("labels", {}).get("job-name")
                if job not in wanted:
                    continue
                self.story.fail_if_pod_failed(pod)
                agent = next((s for s in pod["status"].get("containerStatuses", []) if s["name"] == "agent"), {})
                if agent.get("state", {}).get("running"):
                    out[job] = pod["metadata"]["name"]
            return out if len(out) == len(wanted) else None

        return wait_until(f"{len(names)} agents to run", all_running, timeout=timeout, interval=1)

    def served_all(self, pods: dict[str, str]) -> None:
        def one(item):
            job, pod = item
            wait_until(f"{job} to be served", lambda: served(self.story, job, pod, []), timeout=120, interval=0.5)

        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(one, pods.items()))

    def delete(self, phase: str) -> None:
        self.story.kubectl("delete", "taskrun", "-n", self.story.work_ns, "-l", f"{PHASE_LABEL}={phase}", "--wait=false")
        wait_until(f"the pods of {phase} to be gone", lambda: not self.story.json(
            "get", "pods", "-n", self.story.work_ns)["items"], timeout=300, interval=1)

    def call(self, text: str) -> list:
        if self.args.profile == "stdio":
            return ["everything__echo", {"message": text}]
        return [f"{SERVER}__read", {"text": text}]

    def workload(self, pods: dict[str, str]) -> list[float]:
        """Every task connects, lists and makes --calls tools/call; each task's wall time (s)."""
        calls = [self.call(f"call {i}") for i in range(self.args.calls)]

        def one(pod):
            t = time.time()
            answer = exec_agent(self.story, pod, {"do": "tools", "calls": calls}, timeout=180)
            bad = [c for c in answer.get("calls", []) if "result" not in c]
            if len(answer.get("calls", [])) != len(calls) or bad:
                raise StoryError(f"{pod}: {answer}")
            return time.time() - t

        with ThreadPoolExecutor(PARALLEL) as pool:
            return list(pool.map(one, pods.values()))

    def phase(self, mode: str, n: int) -> dict:
        phase = f"{mode}-{n}"
        names = [f"b{n}-{mode[:2]}-{i}" for i in range(n)]
        out: dict = {"mode": mode, "tasks": n, "machine_before": machine(self.story)}
        out["base"] = measure(self.story, set(), mode)  # the replicas with no tenant of this phase
        applied = time.time()
        self.apply(names, mode, phase)
        pods = self.running(names, timeout=120 + 6 * n)
        out["apply_to_all_running_s"] = round(time.time() - applied, 1)
        self.served_all(pods)
        out["apply_to_all_served_s"] = round(time.time() - applied, 1)
        task_pods = set(pods.values())
        idle0 = measure(self.story, task_pods, mode)
        time.sleep(IDLE_S)
        idle1 = measure(self.story, task_pods, mode)
        if idle1["pods_seen"] != n:
            raise StoryError(f"{phase}: found {idle1['pods_seen']} of {n} pods' containers on the node")
        out["idle"] = idle1
        out["idle_proxy_cpu_ms_per_s"] = (idle1["proxy_cpu_ms"] - idle0["proxy_cpu_ms"]) / IDLE_S
        out["runs"] = []
        for _ in range(self.args.runs):
            c0, t0 = measure(self.story, task_pods, mode), time.time()
            walls = self.workload(pods)
            c1, t1 = measure(self.story, task_pods, mode), time.time()
            raw = c1["proxy_cpu_ms"] - c0["proxy_cpu_ms"]
            out["runs"].append({"proxy_cpu_ms": raw, "seconds": t1 - t0,
                                "proxy_cpu_ms_minus_idle": raw - out["idle_proxy_cpu_ms_per_s"] * (t1 - t0),
                                "task_wall_s_median": statistics.median(walls)})
        out["after"] = measure(self.story, task_pods, mode)
        out["machine_after"] = machine(self.story)
        self.delete(phase)
        self.say(summary(out, self.args.calls))
        return out

    def latency(self) -> dict:
        names = {"sidecar": "lat-sidecar", "shared": "lat-shared"}
        for mode, name in names.items():
            self.apply([name], mode, "latency")
        pods = self.running(list(names.values()), timeout=180)
        self.served_all(pods)
        out: dict = {"machine_before": machine(self.story), "calls_ms": {"sidecar": [], "shared": []},
                     "round_p50_ms": {"sidecar": [], "shared": []},
                     "add_context": {"sidecar": [], "shared": []}}
        for r in range(self.args.latency_rounds):
            for mode in (("sidecar", "shared") if r % 2 == 0 else ("shared", "sidecar")):
                ms = exec_agent(self.story, pods[names[mode]], {"do": "bench", "call": self.call("x"),
                                                                "warmup": BENCH_WARMUP, "calls": BENCH_CALLS}, timeout=300)["ms"]
                out["calls_ms"][mode] += ms
                out["round_p50_ms"][mode].append(statistics.median(ms))
                self.say(f"  calls round {r} {mode}: p50 {statistics.median(ms):.2f} ms p99 {quantile(ms, 0.99):.2f} ms")
        for i in range(self.args.changes):
            for mode in (("sidecar", "shared") if i % 2 == 0 else ("shared", "sidecar")):
                sample = self.add_context(names[mode], pods[names[mode]], enable=i % 2 == 0)
                out["add_context"][mode].append(sample)
                self.say(f"  add-context {i} {mode}: {sample['from_start']:.3f} s from the CLI's start, "
                         f"{sample['from_return']:.3f} s after its return")
        out["machine_after"] = machine(self.story)
        self.delete("latency")
        return out

    def add_context(self, name: str, pod: str, enable: bool) -> dict:
        story = self.story
        listener = subprocess.Popen(
            [str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "exec", "-n", story.work_ns, pod,
             "-c", "agent", "--", "python3", "-c", PROBE, json.dumps({"do": "listen", "timeout": 60})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = listener.stdout.readline()
            if "listening" not in line:
                raise StoryError(f"the listener in {pod} did not start: {line} {listener.communicate(timeout=30)}")
            asked = time.time()
            done = story.cli("task", "add-context", name, "--enable-tools" if enable else "--disable-tools",
                             f"{SERVER}:write")
            returned = time.time()
            if done.returncode != 0:
                raise StoryError(f"add-context {name}: {done.stderr}")
            stdout, stderr = listener.communicate(timeout=60)
        finally:
            listener.kill()
        told = json.loads(stdout.strip().splitlines()[-1])
        if "list_changed_at" not in told:
            raise StoryError(f"no list_changed in {pod}: {stdout} {stderr}")
        return {"from_start": told["list_changed_at"] - asked, "from_return": told["list_changed_at"] - returned}


def summary(p: dict, calls: int) -> str:
    n, idle = p["tasks"], p["idle"]
    cpu = statistics.median(r["proxy_cpu_ms"] for r in p["runs"]) if p["runs"] else 0
    return (f"  {p['mode']} x{n}: running {p['apply_to_all_running_s']} s, served {p['apply_to_all_served_s']} s; "
            f"proxy PSS {idle['proxy_pss']:.1f} MiB ({idle['proxy_pss'] / n:.2f}/task), agent PSS "
            f"{idle['agent_pss'] / n:.2f}/task, replicas base {p['base']['replicas']['pss']:.1f} MiB; idle proxy CPU "
            f"{p['idle_proxy_cpu_ms_per_s']:.1f} ms/s; workload ({calls} calls/task) proxy CPU {cpu:.0f} ms "
            f"({cpu / n:.1f}/task); load {p['machine_before']['load']} -> {p['machine_after']['load']}")


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def crossover(phases: list[dict]) -> dict:
    """Each mode's total as a line fitted to its measured totals: sidecar a_s + s N (its
    intercept is the binary's pages the proxies share, which PSS splits among them), shared
    R + t N (with the replicas' totals at 0 tenants too); shared costs less from
    N > (R - a_s) / (s - t). Workload CPU has no fixed part: per task, each mode's mean."""
    side = [p for p in phases if p["mode"] == "sidecar"]
    shared = [p for p in phases if p["mode"] == "shared"]
    if not side or not shared:
        return {}
    out = {}
    figures = {
        "memory_mib": (lambda p: p["idle"]["proxy_pss"], lambda p: p["base"]["replicas"]["pss"]),
        "memory_after_calls_mib": (lambda p: p["after"]["proxy_pss"], lambda p: p["base"]["replicas"]["pss"]),
        "anon_memory_mib": (lambda p: p["idle"].get("proxy_anon", 0.0), lambda p: p["base"]["replicas"].get("anon", 0.0)),
        "anon_memory_after_calls_mib": (lambda p: p["after"].get("proxy_anon", 0.0),
                                        lambda p: p["base"]["replicas"].get("anon", 0.0)),
        "idle_cpu_ms_per_s": (lambda p: p["idle_proxy_cpu_ms_per_s"], None),
        "workload_cpu_ms": (lambda p: statistics.median(r["proxy_cpu_ms_minus_idle"] for r in p["runs"]), None),
    }

    def line(points):
        return fit(points) if len({x for x, _ in points}) > 1 else (0.0, points[0][1] / points[0][0])

    for key, (value, base) in figures.items():
        if key == "workload_cpu_ms":
            a_s, s = 0.0, statistics.fmean(value(p) / p["tasks"] for p in side)
            a, t = 0.0, statistics.fmean(value(p) / p["tasks"] for p in shared)
        else:
            a_s, s = line([(p["tasks"], value(p)) for p in side])
            points = [(p["tasks"], value(p)) for p in shared] + ([(0, base(p)) for p in shared] if base else [])
            a, t = fit(points) if len({x for x, _ in points}) > 1 else (points[0][1], 0.0)
        out[key] = {"sidecar_fixed": a_s, "sidecar_per_task": s, "shared_fixed": a, "shared_per_task": t,
                    "crossover_tasks": ((a - a_s) / (s - t)) if s > t else None}
    return out


def tables(result: dict, calls: int) -> str:
    lines = []
    lat = result.get("latency")
    if lat:
        lines += ["| per call (tools/call round trip, ms) | sidecar (loopback) | shared (ClusterIP) |", "|---|---|---|"]
        for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            lines.append(f"| {label} (n={len(lat['calls_ms']['sidecar'])}) | {quantile(lat['calls_ms']['sidecar'], q):.2f} "
                         f"| {quantile(lat['calls_ms']['shared'], q):.2f} |")
        lines.append("| each round's p50 | " + " | ".join(", ".join(f"{v:.2f}" for v in lat["round_p50_ms"][m])
                                                      for m in ("sidecar", "shared")) + " |")
        lines += ["", "| add-context -> list_changed (s) | sidecar | shared |", "|---|---|---|"]
        for field in ("from_start", "from_return"):
            for label, q in (("p50", 0.5), ("p95", 0.95)):
                vals = {m: [s[field] for s in lat["add_context"][m]] for m in ("sidecar", "shared")}
                lines.append(f"| {field.replace('_', ' ')} {label} (n={len(vals['sidecar'])}) | "
                             f"{quantile(vals['sidecar'], q):.3f} | {quantile(vals['shared'], q):.3f} |")
        lines.append("")
    lines += [f"| tasks, mode | proxy PSS total / per task (MiB) | after the calls | agent PSS per task | "
              f"zone containers PSS per task (after the calls) | replicas with 0 tasks | idle proxy CPU (ms/s) | "
              f"workload proxy CPU total / per task (ms, {calls} calls) | apply -> all served (s) | "
              "load before -> after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["phases"]:
        n, idle = p["tasks"], p["idle"]
        cpu = statistics.median(r["proxy_cpu_ms_minus_idle"] for r in p["runs"]) if p["runs"] else 0
        after = p["after"]
        zones = sum(c["pss"] for name, c in after["containers"].items() if name not in ("agent", "mcp-proxy"))
        lines.append(f"| {n} {p['mode']} | {idle['proxy_pss']:.1f} / {idle['proxy_pss'] / n:.2f} | "
                     f"{after['proxy_pss']:.1f} / {after['proxy_pss'] / n:.2f} (anon {after.get('proxy_anon', 0) / n:.2f}) | "
                     f"{idle['agent_pss'] / n:.2f} | {zones / n:.2f} | {p['base']['replicas']['pss']:.1f} | "
                     f"{p['idle_proxy_cpu_ms_per_s']:.1f} | {cpu:.0f} / {cpu / n:.1f} | {p['apply_to_all_served_s']} | "
                     f"{p['machine_before']['load']} -> {p['machine_after']['load']} |")
    cross = result.get("crossover") or {}
    if cross:
        lines += ["", "| figure (fitted lines) | sidecar fixed + per task | shared fixed + per task | "
                  "shared cheaper from N > |", "|---|---|---|---|"]
        for key, c in cross.items():
            at = c["crossover_tasks"]
            at = "never" if at is None else "any N" if at <= 0 else f"{at:.1f}"
            lines.append(f"| {key} | {c['sidecar_fixed']:.2f} + {c['sidecar_per_task']:.2f} N | "
                         f"{c['shared_fixed']:.2f} + {c['shared_per_task']:.2f} N | {at} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="1,10,50", help="comma-separated concurrent task counts")
    parser.add_argument("--runs", type=int, default=3, help="workload runs per phase (their median)")
    parser.add_argument("--calls", type=int, default=10, help="tools/call per task per workload run")
    parser.add_argument("--latency-rounds", type=int, default=4, help="rounds of 200 calls per mode; 0: skip")
    parser.add_argument("--changes", type=int, default=10, help="add-context samples per mode")
    parser.add_argument("--profile", choices=("http", "stdio"), default="http",
                        help="http: one HTTP server on the host; stdio: also the everything server in each pod's zone")
    parser.add_argument("--out", default=None, help="JSON file for every figure")
    parser.add_argument("--report", nargs="+", metavar="JSON", default=None,
                        help="no run: the tables of earlier runs' --out files, their phases merged")
    args = parser.parse_args()
    if args.report:
        runs = [json.loads(Path(f).read_text()) for f in args.report]
        merged: dict = {"phases": [p for r in runs for p in r["phases"]], "latency": None}
        for r in runs:  # the latency samples of every run, pooled
            lat = r.get("latency")
            if not lat:
                continue
            if merged["latency"] is None:
                merged["latency"] = json.loads(json.dumps(lat))
                continue
            for key in ("calls_ms", "round_p50_ms", "add_context"):
                for mode in ("sidecar", "shared"):
                    merged["latency"][key][mode] += lat[key][mode]
        merged["crossover"] = crossover(merged["phases"])
        print(tables(merged, runs[0]["args"]["calls"]))
        return 0
    counts = [int(x) for x in args.tasks.split(",") if x.strip()]
    say = lambda *a: print(*a, flush=True)  # noqa: E731
    result: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "args": vars(args), "phases": []}
    try:
        with ExitStack() as cleanup:
            records = Path(tempfile.mkdtemp(prefix="bench-shared-"))
            cleanup.callback(lambda: subprocess.run(["rm", "-rf", str(records)]))
            story = shared_story(cleanup, records, [(SERVER, ALPHA_PORT)])
            bench = Bench(story, args, say)
            result["machine_start"] = machine(story)
            say(f"installed: {result['machine_start']}")
            if args.latency_rounds > 0:
                say("latency: one sidecar task, one shared task")
                result["latency"] = bench.latency()
            for i, n in enumerate(counts):
                for mode in (("sidecar", "shared") if i % 2 == 0 else ("shared", "sidecar")):
                    result["phases"].append(bench.phase(mode, n))
            result["crossover"] = crossover(result["phases"])
            result["machine_end"] = machine(story)
    except AssertionError as e:  # StoryError, and exec_agent's failed exec
        print(f"\nbench failed: {e}", file=sys.stderr)
        return 1
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    say("\n" + tables(result, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
