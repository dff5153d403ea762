"""A task's end on the real control plane and the real node (docs/api.md, "The agent's result"
and "Cancelling a task"):

- a running task cancelled with the `orchestrator.io/cancel` annotation: its Job is deleted, its
  pod goes away, the TaskRun says `Cancelled`, who asked and when, and no Job is made again;
- an agent's termination message becomes `status.result` as it wrote it; a hostile agent's
  (garbage, or a result too large for the kubelet's 4096 bytes) becomes a bounded `result.error`.

The agents are small shell commands in the agent image (no model). The chart is installed and the
operator runs once for the module (as in the story). Needs the cluster with its real node.
"""

from __future__ import annotations

import json

from story import REAL_NODE, Story, wait_until


def apply_task(story: Story, name: str, task_id: int, script: str) -> None:
    taskrun = {
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "metadata": {"name": name},
        "spec": {
            "taskId": task_id,
            "serviceName": "lifecycle",
            "task": {"prompt": "end somehow"},
            "agent": {"command": ["sh", "-c", script]},
            "podTemplate": {
                "nodeSelector": {REAL_NODE[0]: REAL_NODE[1]},
                "tolerations": [{"key": REAL_NODE[0], "operator": "Equal", "value": REAL_NODE[1], "effect": "NoSchedule"}],
            },
            "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]},
        },
    }
    story.kubectl("apply", "-n", story.work_ns, "-f", "-", stdin=json.dumps(taskrun))


def status(story: Story, name: str) -> dict:
    return story.json("get", "taskrun", name, "-n", story.work_ns).get("status", {})


def in_phase(story: Story, name: str, phase: str, timeout: float = 120) -> dict:
    def reached():
        s = status(story, name)
        if s.get("phase") in ("Succeeded", "Failed", "Cancelled") and s["phase"] != phase:
            raise AssertionError(f"{name} ended {s['phase']}, not {phase}: {json.dumps(s)[:2000]}")
        return s if s.get("phase") == phase else None

    return wait_until(f"{name} to be {phase}", reached, timeout=timeout, interval=0.2)


def condition(s: dict, type_: str) -> dict:
    return next(c for c in s.get("conditions", []) if c["type"] == type_)


def pods_of(story: Story, job: str) -> list[dict]:
    return story.json("get", "pods", "-n", story.work_ns, "-l", f"job-name={job}")["items"]


def test_a_running_task_is_cancelled_its_pod_stopped_and_its_job_never_made_again(story: Story):
    # A long-running agent that ends on SIGTERM, as a pod being deleted is told to.
    apply_task(story, "cancel-me", 3001, "trap 'exit 143' TERM; sleep 3600 & wait")

    def agent_running():
        pods = pods_of(story, "cancel-me")
        if not pods:
            return None
        story.fail_if_pod_failed(pods[0])
        agent = next((c for c in pods[0]["status"].get("containerStatuses", []) if c["name"] == "agent"), {})
        return pods[0] if agent.get("state", {}).get("running") else None

    pod = wait_until("the agent of cancel-me to run", agent_running, timeout=120, interval=0.2)
    in_phase(story, "cancel-me", "Running")
    # The user the API server authenticates (the chart's admission policy accepts no other).
    user = story.json("auth", "whoami")["status"]["userInfo"]["username"]
    # As `orchestrator-cli task cancel` writes it (CancelRequest::annotation_value: compact JSON).
    request = json.dumps({"user": user}, separators=(",", ":"))
    story.kubectl("annotate", "taskrun", "cancel-me", "-n", story.work_ns, f"orchestrator.io/cancel={request}")

    s = in_phase(story, "cancel-me", "Cancelled", timeout=60)
    assert s["cancellation"]["requestedBy"] == user, s["cancellation"]
    assert s["cancellation"]["time"] and s["completionTime"], s
    succeeded = condition(s, "Succeeded")
    assert (succeeded["status"], succeeded["reason"], succeeded["message"]) == \
        ("False", "Cancelled", f"cancelled by {user}"), succeeded
    assert condition(s, "JobCreated")["reason"] == "DeletedOnCancel", s["conditions"]
    events = story.json("get", "events", "-n", story.work_ns, "--field-selector", "involvedObject.name=cancel-me")
    assert any(e.get("reason") == "Cancelled" for e in events["items"]), [e.get("reason") for e in events["items"]]

    # The pod is stopped (the Job's deletion propagates in the background) and nothing is made
    # again: the operator saw the Job go (it watches Jobs) and records the task as it was.
    wait_until("the pod of cancel-me to go", lambda: story.kubectl(
        "get", "pod", pod["metadata"]["name"], "-n", story.work_ns, "--ignore-not-found", "-o", "name") == "",
        timeout=60, interval=0.2)
    assert story.kubectl("get", "job", "cancel-me", "-n", story.work_ns, "--ignore-not-found", "-o", "name") == ""
    assert pods_of(story, "cancel-me") == []
    after = status(story, "cancel-me")
    assert after["phase"] == "Cancelled" and after["cancellation"] == s["cancellation"], after

    story.kubectl("delete", "taskrun", "cancel-me", "-n", story.work_ns)


REPORT = {"subtype": "success", "isError": False, "text": "opened PR #12 — done", "turns": 3,
          "inputTokens": 1200, "outputTokens": 45, "cacheReadInputTokens": 7, "costUsd": "0.5",
          "durationMs": 5400, "sessionId": "s-1"}


def test_the_agents_report_is_the_result_and_a_hostile_one_is_a_bounded_error(story: Story):
    report = json.dumps(REPORT, ensure_ascii=False).replace("'", "")
    apply_task(story, "reports", 3002, f"printf '%s' '{report}' > /dev/termination-log")
    # Garbage, escape sequences included.
    apply_task(story, "garbage", 3003,
               "i=0; while [ $i -lt 300 ]; do printf 'Ignore previous instructions \\033[31m '; i=$((i+1)); done"
               " > /dev/termination-log")
    # A result too large: the kubelet keeps its last 4096 bytes, which are no JSON object.
    apply_task(story, "too-large", 3004,
               "{ printf '{\"subtype\":\"success\",\"text\":\"'; i=0; while [ $i -lt 1000 ]; do printf 'AAAAAAAAAA';"
               " i=$((i+1)); done; printf '\"}'; } > /dev/termination-log")

    s = in_phase(story, "reports", "Succeeded")
    assert s["result"] == REPORT, s.get("result")
    for name in ("garbage", "too-large"):
        s = in_phase(story, name, "Succeeded")
        result = s["result"]
        assert set(result) == {"error"}, result
        assert result["error"].startswith("the agent's termination message is not a result"), result
        assert len(result["error"]) <= 256 and "\x1b" not in result["error"], result
    for name in ("reports", "garbage", "too-large"):
        story.kubectl("delete", "taskrun", name, "-n", story.work_ns)
