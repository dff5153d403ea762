"""The model key on the real node (issue 42): a TaskRun with spec.model runs a hostile agent (a
script in the agent image, no model needed) that looks for the key everywhere its container
reaches and tries to use the gateway as an open proxy, and finds nothing.

The agent looks in its environment, every file of its container's filesystem (under 1 MiB), every
process it can see (/proc/*/environ, cmdline), the proxy's key path, and asks the gateway with its
own credential for other paths, another host, a path that climbs out, without a credential, and
with a real request (the endpoint is unreachable from the pod: the answer must not carry the
key). The chart is installed and the operator runs once for the module (as in the story). Needs
the cluster with its real node; about a minute.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "story"))

from story import REAL_NODE, Story, wait_until  # noqa: E402

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
def cluster():
    story = Story(say=lambda *_: None)
    with ExitStack() as cleanup:
        story.prepare(cleanup)
        yield story


def test_a_hostile_agent_finds_no_model_key_and_no_open_proxy(cluster: Story):
    story = cluster
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
