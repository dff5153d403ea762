"""The operator adopts nothing, on the real control plane: a TaskRun named like a ServiceAccount
that already exists in its namespace (its per-task ServiceAccount would take that name) is blocked
with a condition naming the ServiceAccount and the fix, and nothing is applied: the
ServiceAccount keeps its resourceVersion and gets no owner reference, so deleting the TaskRun
(the garbage collector at work) leaves it in place.

The operator runs as in the story: installed with the chart, with the chart's ServiceAccount and
RBAC (the check needs no verb the chart does not grant). No pod runs, so neither the real node
nor the node's images are needed; a few seconds. Needs the cluster (`e2e/cluster up`).
"""

from __future__ import annotations

import json

import pytest

from story import Story, wait_until

NAME = "build-bot"


@pytest.fixture(scope="module")
def story(installed_story):
    """The chart installed and the operator running with its ServiceAccount (conftest.py), without
    the real node and its images: no Job is created here."""
    return installed_story


def taskrun(name: str) -> dict:
    return {
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "metadata": {"name": name},
        "spec": {
            "taskId": 4242,
            "serviceName": "adopts-nothing",
            "task": {"prompt": "say hello"},
            "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]},
        },
    }


def ready(story: Story, name: str) -> dict | None:
    tr = story.json("get", "taskrun", name, "-n", story.work_ns)
    return next((c for c in tr.get("status", {}).get("conditions", []) if c["type"] == "Ready"), None)


def test_a_taskrun_named_like_an_existing_service_account_is_blocked_and_the_account_survives(story: Story):
    ns = story.work_ns
    story.kubectl("create", "serviceaccount", NAME, "-n", ns)
    before = story.json("get", "serviceaccount", NAME, "-n", ns)

    story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(taskrun(NAME)))
    cond = wait_until(
        "the TaskRun to be blocked with NameTaken",
        lambda: (c := ready(story, NAME)) and c["reason"] == "NameTaken" and c,
        timeout=30, interval=0.2,
    )
    assert cond["status"] == "False", cond
    message = cond["message"]
    assert f"ServiceAccount {ns}/{NAME} exists and is not this TaskRun's (it has no controller)" in message, message
    assert "rename the TaskRun" in message and f"kubectl -n {ns} delete serviceaccount {NAME}" in message, message
    events = story.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME}")["items"]
    assert any(e.get("reason") == "NameTaken" and e.get("type") == "Warning" for e in events), events

    # Nothing was applied: not the ServiceAccount, nor any other child.
    after = story.json("get", "serviceaccount", NAME, "-n", ns)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], after
    assert "ownerReferences" not in after["metadata"], after["metadata"]
    for kind, name in [("job", NAME), ("configmap", f"{NAME}-tools"), ("role", NAME),
                       ("rolebinding", NAME), ("lease", NAME)]:
        found = story.kubectl("get", kind, name, "-n", ns, "--ignore-not-found", "-o", "name")
        assert found == "", f"{kind} {name} was created: {found}"

    # The TaskRun goes. A witness it owns shows the garbage collector has handled the deletion.
    uid = story.json("get", "taskrun", NAME, "-n", ns)["metadata"]["uid"]
    witness = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": f"{NAME}-witness", "namespace": ns, "ownerReferences": [
                   {"apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "name": NAME, "uid": uid}]}}
    story.kubectl("create", "-f", "-", stdin=json.dumps(witness))
    story.kubectl("delete", "taskrun", NAME, "-n", ns, "--wait=true")
    wait_until(
        "the garbage collector to delete the TaskRun's dependents",
        lambda: story.kubectl("get", "configmap", f"{NAME}-witness", "-n", ns, "--ignore-not-found", "-o", "name") == "",
        timeout=30, interval=0.2,
    )

    survivor = story.json("get", "serviceaccount", NAME, "-n", ns)
    assert survivor["metadata"]["uid"] == before["metadata"]["uid"], survivor
    assert survivor["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], survivor
    assert "ownerReferences" not in survivor["metadata"], survivor["metadata"]
