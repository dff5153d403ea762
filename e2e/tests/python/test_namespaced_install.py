"""The namespaced install, on the real control plane: the chart installed with
`watchNamespaces: [<work>, <work>-b]` gives the operator's ServiceAccount a Role in each of the
two and nothing cluster-wide, and the operator watches exactly those namespaces.

- `kubectl auth can-i --as` the operator's ServiceAccount: it may patch pods and read Secrets in
  a watched namespace; in `kube-system` and in an unwatched namespace it may not, nor use any
  resource of docs/operator.md's table; no ClusterRoleBinding names it.
- A TaskRun in each watched namespace is reconciled (status, ConfigMap, Job); one in an
  unwatched namespace, applied first, is left alone: no status, no child, no event.
- The operator told to watch a namespace it has no Role in exits at start, naming that namespace
  and what it lacks there.

The operator runs as in the story: the chart's Deployment env, the chart's ServiceAccount token.
Jobs run on kwok nodes (nothing is pulled). Needs the cluster (`e2e/cluster up`); about 15 s.
"""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import ExitStack

import pytest

from story import Story, cargo_binaries, chart_object, wait_until

# What the operator's rules cover (operator/src/rbac.rs), as `kubectl auth can-i --list` names them.
RESOURCES = {
    "taskruns.orchestrator.io", "toolapprovals.orchestrator.io", "taskruns.orchestrator.io/status",
    "configmaps", "jobs.batch", "pods", "serviceaccounts", "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io", "leases.coordination.k8s.io", "secrets",
    "events.events.k8s.io",
}


@pytest.fixture(scope="module")
def story():
    """The chart installed with two watched namespaces and the operator running with its
    ServiceAccount; a third namespace it does not watch."""
    story = Story(say=lambda *_: None)
    story.watched_b = f"{story.work_ns}-b"
    story.unwatched = f"{story.work_ns}-other"
    # The story's install sets watchNamespace to its work namespace; these come after it.
    story.helm_values = ["watchNamespace=", f"watchNamespaces={{{story.work_ns},{story.watched_b}}}"]
    with ExitStack() as cleanup:
        story.cleanup = cleanup
        for ns in (story.watched_b, story.unwatched):  # the chart's Roles need them first
            story.kubectl("create", "namespace", ns)
            cleanup.callback(story.kubectl, "delete", "namespace", ns, "--wait=false")
        story.binaries = cargo_binaries()
        # Never pulled: the Jobs' pods run on kwok nodes.
        story.images = {"agent": "example.invalid/agent:none", "mcp-proxy": "example.invalid/proxy:none"}
        story.install()
        story.account = f"system:serviceaccount:{story.system_ns}:orchestrator-operator"
        yield story


def can_i(story: Story, *args: str) -> str:
    """`kubectl auth can-i ARGS` as the operator's ServiceAccount: yes or no."""
    out = subprocess.run([str(story.bins / "kubectl"), "--kubeconfig", str(story.kubeconfig),
                          "auth", "can-i", *args, "--as", story.account], capture_output=True, text=True)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i {args}: {out.stdout}{out.stderr}"
    return answer


def granted(story: Story, ns: str) -> set[str]:
    """The resources the operator's ServiceAccount may use in `ns` (`kubectl auth can-i --list`)."""
    out = story.kubectl("auth", "can-i", "--list", "-n", ns, "--as", story.account)
    return {line.split()[0] for line in out.splitlines()[1:] if line.strip() and not line.startswith(" ")}


def taskrun(name: str) -> dict:
    return {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": name},
        "spec": {"taskId": 4343, "serviceName": "namespaced", "task": {"prompt": "say hello"},
                 "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]}},
    }


def test_the_operators_account_has_a_role_in_each_watched_namespace_and_nothing_cluster_wide(story: Story):
    for ns in (story.work_ns, story.watched_b):
        for verb, resource in [("patch", "pods"), ("get", "secrets"), ("list", "taskruns.orchestrator.io"),
                               ("create", "jobs.batch"), ("watch", "leases.coordination.k8s.io")]:
            assert can_i(story, verb, resource, "-n", ns) == "yes", f"{verb} {resource} in watched {ns}"
    for ns in ("kube-system", story.unwatched):
        assert can_i(story, "patch", "pods", "-n", ns) == "no", ns
        assert can_i(story, "get", "secrets", "-n", ns) == "no", ns
        assert can_i(story, "list", "taskruns.orchestrator.io", "-n", ns) == "no", ns
        assert not granted(story, ns) & RESOURCES, f"in {ns}: {granted(story, ns) & RESOURCES}"
    for verb, resource in [("list", "taskruns.orchestrator.io"), ("list", "pods"), ("get", "secrets"),
                           ("list", "configmaps"), ("create", "roles.rbac.authorization.k8s.io")]:
        assert can_i(story, verb, resource, "--all-namespaces") == "no", f"{verb} {resource} cluster-wide"
    name = chart_object("operator")
    bindings = [b["metadata"]["name"] for b in story.json("get", "clusterrolebindings")["items"]
                if any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                       and s.get("namespace") == story.system_ns for s in b.get("subjects") or [])]
    assert bindings == [], f"ClusterRoleBindings naming the operator's account: {bindings}"


def test_taskruns_in_the_watched_namespaces_are_reconciled_and_one_elsewhere_is_left_alone(story: Story):
    # The unwatched one first: it has had longer than the others when they are checked.
    story.kubectl("apply", "-n", story.unwatched, "-f", "-", stdin=json.dumps(taskrun("elsewhere")))
    for ns in (story.work_ns, story.watched_b):
        story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(taskrun("here")))

    def job_created(ns: str):
        status = story.json("get", "taskrun", "here", "-n", ns).get("status", {})
        cond = next((c for c in status.get("conditions", []) if c["type"] == "JobCreated"), {})
        return status if cond.get("status") == "True" else None

    for ns in (story.work_ns, story.watched_b):
        status = wait_until(f"the TaskRun in watched {ns} to get its Job", lambda: job_created(ns),
                            timeout=60, interval=0.2)
        assert status.get("configMapName") == "here-tools", status
        story.kubectl("get", "configmap", "here-tools", "-n", ns)
        story.kubectl("get", "job", "here", "-n", ns)

    ns = story.unwatched
    tr = story.json("get", "taskrun", "elsewhere", "-n", ns)
    assert "status" not in tr, tr.get("status")
    assert tr["metadata"]["generation"] == 1 and "finalizers" not in tr["metadata"], tr["metadata"]
    managers = {m.get("manager") for m in tr["metadata"].get("managedFields", [])}
    assert not any(m and m.startswith("orchestrator-operator") for m in managers), managers
    for kind, name in [("configmap", "elsewhere-tools"), ("job", "elsewhere"), ("serviceaccount", "elsewhere"),
                       ("role", "elsewhere"), ("rolebinding", "elsewhere"), ("lease", "elsewhere")]:
        found = story.kubectl("get", kind, name, "-n", ns, "--ignore-not-found", "-o", "name")
        assert found == "", f"{kind} {name} was made in the unwatched namespace: {found}"
    events = story.json("get", "events", "-n", ns)["items"]
    assert events == [], [e.get("reason") for e in events]
    log = story.operator_log.read_text()
    assert ns not in log, f"the operator's log names the unwatched namespace:\n{log[-3000:]}"
    assert "forbidden" not in log.lower(), f"the operator was refused something:\n{log[-3000:]}"


def test_an_operator_told_to_watch_a_namespace_without_its_role_exits_naming_it(story: Story):
    deployment = story.json("get", "deployment", chart_object("operator"), "-n", story.system_ns)
    env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(story.workdir / "operator.kubeconfig")}
    for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
    env.update(ORCH_WATCH_NAMESPACE=f"{story.work_ns},{story.unwatched}", ORCH_BIND="127.0.0.1:0",
               ORCH_LEADER_ELECTION="false", ORCH_LOG_JSON="false", POD_NAME="misconfigured-0")
    out = subprocess.run([str(story.binaries["orchestrator-operator"])], env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert f"namespace {story.unwatched}: taskruns (orchestrator.io): get, list, watch, delete" in text, text
    assert "pods (core): list, patch" in text and "secrets (core): get" in text, text
    assert f"namespace {story.work_ns}:" not in text, text
