"""A pre-created zone-keys Secret blocks the task, on the real control plane (issue 41;
docs/operator.md "Shared-service mode"). In shared mode each stdio server's zone listens on the
task pod's IP and starts its server for a peer that proves the zone's key, from the task's Secret
`<taskrun>-zone-keys`, which the operator creates before the Job. A tenant who may create Secrets
in the namespace makes that Secret first, with keys it knows: were it used, the tenant could start
the zones' servers, with their Secrets, from any pod that reaches the task's pod. So a Secret of
that name the TaskRun does not own blocks the task with a condition naming it and the fix; no Job
is created, the Secret is neither changed nor owned; deleted, the task gets keys of its own.

The operator runs as in the story: installed with the chart (its shared proxy enabled, so shared
tasks are accepted), with the chart's ServiceAccount and RBAC. No pod runs, so neither the real
node nor the node's images are needed; a few seconds. Needs the cluster (`e2e/cluster up`).
"""

from __future__ import annotations

import base64
import json

import pytest

from story import Story, wait_until

NAME = "keys-bot"
KNOWN = "00" * 32


@pytest.fixture(scope="module")
def chart_values():
    return ["sharedProxy.enabled=true"]


@pytest.fixture(scope="module")
def story(installed_story):
    """The chart with its shared proxy enabled, the operator running with its ServiceAccount
    (conftest.py), in namespaces of this module's own. No pod runs here: no Job is created while
    blocked, and the one created at the end never runs (its images are never pulled)."""
    return installed_story


def taskrun() -> dict:
    return {
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "metadata": {"name": NAME},
        "spec": {
            "taskId": 4102,
            "serviceName": "zone-keys",
            "task": {"prompt": "say hello"},
            "proxy": {"mode": "shared"},
            "toolConfig": {"mcpServers": [{"name": "time"}]},
        },
    }


def ready(story: Story) -> dict | None:
    tr = story.json("get", "taskrun", NAME, "-n", story.work_ns)
    return next((c for c in tr.get("status", {}).get("conditions", []) if c["type"] == "Ready"), None)


def job(story: Story) -> str:
    return story.kubectl("get", "job", NAME, "-n", story.work_ns, "--ignore-not-found", "-o", "name")


def test_a_zone_keys_secret_the_taskrun_does_not_own_blocks_it(story: Story):
    ns, secret = story.work_ns, f"{NAME}-zone-keys"
    story.kubectl("create", "secret", "generic", secret, "-n", ns, f"--from-literal=time={KNOWN}")
    before = story.json("get", "secret", secret, "-n", ns)

    story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(taskrun()))
    cond = wait_until(
        "the TaskRun to be blocked with NameTaken",
        lambda: (c := ready(story)) and c["reason"] == "NameTaken" and c,
        timeout=30, interval=0.2,
    )
    assert cond["status"] == "False", cond
    message = cond["message"]
    assert f"Secret {ns}/{secret} exists and is not this TaskRun's (it has no controller)" in message, message
    assert "rename the TaskRun" in message and f"kubectl -n {ns} delete secret {secret}" in message, message
    assert "zone keys must be ones the operator drew" in message, message
    tr = story.json("get", "taskrun", NAME, "-n", ns)
    created = next(c for c in tr["status"]["conditions"] if c["type"] == "JobCreated")
    assert created["status"] == "False", created

    # Not used, not changed, not owned; no Job.
    assert job(story) == ""
    after = story.json("get", "secret", secret, "-n", ns)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], after["metadata"]
    assert "ownerReferences" not in after["metadata"], after["metadata"]

    # Deleted, as the message says: the task goes on (the operator looks again within 10 s), with
    # keys the operator drew, owned by the TaskRun.
    story.kubectl("delete", "secret", secret, "-n", ns)
    wait_until("the Job to be created", lambda: job(story), timeout=30, interval=0.2)
    drawn = story.json("get", "secret", secret, "-n", ns)
    [owner] = drawn["metadata"]["ownerReferences"]
    assert owner["kind"] == "TaskRun" and owner["uid"] == tr["metadata"]["uid"] and owner["controller"], owner
    key = base64.b64decode(drawn["data"]["time"]).decode()
    assert len(key) == 64 and key != KNOWN, "the operator drew a key of its own"
    story.kubectl("delete", "taskrun", NAME, "-n", ns, "--wait=false")
