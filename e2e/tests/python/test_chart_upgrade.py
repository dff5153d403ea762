"""The chart's upgrade path and its cancel policy, on the real control plane (no pod runs: the
operator is installed with replicas=0; a few seconds each; needs `e2e/cluster up`).

Upgrade, from the chart of commit OLD and from one before the ToolApproval CRD: the cluster as
a 0.1.x install left it (that chart's CRDs, which came from its crds/ folder with no Helm
ownership) -> `helm install` that chart -> a TaskRun ->
`helm upgrade` to the working chart refuses without --take-ownership and names the CRD ->
`helm upgrade --reset-then-reuse-values --take-ownership` brings the new CRDs: a status with `result` (pruned by the old
schema) and phase Cancelled (refused by the old enum) are kept, the old TaskRun is still there,
the CRDs carry the keep policy; a second plain `helm upgrade` needs no flag; `helm uninstall`
leaves the CRDs, at the working chart's version.

The cluster is shared: the CRDs are cluster-wide, so this test has them at the old version for a
few seconds (pytest runs these files one at a time; run it under /tmp/orch-e2e.lock beside other
work) and always leaves them at the working version, never deleted (deleting a CRD deletes every
TaskRun of every other test).

Cancel policy: with the working chart installed, two users (impersonated with `kubectl --as`)
who may patch TaskRuns: the orchestrator.io/cancel annotation must name its writer, and once set
nobody may change or remove it.
"""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from story import STATE, bin_dir, wait_until  # noqa: E402

# Charts 0.1.0, with their CRDs in crds/: the last one (27d6d0d), and one from before the
# ToolApproval CRD existed (607cf88). In a fresh cluster the upgrade from the latter creates the
# ToolApproval CRD; in a shared one it exists already (never deleted here: other tests' approvals
# live in it) and the upgrade takes it over.
OLD = "27d6d0d"
BEFORE_TOOLAPPROVAL = "607cf88"
CRDS = ("toolapproval.yaml", "taskrun.yaml")
CANCEL = "orchestrator.io/cancel"


class Kube:
    def __init__(self):
        self.bins = bin_dir()
        self.kubeconfig = STATE / "kubeconfig"
        if not self.kubeconfig.exists():
            pytest.fail(f"{self.kubeconfig} is missing: is the cluster up? (e2e/cluster up)")

    def run(self, tool: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        argv = [str(self.bins / tool), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True)

    def ok(self, tool: str, *args: str, stdin: str | None = None) -> str:
        out = self.run(tool, *args, stdin=stdin)
        assert out.returncode == 0, f"{tool} {' '.join(args)} failed:\n{out.stdout}{out.stderr}"
        return out.stdout

    def refused(self, tool: str, *args: str, stdin: str | None = None) -> str:
        out = self.run(tool, *args, stdin=stdin)
        assert out.returncode != 0, f"{tool} {' '.join(args)} should have failed:\n{out.stdout}"
        return out.stdout + out.stderr

    def json(self, *args: str) -> dict:
        return json.loads(self.ok("kubectl", *args, "-o", "json"))

    def crd_exists(self, name: str) -> bool:
        return self.run("kubectl", "get", "crd", name).returncode == 0

    def crd_writers(self) -> list:
        crd = self.json("get", "crd", "taskruns.orchestrator.io", "--show-managed-fields")
        return [(m["manager"], m["operation"], m.get("time")) for m in crd["metadata"].get("managedFields", [])]

    def put_crd(self, text: str) -> None:
        """The CRD exactly as `text` says (a full replace, so fields another writer added go)."""
        name = "taskruns.orchestrator.io" if "kind: TaskRun\n" in text else "toolapprovals.orchestrator.io"
        verb = "replace" if self.crd_exists(name) else "create"
        self.ok("kubectl", verb, "-f", "-", stdin=text)
        self.ok("kubectl", "wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


@pytest.fixture()
def kube():
    return Kube()


def taskrun(name: str, annotations: dict | None = None) -> str:
    return json.dumps({
        "apiVersion": "orchestrator.io/v1",
        "kind": "TaskRun",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "taskId": 2901,
            "serviceName": "upgrade",
            "task": {"prompt": "say hello"},
            "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]},
        },
    })


def old_chart(dest: Path, commit: str) -> Path:
    """The chart of `commit`, as `git archive COMMIT charts/orchestrator | tar -x` gives it."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "charts/orchestrator"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "charts/orchestrator"


def status_patch(kube: Kube, ns: str, name: str, status: dict, *args: str) -> subprocess.CompletedProcess:
    return kube.run("kubectl", "patch", "taskrun", name, "-n", ns, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": status}), *args)


@pytest.mark.parametrize("commit", [OLD, BEFORE_TOOLAPPROVAL])
def test_upgrade_from_0_1_brings_new_crds_and_keeps_taskruns(kube: Kube, tmp_path: Path, commit: str):
    old = old_chart(tmp_path, commit)
    assert (old / "crds/taskrun.yaml").exists() and "version: 0.1.0" in (old / "Chart.yaml").read_text()
    assert (old / "crds/toolapproval.yaml").exists() == (commit == OLD)
    working = REPO / "charts/orchestrator"
    suffix = secrets.token_hex(3)
    ns, release = f"chart-upgrade-{suffix}", f"up-{suffix}"
    result = {"subtype": "success", "isError": False, "turns": 3, "text": "done"}
    upgraded = False
    try:
        # The cluster as 0.1.x left it: its CRDs (helm install skips crds/ when they exist).
        for f in CRDS:
            if (old / "crds" / f).exists():
                kube.put_crd((old / "crds" / f).read_text())
        kube.ok("helm", "install", release, str(old), "-n", ns, "--create-namespace", "--set", "replicas=0")
        kube.ok("kubectl", "apply", "-n", ns, "-f", "-", stdin=taskrun("before-upgrade"))

        # The old schema: a result is pruned, Cancelled is not a phase. (The API server serves a
        # replaced CRD's schema a moment after it is Established: wait for it, writing nothing.)
        def pruned():
            out = status_patch(kube, ns, "before-upgrade", {"result": result}, "--dry-run=server", "-o", "json")
            return out.returncode == 0 and "result" not in json.loads(out.stdout).get("status", {})
        try:
            wait_until("the API server to serve the old TaskRun schema", pruned, timeout=30, interval=0.2)
        except AssertionError as e:
            # Another writer of the CRD in the shared cluster (e2e's install_taskrun_crd) wins.
            raise AssertionError(f"{e}\nthe TaskRun CRD's writers: {kube.crd_writers()}") from None
        kube.ok("kubectl", "patch", "taskrun", "before-upgrade", "-n", ns, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": {"result": result}}))
        assert "result" not in kube.json("get", "taskrun", "before-upgrade", "-n", ns).get("status", {})
        out = status_patch(kube, ns, "before-upgrade", {"phase": "Cancelled"})
        assert out.returncode != 0 and "Unsupported value" in out.stderr, out.stderr

        # The CRDs carry no Helm ownership: Helm refuses to adopt them unless told to.
        text = kube.refused("helm", "upgrade", release, str(working), "-n", ns, "--set", "replicas=0")
        assert "CustomResourceDefinition" in text and "invalid ownership metadata" in text, text

        # As docs/operator.md says: --reset-then-reuse-values keeps what was set (replicas=0) on the
        # new chart's defaults (plain --reuse-values would keep 0.1.0's defaults, which lack the
        # new values, and fail to render).
        kube.ok("helm", "upgrade", release, str(working), "-n", ns, "--reset-then-reuse-values",
                "--take-ownership")
        upgraded = True
        deployment = kube.json("get", "deployment", f"{release}-orchestrator-operator", "-n", ns)
        assert deployment["spec"]["replicas"] == 0
        for f in CRDS:
            name = f"{f.removesuffix('.yaml')}s.orchestrator.io"
            crd = kube.json("get", "crd", name)
            annotations = crd["metadata"]["annotations"]
            assert annotations.get("helm.sh/resource-policy") == "keep", annotations
            assert annotations.get("meta.helm.sh/release-name") == release, annotations

        # The new fields, on the TaskRun created before the upgrade.
        def kept():
            status_patch(kube, ns, "before-upgrade", {"result": result})
            tr = kube.json("get", "taskrun", "before-upgrade", "-n", ns)
            return tr if tr.get("status", {}).get("result") else None
        tr = wait_until("status.result to be kept by the upgraded CRD", kept, timeout=30, interval=0.5)
        assert tr["status"]["result"]["turns"] == 3 and tr["status"]["result"]["text"] == "done"
        assert tr["spec"]["taskId"] == 2901 and tr["spec"]["serviceName"] == "upgrade"
        out = status_patch(kube, ns, "before-upgrade", {"phase": "Cancelled"})
        assert out.returncode == 0, out.stderr
        assert kube.json("get", "taskrun", "before-upgrade", "-n", ns)["status"]["phase"] == "Cancelled"

        # 0.2.0 -> 0.2.0 with other values: Helm owns everything now, no flag needed.
        kube.ok("helm", "upgrade", release, str(working), "-n", ns, "--reuse-values",
                "--set", "metrics.service.enabled=true")
        releases = json.loads(kube.ok("helm", "list", "-n", ns, "-o", "json"))
        assert [(r["chart"], r["revision"]) for r in releases] == [("orchestrator-0.2.0", "3")], releases

        # Uninstall: the release's objects go, the CRDs (and so the TaskRun) stay.
        kube.ok("helm", "uninstall", release, "-n", ns, "--wait", "--timeout", "60s")
        for f in CRDS:
            assert kube.crd_exists(f"{f.removesuffix('.yaml')}s.orchestrator.io")
        assert kube.json("get", "taskrun", "before-upgrade", "-n", ns)["status"]["result"]["turns"] == 3
    finally:
        kube.run("helm", "uninstall", release, "-n", ns, "--ignore-not-found")
        if not upgraded:
            # Never leave other tests the old schema.
            for f in CRDS:
                kube.put_crd((REPO / "crds/generated" / f).read_text())
        kube.run("kubectl", "delete", "namespace", ns, "--wait=false")


def test_cancel_annotation_names_its_writer_and_stays(kube: Kube):
    suffix = secrets.token_hex(3)
    ns, release = f"chart-cancel-{suffix}", f"cancel-{suffix}"
    alice, bob = f"alice-{suffix}", f"bob-{suffix}"
    # CRDs are cluster-wide and belong to one release: install them only where none are.
    crds = "true" if not kube.crd_exists("taskruns.orchestrator.io") else "false"
    try:
        kube.ok("helm", "install", release, str(REPO / "charts/orchestrator"), "-n", ns,
                "--create-namespace", "--set", "replicas=0", "--set", f"crds.install={crds}")
        kube.ok("kubectl", "create", "role", "taskrun-writer", "-n", ns, "--verb=get,list,create,update,patch",
                "--resource=taskruns.orchestrator.io")
        kube.ok("kubectl", "create", "rolebinding", "taskrun-writers", "-n", ns, "--role=taskrun-writer",
                f"--user={alice}", f"--user={bob}")

        def value(user: str) -> str:
            return json.dumps({"user": user}, separators=(",", ":"))

        def annotate(who: str, *args: str) -> subprocess.CompletedProcess:
            return kube.run("kubectl", "annotate", "taskrun", "t", "-n", ns, "--as", who, *args)

        # The API server starts enforcing a new policy a moment after it is created.
        def enforced():
            out = kube.run("kubectl", "create", "--dry-run=server", "-n", ns, "-f", "-", "--as", bob,
                           stdin=taskrun("probe", {CANCEL: value(alice)}))
            return out.returncode != 0 and "must name the identity" in out.stderr
        wait_until("the cancel policy to be enforced", enforced, timeout=30, interval=0.2)

        kube.ok("kubectl", "create", "-n", ns, "-f", "-", "--as", alice, stdin=taskrun("t"))
        # Bob cannot cancel in Alice's name; not at create either.
        out = annotate(bob, f"{CANCEL}={value(alice)}")
        assert out.returncode != 0, out.stdout
        assert f"must name the identity making the request: {value(bob)}, not {value(alice)}" in out.stderr, out.stderr
        out = kube.run("kubectl", "create", "-n", ns, "-f", "-", "--as", bob,
                       stdin=taskrun("t2", {CANCEL: value(alice)}))
        assert out.returncode != 0 and "must name the identity" in out.stderr, out.stderr
        kube.ok("kubectl", "create", "-n", ns, "-f", "-", "--as", bob, stdin=taskrun("t3", {CANCEL: value(bob)}))
        # Something that is not the JSON the CLI writes names nobody: refused.
        out = annotate(alice, f"{CANCEL}=yes")
        assert out.returncode != 0 and "must name the identity" in out.stderr, out.stderr

        # Alice cancels in her own name.
        out = annotate(alice, f"{CANCEL}={value(alice)}")
        assert out.returncode == 0, out.stderr
        # Then nobody rewrites or removes it, the cluster admin included.
        out = annotate(bob, "--overwrite", f"{CANCEL}={value(bob)}")
        assert out.returncode != 0 and "cannot be changed" in out.stderr, out.stderr
        out = annotate(alice, f"{CANCEL}-")
        assert out.returncode != 0 and "cannot be removed" in out.stderr, out.stderr
        out = kube.run("kubectl", "annotate", "taskrun", "t", "-n", ns, f"{CANCEL}-")
        assert out.returncode != 0 and "cannot be removed" in out.stderr, out.stderr
        # Writes that leave it as it is go through, whoever makes them.
        out = kube.run("kubectl", "label", "taskrun", "t", "-n", ns, "--as", bob, "reviewed=yes")
        assert out.returncode == 0, out.stderr
        tr = kube.json("get", "taskrun", "t", "-n", ns)
        assert tr["metadata"]["annotations"][CANCEL] == value(alice)
        assert tr["metadata"]["labels"]["reviewed"] == "yes"
    finally:
        kube.run("helm", "uninstall", release, "-n", ns, "--ignore-not-found")
        kube.run("kubectl", "delete", "namespace", ns, "--wait=false")
