"""The chart's monitoring kit (docs/operator.md, "Monitoring"): each part off by default and on by
one value; the alert rules, taken from `helm template` output, pass `promtool check rules` and
`promtool test rules` (each alert fires on the series it is about, with its labels, and stays
quiet where it should); every metric a rule or panel names is one the operator or the proxy
registers (e2e/tools/monitoring-metric-names lists them; the story compares them with real
scrapes); the approval webhook's URL comes only from a Secret; and the API server accepts every
object with the Prometheus Operator's own CRDs installed.

promtool is built from the Prometheus Go module by e2e/tools/promtool (e2e/setup starts that
build in the background; this waits for it). The Prometheus Operator CRDs come from its Go module
(e2e/tools/prometheus-operator-crds). Needs `e2e/cluster up` for the last test only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]

from story import STATE, bin_dir  # noqa: E402

CHART = REPO / "charts/orchestrator"
PARTS = {
    "monitoring.podMonitor.enabled": ("PodMonitor", "r-orchestrator-task-pods"),
    "monitoring.serviceMonitor.enabled": ("ServiceMonitor", "r-orchestrator-operator"),
    "monitoring.prometheusRule.enabled": ("PrometheusRule", "r-orchestrator"),
    "monitoring.dashboard.enabled": ("ConfigMap", "r-orchestrator-dashboard"),
}
# The alerts the kit promises (issue 29) and the metric each one reads.
ALERTS = {
    "OrchestratorTaskRunsFailing": "orchestrator_operator_taskrun_phase_transitions_total",
    "OrchestratorApprovalWaiting": "orchestrator_operator_approval_oldest_pending_timestamp_seconds",
    "McpProxyConfigReloadFailing": "mcp_proxy_config_reloads_total",
    "McpProxyUpstreamCrashLooping": "mcp_proxy_upstream_restarts_total",
    "OrchestratorReconcileErrors": "orchestrator_operator_reconcile_errors_total",
    "OrchestratorOperatorAbsent": "orchestrator_operator_build_info",
}


@pytest.fixture(scope="module")
def bins() -> Path:
    return bin_dir()


def helm_template(bins: Path, *values: str, ok: bool = True) -> subprocess.CompletedProcess:
    argv = [str(bins / "helm"), "template", "r", str(CHART), "-n", "sys", "--kube-version", "1.35.0"]
    for v in values:
        argv += ["--set", v]
    out = subprocess.run(argv, capture_output=True, text=True)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def docs(bins: Path, *values: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(helm_template(bins, *values).stdout) if d]


def kit(objects: list[dict]) -> list[tuple[str, str]]:
    """The monitoring objects among `objects`, as (kind, name)."""
    kinds = {kind for kind, _ in PARTS.values()}
    return sorted(
        (d["kind"], d["metadata"]["name"]) for d in objects
        if d["kind"] in kinds - {"ConfigMap"}
        or (d["kind"] == "ConfigMap" and (d["metadata"].get("labels") or {}).get("grafana_dashboard") == "1")
    )


def operator_env(objects: list[dict]) -> dict[str, dict]:
    deployment = next(d for d in objects if d["kind"] == "Deployment")
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def metrics_service(objects: list[dict]) -> list[str]:
    return [d["metadata"]["name"] for d in objects if d["kind"] == "Service"]


def all_on() -> list[str]:
    return [f"{value}=true" for value in PARTS]


def rule_groups(bins: Path, *values: str) -> dict:
    rule = next(d for d in docs(bins, *all_on(), *values) if d["kind"] == "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def test_each_part_is_off_by_default_and_on_by_its_own_value(bins: Path):
    default = docs(bins)
    assert kit(default) == []
    env = operator_env(default)
    assert "ORCH_SIDECAR_METRICS_PORT" not in env and "ORCH_APPROVAL_WEBHOOK_URL" not in env
    assert metrics_service(default) == []
    for value, want in PARTS.items():
        objects = docs(bins, f"{value}=true")
        assert kit(objects) == [want], value
        # The PodMonitor only finds a port if the operator gives the proxies one.
        has_port = "ORCH_SIDECAR_METRICS_PORT" in operator_env(objects)
        assert has_port == (value == "monitoring.podMonitor.enabled"), value
        # The ServiceMonitor needs the operator's metrics Service.
        assert bool(metrics_service(objects)) == (value == "monitoring.serviceMonitor.enabled"), value
    assert kit(docs(bins, *all_on())) == sorted(PARTS.values())


def test_pod_monitor_scrapes_the_task_pods_metrics_port(bins: Path):
    objects = docs(bins, "monitoring.podMonitor.enabled=true", "monitoring.podMonitor.port=9100",
                   "monitoring.labels.release=kube-prometheus-stack")
    assert operator_env(objects)["ORCH_SIDECAR_METRICS_PORT"]["value"] == "9100"
    pm = next(d for d in objects if d["kind"] == "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The label the operator puts on every task pod (operator/src/render).
    assert pm["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "orchestrator-operator"}}
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    [endpoint] = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"taskrun", "task_id", "service"}
    sources = "".join(p.read_text() for p in (REPO / "operator/src").rglob("*.rs"))
    assert '"app.kubernetes.io/managed-by"' in sources and '"orchestrator-operator"' in sources
    # Namespaced installs scrape only the watched namespaces.
    pm = next(d for d in docs(bins, "monitoring.podMonitor.enabled=true", "watchNamespaces={team-a,team-b}")
              if d["kind"] == "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    # The ServiceMonitor keeps the operator's own `namespace` label (the TaskRun's).
    sm = next(d for d in docs(bins, "monitoring.serviceMonitor.enabled=true") if d["kind"] == "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["spec"]["endpoints"][0]["port"] == "http-metrics"


def test_the_webhook_url_comes_only_from_a_secret(bins: Path):
    objects = docs(bins, "approvals.webhook.secretName=approval-hook", "approvals.webhook.secretKey=slack-url",
                   "approvals.webhook.format=cloudevents")
    env = operator_env(objects)
    assert env["ORCH_APPROVAL_WEBHOOK_URL"] == {
        "name": "ORCH_APPROVAL_WEBHOOK_URL",
        "valueFrom": {"secretKeyRef": {"name": "approval-hook", "key": "slack-url"}},
    }
    assert env["ORCH_APPROVAL_WEBHOOK_FORMAT"]["value"] == "cloudevents"
    out = helm_template(bins, "approvals.webhook.secretName=hook", "approvals.webhook.format=teams", ok=False)
    assert out.returncode != 0 and "/approvals/webhook/format" in out.stderr, out.stderr
    # A URL is no value of the chart: it would end up in the Deployment.
    out = helm_template(bins, "approvals.webhook.url=https://hooks.example/T0", ok=False)
    assert out.returncode != 0 and "'url' not allowed" in out.stderr, out.stderr


def promtool() -> str:
    out = subprocess.run([str(REPO / "e2e/tools/promtool")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


# Input series -> alerts, at 1-minute steps from time 0. Each alert fires on the series it is
# about with that series' labels, and not on its neighbours or before its time.
RULE_TESTS = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # team-a: one TaskRun fails at 3m; team-b: only successes.
                {"series": 'orchestrator_operator_taskrun_phase_transitions_total{namespace="team-a",phase="Failed"}',
                 "values": "0 0 0 1x40"},
                {"series": 'orchestrator_operator_taskrun_phase_transitions_total{namespace="team-b",phase="Succeeded"}',
                 "values": "0+1x40"},
                # A call of t1 held since time 60 s; one of t2 since 540 s.
                {"series": 'orchestrator_operator_approval_oldest_pending_timestamp_seconds{namespace="team-a",taskrun="t1"}',
                 "values": "60x40"},
                {"series": 'orchestrator_operator_approval_oldest_pending_timestamp_seconds{namespace="team-a",taskrun="t2"}',
                 "values": "540x40"},
                # Pod p1 gets one invalid config at 3m; p2 reloads fine all along.
                {"series": 'mcp_proxy_config_reloads_total{namespace="team-a",pod="p1",result="failed",source="api"}',
                 "values": "0 0 0 1x40"},
                {"series": 'mcp_proxy_config_reloads_total{namespace="team-a",pod="p2",result="ok",source="api"}',
                 "values": "0+1x40"},
                # github restarts every minute for 6 minutes, time once.
                {"series": 'mcp_proxy_upstream_restarts_total{namespace="team-a",pod="p1",server="github"}',
                 "values": "0+1x6 6x34"},
                {"series": 'mcp_proxy_upstream_restarts_total{namespace="team-a",pod="p1",server="time"}',
                 "values": "0 0 1x40"},
                # The operator fails a reconcile every minute from 1m to 25m, then recovers.
                {"series": 'orchestrator_operator_reconcile_errors_total{outcome="kube_api"}',
                 "values": "0+1x25 25x15"},
                # The operator reports until 10m, then no scrape finds it.
                {"series": 'orchestrator_operator_build_info{version="0.1.0"}', "values": "1x10 _x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "OrchestratorTaskRunsFailing",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "namespace": "team-a", "team": "platform"}}]},
                {"eval_time": "25m", "alertname": "OrchestratorTaskRunsFailing", "exp_alerts": []},
                {"eval_time": "9m", "alertname": "OrchestratorApprovalWaiting", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "OrchestratorApprovalWaiting",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "team": "platform", "namespace": "team-a",
                                                "taskrun": "t1"}}]},
                {"eval_time": "5m", "alertname": "McpProxyConfigReloadFailing",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "team": "platform",
                                                "namespace": "team-a", "pod": "p1"}}]},
                {"eval_time": "20m", "alertname": "McpProxyConfigReloadFailing", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "McpProxyUpstreamCrashLooping", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "McpProxyUpstreamCrashLooping",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "team": "platform", "namespace": "team-a",
                                                "pod": "p1", "server": "github"}}]},
                {"eval_time": "30m", "alertname": "McpProxyUpstreamCrashLooping", "exp_alerts": []},
                # Pending (for: 10m) at 5m, firing at 15m, gone after the errors stop.
                {"eval_time": "5m", "alertname": "OrchestratorReconcileErrors", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "OrchestratorReconcileErrors",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "team": "platform", "outcome": "kube_api"}}]},
                {"eval_time": "40m", "alertname": "OrchestratorReconcileErrors", "exp_alerts": []},
                # Present until 10m (and 5 minutes of staleness after); absent from 15m, so
                # pending, then firing 5 minutes later; a single missed scrape pages nobody.
                {"eval_time": "12m", "alertname": "OrchestratorOperatorAbsent", "exp_alerts": []},
                {"eval_time": "18m", "alertname": "OrchestratorOperatorAbsent", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "OrchestratorOperatorAbsent",
                 "exp_alerts": [{"exp_labels": {"severity": "critical", "team": "platform"}}]},
            ],
        }
    ],
}


def test_alert_rules_pass_promtool_check_and_their_unit_tests(bins: Path, tmp_path: Path):
    groups = rule_groups(bins, "monitoring.prometheusRule.alertLabels.team=platform")
    alerts = {r["alert"] for g in groups["groups"] for r in g["rules"]}
    assert alerts == set(ALERTS)
    for g in groups["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in ("warning", "critical"), r
            assert {"summary", "description", "runbook"} <= set(r["annotations"]), r
            assert ALERTS[r["alert"]] in r["expr"], r
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups))
    tool = promtool()
    out = subprocess.run([tool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts)} rules found" in out.stdout + out.stderr, out.stdout + out.stderr

    # The expected alerts carry their annotations as the rules render them for these labels.
    tests = json.loads(json.dumps(RULE_TESTS))
    tests["rule_files"] = [str(rules)]
    for case in tests["tests"][0]["alert_rule_test"]:
        for alert in case["exp_alerts"]:
            alert["exp_labels"] = {k: v for k, v in alert["exp_labels"].items() if v is not None}
            alert["exp_annotations"] = annotations_of(groups, case["alertname"], alert["exp_labels"], tmp_path,
                                                      tool, tests, case)
    file = tmp_path / "tests.yaml"
    file.write_text(yaml.safe_dump(tests))
    out = subprocess.run([tool, "test", "rules", str(file)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr

    # And the tests would catch a rule that never fires: one expression broken, promtool fails.
    broken = json.loads(json.dumps(groups))
    broken["groups"][0]["rules"][0]["expr"] = broken["groups"][0]["rules"][0]["expr"].replace('"Failed"', '"Failled"')
    rules.write_text(yaml.safe_dump(broken))
    out = subprocess.run([tool, "test", "rules", str(file)], capture_output=True, text=True)
    assert out.returncode != 0 and "OrchestratorTaskRunsFailing" in out.stdout + out.stderr
    rules.write_text(yaml.safe_dump(groups))


def test_with_a_runbook_base_url_each_alert_links_its_own_section_of_the_docs(bins: Path):
    base = "https://docs.example.com/orchestrator/v0.2.0/docs/operator.md"
    groups = rule_groups(bins, f"monitoring.prometheusRule.runbookBaseUrl={base}")
    # The sections the links point at: docs/operator.md's `#### <alert>` headings under
    # "Runbooks" (a heading's anchor is its text in lower case, as Git forges and renderers make it).
    text = (REPO / "docs/operator.md").read_text()
    runbooks = text[text.index("### Runbooks"):]
    anchors = {m.lower() for m in re.findall(r"^#### (\w+)$", runbooks[: runbooks.find("\n## ")], re.M)}
    links = {r["alert"]: r["annotations"]["runbook_url"] for g in groups["groups"] for r in g["rules"]}
    assert set(links) == set(ALERTS)
    for alert, url in links.items():
        page, _, anchor = url.partition("#")
        assert page == base and anchor == alert.lower() and anchor in anchors, (alert, url, sorted(anchors))
    # Unset (the default): no runbook_url; a value that is no URL is refused, naming the field.
    assert all("runbook_url" not in r["annotations"] for g in rule_groups(bins)["groups"] for r in g["rules"])
    out = helm_template(bins, *all_on(), "monitoring.prometheusRule.runbookBaseUrl=operator.md", ok=False)
    assert out.returncode != 0 and "runbookBaseUrl" in out.stderr, out.stderr


def annotations_of(groups, alertname, labels, tmp_path, tool, tests, case) -> dict:
    """The annotations promtool reports for `alertname` with `labels` at the case's time: read
    from a failing run with no annotations expected (promtool prints what it got). Checked to
    name the series' own labels, so the templates really use them."""
    probe = json.loads(json.dumps(tests))
    probe["tests"][0]["alert_rule_test"] = [{"eval_time": case["eval_time"], "alertname": alertname,
                                             "exp_alerts": [{"exp_labels": labels}]}]
    file = tmp_path / "probe.yaml"
    file.write_text(yaml.safe_dump(probe))
    out = subprocess.run([tool, "test", "rules", str(file)], capture_output=True, text=True)
    text = out.stdout + out.stderr
    got = re.search(r"got:\s*\[(.*)\]", text, re.S)
    assert got, text
    match = re.search(r"Annotations:\{(.*)\}\s*$", got.group(1), re.M)
    assert match, text
    annotations = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1)))
    annotations = {k: json.loads(f'"{v}"') for k, v in annotations.items()}
    assert set(annotations) == {"summary", "description", "runbook"}, annotations
    for key in ("namespace", "taskrun", "pod", "server", "outcome"):
        if key in labels:
            assert labels[key] in annotations["summary"] + annotations["description"], (key, annotations)
    return annotations


def test_every_metric_a_rule_or_panel_uses_is_registered(bins: Path):
    tool = REPO / "e2e/tools/monitoring-metric-names"
    env = {"PATH": f"{bins}:/usr/bin:/bin", "HELM": str(bins / "helm")}
    out = subprocess.run([sys.executable, str(tool), "--families"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    families = out.stdout.split()
    registered = set()
    for prefix, source in (("orchestrator_operator", "operator/src/metrics.rs"),
                           ("mcp_proxy", "sidecar/src/metrics.rs")):
        text = (REPO / source).read_text()
        registered |= {f"{prefix}_{n}" for n in re.findall(r'register\(\s*"([a-z_]+)"', text)}
    assert len(registered) > 15, registered
    assert families and set(families) <= registered, set(families) - registered
    out = subprocess.run([sys.executable, str(tool), "--origins"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    origins = dict(line.split("\t") for line in out.stdout.splitlines())
    for alert, metric in ALERTS.items():
        assert f"alert:{alert}" in origins[metric], (alert, origins.get(metric))
    # The tool reads PromQL, not just prefixes: a made-up metric in a rule shows up.
    objects = docs(bins, "monitoring.prometheusRule.enabled=true")
    rule = next(d for d in objects if d["kind"] == "PrometheusRule")["spec"]["groups"][0]["rules"][1]
    assert rule["alert"] == "OrchestratorApprovalWaiting"
    rule["expr"] = 'time() - approvals_oldest_typo{x="orchestrator_operator_y"} > 600'
    manifest = yaml.safe_dump_all(objects)
    out = subprocess.run([sys.executable, str(tool), "--manifest", "-"], input=manifest, capture_output=True,
                         text=True)
    assert "approvals_oldest_typo" in out.stdout.split() and "orchestrator_operator_y" not in out.stdout


def test_the_api_server_accepts_the_kit_with_the_prometheus_operator_crds(bins: Path):
    kubeconfig = STATE / "kubeconfig"
    if not kubeconfig.exists():
        pytest.fail(f"{kubeconfig} is missing: is the cluster up? (e2e/cluster up)")
    kubectl = [str(bins / "kubectl"), "--kubeconfig", str(kubeconfig)]
    # Left installed: they are inert without a Prometheus Operator, and a second run applies the
    # same (the story installs the kit with them).
    env = {**os.environ, "PATH": f"{bins}:{os.environ['PATH']}", "KUBECONFIG": str(kubeconfig)}
    out = subprocess.run([str(REPO / "e2e/tools/prometheus-operator-crds")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = helm_template(bins, *all_on(), "approvals.webhook.secretName=hook",
                             "monitoring.prometheusRule.alertLabels.team=platform").stdout
    kit_only = "\n---\n".join(yaml.safe_dump(d) for d in yaml.safe_load_all(manifest)
                              if d and (d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule")
                                        or d["metadata"]["name"].endswith("-dashboard")))
    out = subprocess.run([*kubectl, "apply", "--dry-run=server", "-n", "default", "-f", "-"],
                         input=kit_only.replace("namespace: sys", "namespace: default"),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for want in ("podmonitor.monitoring.coreos.com/r-orchestrator-task-pods",
                 "servicemonitor.monitoring.coreos.com/r-orchestrator-operator",
                 "prometheusrule.monitoring.coreos.com/r-orchestrator",
                 "configmap/r-orchestrator-dashboard"):
        assert f"{want} created (server dry run)" in out.stdout or f"{want} configured (server dry run)" in out.stdout, out.stdout
