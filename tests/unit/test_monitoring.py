"""deploy/monitoring validates offline: the dashboard and the alerts name only metrics the
sidecar exports, the rules pass promtool when it is installed, and the Prometheus Operator
resources have the shape their CRDs ask for (their schemas are not available offline)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.core.fleet import FleetFigures
from proxy.observability.fleet import FleetCollector
from proxy.observability.metrics import Metrics

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
DASHBOARD = MONITORING / "kubemoot-fleet.json"
RULES = MONITORING / "prometheusrule.yaml"
SERVICE_MONITOR = MONITORING / "servicemonitor.yaml"

# prometheus_client's ProcessCollector exports these on Linux only.
PROCESS_METRICS = {
    "process_cpu_seconds_total", "process_resident_memory_bytes",
    "process_virtual_memory_bytes", "process_start_time_seconds", "process_open_fds",
    "process_max_fds",
}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created")}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$namespace": ".*", "${datasource}": "x"}


def exported_metrics() -> set[str]:
    """Every series name the sidecar's registry exports, labelled families included (those
    have no samples until a call labels them)."""
    names = set(PROCESS_METRICS)
    # The fleet's gauges come from a collector over a snapshot; an empty fleet names them all.
    fleet = FleetCollector(lambda: FleetFigures((), {})).collect()
    for family in (*Metrics().registry.collect(), *fleet):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges, grouping clauses, offsets, function calls and keywords are set aside."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    words = re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*\b(?!\s*\()", text)
    return {w for w in words if w.lower() not in PROMQL_WORDS}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _dashboard_queries() -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _dashboard()["panels"]
            for target in panel["targets"]]


def _rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    return groups


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in _rule_groups() for rule in group["rules"]]


def test_metric_names_are_read_from_promql() -> None:
    expr = ('histogram_quantile(0.95, sum by (le) (rate(kubemoot_wait_seconds_bucket'
            '{reason="a b", namespace=~"$ns"}[5m] offset 1h))) > 2 * (x_total or vector(0)) '
            'and on (job, instance) up')
    assert metric_names(expr) == {"kubemoot_wait_seconds_bucket", "x_total", "up"}


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys(), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["refId"] and target["expr"], panel["title"]
            used = set(re.findall(r"\$\{?(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, panel["title"]


def test_dashboard_shows_what_operators_ask_about() -> None:
    queries = " ".join(expr for _, expr in _dashboard_queries())
    for metric in ("kubemoot_provider_memory_resident_bytes", "kubemoot_placements_total",
                   "kubemoot_wait_seconds_bucket", "kubemoot_refusals_total",
                   "kubemoot_decision_seconds_bucket", "process_cpu_seconds_total"):
        assert metric in queries


def test_dashboard_queries_name_only_exported_metrics() -> None:
    exported = exported_metrics()
    for title, expr in _dashboard_queries():
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= exported, (title, names - exported)


def test_every_alert_is_complete_and_names_only_exported_metrics() -> None:
    exported = exported_metrics()
    alerts = _alerts()
    assert {a["alert"] for a in alerts} == {
        "KubemootSidecarCpuSaturated", "KubemootSharedStateDisconnected", "KubemootCircuitOpen",
        "KubemootGpuBusyRefusalsRising", "KubemootProviderStateStale",
        "KubemootProviderDown"}
    for rule in alerts:
        assert {"alert", "expr", "for", "labels", "annotations"} <= rule.keys(), rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]
        names = metric_names(rule["expr"])
        assert names and names <= exported, (rule["alert"], names - exported)


def test_prometheus_rule_and_service_monitor_have_their_crds_shape() -> None:
    rule = yaml.safe_load(RULES.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] and set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    for group in _rule_groups():
        assert group["name"] and group["rules"]

    monitor = yaml.safe_load(SERVICE_MONITOR.read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1",
                                                        "ServiceMonitor")
    ops_service = yaml.safe_load((MONITORING.parent / "base" / "ops-service.yaml").read_text())
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= ops_service["metadata"]["labels"].items()
    service_ports = {p["name"] for p in ops_service["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        assert endpoint["port"] in service_ports
        assert endpoint["path"] == "/metrics"


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it "
                    "where apt-get can)")
    return promtool


def _check_rules(promtool: str, groups: list[dict[str, Any]], tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": groups}))
    done = subprocess.run([promtool, "check", "rules", str(rules_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    _check_rules(_promtool(), _rule_groups(), tmp_path)


def test_promtool_parses_the_dashboard_queries(tmp_path: Path) -> None:
    """Each query, Grafana's variables substituted, as a recording rule: promtool parses it."""
    rules = []
    for n, (_, expr) in enumerate(_dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{n}", "expr": expr})
    _check_rules(_promtool(), [{"name": "dashboard", "rules": rules}], tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_monitoring_renders_with_the_dashboard_for_grafana() -> None:
    done = subprocess.run(["kubectl", "kustomize", str(MONITORING)], capture_output=True,
                          text=True, timeout=120, check=True)
    docs = {d["kind"]: d for d in yaml.safe_load_all(done.stdout)}
    assert docs.keys() == {"ConfigMap", "PrometheusRule", "ServiceMonitor"}
    config_map = docs["ConfigMap"]
    kubernetes_validate.validate(config_map, "1.32", strict=True)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"][DASHBOARD.name]) == _dashboard()


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{matchers}}}", "values": values}


SIDECAR = {"job": "kubectl-agent-ops", "instance": "10.0.0.7:9464"}
OTHER_PROCESS = {"job": "node", "instance": "10.0.0.9:9100"}
WARNING = {"severity": "warning"}

# promtool unit tests of the alerts on made-up series (one sample a minute): each alert fires
# on what it is for, and not on what merely looks like it.
RULE_TESTS: list[dict[str, Any]] = [
    {"input_series": [
        _series("process_cpu_seconds_total", "0+60x30", **SIDECAR),   # a full core
        _series("kubemoot_decision_seconds_count", "0x30", **SIDECAR),
        _series("process_cpu_seconds_total", "0+60x30", **OTHER_PROCESS)],  # not a sidecar
     "alert_rule_test": [
         {"eval_time": "8m", "alertname": "KubemootSidecarCpuSaturated", "exp_alerts": []},
         {"eval_time": "20m", "alertname": "KubemootSidecarCpuSaturated",
          "exp_alerts": [{"exp_labels": SIDECAR | WARNING}]}]},
    {"input_series": [_series("kubemoot_nats_connected", "1x3 0x10", **SIDECAR)],
     "alert_rule_test": [
         {"eval_time": "6m", "alertname": "KubemootSharedStateDisconnected",
          "exp_alerts": [{"exp_labels": SIDECAR | WARNING}]}]},
    {"input_series": [
        _series("kubemoot_provider_circuit_state", "2x10", provider="gpu-a", **SIDECAR),
        _series("kubemoot_provider_circuit_state", "1x10", provider="gpu-b", **SIDECAR)],
     "alert_rule_test": [
         {"eval_time": "5m", "alertname": "KubemootCircuitOpen",
          "exp_alerts": [{"exp_labels": {"provider": "gpu-a"} | WARNING}]}]},
    {"input_series": [  # quiet for 70 minutes, then 10 refusals a minute
        _series("kubemoot_refusals_total", "0x70 0+10x30", reason="gpu-busy", **SIDECAR),
        _series("kubemoot_refusals_total", "0+100x100", reason="model-not-found", **SIDECAR)],
     "alert_rule_test": [
         {"eval_time": "90m", "alertname": "KubemootGpuBusyRefusalsRising",
          "exp_alerts": [{"exp_labels": WARNING}]}]},
    {"input_series": [  # 10 a minute for two hours: busy, but not rising
        _series("kubemoot_refusals_total", "0+10x150", reason="gpu-busy", **SIDECAR)],
     "alert_rule_test": [
         {"eval_time": "140m", "alertname": "KubemootGpuBusyRefusalsRising", "exp_alerts": []}]},
    {"input_series": [  # gpu-a is stale to one sidecar only; gpu-b to both
        _series("kubemoot_provider_state_age_seconds", "100x10", provider="gpu-a", **SIDECAR),
        _series("kubemoot_provider_state_age_seconds", "3x10", provider="gpu-a",
                job="kubectl-agent-ops", instance="10.0.0.8:9464"),
        _series("kubemoot_provider_state_age_seconds", "100x10", provider="gpu-b", **SIDECAR),
        _series("kubemoot_provider_state_age_seconds", "100x10", provider="gpu-b",
                job="kubectl-agent-ops", instance="10.0.0.8:9464")],
     "alert_rule_test": [
         {"eval_time": "8m", "alertname": "KubemootProviderStateStale",
          "exp_alerts": [{"exp_labels": {"provider": "gpu-b"} | WARNING}]}]},
    # A provider that does not answer, as the sidecars export it (test_an_unreachable_
    # provider_is_fresh_and_not_ready): probed every 2 s, so fresh, and not ready. The
    # staleness alert stays quiet; this one is for it. gpu-a is up to one sidecar.
    {"input_series": [
        _series("kubemoot_provider_state_age_seconds", "2x10", provider="gpu-b", **SIDECAR),
        _series("kubemoot_provider_ready", "0x10", provider="gpu-b", **SIDECAR),
        _series("kubemoot_provider_ready", "0x10", provider="gpu-a", **SIDECAR),
        _series("kubemoot_provider_ready", "1x10", provider="gpu-a",
                job="kubectl-agent-ops", instance="10.0.0.8:9464")],
     "alert_rule_test": [
         {"eval_time": "8m", "alertname": "KubemootProviderStateStale", "exp_alerts": []},
         {"eval_time": "3m", "alertname": "KubemootProviderDown", "exp_alerts": []},
         {"eval_time": "8m", "alertname": "KubemootProviderDown",
          "exp_alerts": [{"exp_labels": {"provider": "gpu-b"} | WARNING}]}]},
]


def test_promtool_alerts_fire_on_what_they_are_for(tmp_path: Path) -> None:
    promtool = _promtool()
    # Without annotations: the tests are about when an alert fires, not its wording.
    groups = [{**group, "rules": [{k: v for k, v in rule.items() if k != "annotations"}
                                  for rule in group["rules"]]} for group in _rule_groups()]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", **case} for case in RULE_TESTS]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_metrics_carry_no_created_series_and_every_family_is_documented() -> None:
    metrics = Metrics()
    metrics.placements.labels("warm", "gpu", "qwen3:8b").inc()
    metrics.wait_seconds.labels("placed").observe(0.5)
    text = metrics.render().decode()
    assert "_created" not in text
    documented = (MONITORING.parents[1] / "docs" / "metrics.md").read_text()
    for family in metrics.registry.collect():
        if not family.name.startswith("kubemoot_"):
            continue  # the process collector's, named by Prometheus' conventions
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in documented, name
