"""The task pod's two processes on this machine: the proxy binary with the sample TaskRun's rendered
proxy.yaml, and the real Claude Code (the agent image's binary) run with the agent container's
rendered command, env and files, against the scripted model stand-in (e2e/model/scripted_model.py).

Used by the host tests of the real agent (e2e/tests/python/test_claude_code.py) and by
e2e/story/tool_bytes.py. What differs from the pod, and only that: file paths (a temp dir instead
of the ConfigMap volume), the proxy's port (a free one), the proxy's cache directory and audit
file (so a test can restart the proxy with a warm cache and read its audit lines), and the model
URL (the stand-in), and where the agent's credential lives (a directory of the run's, setgid to
the pod's group as the pod's volume is, instead of the memory-backed volume; the rendered
headersHelper is given the host proxy's port and uid). The render snapshots are what the
operator's unit tests pin, so these are the bytes a pod gets.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e" / "model"))

from scripted_model import ScriptedModel  # noqa: E402

SNAPSHOTS = REPO / "operator/src/render/snapshots"
CONFIG_MAP = SNAPSHOTS / "orchestrator_operator__render__tests__sample_config_map_snapshot.snap"
JOB = SNAPSHOTS / "orchestrator_operator__render__tests__sample_job_snapshot.snap"
# The agent image's environment (e2e/images/build, `agent`): no update checks, no telemetry.
IMAGE_ENV = {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
# The uid:gid the images run as (e2e/images/build, Dockerfile): Claude Code refuses
# `bypassPermissions` as root, and the pod never runs it as root.
POD_USER = 65532


def _snapshot(path: Path) -> dict:
    """An insta snapshot's YAML document (after its `---` header)."""
    return yaml.safe_load(path.read_text().split("---\n", 2)[2])


def rendered_files() -> dict[str, str]:
    """The sample TaskRun's ConfigMap data (proxy.yaml, mcp-config.json, settings.json, task.md)."""
    return _snapshot(CONFIG_MAP)["data"]


def agent_container() -> dict:
    """The sample Job's agent container (command and env as rendered)."""
    pod = _snapshot(JOB)["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "agent")


def zone_containers() -> dict[str, dict]:
    """The sample Job's server containers (`zone-<server>`), by server name."""
    pod = _snapshot(JOB)["spec"]["template"]["spec"]
    return {c["name"].removeprefix("zone-"): c for c in pod["initContainers"] if c["name"].startswith("zone-")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def claude_bin() -> str:
    """$CLAUDE_BIN, or the agent image's Claude Code binary (`e2e/images/build claude-bin`: the
    pinned version, from the image's cached layer or npm)."""
    if os.environ.get("CLAUDE_BIN"):
        return os.environ["CLAUDE_BIN"]
    out = subprocess.run([str(REPO / "e2e/images/build"), "claude-bin"], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def proxy_bin() -> str:
    """$MCP_PROXY_BIN, or the build the proxy image carries (built if missing): the release build,
    or with ORCH_IMAGES_TEST_BUILD=1 (./test) the build `cargo test --workspace` makes."""
    if os.environ.get("MCP_PROXY_BIN"):
        return os.environ["MCP_PROXY_BIN"]
    if os.environ.get("ORCH_IMAGES_TEST_BUILD") == "1":
        from story import cargo_binaries

        return str(cargo_binaries()["orchestrator-mcp-proxy"])
    env = dict(os.environ)
    if not env.get("CARGO_TARGET_DIR"):
        env["CARGO_TARGET_DIR"] = subprocess.run([str(REPO / "scripts/target-dir")], check=True,
                                                 capture_output=True, text=True).stdout.strip()
    out = subprocess.run(["cargo", "build", "-q", "--release", "--locked", "-p", "orchestrator-mcp-proxy",
                          "--message-format", "json"], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "orchestrator-mcp-proxy":
            return msg["executable"]
    raise RuntimeError("cargo built no orchestrator-mcp-proxy")


@functools.cache
def agent_helper_bin() -> str:
    """$AGENT_HELPER_BIN, or the orchestrator-agent the e2e agent images carry (e2e/images/build's
    layer_helper: the build `cargo test --workspace` makes; a no-op when up to date)."""
    if os.environ.get("AGENT_HELPER_BIN"):
        return os.environ["AGENT_HELPER_BIN"]
    from story import cargo_binaries  # the workspace's binaries as `cargo test --workspace` builds them

    return str(cargo_binaries()["orchestrator-agent"])


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (the proxy's upstream servers and their children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


@dataclass
class HostProxy:
    """orchestrator-mcp-proxy running the rendered proxy.yaml on a free port, requiring the
    agent's credential it writes to `token_file` (as the operator runs it)."""

    process: subprocess.Popen
    port: int
    work: Path
    audit: Path
    token_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def headers(self) -> dict:
        """The agent's credential as a header (what its headersHelper prints)."""
        return {"Authorization": "Bearer " + self.token_file.read_text().strip()}

    def _get(self, path: str) -> bytes:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=self.headers)
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.read()

    def metrics(self) -> str:
        return self._get("/metrics").decode()

    def starts(self) -> dict[tuple[str, str], int]:
        """(server, reason) -> upstream starts so far (mcp_proxy_upstream_starts_total)."""
        out = {}
        for m in re.finditer(r'^mcp_proxy_upstream_starts_total\{([^}]*)\} (\d+)', self.metrics(), re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels.get("server", ""), labels.get("reason", ""))] = int(m.group(2))
        return out

    def status(self) -> dict:
        """`GET /tools`: each server's state (running/stopped/failed) and its tools' verdicts."""
        return json.loads(self._get("/tools"))

    def running(self) -> list[str]:
        return [s["name"] for s in self.status()["servers"] if s["state"] == "running"]

    def exposed(self) -> list[str]:
        return sorted(t["exposedAs"] for s in self.status()["servers"] for t in s["tools"] if t.get("exposedAs"))

    zones: list[subprocess.Popen] = field(default_factory=list)

    def upstream_processes(self) -> list[int]:
        """The servers' processes: under each server's zone launcher (as in the pod's server
        containers), and any the proxy started itself."""
        return [p for root in [self.process, *self.zones] for p in descendants(root.pid)]

    def audit_records(self) -> list[dict]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line.strip()]


@contextmanager
def host_proxy(work: Path, cache_dir: Path | None, name: str = "proxy",
               policy: dict | None = None, gateway: dict | None = None,
               audit_arguments: bool = False) -> Iterator[HostProxy]:
    """The proxy with the sample's rendered proxy.yaml, on a free port, its audit in a file; the
    memory server's file under `work`; `policy` entries set over the rendered ones (e.g.
    `{"toolMode": "intent"}`); `gateway` as the proxy config's (the model gateway, as a TaskRun
    with spec.model renders it). Stopped with SIGTERM (as the kubelet stops the sidecar)."""
    cfg = yaml.safe_load(rendered_files()["proxy.yaml"])
    if policy:
        cfg["policy"] = {**cfg.get("policy", {}), **policy}
    if gateway:
        cfg["gateway"] = gateway
    port = free_port()
    cfg["listen"] = f"127.0.0.1:{port}"
    audit = work / f"{name}-audit.jsonl"
    cfg["audit"] = {"path": str(audit), **({"includeArguments": True} if audit_arguments else {})}
    # Each stdio server as the pod runs it: `orchestrator-mcp-proxy zone` with its container's
    # rendered command and env, on a socket the proxy config names (here under `work`).
    zones = []
    containers = zone_containers()
    log = open(work / f"{name}.log", "w")
    for s in cfg["servers"]:
        stdio = s.get("stdio") or {}
        if not stdio.get("socket"):
            continue
        container = containers[s["name"]]
        # One path per server whichever proxy runs (the socket is part of the server's spec
        # hash, so a restarted proxy finds its cached tool lists, as in a pod).
        sock = work / "zones" / s["name"] / "mcp.sock"
        sock.parent.mkdir(parents=True, exist_ok=True)
        stdio["socket"] = str(sock)
        # The zone runs here as this process's uid, not the pod's (the proxy holds it to it).
        stdio["zoneUid"] = os.getuid()
        command = container["command"]
        server_command = command[command.index("--") + 1:]
        env = {"PATH": os.environ["PATH"], "HOME": str(work)}
        env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e and e["name"] not in ("PATH", "HOME")})
        if "MEMORY_FILE_PATH" in env:
            env["MEMORY_FILE_PATH"] = str(work / "memory.jsonl")
        zones.append(subprocess.Popen(
            [proxy_bin(), "zone", "--socket", str(sock), "--server", s["name"], "--", *server_command],
            env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT))
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    # The agent's credential: the proxy writes it (0640) into a directory of the pod's group,
    # setgid as the pod's fsGroup volume is, so the agent's uid reads it and no one else does.
    credential = work / f"{name}-credential"
    credential.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        os.chown(credential, 0, POD_USER)
    os.chmod(credential, 0o2750)
    token_file = credential / "token"
    cmd = [proxy_bin(), "--config", str(config), "--cache-dir", str(cache_dir) if cache_dir else "",
           "--client-token-file", str(token_file)]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proxy = HostProxy(process, port, work, audit, token_file, zones)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                proxy.metrics()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the proxy did not come up; see {work / (name + '.log')}")
                time.sleep(0.05)
        yield proxy
    finally:
        for p in [process, *zones]:  # the proxy first, as the kubelet stops the sidecars
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        log.close()


@dataclass
class AgentRun:
    returncode: int
    stdout: str
    stderr: str
    home: Path = field(default_factory=Path)


def _as_pod_user() -> dict:
    """Run as the pod's uid when we are root (Claude Code refuses bypassPermissions as root)."""
    if os.geteuid() != 0:
        return {}
    return {"user": POD_USER, "group": POD_USER, "extra_groups": []}


def run_claude(model: ScriptedModel, proxy: HostProxy | str, work: Path, *, mcp_config: dict | None = None,
               settings: dict | None = None, env: dict | None = None, as_pod_user: bool = True,
               timeout: float = 180, through_gateway: bool = False) -> AgentRun:
    """The agent container's rendered command (`sh -c "exec claude -p ... < task.md"`) with its
    rendered env, the rendered files at host paths (mcp-config.json pointed at the proxy's URL,
    its headersHelper given the host proxy's port, uid and token file), as the pod's uid when run
    by root (unless `as_pod_user` is false). `mcp_config` / `settings` replace the rendered ones;
    a plain URL for `proxy` means a server that takes no credential. `through_gateway`: as a
    TaskRun with spec.model renders the agent: its base URL the proxy's /model, no model key in
    its env, and settings' apiKeyHelper the rendered model-key.sh (the proxy's port check, then
    the agent's credential)."""
    proxy_url = proxy if isinstance(proxy, str) else proxy.url
    files = rendered_files()
    container = agent_container()
    home = Path(tempfile.mkdtemp(prefix="agent-", dir=work))
    bin_dir, tools, task, workspace = home / "bin", home / "tools", home / "task", home / "workspace"
    for d in (bin_dir, tools, task, workspace):
        d.mkdir()
    claude = bin_dir / "claude"
    source = claude_bin()
    try:
        os.link(source, claude)  # same file, reachable for the pod's uid (its home is not)
    except OSError:
        shutil.copy2(source, claude)
    # The agent image's result reader, which the rendered script runs at the end.
    shutil.copy2(agent_helper_bin(), bin_dir / "orchestrator-agent")
    mcp = mcp_config if mcp_config is not None else json.loads(files["mcp-config.json"])
    if mcp_config is None:
        server = mcp["mcpServers"]["orchestrator"]
        server["url"] = proxy_url
        if isinstance(proxy, HostProxy):
            # The rendered headersHelper, with the host proxy's port and uid (the pod's: 8080 and
            # the proxy container's 65533) and its path here.
            script = files["mcp-headers.sh"]
            script = re.sub(r"^port=\d+ uid=\d+", f"port={proxy.port} uid={os.geteuid()}", script, count=1, flags=re.M)
            (tools / "mcp-headers.sh").write_text(script)
            server["headersHelper"] = server["headersHelper"].replace("/etc/orchestrator/tools", str(tools))
        else:
            server.pop("headersHelper", None)
    (tools / "mcp-config.json").write_text(json.dumps(mcp))
    settings = dict(settings if settings is not None else json.loads(files["settings.json"]))
    if through_gateway:
        assert isinstance(proxy, HostProxy), "the gateway is the host proxy's"
        # model-key.sh as the operator renders it (render/model.rs: the headers helper's port
        # check, then the token), with the host proxy's port and uid.
        check = (tools / "mcp-headers.sh").read_text().rsplit("printf '{", 1)[0]
        (tools / "model-key.sh").write_text(check + 'cat "$token"\n')
        settings["apiKeyHelper"] = f"sh {tools / 'model-key.sh'}"
    else:
        # Straight to the model with the stand-in's key (below): no key helper (the sample's
        # rendered one prints the pod's credential, for its proxy's gateway).
        settings.pop("apiKeyHelper", None)
    (tools / "settings.json").write_text(json.dumps(settings))
    (task / "task.md").write_text(files["task.md"])
    paths = {"/etc/orchestrator/tools": str(tools), "/etc/orchestrator/task": str(task), "/tmp": str(home)}
    run_env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", **IMAGE_ENV}
    for e in container.get("env", []):
        if "value" in e:
            value = e["value"]
            for pod_path, host_path in paths.items():
                if value == pod_path or value.startswith(pod_path + "/"):
                    value = host_path + value[len(pod_path):]
                    break
            run_env[e["name"]] = value
    run_env["ORCHESTRATOR_MCP_URL"] = proxy_url
    if isinstance(proxy, HostProxy):
        run_env["ORCHESTRATOR_MCP_TOKEN_FILE"] = str(proxy.token_file)
    else:
        run_env.pop("ORCHESTRATOR_MCP_TOKEN_FILE", None)
    # Each run writes only below its own home: its temporary files (the agent script's, Claude
    # Code's) and its termination log, never the host's /tmp names or /dev/termination-log, which
    # a run as another uid could not write after this one.
    run_env["TMPDIR"] = str(home / "tmp")
    (home / "tmp").mkdir()
    run_env["ORCHESTRATOR_TERMINATION_LOG"] = str(home / "termination-log")
    if through_gateway:
        run_env.pop("ANTHROPIC_API_KEY", None)
        run_env["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{proxy.port}/model"
    else:
        run_env["ANTHROPIC_API_KEY"] = "sk-ant-stand-in"  # the stand-in takes any key
        run_env["ANTHROPIC_BASE_URL"] = model.url
    run_env.update(env or {})
    user = _as_pod_user() if as_pod_user else {}
    if user:
        # `work` must be reachable for that uid (e.g. a tempfile.mkdtemp() under /tmp, mode 0755).
        for p in [home, *home.rglob("*")]:
            if p != claude:  # the binary stays root's (a hard link to the cached file)
                os.chown(p, POD_USER, POD_USER)
    done = subprocess.run(container["command"], env=run_env, cwd=workspace, capture_output=True, text=True,
                          timeout=timeout, **user)
    return AgentRun(done.returncode, done.stdout, done.stderr, home)
