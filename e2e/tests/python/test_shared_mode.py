"""Shared-service mode on the real node (issue 31; docs/proxy.md "Shared mode"): the chart's
shared proxy Deployment serves two tasks, each isolated, reached through its ClusterIP Service
over the node's pod network.

Two TaskRuns in `spec.proxy.mode: shared`, alpha and beta, each allowed the tools of its own
HTTP MCP server on the host (reached through the pods' portal), and agents that are scripts (the
image's Python; no model). What a user and an attacker would check:
- each task's agent is offered exactly its own tools, through the Service, with its pod's token;
- alpha's agent, calling beta's tool by its exposed name, gets an unknown tool and beta's server
  never runs it;
- beta's agent holding alpha's token (read out of alpha's pod) is refused from its own pod (the
  peer check), and alpha's session id with beta's token is unknown (404);
- add-context on alpha reaches alpha's open session as `notifications/tools/list_changed` (the
  time from the CLI's return is reported), not beta's;
- when alpha is cancelled, its token is refused as a task no longer served (403
  PROXY.UNKNOWN_TASK), and the time that took is reported.
Needs the cluster with its real node and pod network (e2e/cluster up).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "story"))

from shared_mode import (  # noqa: E402
    ALPHA_PORT,
    BETA_PORT,
    PROBE,
    TOKEN_FILE,
    exec_agent,
    running_agent,
    served,
    shared_story,
    taskrun,
)
from story import Story, wait_until  # noqa: E402


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with ExitStack() as cleanup:
        story = shared_story(cleanup, tmp_path_factory.mktemp("shared"), [("alpha", ALPHA_PORT), ("beta", BETA_PORT)])
        # alpha also has a stdio server: it runs in alpha's pod (its zone), which the shared
        # proxy reaches over TCP with the zone's key.
        zoned = [{"name": "everything", "tools": {"allow": ["echo"]}}]
        for tr in (taskrun("alpha", 1, "alpha", more=zoned), taskrun("beta", 2, "beta")):
            story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(tr))
        story.pods = {job: running_agent(story, job) for job in ("alpha", "beta")}
        yield story


def calls(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def test_each_task_gets_exactly_its_own_tools_and_a_stolen_token_is_refused(shared):
    story = shared
    alpha_pod, beta_pod = (story.pods[j]["metadata"]["name"] for j in ("alpha", "beta"))
    for job in ("alpha", "beta"):
        tr = story.json("get", "taskrun", job, "-n", story.work_ns)
        assert tr["status"].get("proxyMode") == "shared", tr["status"]
        pod = story.pods[job]
        names = [c["name"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]]
        assert "mcp-proxy" not in names, f"a shared task's pod has no proxy: {names}"

    # alpha sees its own tools only, and calling beta's by name reaches nothing.
    alpha = wait_until("alpha's tools through the shared proxy", lambda: served(
        story, "alpha", alpha_pod, [["alpha__read", {"text": "mine"}], ["beta__read", {"text": "theirs"}],
                                    ["everything__echo", {"message": "through the zone"}]]),
        timeout=60, interval=0.5)
    assert alpha["tools"] == ["alpha__read", "everything__echo"], alpha
    ok, refused, zoned = alpha["calls"]
    assert "through the zone" in json.dumps(zoned.get("result")), zoned
    names = [c["name"] for c in story.pods["alpha"]["spec"].get("initContainers", [])]
    assert "zone-everything" in names, names
    assert ok["result"]["content"][0]["text"] == "read:mine", ok
    text = json.dumps(refused)
    assert "beta__read" in text and ("unknown" in text.lower() or "not" in text.lower()), refused
    assert [c["text"] for c in calls(story.records["alpha"])] == ["mine"]
    assert calls(story.records["beta"]) == [], "beta's server ran a call alpha made"

    beta = wait_until("beta's tools", lambda: served(story, "beta", beta_pod, []), timeout=60, interval=0.5)
    assert beta["tools"] == ["beta__read"], beta

    # alpha's session id, with beta's own token: no such session for beta.
    answer = exec_agent(story, beta_pod, {"do": "raw", "session": alpha["session"],
                                          "body": {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                                          "token": story.kubectl("exec", "-n", story.work_ns, beta_pod, "-c", "agent",
                                                                 "--", "cat", TOKEN_FILE).strip()})
    assert answer["status"] == 404, answer

    # alpha's token, stolen out of alpha's pod, used from beta's pod: the peer check refuses it.
    stolen = story.kubectl("exec", "-n", story.work_ns, alpha_pod, "-c", "agent", "--", "cat", TOKEN_FILE).strip()
    answer = exec_agent(story, beta_pod, {"do": "raw", "token": stolen})
    assert answer["status"] == 403 and "PROXY.PEER_MISMATCH" in answer["body"], answer
    # No token, a forged one, and the pod's API token are refused before any task is chosen.
    for token in (None, "x.y.z"):
        answer = exec_agent(story, beta_pod, {"do": "raw", "token": token})
        assert answer["status"] == 401, answer

    # The token is no API token: the API server refuses it (its audience is the shared proxy's).
    out = subprocess.run([str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "--token", stolen,
                          "auth", "whoami"], capture_output=True, text=True)
    assert out.returncode != 0 and "Unauthorized" in out.stderr + out.stdout, out

    # add-context on alpha: alpha's open session is told; the time from the CLI's return.
    listener = subprocess.Popen(
        [str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig), "exec", "-n", story.work_ns, alpha_pod,
         "-c", "agent", "--", "python3", "-c", PROBE, json.dumps({"do": "listen", "timeout": 60})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = listener.stdout.readline()
        assert line.strip(), f"the listener in alpha's pod did not start: {listener.communicate(timeout=30)}"
        first = json.loads(line)
        assert "listening" in first, first
        asked = time.time()
        done = story.cli("task", "add-context", "alpha", "--enable-tools", "alpha:write")
        assert done.returncode == 0, done.stderr
        returned = time.time()
        out, err = listener.communicate(timeout=60)
    finally:
        listener.kill()
    told = json.loads(out.strip().splitlines()[-1])
    assert "list_changed_at" in told, (out, err)
    # From the CLI's start (it reads the TaskRun and the catalog, then writes) and from its return.
    from_start, from_return = told["list_changed_at"] - asked, told["list_changed_at"] - returned
    print(f"add-context -> list_changed on alpha's session: {from_start:.3f} s from the CLI's start, "
          f"{from_return:.3f} s after it returned")
    assert from_start <= 5, f"add-context took {from_start:.1f} s to reach alpha's session"
    alpha = exec_agent(story, alpha_pod, {"do": "tools"})
    assert alpha["tools"] == ["alpha__read", "alpha__write", "everything__echo"], alpha
    assert exec_agent(story, beta_pod, {"do": "tools"})["tools"] == ["beta__read"]

    # alpha ends: its token is refused as a task no longer served, from its own pod's address too.
    cancelled = time.time()
    done = story.cli("task", "cancel", "alpha")
    assert done.returncode == 0, done.stderr

    def refused_unknown():
        answer = exec_agent(story, beta_pod, {"do": "raw", "token": stolen})
        return answer if answer["status"] == 403 and "PROXY.UNKNOWN_TASK" in answer["body"] else None

    wait_until("alpha's token to be refused as a finished task's", refused_unknown, timeout=60, interval=0.2)
    story.figures["shared_cancel_to_token_refused_s"] = round(time.time() - cancelled, 2)
    print(f"cancel -> alpha's token refused: {story.figures['shared_cancel_to_token_refused_s']} s")
    assert not story.json("get", "configmap", "-n", story.system_ns,
                          "-l", "orchestrator.io/shared-proxy-config=true",
                          "--field-selector", f"metadata.name=task.{story.work_ns}.alpha")["items"]
    # beta goes on.
    assert exec_agent(story, beta_pod, {"do": "tools"})["tools"] == ["beta__read"]
