"""The chart's PrometheusRule and Grafana dashboard: off by default, well formed, and reading only metrics
that the project (dflash_trt/serving/metrics.py) and Triton export."""

from __future__ import annotations

import json
import re
import types

import pytest
import yaml
from chart_render import CHART, PROFILES, kinds, only, profile_values, render

from dflash_trt.serving.metrics import TRITON_METRICS, DFlashMetrics

ON = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}, "serviceMonitor": {"enabled": True}}
ALERTS = {"DFlashAcceptanceRateLow", "DFlashTauFalling", "DFlashRequestsFailing", "DFlashCanaryAcceptanceNearZero",
          "DFlashSampledCanaryAcceptanceNearZero"}
SUFFIXES = ("_bucket", "_sum", "_count")
METRIC = re.compile(r"\b((?:dflash|nv_inference)_[a-z_]+)\b")


def project_metric_names() -> set[str]:
    """Series names the dflash model exports, read from DFlashMetrics itself (histograms as Prometheus
    spells them: _bucket, _sum, _count)."""
    class Family:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

        def __init__(self, name, description, kind):
            self.name, self.kind = name, kind

        def Metric(self, labels=None, buckets=None):  # noqa: N802 - Triton's spelling
            return types.SimpleNamespace(increment=lambda v: None, set=lambda v: None, observe=lambda v: None)

    families = DFlashMetrics(types.SimpleNamespace(MetricFamily=Family), "dflash").families.values()
    return {f.name + suffix for f in families for suffix in (SUFFIXES if f.kind == "histogram" else ("",))}


def rule_of(objects) -> dict:
    return only(objects, "PrometheusRule")


def dashboard_of(objects) -> dict:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    return json.loads(config_map["data"]["dflash-triton.json"])


def expressions(objects) -> list[str]:
    rules = [rule["expr"] for group in rule_of(objects)["spec"]["groups"] for rule in group["rules"]]
    panels = [target["expr"] for panel in dashboard_of(objects)["panels"] for target in panel["targets"]]
    return rules + panels


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_off_by_default_in_every_shipped_profile(profile):
    objects = render(profile_values(profile))
    assert "PrometheusRule" not in kinds(objects) and "ConfigMap" not in kinds(objects)


def test_rule_alerts_on_acceptance_tau_errors_and_the_canary():
    rule = rule_of(render(profile_values("default", ON)))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule["spec"]) == {"groups"}
    rules = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(rules) == ALERTS
    for alert in rules.values():
        assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}
        assert alert["labels"]["severity"] in ("warning", "critical") and alert["annotations"]["summary"]
    assert rules["DFlashAcceptanceRateLow"]["for"] == "10m" and rules["DFlashAcceptanceRateLow"]["expr"].endswith(
        "< 0.2")
    assert rules["DFlashTauFalling"]["for"] == "15m" and "< 0.7 * (" in rules["DFlashTauFalling"]["expr"]
    assert rules["DFlashRequestsFailing"]["expr"].endswith("> 0.05")


def test_thresholds_and_durations_come_from_the_values():
    values = {**ON, "prometheusRule": {"enabled": True, "acceptanceRateThreshold": 0.35, "acceptanceRateFor": "30m",
                                       "errorRatioThreshold": 0.01, "labels": {"release": "kube-prometheus"}}}
    rule = rule_of(render(profile_values("default", values)))
    rules = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert rules["DFlashAcceptanceRateLow"]["expr"].endswith("< 0.35") and rules["DFlashAcceptanceRateLow"]["for"] == "30m"
    assert rules["DFlashRequestsFailing"]["expr"].endswith("> 0.01")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"


def test_rules_select_the_release_the_service_monitor_scrapes():
    objects = render(profile_values("default", ON))
    service = only(objects, "Service")["metadata"]["name"]
    for group in rule_of(objects)["spec"]["groups"]:
        for rule in group["rules"]:
            for selector in re.findall(r"\{([^}]*)\}", rule["expr"]):
                assert f'namespace="serving", service="{service}"' in selector, rule["alert"]


def test_every_metric_read_is_one_the_project_or_triton_exports():
    exported = project_metric_names() | set(TRITON_METRICS)
    used = {name for expr in expressions(render(profile_values("default", ON))) for name in METRIC.findall(expr)}
    assert used and used <= exported, used - exported
    # Every alert and panel family is used: acceptance, tau, tokens, latency, queue, in flight, canary, errors.
    for name in ("dflash_acceptance_length_bucket", "dflash_generated_tokens_total", "dflash_requests_in_flight",
                 "dflash_time_to_first_token_seconds_bucket", "dflash_inter_token_latency_seconds_bucket",
                 "nv_inference_pending_request_count", "dflash_canary_acceptance_rate",
                 "dflash_canary_sampled_acceptance_rate", "nv_inference_request_failure"):
        assert name in used, name


def test_the_metric_name_check_can_fail():
    assert "dflash_acceptance_rate" not in project_metric_names()  # a plausible name the project does not export
    assert "dflash_acceptance_length_bucket" in project_metric_names()


def test_expressions_are_balanced():
    for expr in expressions(render(profile_values("default", ON))):
        for opening, closing in ("()", "{}", "[]"):
            depth = 0
            for char in expr:
                depth += (char == opening) - (char == closing)
                assert depth >= 0, expr
            assert depth == 0, expr


def test_dashboard_has_the_panels_and_selects_by_variables():
    objects = render(profile_values("default", ON))
    dashboard = dashboard_of(objects)
    titles = " | ".join(panel["title"] for panel in dashboard["panels"])
    for word in ("tau", "Acceptance-length histogram", "Tokens per second", "TTFT", "ITL", "Queue", "in flight"):
        assert word in titles, word
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "service"}
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert 'namespace="$namespace", service="$service"' in target["expr"], panel["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "dflash-triton"


def test_dashboard_config_map_carries_the_sidecar_label_and_the_chart_file():
    objects = render(profile_values("default", ON))
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["dflash-triton.json"]) == json.loads(
        (CHART / "dashboards" / "dflash-triton.json").read_text())


def test_schema_rejects_bad_thresholds(chart):
    from chart_render import helm

    for bad in ({"acceptanceRateThreshold": 1.5}, {"acceptanceRateFor": "ten minutes"}, {"tauDropRatio": -0.1}):
        with pytest.raises(helm.HelmValuesError):
            chart.render({"prometheusRule": {"enabled": True, **bad}}, name="dflash")


def test_values_document_the_monitoring_options():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["prometheusRule"]["enabled"] is False and values["grafanaDashboard"]["enabled"] is False
