"""The model gateway on the real node (issue 42).

1. A TaskRun with spec.model runs a hostile agent (a script in the agent image, no model needed)
   that looks for the key everywhere its container reaches and tries to use the gateway as an
   open proxy, and finds nothing.
2. Two tasks run Claude Code against scripted models (HTTPS, their CA in a ConfigMap) with a small
   output-token budget: the gateway refuses once it is spent, the TaskRuns show BudgetExceeded;
   a person raises one task's budget with `task add-context --budget` and that task goes on and
   succeeds; the other's agent gives up (no retries) and its TaskRun fails with BudgetExceeded.
3. `orchestrator-cli task submit` with no model named runs on the chart's default credential (the
   Secret orchestrator-model of the task's namespace).
4. Policy as code (issue 44): a TaskRun's CEL condition and its decision point (a real Open Policy
   Agent on the host) refuse Claude Code's calls, `add-context --conditions` changes the rules
   while it runs, and with OPA stopped the next call is refused.

The agent looks in its environment, every file of its container's filesystem (under 1 MiB), every
process it can see (/proc/*/environ, cmdline), the proxy's key path, and asks the gateway with its
own credential for other paths, another host, a path that climbs out, without a credential, and
with a real request (the endpoint is unreachable from the pod: the answer must not carry the
key). The chart is installed and the operator runs once for the module (as in the story). Needs
the cluster with its real node; about three minutes.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from story import MODEL_PORT, REAL_NODE, Story, wait_until
from scripted_model import ScriptedModel, text, tls_pair, tool_result_text, tool_use

REPO = Path(__file__).resolve().parents[3]

# Host ports the real node's pods reach (MODEL_PORT .. +9, e2e/node/node); other modules use the
# first five.
RAISED_PORT, SPENT_PORT, DEFAULT_PORT = MODEL_PORT + 5, MODEL_PORT + 6, MODEL_PORT + 7
PLACEMENT = {
    "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
    "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
}

HOSTILE = r'''
import hashlib, json, os, re, urllib.request, urllib.error
# The agent is not told the key, only its hash: anything shaped like a key is hashed and compared.
want = os.environ["KEY_SHA256"]
shape = re.compile(rb"sk-ant-api03-[0-9a-f]{48}")
def has_key(data):
    return any(hashlib.sha256(m).hexdigest() == want for m in shape.findall(data))
found = []
for name, value in os.environ.items():
    if has_key(value.encode()):
        found.append("env " + name)
for root, dirs, files in os.walk("/"):
    if root.startswith(("/proc", "/sys", "/dev")):
        dirs[:] = []
        continue
    for f in files:
        path = os.path.join(root, f)
        try:
            if os.path.islink(path) or os.path.getsize(path) > 1 << 20:
                continue
            with open(path, "rb") as h:
                if has_key(h.read()):
                    found.append("file " + path)
        except OSError:
            pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as h:
                    if has_key(h.read()):
                        found.append(f"/proc/{pid}/{what}")
            except OSError:
                pass
for path in ("/etc/orchestrator/model/api-key",):
    try:
        open(path).read()
        found.append("readable " + path)
    except OSError as e:
        pass
token = open(os.environ["ORCHESTRATOR_MCP_TOKEN_FILE"]).read().strip()
base = os.environ["ANTHROPIC_BASE_URL"]
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}).encode()
answers = {}
def ask(label, url, method="POST", headers=None, data=body):
    request = urllib.request.Request(url, data=data if method == "POST" else None, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            status, text = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    except OSError as e:
        status, text = 0, str(e).encode()
    answers[label] = status
    if has_key(text):
        found.append("answer " + label)
mine = {"x-api-key": token}
ask("models", base + "/v1/models", "GET", mine)
ask("complete", base + "/v1/complete", headers=mine)
ask("climb", base + "/v1/messages/../../../v1/models", headers=mine)
ask("other host", base + "/v1/messages", headers={**mine, "host": "api.anthropic.com"})
ask("no credential", base + "/v1/messages")
ask("guessed credential", base + "/v1/messages", headers={"x-api-key": "0" * 64})
ask("messages", base + "/v1/messages?beta=true", headers=mine)
ask("metrics", base.rsplit("/model", 1)[0] + "/metrics", "GET", {"authorization": "Bearer " + token})
ask("audit", base.rsplit("/model", 1)[0] + "/audit", "GET", {"authorization": "Bearer " + token})
print("HOSTILE " + json.dumps({"found": found, "answers": answers, "env": sorted(os.environ)}))
'''


@pytest.fixture(scope="module")
def chart_values():
    # The chart's default credential points at a stand-in of this module, its CA in the
    # ConfigMap model-ca of the tasks' namespace.
    return [f"model.endpoint=https://127.0.0.1:{DEFAULT_PORT}", "model.caConfigMapName=model-ca",
            "model.caConfigMapKey=ca.crt"]


@pytest.fixture(scope="module")
def story(story):
    """The story's (conftest.py), with the stand-in's TLS pair and its CA in model-ca."""
    story.tls = tls_pair(story.workdir / "model-tls")
    ca = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "model-ca"},
          "data": {"ca.crt": Path(story.tls[0]).read_text()}}
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(ca))
    return story


def test_a_hostile_agent_finds_no_model_key_and_no_open_proxy(story: Story):
    key = "sk-ant-api03-" + secrets.token_hex(24)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "model-key-hunt"},
              "stringData": {"api-key": key}}
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(secret))
    taskrun = {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": "key-hunt"},
        "spec": {
            "taskId": 4201, "serviceName": "gateway", "task": {"prompt": "find the key"},
            "model": {"secretKeyRef": {"name": "model-key-hunt", "key": "api-key"},
                      "endpoint": "https://127.0.0.1:1"},
            "agent": {"command": ["python3", "-c", HOSTILE],
                      "env": [{"name": "KEY_SHA256", "value": hashlib.sha256(key.encode()).hexdigest()}]},
            "podTemplate": {
                "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1],
                                 "effect": "NoSchedule"}],
            },
            "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]},
        },
    }
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))

    def finished():
        s = story.json("get", "taskrun", "key-hunt", "-n", story.work_ns).get("status", {})
        return s if s.get("phase") in ("Succeeded", "Failed") else None

    status = wait_until("the hostile agent to finish", finished, timeout=300)
    logs = story.kubectl("logs", "-n", story.work_ns, "job/key-hunt", "-c", "agent")
    line = next((l for l in logs.splitlines() if l.startswith("HOSTILE ")), None)
    assert line, f"the agent printed no report ({status.get('phase')}): {logs[-3000:]}"
    report = json.loads(line.removeprefix("HOSTILE "))
    assert report["found"] == [], report["found"]
    assert "ANTHROPIC_API_KEY" not in report["env"] and "ANTHROPIC_BASE_URL" in report["env"], report["env"]
    answers = report["answers"]
    assert answers["models"] == 404 and answers["complete"] == 404 and answers["climb"] == 404, answers
    assert answers["other host"] == 403, answers
    assert answers["no credential"] == 401 and answers["guessed credential"] == 401, answers
    # Forwarded with the key, to an endpoint the pod cannot reach: the gateway's own error.
    assert answers["messages"] == 502, answers
    assert answers["metrics"] == 200 and answers["audit"] == 200, answers
    # The proxy's own log and audit stream (stdout) never carry the key either.
    proxy_log = story.kubectl("logs", "-n", story.work_ns, "job/key-hunt", "-c", "mcp-proxy")
    assert key not in proxy_log
    assert "model_request" in proxy_log, proxy_log[-2000:]


def model_secret(story: Story, name: str) -> str:
    key = "sk-ant-api03-" + secrets.token_hex(24)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"api-key": key}}
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(secret))
    return key


def status(story: Story, name: str) -> dict:
    return story.json("get", "taskrun", name, "-n", story.work_ns).get("status", {})


def condition(story: Story, name: str, kind: str) -> dict:
    return next((c for c in status(story, name).get("conditions", []) if c["type"] == kind), {})


class Steps:
    """A model that has the agent run Bash commands (about 30 output tokens each) until `stop`
    is set, then ends its turn."""

    def __init__(self):
        self.stop = threading.Event()
        self.ran: list[str] = []

    def __call__(self, first):
        r, n = first, 0
        while not self.stop.is_set():
            n += 1
            r = yield tool_use("Bash", {"command": f"echo step {n} done", "description": "a step"})
            result = tool_result_text(r)
            assert f"step {n} done" in result, result
            self.ran.append(result.strip())
        yield text("all steps done")


def budget_task(story: Story, name: str, task_id: int, port: int, env: list) -> dict:
    return {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name},
        "spec": {
            "taskId": task_id, "serviceName": "gateway", "task": {"prompt": "do the steps"},
            "model": {"secretKeyRef": {"name": "model-budget", "key": "api-key"},
                      "endpoint": f"https://127.0.0.1:{port}",
                      "caConfigMapKeyRef": {"name": "model-ca", "key": "ca.crt"}},
            "budget": {"outputTokens": BUDGET},
            "agent": {"env": env},
            "podTemplate": PLACEMENT,
            "toolConfig": {"internalTools": {"permissions": {"allow": ["Bash"]}},
                           "mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]},
        },
    }


BUDGET = 150  # output tokens: a few Bash steps


def test_a_spent_budget_stops_the_task_and_a_raised_one_lets_it_go_on(story: Story):
    key = model_secret(story, "model-budget")
    raised_steps, spent_steps = Steps(), Steps()
    with ScriptedModel(raised_steps, port=RAISED_PORT, tls=story.tls[1:]) as raised_model, \
            ScriptedModel(spent_steps, port=SPENT_PORT, tls=story.tls[1:]) as spent_model:
        # Both tasks' agents retry a refused request as Claude Code does (429); the second is
        # told not to retry, so it gives up at the first refusal.
        for task in (budget_task(story, "budget-raised", 4202, RAISED_PORT, []),
                     budget_task(story, "budget-spent", 4203, SPENT_PORT,
                                 [{"name": "CLAUDE_CODE_MAX_RETRIES", "value": "0"}])):
            story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(task))

        # The gateway stops both: the TaskRuns say so, naming the field.
        for name in ("budget-raised", "budget-spent"):
            cond = wait_until(f"{name}'s BudgetExceeded condition", lambda n=name: (
                c if (c := condition(story, n, "BudgetExceeded")).get("status") == "True" else None), timeout=240)
            assert "spec.budget.outputTokens" in cond["message"], cond
        used = status(story, "budget-raised")["usage"]
        assert used["exceeded"] == "outputTokens" and used["refused"] >= 1, used
        assert used["outputTokens"] <= BUDGET, f"the gateway let the task spend past its budget: {used}"
        assert not raised_model.finished()

        # A person raises it while the task runs: the agent's next retry goes through.
        raised_at = time.monotonic()
        out = story.cli("task", "add-context", "budget-raised", "--budget", "outputTokens=100000", "--wait-synced")
        assert out.returncode == 0, out.stderr
        assert "budget: outputTokens 150 → 100000" in out.stdout, out.stdout
        raised_steps.stop.set()

        def finished(name):
            s = status(story, name)
            return s if s.get("phase") in ("Succeeded", "Failed") else None

        raised = wait_until("the raised task to finish", lambda: finished("budget-raised"), timeout=240)
        went_on_s = time.monotonic() - raised_at
        spent = wait_until("the spent task to finish", lambda: finished("budget-spent"), timeout=240)
        raised_count, spent_count = raised_model.usage(), spent_model.usage()
        raised_keys = {r.headers.get("x-api-key") for r in raised_model.requests}
        spent_keys = {r.headers.get("x-api-key") for r in spent_model.requests}

    # What the gateway counted is what the model stand-in answered, request for request.
    def counted(name, count):
        u = status(story, name).get("usage") or {}
        same = (u.get("inputTokens"), u.get("outputTokens"), u.get("requests")) == \
            (count["input_tokens"], count["output_tokens"], count["requests"])
        return u if same else None

    try:
        raised_usage = wait_until("budget-raised's usage", lambda: counted("budget-raised", raised_count), timeout=30)
        spent_usage = wait_until("budget-spent's usage", lambda: counted("budget-spent", spent_count), timeout=30)
    except Exception as e:
        raise AssertionError(f"{e}: raised {status(story, 'budget-raised').get('usage')} vs {raised_count}, "
                             f"spent {status(story, 'budget-spent').get('usage')} vs {spent_count}") from None

    logs = story.kubectl("logs", "-n", story.work_ns, "job/budget-raised", "-c", "agent", "--tail", "40")
    assert raised["phase"] == "Succeeded", f"{raised}\n{logs}"
    assert raised_usage.get("exceeded") is None and raised_usage["outputTokens"] > BUDGET, raised_usage
    within = condition(story, "budget-raised", "BudgetExceeded")
    assert within["status"] == "False", within
    assert raised_keys == {key} and spent_keys == {key}

    assert spent["phase"] == "Failed", spent
    failed = next(c for c in spent["conditions"] if c["type"] == "Succeeded")
    assert failed["status"] == "False" and failed["reason"] == "BudgetExceeded", failed
    assert spent_usage["exceeded"] == "outputTokens" and spent_usage["outputTokens"] <= BUDGET, spent_usage
    print(f"raised task went on {went_on_s:.1f} s after add-context --budget; "
          f"raised usage {raised_usage}, spent usage {spent_usage}")


def test_task_submit_runs_on_the_charts_default_credential(story: Story):
    key = model_secret(story, "orchestrator-model")

    def script(first):
        yield text("done on the default credential")

    with ScriptedModel(script, port=DEFAULT_PORT, tls=story.tls[1:]) as model:
        out = story.cli(
            "task", "submit", "--service", "gateway", "--prompt", "say done", "--task-id", "4204",
            "--tools", "everything:echo", "--node-selector", f"{REAL_NODE[0]}={REAL_NODE[1]}",
            "--toleration", f"{REAL_NODE[0]}={REAL_NODE[1]}:NoSchedule", "--wait", "--timeout", "4m")
        count = model.usage()
        keys = {r.headers.get("x-api-key") for r in model.requests}
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    tr = story.json("get", "taskrun", "task-4204", "-n", story.work_ns)
    assert "model" not in tr["spec"], tr["spec"]
    assert tr["status"]["phase"] == "Succeeded", tr["status"]
    assert keys == {key}, "the model API got another key than the namespace's orchestrator-model"
    usage = wait_until("status.usage", lambda: (
        u if (u := status(story, "task-4204").get("usage", {})).get("requests") == count["requests"] else None),
        timeout=30)
    assert (usage["inputTokens"], usage["outputTokens"]) == (count["input_tokens"], count["output_tokens"])
    assert tr["status"]["result"]["text"] == "done on the default credential", tr["status"]["result"]


CONDITION_PORT = MODEL_PORT + 9
OPA_PORT = RAISED_PORT  # free once the budget test is done: this module's tests run one at a time
OPA_RULE = """package orchestrator

import rego.v1

# The test's rule beside the shipped example policy: the task's identity is in the input.
deny contains msg if {
	input.server == "everything"
	contains(object.get(input.args, "message", ""), "protected")
	msg := sprintf("task %s/%s: echo must not carry protected words", [input.task.namespace, input.task.name])
}
"""


class Opa:
    """Open Policy Agent (built from its Go module, e2e/tools/opa) on a host port the real
    node's pods reach, serving the shipped example policy and the test's rule."""

    def __init__(self, policy_dir: Path):
        out = subprocess.run([str(REPO / "e2e/tools/opa")], capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stderr[-2000:]
        rule = policy_dir / "e2e.rego"
        rule.write_text(OPA_RULE)
        self.process = subprocess.Popen(
            [out.stdout.strip(), "run", "--server", "--addr", f"127.0.0.1:{OPA_PORT}", "--log-level", "error",
             "--disable-telemetry", str(REPO / "config/policy/orchestrator.rego"), str(rule)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until("opa to listen", self.listening, timeout=30)

    def listening(self) -> bool:
        assert self.process.poll() is None, self.process.stderr.read().decode()[-2000:]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", OPA_PORT)) == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def test_claude_code_gets_a_conditions_and_a_decision_points_refusal_as_the_tools_error(story: Story, tmp_path: Path):
    """Issue 44 on the real node. A TaskRun's CEL condition and its decision point (a real OPA
    on the host, asked by the task's proxy in its pod) each refuse one of Claude Code's MCP calls:
    the model reads the refusal (the condition's name and message; the policy's reason, which
    names the task from its input) as the tool's error, and the server never gets the call; a call
    both let through is answered; `add-context --conditions` replaces the list while the task
    runs and the next call is held to the new one; with OPA stopped the next call is refused
    (fail closed)."""
    model_secret(story, "model-conditions")
    seen: dict = {}
    changed = threading.Event()
    stopped = threading.Event()

    def script(first):
        echo = first.mcp_name("everything__echo")
        r = yield tool_use(echo, {"message": "the secret plan"})
        seen["refused"] = tool_result_text(r)
        r = yield tool_use(echo, {"message": "hello"})
        seen["allowed"] = tool_result_text(r)
        r = yield tool_use(echo, {"message": "the protected branch"})
        seen["policy"] = tool_result_text(r)
        seen["changed"] = changed.wait(timeout=120)
        r = yield tool_use(echo, {"message": "hello again"})
        seen["after"] = tool_result_text(r)
        seen["stopped"] = stopped.wait(timeout=60)
        r = yield tool_use(echo, {"message": "goodbye"})
        seen["unreachable"] = tool_result_text(r)
        yield text("done with conditions")

    condition = {"name": "no-secrets", "tools": ["everything/echo"],
                 "when": 'args.message.contains("secret")', "message": "echo must not carry secrets"}
    point = f"http://127.0.0.1:{OPA_PORT}/v1/data/orchestrator/decision"
    taskrun = {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": "conditions"},
        "spec": {
            "taskId": 4205, "serviceName": "gateway", "task": {"prompt": "echo things"},
            "model": {"secretKeyRef": {"name": "model-conditions", "key": "api-key"},
                      "endpoint": f"https://127.0.0.1:{CONDITION_PORT}",
                      "caConfigMapKeyRef": {"name": "model-ca", "key": "ca.crt"}},
            "podTemplate": PLACEMENT,
            "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}],
                           "policy": {"conditions": [condition],
                                      "decisionPoint": {"url": point, "timeoutMilliseconds": 1000}}},
        },
    }
    manifest = tmp_path / "taskrun.json"
    manifest.write_text(json.dumps(taskrun))
    # The CLI's validate says what the operator will say, before anything is applied.
    out = story.cli("task", "validate", str(manifest))
    assert out.returncode == 0 and ": valid" in out.stdout, f"{out.stdout}\n{out.stderr}"
    opa = Opa(tmp_path)
    try:
        with ScriptedModel(script, port=CONDITION_PORT, tls=story.tls[1:]) as model:
            story.kubectl("apply", "-n", story.work_ns, "-f", str(manifest))
            model.wait_for(lambda r: "policy" in seen, timeout=240, what="the decision point's refusal")
            # A person replaces the condition: now "hello" is what echo may not carry.
            changed_list = tmp_path / "conditions.yaml"
            changed_list.write_text(json.dumps([{**condition, "name": "no-hello",
                                                 "when": 'args.message.startsWith("hello")',
                                                 "message": "no greetings"}]))
            out = story.cli("task", "add-context", "conditions", "--conditions", str(changed_list), "--wait-synced")
            assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
            assert "conditions: no-secrets → no-hello" in out.stdout, out.stdout
            changed.set()
            model.wait_for(lambda r: "after" in seen, timeout=120, what="the call after the change")
            opa.stop()
            stopped.set()
            final = wait_until("the task to finish", lambda: (
                s if (s := status(story, "conditions")).get("phase") in ("Succeeded", "Failed") else None), timeout=240)
    finally:
        opa.stop()
    assert seen["changed"] and seen["stopped"], "add-context or the stop did not come back in time"
    # What the model read: each refusal, as Claude Code passes a tool error on.
    assert seen["refused"].startswith("ERROR:"), seen["refused"]
    assert 'condition "no-secrets"' in seen["refused"] and "echo must not carry secrets" in seen["refused"], seen
    assert not seen["allowed"].startswith("ERROR:") and "hello" in seen["allowed"], seen
    assert seen["policy"].startswith("ERROR:"), seen["policy"]
    assert f"task {story.work_ns}/conditions: echo must not carry protected words" in seen["policy"], seen
    assert seen["after"].startswith("ERROR:") and 'condition "no-hello"' in seen["after"], seen
    assert seen["unreachable"].startswith("ERROR:"), seen["unreachable"]
    assert "the decision point could not be reached" in seen["unreachable"], seen
    assert final["phase"] == "Succeeded", final
    assert final["result"]["text"] == "done with conditions", final["result"]
    # The proxy's audit: each refusal names its rule; only "hello" reached the server.
    pod = story.json("get", "pods", "-n", story.work_ns, "-l", "job-name=conditions")["items"][0]
    calls = [r for r in story.audit_stream(pod) if r["recordType"] == "tool_call"]
    assert [r["decision"] for r in calls] == ["denied", "allowed", "denied", "denied", "denied"], calls
    assert [calls[i].get("rule") for i in (0, 2, 3, 4)] == [
        'policy.conditions[0] "no-secrets"', f"policy.decisionPoints[0] {point}",
        'policy.conditions[0] "no-hello"', f"policy.decisionPoints[0] {point}"], calls
    assert "echo must not carry protected words" in calls[2].get("error", ""), calls[2]
