"""The approval webhook on the real control plane: the operator (installed with the chart, run on
the host with the chart's ServiceAccount as in the story) with ORCH_APPROVAL_WEBHOOK_URL pointing
at a receiver on 127.0.0.1. A call is held for approval the way a task's proxy says so: its
requests listed on the task's Lease (written here as the cluster admin, whom the chart's Lease
policy does not check; the proxy's side of it is sidecar/tests/python/test_approval*.py). The
receiver gets exactly one body per call, however many reconciles follow: a CloudEvent, then from
a second operator run in Slack format, one for the next call only (the first is listed already),
its hostile tool name escaped. The operator's /metrics shows the call waiting
(approvals_pending, approval_oldest_pending_timestamp_seconds) and the delivery
(approval_notifications_total{outcome="ok"}); the series go when the TaskRun does.

The CRDs are this checkout's, applied server-side (the chart's release does not own them). The task
pod runs on a kwok node (its agent image is the one kwok leaves Running), so neither the
real node nor any image is needed; about 15 s. Needs the cluster (`e2e/cluster up`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import urllib.request
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from story import Story, cargo_binaries, free_port, wait_until  # noqa: E402

TASK = "notify-me"
TASK_ID = 4711
# kwok leaves a pod with this agent image Running (e2e/cluster's stages): the task stays running.
KWOK_RUNNING_AGENT = "e2e.orchestrator.invalid/scripted-agent:latest"
SECRET_PATH = "/services/T000/B000/XXXXSECRETXXXX"
REQUESTS = "orchestrator.io/approval-requests"


class Receiver:
    """An HTTP receiver on 127.0.0.1 that answers 200 and keeps each POST."""

    def __init__(self):
        self.got: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.got.append({"path": self.path, "type": self.headers.get("Content-Type"),
                                         "body": json.loads(body or b"null")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict]:
        with self.lock:
            return list(self.got)


class Operator:
    """The operator binary with the story's environment (the Deployment's) and the webhook."""

    def __init__(self, story: Story, env: dict, url: str, fmt: str):
        self.port = free_port()
        self.log = story.workdir / f"operator-{fmt}.log"
        env = {**env, "ORCH_BIND": f"127.0.0.1:{self.port}", "ORCH_APPROVAL_WEBHOOK_URL": url,
               "ORCH_APPROVAL_WEBHOOK_FORMAT": fmt}
        self.proc = subprocess.Popen([str(story.binaries["orchestrator-operator"])], env=env,
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        story.cleanup.callback(self.stop)
        wait_until("the operator to lead", lambda: self.get("/readyz") == "leader\n", timeout=60)

    def get(self, path: str) -> str:
        assert self.proc.poll() is None, f"the operator exited:\n{self.log.read_text()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.read().decode()
        except OSError:
            return ""

    def metric(self, line: str) -> float | None:
        """The value of the series `line` names (name{labels}), if it is there."""
        for have in self.get("/metrics").splitlines():
            if have.startswith(line + " "):
                return float(have.rsplit(" ", 1)[1])
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)


@pytest.fixture(scope="module")
def story():
    """The chart installed (CRDs, RBAC, catalog, policies) and the story's operator stopped: its
    environment is kept, and each test runs the operator with the webhook on top of it."""
    # The CRDs are cluster-wide and one release owns them (maybe another test's): this checkout's
    # are applied as they are, and this release leaves them alone.
    story = Story(say=lambda *_: None, helm_values=["crds.install=false"])
    for crd in ("taskrun.yaml", "toolapproval.yaml"):
        story.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager", "e2e-approval-webhook",
                      "-f", str(REPO / "crds" / "generated" / crd))
    with ExitStack() as cleanup:
        story.cleanup = cleanup
        story.binaries = cargo_binaries()
        story.images = {"agent": KWOK_RUNNING_AGENT, "mcp-proxy": "example.invalid/proxy:none"}
        envs = []
        real_popen = subprocess.Popen

        def popen(argv, *args, **kwargs):
            if str(argv[0]).endswith("orchestrator-operator"):
                envs.append(dict(kwargs["env"]))
            return real_popen(argv, *args, **kwargs)

        subprocess.Popen = popen
        try:
            story.install()
        finally:
            subprocess.Popen = real_popen
        story.operator.terminate()
        try:
            story.operator.wait(15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the story's operator did not stop:\n{story.operator_log.read_text()[-4000:]}") from None
        story.operator_env = envs[0]
        story.receiver = Receiver()
        cleanup.callback(story.receiver.server.shutdown)
        yield story


def call_digest(namespace: str, task: str, request: dict, params: dict) -> str:
    """orchestrator_crds::approval::CallDigest: SHA-256 of the RFC 8785 canonical JSON (for these
    ASCII strings, sorted-key compact json.dumps; see test_approval.py's shared test vector)."""
    call = {"v": 1, "namespace": namespace, "taskRun": task, "id": request["id"],
            "server": request["server"], "definition": request["definition"],
            "contextVersion": request["contextVersion"], "params": params}
    canonical = json.dumps(call, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def held(story: Story, id: str, tool: str) -> dict:
    """A request as the proxy lists it on the Lease, its arguments holding what looks secret."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    params = {"name": tool, "arguments": {"message": "token hunter2-SECRET-ARG"}}
    request = {"id": id, "server": "everything", "tool": tool, "definition": "sha256:" + "1" * 64,
               "contextVersion": 1, "params": json.dumps(params, separators=(",", ":")),
               "paramsBytes": len(json.dumps(params, separators=(",", ":"))), "maskNonce": "a1b2c3",
               "requestedAt": now.isoformat().replace("+00:00", "Z"),
               "expiresAt": (now + timedelta(minutes=10)).isoformat().replace("+00:00", "Z")}
    request["digest"] = call_digest(story.work_ns, TASK, request, params)
    return request


def proxy_lists(story: Story, requests: list[dict]) -> None:
    story.kubectl("annotate", "lease", TASK, "-n", story.work_ns, "--overwrite",
                  f"{REQUESTS}={json.dumps(requests, separators=(',', ':'))}")


def pending_ids(story: Story) -> list[str]:
    tr = story.json("get", "taskrun", TASK, "-n", story.work_ns)
    return [a["id"] for a in tr.get("status", {}).get("approvals", []) if a["state"] == "Pending"]


def reconciles(operator: Operator) -> float:
    return operator.metric('orchestrator_operator_reconciles_total{outcome="ok"}') or 0


def storm(story: Story, operator: Operator, n: int = 5) -> None:
    """`n` more reconciles of the TaskRun (an annotation each), waited for on the operator's own
    count."""
    for i in range(n):
        before = reconciles(operator)
        story.kubectl("annotate", "taskrun", TASK, "-n", story.work_ns, "--overwrite", f"e2e.orchestrator.io/poke={i}")
        wait_until("a reconcile", lambda: reconciles(operator) > before, timeout=30, interval=0.05)


def test_one_cloudevent_then_one_slack_message_per_waiting_call_and_the_metrics(story: Story):
    ns, receiver = story.work_ns, story.receiver
    first = Operator(story, story.operator_env, receiver.url, "cloudevents")
    taskrun = {"apiVersion": "orchestrator.io/v1", "kind": "TaskRun", "metadata": {"name": TASK},
               "spec": {"taskId": TASK_ID, "serviceName": "webhook",
                        "task": {"prompt": "echo something"},
                        "toolConfig": {"mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]}}}
    story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(taskrun))
    wait_until("the task's Lease", lambda: story.kubectl("get", "lease", "-n", ns, "--ignore-not-found", TASK).strip(),
               timeout=30, interval=0.1)

    a1 = held(story, "a1b2c3d4", "echo")
    proxy_lists(story, [a1])
    wait_until("a1 listed as pending", lambda: pending_ids(story) == ["a1b2c3d4"], timeout=30, interval=0.1)
    wait_until("the CloudEvent", receiver.bodies, timeout=15, interval=0.05)
    storm(story, first)
    got = receiver.bodies()
    assert len(got) == 1, got
    event = got[0]
    assert event["path"] == SECRET_PATH
    assert event["type"] == "application/cloudevents+json"
    body = event["body"]
    assert (body["specversion"], body["type"], body["id"], body["subject"]) == \
        ("1.0", "io.orchestrator.approval.requested", "a1b2c3d4", "everything/echo"), body
    assert body["source"] == f"/apis/orchestrator.io/v1/namespaces/{ns}/taskruns/{TASK}"
    assert body["data"] == {"namespace": ns, "taskRun": TASK, "taskId": TASK_ID, "approvalId": "a1b2c3d4",
                            "server": "everything", "tool": "echo", "digest": a1["digest"],
                            "expiresAt": a1["expiresAt"]}, body
    assert "SECRET-ARG" not in json.dumps(body), "never the call's arguments"

    labels = f'{{namespace="{ns}",taskrun="{TASK}"}}'
    assert first.metric(f"orchestrator_operator_approvals_pending{labels}") == 1
    oldest = first.metric(f"orchestrator_operator_approval_oldest_pending_timestamp_seconds{labels}")
    assert oldest == datetime.fromisoformat(a1["requestedAt"].replace("Z", "+00:00")).timestamp()
    assert first.metric('orchestrator_operator_approval_notifications_total{format="cloudevents",outcome="ok"}') == 1
    log = first.log.read_text()
    assert "XXXXSECRETXXXX" not in log and "approval webhook delivered" in log, log
    first.stop()

    # A second operator process, in Slack format: a1 is listed already (not sent again); a new
    # call, its tool named by a hostile server to ping the channel and plant a link, is.
    second = Operator(story, story.operator_env, receiver.url, "slack")
    hostile = "x<!channel><https://evil.example|approve>"
    a2 = held(story, "e5f6a7b8", hostile)
    proxy_lists(story, [a1, a2])
    wait_until("a2 listed as pending", lambda: set(pending_ids(story)) == {"a1b2c3d4", "e5f6a7b8"},
               timeout=30, interval=0.1)
    wait_until("the Slack message", lambda: len(receiver.bodies()) == 2, timeout=15, interval=0.05)
    storm(story, second)
    got = receiver.bodies()
    assert len(got) == 2, got
    slack = got[1]
    assert slack["type"] == "application/json"
    text = slack["body"]["text"]
    assert set(slack["body"]) == {"text"}
    for part in [f"`{ns}/{TASK}`", f"task {TASK_ID}", "request `e5f6a7b8`", a2["expiresAt"],
                 f"orchestrator-cli -n {ns} task approvals {TASK} --show e5f6a7b8",
                 "`everything/x&lt;!channel&gt;&lt;https://evil.example|approve&gt;`"]:
        assert part in text, (part, text)
    assert "<" not in text and ">" not in text and "a1b2c3d4" not in text, text
    assert second.metric(f"orchestrator_operator_approvals_pending{labels}") == 2
    assert second.metric('orchestrator_operator_approval_notifications_total{format="slack",outcome="ok"}') == 1

    # The TaskRun goes: so do its series.
    story.kubectl("delete", "taskrun", TASK, "-n", ns, "--wait=true")
    wait_until("the approvals series to go",
               lambda: second.metric(f"orchestrator_operator_approvals_pending{labels}") is None,
               timeout=30, interval=0.1)
    assert second.metric(f"orchestrator_operator_approval_oldest_pending_timestamp_seconds{labels}") is None
    second.stop()
