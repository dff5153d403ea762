"""Every agent runtime on the real node (issue 43): Codex CLI, Gemini CLI and OpenCode, each in its
own image (e2e/images/build agent-codex, agent-gemini, agent-opencode), run by the operator with
the config it renders for that runtime, against a scripted model API of the runtime's provider
(the Responses API for Codex, the Gemini API for Gemini CLI, the Messages API for OpenCode; HTTPS
with its own CA, as a private endpoint is), through the task's proxy: its MCP server and its model
gateway.

For each runtime, what a platform team would check:
- connecting and listing starts no server (the proxy's log at the runtime's first model request,
  whose answer makes the first call); that call starts its server;
- the model is offered exactly the TaskRun's allowed MCP tools, and none of a disabled server;
- the built-in shell the TaskRun denies (`Bash`) is not offered (each runtime's own name for it);
- the allowed MCP call goes through the proxy and is in its audit, from the agent's client;
- a tool granted with `orchestrator-cli task add-context` reaches the model's next request (the
  time from the CLI's start is measured and printed);
- the model key is only in the proxy: the agent's container names no Secret, none of its
  processes has the key in its environment or command line, and the model API gets the key on
  every request (never the agent's credential);
- the TaskRun succeeds with the runtime's result (its final text) and `status.usage` equal to the
  stand-in's own count of tokens and requests.

Needs the cluster with its real node (e2e/cluster up). The three images are imported once for the
module (cached after the first build).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scripted_gemini import ScriptedGemini
from scripted_model import ScriptedModel, text, tls_pair, tool_result_text, tool_use
from scripted_responses import ScriptedResponses
from story import MODEL_PORT, NODE_SOCK, REAL_NODE, REPO, Story, StoryError, check, expected_tools, wait_until

PORT = MODEL_PORT + 8  # the pods reach MODEL_PORT .. +9 (e2e/node/node); one runtime at a time
OFFERED_WITHIN_S = 30  # add-context -> the model offered the new tool, at most (the figure is printed)


@dataclass
class Runtime:
    name: str  # spec.agent.runtime
    image: str  # e2e/images/build's name
    chart_key: str  # agent.images.<key>
    model: str  # spec.agent.model
    server: type  # the scripted model API
    shell: str  # the runtime's own name for Bash
    key_header: str  # where the gateway puts the key
    options: dict = field(default_factory=dict)
    # How the runtime names a tool to the model: Codex keeps only [A-Za-z0-9_] (get-sum: get_sum)
    # and calls the MCP tool by its own name.
    sanitized: bool = False

    def named(self, tool: str) -> str:
        return re.sub(r"[^A-Za-z0-9_]", "_", tool) if self.sanitized else tool

    def key_seen(self, request) -> str:
        value = request.headers.get(self.key_header, "")
        return value.removeprefix("Bearer ") if self.key_header == "authorization" else value


RUNTIMES = [
    # A model name Codex has no built-in metadata for: it offers MCP tools directly. With one of
    # its catalog models (gpt-5.5, and names it takes for one: gpt-5.5-scripted) it offers its
    # tool_search instead, which finds them (docs/api.md says so).
    Runtime("codex", "agent-codex", "codex", "stand-in-model", ScriptedResponses, "exec_command", "authorization",
            sanitized=True),
    Runtime("gemini-cli", "agent-gemini", "geminiCli", "gemini-2.5-pro", ScriptedGemini, "run_shell_command",
            "x-goog-api-key"),
    Runtime("opencode", "agent-opencode", "opencode", "claude-sonnet-4-5", ScriptedModel, "bash", "x-api-key",
            {"mcp_prefix": "{server}_"}),
]


def import_images() -> dict[str, str]:
    """name -> ref of the runtimes' images, built (cached) and imported into the node's containerd."""
    out = subprocess.run([REPO / "e2e/images/build", "import", "--address", str(NODE_SOCK),
                          *(r.image for r in RUNTIMES)], capture_output=True, text=True)
    check(out.returncode == 0, f"e2e/images/build import failed:\n{out.stderr[-3000:]}")
    refs = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            refs[parts[0]] = parts[1]
    return refs


@pytest.fixture(scope="module")
def chart_values():
    refs = import_images()
    return [f"agent.images.{r.chart_key}={refs[r.image]}" for r in RUNTIMES]


@pytest.fixture(scope="module")
def story(story):
    story.tls = tls_pair(story.workdir / "model-tls")
    ca = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "model-ca"},
          "data": {"ca.crt": Path(story.tls[0]).read_text()}}
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(ca))
    return story


class Script:
    """The model's side: call the allowed tool, keep the agent busy until the granted tool is
    offered, call it, answer."""

    def __init__(self, runtime: Runtime, want_before: list[str], starts=None):
        self.named = runtime.named
        self.starts = starts  # the servers the proxy has started (story.server_starts), or None
        self.want_before = [runtime.named(t) for t in want_before]
        self.granted = threading.Event()
        self.called = threading.Event()
        self.seen: dict = {}

    def __call__(self, first):
        self.seen["first"] = first
        # The runtime has connected and listed (its first request offers the tools); its first
        # call is only in the answer to come: no server may have started yet (lazy start).
        self.seen["started_at_connect"] = self.starts() if self.starts else {}
        r = yield tool_use(first.mcp_name(self.named("everything__get-sum")), {"a": 2, "b": 3})
        self.seen["sum"] = tool_result_text(r)
        self.called.set()
        n = 0
        deadline = time.monotonic() + OFFERED_WITHIN_S + 60
        while not ("everything__echo" in r.mcp_tools() and self.granted.is_set()):
            check(time.monotonic() < deadline, f"echo never offered after add-context: {r.mcp_tools()}")
            n += 1
            r = yield tool_use(first.mcp_name(self.named("everything__get-sum")), {"a": n, "b": 1}).after(0.5)
        self.seen["offered"] = r
        self.seen["busy_calls"] = n
        r = yield tool_use(first.mcp_name("everything__echo"), {"message": "granted"})
        self.seen["echo"] = tool_result_text(r)
        yield text("Done: 2 + 3 = 5, and echo answered.")


# Gemini CLI reads system settings only through directories that are root's and writable by no
# other uid (the ConfigMap's mount is group-writable under the pod's fsGroup): the agent-gemini
# image holds the operator's settings as /etc/gemini-cli/settings.json, and the script checks that
# they are the ConfigMap's copy.
CASES = [pytest.param(r, id=r.name) for r in RUNTIMES]


@pytest.mark.parametrize("runtime", CASES)
def test_the_runtime_gets_exactly_its_tools_through_the_proxy_and_its_key_stays_in_the_proxy(story: Story, runtime: Runtime):
    name = f"rt-{runtime.name}"
    key = f"sk-{runtime.name}-stand-in-{secrets.token_hex(12)}"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"model-{runtime.name}"},
              "stringData": {"api-key": key}}
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(secret))
    taskrun = {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name},
        "spec": {
            "taskId": 4300 + RUNTIMES.index(runtime), "serviceName": "runtimes",
            "task": {"prompt": "Add 2 and 3 with get-sum, then echo once you may."},
            "agent": {"runtime": runtime.name, "model": runtime.model},
            "model": {"secretKeyRef": {"name": f"model-{runtime.name}", "key": "api-key"},
                      "endpoint": f"https://127.0.0.1:{PORT}",
                      "caConfigMapKeyRef": {"name": "model-ca", "key": "ca.crt"}},
            "podTemplate": {
                "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1],
                                 "effect": "NoSchedule"}],
            },
            "activeDeadlineSeconds": 600,
            "toolConfig": {
                "internalTools": {"permissions": {"allow": ["*"], "deny": ["Bash"]}},
                "mcpServers": [
                    {"name": "everything", "tools": {"allow": ["get-sum"]}},
                    {"name": "memory", "enabled": False},
                ],
            },
        },
    }
    allowed = expected_tools(taskrun, story.catalog())
    check(allowed == ["everything__get-sum"], f"the TaskRun allows {allowed}")
    script = Script(runtime, allowed, starts=lambda: story.server_starts(
        story.json("get", "pods", "-n", story.work_ns, "-l", f"job-name={name}")["items"][0]))
    model = runtime.server(script, port=PORT, tls=story.tls[1:], **runtime.options).start()
    try:
        applied = time.time()
        story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))

        def pod():
            pods = story.json("get", "pods", "-n", story.work_ns, "-l", f"job-name={name}")["items"]
            story.fail_if_pod_failed(pods[0] if pods else None)
            return pods[0] if pods else None

        def logs() -> str:
            out = []
            for c in ("mcp-proxy", "agent"):
                try:
                    out.append(f"--- {c} ---\n" + story.kubectl("logs", "-n", story.work_ns, f"job/{name}", "-c", c,
                                                               "--tail", "80"))
                except subprocess.CalledProcessError as e:
                    out.append(f"--- {c}: no logs ({e.stderr.strip()})")
            return "\n".join(out)

        the_pod = wait_until(f"the pod of {name}", pod, timeout=120)

        def asked_or_ended():
            if model.conversation():
                return True
            p = story.json("get", "pod", the_pod["metadata"]["name"], "-n", story.work_ns)
            agent = next((c for c in p["status"].get("containerStatuses", []) if c["name"] == "agent"), {})
            return "terminated" in agent.get("state", {})

        try:
            # The agent's container ending before it asked the model is a failure, now.
            wait_until(f"{runtime.name}'s first model request, or its end", asked_or_ended, timeout=180, interval=0.5)
            first = model.wait_for(lambda r: True, timeout=1, what=f"{runtime.name}'s first model request")
        except (TimeoutError, StoryError) as e:
            raise AssertionError(f"{e}\n{logs()}") from None
        # Exactly the allowed MCP tools; none of the disabled server; the denied shell not offered.
        check(first.mcp_tools() == script.want_before,
              f"{runtime.name}'s model is offered {first.mcp_tools()}, the TaskRun allows {script.want_before} "
              f"(all its tools: {first.tools})\n{logs()}")
        check(runtime.shell not in first.tools, f"Bash is denied, but {runtime.name} offers {runtime.shell}: "
                                                f"{first.tools}")
        # The key only in the proxy, while the agent runs.
        story.api_key = key
        spec = story.json("get", "pod", the_pod["metadata"]["name"], "-n", story.work_ns)["spec"]
        agent = next(c for c in spec["containers"] if c["name"] == "agent")
        from_secrets = [e["name"] for e in agent.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        check(not from_secrets and not agent.get("envFrom"), f"the agent's env comes from Secrets: {from_secrets}")
        pid = story.container_pids(the_pod)["agent"]
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        seen, found = 0, []
        for p in Path("/proc").iterdir():
            try:
                if not p.name.isdigit() or (p / "cgroup").read_text() != cgroup:
                    continue
                seen += 1
                for what in ("environ", "cmdline"):
                    if key.encode() in (p / what).read_bytes():
                        found.append(f"/proc/{p.name}/{what}")
            except OSError:
                continue
        check(seen and not found, f"the model key is readable in the agent's processes: {found}")

        # The person grants echo once the first call went through.
        try:
            model.wait_for(lambda r: script.called.is_set(), timeout=120, what="the get-sum call's result")
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{logs()}") from None
        check(script.seen["started_at_connect"] == {},
              f"{runtime.name} connected and listed, and the proxy had already started "
              f"{script.seen['started_at_connect']} (server: why) before any call")
        check("5" in script.seen["sum"] and not script.seen["sum"].startswith("ERROR"),
              f"get-sum through the proxy answered {script.seen['sum']!r}")
        starts = story.server_starts(the_pod)  # one read of the proxy's log
        check(set(starts) == {"everything"}, f"the first call should have started everything alone: {starts}")
        started = time.time()
        cli = story.cli("task", "add-context", name, "--enable-tools", "everything:echo", "--wait-synced")
        check(cli.returncode == 0, f"add-context failed ({cli.returncode}):\n{cli.stdout}{cli.stderr}")
        script.granted.set()
        try:
            model.wait_for(lambda r: "offered" in script.seen, timeout=OFFERED_WITHIN_S + 60,
                           what="a request offering echo")
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{logs()}") from None
        offered_s = script.seen["offered"].wall - started
        print(f"{runtime.name}: add-context -> echo offered to the model in {offered_s:.2f} s "
              f"({script.seen['busy_calls']} calls meanwhile)")
        check(offered_s <= OFFERED_WITHIN_S, f"echo offered {offered_s:.1f} s after add-context")
        check(script.seen["offered"].mcp_tools() == [runtime.named(t) for t in ("everything__echo", "everything__get-sum")],
              f"after add-context: {script.seen['offered'].mcp_tools()}")

        def finished():
            tr = story.json("get", "taskrun", name, "-n", story.work_ns)
            phase = tr.get("status", {}).get("phase")
            return tr if phase in ("Succeeded", "Failed") else None

        try:
            tr = wait_until(f"{name} to finish", finished, timeout=180)
        except Exception as e:
            raise AssertionError(f"{e}\n{logs()}") from None
        status = tr["status"]
        check(status["phase"] == "Succeeded", f"{name} ended {status['phase']}: {status.get('conditions')}\n{logs()}")
        check("Done: 2 + 3 = 5" in (status.get("result") or {}).get("text", ""),
              f"{name}'s result: {status.get('result')}")
        check("granted" in script.seen["echo"], f"echo answered {script.seen['echo']!r}")
        # Every model request carried the Secret's key, none the agent's credential.
        keys = {runtime.key_seen(r) for r in model.requests}
        check(keys == {key}, f"the model API got these keys: {[k[:12] for k in keys]}")
        # status.usage is the gateway's count, equal to the stand-in's.
        stand_in = model.usage()

        def usage_matches():
            usage = story.json("get", "taskrun", name, "-n", story.work_ns)["status"].get("usage") or {}
            counted_in = usage.get("inputTokens", 0) + usage.get("cacheReadInputTokens", 0) \
                + usage.get("cacheCreationInputTokens", 0)
            return usage if (usage.get("requests") == stand_in["requests"]
                             and counted_in == stand_in["input_tokens"]
                             and usage.get("outputTokens") == stand_in["output_tokens"]) else None

        try:
            usage = wait_until("status.usage to equal the stand-in's count", usage_matches, timeout=30)
        except Exception:
            raise AssertionError(f"status.usage {tr['status'].get('usage')} != the stand-in's {stand_in}") from None
        # The MCP calls are in the proxy's audit.
        calls = [r for r in story.audit_stream(the_pod) if r["recordType"] == "tool_call"]
        tools = [r.get("tool") for r in calls]
        check("everything__get-sum" in tools and "everything__echo" in tools
              and all(r["decision"] == "allowed" for r in calls), f"the proxy's audit: {tools}")
        print(f"{runtime.name}: {usage['requests']} model requests, {usage.get('inputTokens')} input + "
              f"{usage.get('cacheReadInputTokens', 0)} cached, {usage.get('outputTokens')} output tokens; "
              f"{len(calls)} MCP calls audited; applied -> succeeded {time.time() - applied:.0f} s")
    finally:
        model.stop()
