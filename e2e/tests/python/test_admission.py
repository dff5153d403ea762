"""The chart's admission policies on the real control plane: a tenant gets nothing through the
operator that it could not get itself, and nobody but the task's proxy writes its Lease.

One chart install (no operator pod: replicas=0; the policies are the API server's) watching one
namespace, with users impersonated by `kubectl --as`:
- tenant: may create, update and patch TaskRuns and nothing else (`auth can-i get secrets` = no);
- reader: the same, and get on the Secret and ConfigMap the TaskRuns name, use on the
  ServiceAccount `ci`;
- editor: the built-in `edit` role (it may impersonate the namespace's ServiceAccounts and create
  pods) and the TaskRun writes;
- the cluster admin (the e2e kubeconfig).

Shown: a Secret or ConfigMap named in spec.task, spec.agent.env, spec.model (the key, the
endpoint's CAs), a server's secretRefs or podTemplate.imagePullSecrets is refused at admission for the tenant, with each field (and its
index) and the missing permission named, and admitted for the reader; an update is checked only
for the references it adds; a ServiceAccount needs `use` (or `impersonate`); placement outside
the chart's set (a toleration of every taint, the e2e real node's taint and label, a priority
class) is refused for who may not create pods and admitted once the Namespace's annotations
allow it; the created-by annotation names its writer (`task submit` writes it) and never
changes; `task validate` shows a tenant the refusal it would get, creating nothing; a user's or another namespace's account's patch of a proxy Lease and a DELETE of it are
refused, the operator's patch and the garbage collector's delete go through.

Needs the cluster (`e2e/cluster up`) and the CLI (built by cargo_binaries, a no-op when up to
date); about 30 s.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from story import REAL_NODE, STATE, bin_dir, cargo_binaries, wait_until  # noqa: E402

CREATED_BY = "orchestrator.io/created-by"
SECRET, CONFIG_MAP, ACCOUNT = "model-key", "task-text", "ci"


class Cluster:
    """kubectl and helm against the e2e cluster, as the admin or as `--as` someone."""

    def __init__(self):
        self.bins = bin_dir()
        self.kubeconfig = STATE / "kubeconfig"
        if not self.kubeconfig.exists():
            pytest.fail(f"{self.kubeconfig} is missing: is the cluster up? (e2e/cluster up)")
        suffix = secrets.token_hex(3)
        self.ns, self.sys, self.release = f"adm-{suffix}", f"adm-sys-{suffix}", f"adm-{suffix}"
        self.tenant, self.reader, self.editor = f"tenant-{suffix}", f"reader-{suffix}", f"editor-{suffix}"

    def run(self, tool: str, *args: str, stdin: str | None = None, who: str | None = None) -> subprocess.CompletedProcess:
        argv = [str(self.bins / tool), "--kubeconfig", str(self.kubeconfig), *args]
        if who:
            argv += ["--as", who]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True)

    def ok(self, tool: str, *args: str, stdin: str | None = None, who: str | None = None) -> str:
        out = self.run(tool, *args, stdin=stdin, who=who)
        assert out.returncode == 0, f"{tool} {' '.join(args)} as {who or 'admin'} failed:\n{out.stdout}{out.stderr}"
        return out.stdout

    def create(self, obj: dict, who: str | None = None, dry_run: bool = False) -> subprocess.CompletedProcess:
        args = ["create", "-n", self.ns, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        return self.run("kubectl", *args, stdin=json.dumps(obj), who=who)

    def patch(self, kind: str, name: str, patch: dict, who: str | None = None, kind_of_patch: str = "merge") -> subprocess.CompletedProcess:
        return self.run("kubectl", "patch", kind, name, "-n", self.ns, "--type", kind_of_patch,
                        "-p", json.dumps(patch), who=who)

    def json(self, *args: str) -> dict:
        return json.loads(self.ok("kubectl", *args, "-o", "json"))


def refused(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0, f"admitted, should have been refused:\n{out.stdout}"
    assert "denied request" in out.stderr or "forbidden" in out.stderr.lower(), out.stderr
    return out.stderr


def admitted(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, f"refused, should have been admitted:\n{out.stderr}"


def taskrun(name: str, spec: dict | None = None, annotations: dict | None = None) -> dict:
    return {
        "apiVersion": "orchestrator.io/v1", "kind": "TaskRun",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {"taskId": 7, "serviceName": "admission", "task": {"prompt": "say hello"}, **(spec or {})},
    }


def user(name: str) -> str:
    return json.dumps({"user": name}, separators=(",", ":"))


@pytest.fixture(scope="module")
def k():
    k = Cluster()
    crds = "false" if k.run("kubectl", "get", "crd", "taskruns.orchestrator.io").returncode == 0 else "true"
    try:
        k.ok("kubectl", "create", "namespace", k.ns)
        k.ok("helm", "install", k.release, str(REPO / "charts/orchestrator"), "-n", k.sys, "--create-namespace",
             "--set", "replicas=0", "--set", f"crds.install={crds}", "--set", f"watchNamespace={k.ns}")
        k.ok("kubectl", "create", "secret", "generic", SECRET, "-n", k.ns, "--from-literal=api-key=sk-not-for-tenants")
        k.ok("kubectl", "create", "configmap", CONFIG_MAP, "-n", k.ns, "--from-literal=task.md=hello")
        k.ok("kubectl", "create", "serviceaccount", ACCOUNT, "-n", k.ns)
        k.ok("kubectl", "create", "role", "taskruns", "-n", k.ns, "--verb=get,list,create,update,patch",
             "--resource=taskruns.orchestrator.io")
        k.ok("kubectl", "create", "rolebinding", "taskruns", "-n", k.ns, "--role=taskruns",
             f"--user={k.tenant}", f"--user={k.reader}", f"--user={k.editor}")
        k.ok("kubectl", "create", "role", "reads", "-n", k.ns, "--verb=get", "--resource=secrets",
             f"--resource-name={SECRET}")
        k.ok("kubectl", "create", "role", "reads-task", "-n", k.ns, "--verb=get", "--resource=configmaps",
             f"--resource-name={CONFIG_MAP}")
        # `kubectl create role` knows `use` only on podsecuritypolicies; RBAC takes any verb.
        k.ok("kubectl", "create", "-n", k.ns, "-f", "-", stdin=json.dumps({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "uses-ci"},
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["use"],
                       "resourceNames": [ACCOUNT]}]}))
        for role in ("reads", "reads-task", "uses-ci"):
            k.ok("kubectl", "create", "rolebinding", role, "-n", k.ns, f"--role={role}", f"--user={k.reader}")
        k.ok("kubectl", "create", "rolebinding", "edit", "-n", k.ns, "--clusterrole=edit", f"--user={k.editor}")

        # A new policy is enforced a moment after it is created: wait for each (the chart has it).
        probes = {
            "references": taskrun("probe", {"task": {"secretKeyRef": {"name": SECRET, "key": "api-key"}}}),
            "placement": taskrun("probe", {"podTemplate": {"priorityClassName": "system-cluster-critical"}}),
            "created-by": taskrun("probe", annotations={CREATED_BY: user("someone-else")}),
        }
        for what, probe in probes.items():
            policy = f"validatingadmissionpolicy/{k.release}-orchestrator-taskrun-{what}"
            if k.run("kubectl", "get", policy).returncode != 0:
                continue
            wait_until(f"the {what} policy to be enforced",
                       lambda probe=probe: k.create(probe, who=k.tenant, dry_run=True).returncode != 0,
                       timeout=30, interval=0.2)
        yield k
    finally:
        k.run("helm", "uninstall", k.release, "-n", k.sys, "--ignore-not-found")
        k.run("kubectl", "delete", "namespace", k.ns, k.sys, "--wait=false")


def test_a_tenant_cannot_name_what_it_may_not_read_and_a_reader_can(k: Cluster):
    can_i = k.run("kubectl", "auth", "can-i", "get", "secrets", "-n", k.ns, who=k.tenant)
    assert can_i.stdout.strip() == "no", can_i.stdout + can_i.stderr

    def secret_env(name: str, secret: str = SECRET) -> dict:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": "api-key"}}}

    # Each place a TaskRun names a Secret or ConfigMap, and the field the refusal names.
    cases = {
        f"spec.task.secretKeyRef: {k.tenant} may not get secrets/{SECRET}":
            {"task": {"secretKeyRef": {"name": SECRET, "key": "api-key"}}},
        f"spec.task.configMapKeyRef: {k.tenant} may not get configmaps/{CONFIG_MAP}":
            {"task": {"configMapKeyRef": {"name": CONFIG_MAP, "key": "task.md"}}},
        # The attack: the agent prints the Secret into its termination message (status.result).
        f"spec.agent.env[1].valueFrom.secretKeyRef: {k.tenant} may not get secrets/{SECRET}":
            {"agent": {"command": ["sh", "-c", "printf '{\"text\":\"%s\"}' \"$KEY\" > /dev/termination-log"],
                       "env": [{"name": "PLAIN", "value": "x"}, secret_env("KEY")]}},
        f"spec.agent.env[0].valueFrom.configMapKeyRef: {k.tenant} may not get configmaps/{CONFIG_MAP}":
            {"agent": {"env": [{"name": "CM", "valueFrom": {"configMapKeyRef": {"name": CONFIG_MAP, "key": "task.md"}}}]}},
        f"spec.toolConfig.mcpServers[1].secretRefs[0]: {k.tenant} may not get secrets/{SECRET}":
            {"toolConfig": {"mcpServers": [{"name": "time"}, {"name": "github", "secretRefs": [
                {"env": "GITHUB_PERSONAL_ACCESS_TOKEN", "name": SECRET, "key": "api-key"}]}]}},
        f"spec.podTemplate.imagePullSecrets[0]: {k.tenant} may not get secrets/{SECRET}":
            {"podTemplate": {"imagePullSecrets": [{"name": SECRET}]}},
        # The model key: only the task's proxy reads it, but the operator mounts it for the task.
        f"spec.model.secretKeyRef: {k.tenant} may not get secrets/{SECRET}":
            {"model": {"secretKeyRef": {"name": SECRET, "key": "api-key"}}},
    }
    for i, (message, spec) in enumerate(cases.items()):
        text = refused(k.create(taskrun(f"ref-{i}", spec), who=k.tenant))
        assert f"{message} in namespace {k.ns}, and the operator would read it for the task." in text, text
        assert "Name only Secrets and ConfigMaps you may get, or have an admin grant you get on it" in text, text
        # Who may read them gets what it names; the admin too (one check for every Secret).
        admitted(k.create(taskrun(f"ref-{i}", spec), who=k.reader))
        admitted(k.create(taskrun(f"ref-{i}-admin", spec), dry_run=True))
    assert k.run("kubectl", "get", "taskrun", "ref-2", "-n", k.ns).returncode == 0

    # The model endpoint's CAs too: the reader may get the key's Secret, not this ConfigMap.
    model = {"secretKeyRef": {"name": SECRET, "key": "api-key"},
             "caConfigMapKeyRef": {"name": "not-granted-ca", "key": "ca.crt"}}
    text = refused(k.create(taskrun("model-ca", {"model": model}), who=k.reader))
    assert f"spec.model.caConfigMapKeyRef: {k.reader} may not get configmaps/not-granted-ca" in text, text
    model["caConfigMapKeyRef"]["name"] = CONFIG_MAP
    admitted(k.create(taskrun("model-ca", {"model": model}), who=k.reader))

    # Past the first 16 new references, the rest are checked together.
    many = [secret_env(f"K{i}") for i in range(16)] + [secret_env("OTHER", "not-granted")]
    text = refused(k.create(taskrun("many", {"agent": {"env": many}}), who=k.reader))
    assert (f"TaskRun many names more than 16 new Secrets and ConfigMaps, and {k.reader} may not get at least one "
            f"of these in namespace {k.ns}: spec.agent.env[16].valueFrom.secretKeyRef (secrets/not-granted)") in text, text


def test_an_update_is_checked_only_for_the_references_it_adds(k: Cluster):
    name = "shared-work"
    github = {"name": "github", "enabled": False,
              "secretRefs": [{"env": "GITHUB_PERSONAL_ACCESS_TOKEN", "name": SECRET, "key": "api-key"}]}
    admitted(k.create(taskrun(name, {"toolConfig": {"mcpServers": [github]}}), who=k.reader))

    # The tenant edits the tools around the reference the reader made: admitted.
    servers = [{**github, "enabled": True, "tools": {"allow": ["get_*"]}}, {"name": "time"}]
    admitted(k.patch("taskrun", name, {"spec": {"toolConfig": {"mcpServers": servers}}}, who=k.tenant))
    # A reference of its own, or the Secret moved to another server or env var: refused.
    moved = [{"name": "github", "enabled": True},
             {"name": "memory", "secretRefs": [{"env": "GITHUB_PERSONAL_ACCESS_TOKEN", "name": SECRET, "key": "api-key"}]}]
    text = refused(k.patch("taskrun", name, {"spec": {"toolConfig": {"mcpServers": moved}}}, who=k.tenant))
    assert f"spec.toolConfig.mcpServers[1].secretRefs[0]: {k.tenant} may not get secrets/{SECRET}" in text, text
    renamed = [{**github, "secretRefs": [{"env": "OTHER", "name": SECRET, "key": "api-key"}]}]
    text = refused(k.patch("taskrun", name, {"spec": {"toolConfig": {"mcpServers": renamed}}}, who=k.tenant))
    assert f"spec.toolConfig.mcpServers[0].secretRefs[0]: {k.tenant} may not get secrets/{SECRET}" in text, text
    tr = k.json("get", "taskrun", name, "-n", k.ns)
    assert [s["name"] for s in tr["spec"]["toolConfig"]["mcpServers"]] == ["github", "time"], tr["spec"]


def test_a_service_account_needs_use(k: Cluster):
    spec = {"serviceAccountName": ACCOUNT}
    text = refused(k.create(taskrun("as-ci", spec), who=k.tenant))
    assert (f"spec.serviceAccountName: {k.tenant} may not use ServiceAccount {ACCOUNT} in namespace {k.ns} "
            f"(no use or impersonate on serviceaccounts/{ACCOUNT})") in text, text
    assert "Leave serviceAccountName unset" in text and "verbs [use]" in text, text
    admitted(k.create(taskrun("as-ci", spec), who=k.reader))
    # The built-in edit role holds impersonate on the namespace's ServiceAccounts.
    admitted(k.create(taskrun("as-ci-edit", spec), who=k.editor, dry_run=True))


def test_placement_outside_the_allowed_set_is_refused_unless_the_namespace_widens_it(k: Cluster):
    every_taint = taskrun("every-taint", {"podTemplate": {"tolerations": [{"operator": "Exists"}]}})
    text = refused(k.create(every_taint, who=k.tenant))
    assert f"placement not allowed for {k.tenant} in namespace {k.ns}" in text, text
    assert "spec.podTemplate.tolerations[0] (no key: every taint, operator Exists)" in text, text
    assert "admission.placement.tolerations" in text and "orchestrator.io/allowed-tolerations" in text, text

    key, value = REAL_NODE
    real_node = {"nodeSelector": {key: value},
                 "tolerations": [{"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}]}
    text = refused(k.create(taskrun("real-node", {"podTemplate": real_node}), who=k.tenant))
    assert f"spec.podTemplate.tolerations[0] (key {key}, operator Equal, value {value}, effect NoSchedule)" in text, text
    text = refused(k.create(taskrun("real-node", {"podTemplate": {"nodeSelector": {key: value}}}), who=k.tenant))
    assert f"spec.podTemplate.nodeSelector[{key}]" in text, text
    one_node = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}}}}
    text = refused(k.create(taskrun("one-node", {"podTemplate": one_node}), who=k.tenant))
    assert ("spec.podTemplate.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[1].matchFields[0] (field metadata.name)") in text, text
    assert "nodeSelectorTerms[0]" not in text, text
    other_ns = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname",
         "namespaceSelector": {}}]}}}
    text = refused(k.create(taskrun("near-db", {"podTemplate": other_ns}), who=k.tenant))
    assert "spec.podTemplate.affinity.podAffinity (a term reaches pods of other namespaces" in text, text
    text = refused(k.create(taskrun("urgent", {"podTemplate": {"priorityClassName": "system-cluster-critical",
                                                                "runtimeClassName": "runc-unconfined"}}), who=k.tenant))
    assert "spec.podTemplate.priorityClassName (system-cluster-critical; allowed: )" in text, text
    assert "spec.podTemplate.runtimeClassName (runc-unconfined; allowed: )" in text, text

    # The chart's default set is admitted; so is anything for who may create pods (the admin).
    default = {"nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]}
    admitted(k.create(taskrun("defaults", {"podTemplate": default}), who=k.tenant, dry_run=True))
    admitted(k.create(every_taint, dry_run=True))

    # The Namespace's annotations widen it (only who may update the Namespace sets them).
    k.ok("kubectl", "annotate", "namespace", k.ns, f"orchestrator.io/allowed-tolerations={key}={value}",
         f"orchestrator.io/allowed-node-selector-keys={key}")
    wait_until("the widened namespace to admit the real node's placement",
               lambda: k.create(taskrun("real-node", {"podTemplate": real_node}), who=k.tenant, dry_run=True).returncode == 0,
               timeout=30, interval=0.2)
    other_value = {"tolerations": [{"key": key, "operator": "Equal", "value": "other", "effect": "NoSchedule"}]}
    text = refused(k.create(taskrun("other-node", {"podTemplate": other_value}), who=k.tenant))
    assert f"Allowed tolerations: node.kubernetes.io/not-ready, node.kubernetes.io/unreachable, {key}={value}" in text, text
    refused(k.create(every_taint, who=k.tenant))


def test_created_by_names_the_creator_and_stays(k: Cluster):
    text = refused(k.create(taskrun("claimed", annotations={CREATED_BY: user(k.reader)}), who=k.tenant))
    assert f"must name the identity making the request: {user(k.tenant)}, not {user(k.reader)}" in text, text
    admitted(k.create(taskrun("mine", annotations={CREATED_BY: user(k.tenant)}), who=k.tenant))
    admitted(k.create(taskrun("unsigned"), who=k.tenant))

    text = refused(k.run("kubectl", "annotate", "taskrun", "mine", "-n", k.ns, "--overwrite",
                         f"{CREATED_BY}={user(k.reader)}", who=k.reader))
    assert "is set when it is created and cannot be changed afterwards" in text, text
    text = refused(k.run("kubectl", "annotate", "taskrun", "mine", "-n", k.ns, f"{CREATED_BY}-"))
    assert "cannot be removed" in text, text
    text = refused(k.run("kubectl", "annotate", "taskrun", "unsigned", "-n", k.ns,
                         f"{CREATED_BY}={user(k.reader)}", who=k.reader))
    assert "cannot be added" in text, text
    # Other writes leave it as it is and go through.
    admitted(k.run("kubectl", "label", "taskrun", "mine", "-n", k.ns, "reviewed=yes", who=k.reader))
    assert k.json("get", "taskrun", "mine", "-n", k.ns)["metadata"]["annotations"][CREATED_BY] == user(k.tenant)


def test_task_submit_names_its_caller_as_the_creator(k: Cluster):
    cli = cargo_binaries()["orchestrator-cli"]
    out = subprocess.run([str(cli), "--kubeconfig", str(k.kubeconfig), "--as", k.tenant, "-n", k.ns,
                          "--catalog", str(REPO / "config/catalog.yaml"), "task", "submit", "--service", "admission",
                          "--prompt", "say hello", "--tools", "time:get_current_time", "--task-id", "77"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    annotations = k.json("get", "taskrun", "task-77", "-n", k.ns)["metadata"]["annotations"]
    assert annotations[CREATED_BY] == user(k.tenant), annotations


def test_task_validate_shows_a_tenant_what_admission_would_refuse_and_creates_nothing(k: Cluster, tmp_path: Path):
    """`orchestrator-cli task validate` asks the API server for a dry run as its caller: the
    tenant reads the admission policy's refusal (the field and the permission it lacks), the
    reader is told the same file is valid, and nothing is created for either."""
    cli = cargo_binaries()["orchestrator-cli"]
    manifest = tmp_path / "taskrun.yaml"
    manifest.write_text(json.dumps(taskrun("validate-me", {
        "model": {"secretKeyRef": {"name": SECRET, "key": "api-key"}},
        "toolConfig": {"mcpServers": [{"name": "time"}]}})))

    def validate(who: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(cli), "--kubeconfig", str(k.kubeconfig), "--as", who, "-n", k.ns,
                               "--catalog", str(REPO / "config/catalog.yaml"), "task", "validate", str(manifest)],
                              capture_output=True, text=True)

    out = validate(k.tenant)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"spec.model.secretKeyRef: {k.tenant} may not get secrets/{SECRET}" in out.stdout, out.stdout
    assert "1 of 1 TaskRuns would not be accepted" in out.stderr, out.stderr
    out = validate(k.reader)
    assert out.returncode == 0 and "TaskRun validate-me in " in out.stdout and ": valid" in out.stdout, \
        out.stdout + out.stderr
    assert k.run("kubectl", "get", "taskrun", "validate-me", "-n", k.ns).returncode != 0, "a dry run created it"


def test_only_the_proxy_writes_its_lease_and_nobody_deletes_it(k: Cluster):
    # What the operator makes for a task: a Lease bound to the task pod's uid, owned (here) by a
    # ConfigMap standing in for the TaskRun.
    owner = k.json("create", "configmap", "lease-owner", "-n", k.ns, "--from-literal=x=y")
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
        "name": "task-1", "labels": {"orchestrator.io/proxy-lease": "true"},
        "annotations": {"orchestrator.io/proxy-pod-uid": "3e5d0c1a-0000-4000-8000-000000000001",
                        "orchestrator.io/proxy-pod": "task-1-abcde"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "lease-owner",
                             "uid": owner["metadata"]["uid"]}]}}
    admitted(k.create(lease))
    writer = f"lease-writer-{k.tenant}"
    k.ok("kubectl", "create", "role", "leases", "-n", k.ns, "--verb=get,patch,update,delete",
         "--resource=leases.coordination.k8s.io")
    other = "system:serviceaccount:default:default"
    k.ok("kubectl", "create", "rolebinding", "leases", "-n", k.ns, "--role=leases", f"--user={writer}",
         "--serviceaccount=default:default")
    served = {"metadata": {"annotations": {"orchestrator.io/served-context-version": "9"}}}

    def patch_refused(who: str | None) -> str:
        return refused(k.patch("lease", "task-1", served, who=who))

    wait_until("the Lease policy to refuse a user's patch",
               lambda: k.patch("lease", "task-1", served, who=writer).returncode != 0, timeout=30, interval=0.2)
    text = patch_refused(writer)
    assert f"only the proxy of the task pod task-1-abcde may write Lease task-1; {writer} presented a token bound to no pod" in text, text
    assert "bound to no pod" in patch_refused(other), "another namespace's ServiceAccount with a binding"
    for who in (writer, other):
        text = refused(k.run("kubectl", "delete", "lease", "task-1", "-n", k.ns, who=who))
        assert "may not delete it (it goes with its TaskRun: delete the TaskRun)" in text, text

    # The operator writes it; so does whoever may write TaskRuns' status (another release's
    # operator, the cluster admin: it could write the approvals directly); the garbage collector
    # deletes it with its owner.
    operator = f"system:serviceaccount:{k.sys}:{k.release}-orchestrator-operator"
    admitted(k.patch("lease", "task-1", served, who=operator))
    admitted(k.patch("lease", "task-1", served))
    k.ok("kubectl", "delete", "configmap", "lease-owner", "-n", k.ns)
    wait_until("the garbage collector to delete the Lease with its owner",
               lambda: k.run("kubectl", "get", "lease", "task-1", "-n", k.ns).returncode != 0,
               timeout=60, interval=0.5)
