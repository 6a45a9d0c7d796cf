"""The HorizontalPodAutoscaler scales on our own per-pod metric, dflash_requests_in_flight."""

import re

import yaml
from chart_render import CHART, kinds, only, profile_values, render


def test_no_hpa_unless_enabled():
    assert "HorizontalPodAutoscaler" not in kinds(render(profile_values("default")))


def test_hpa_targets_the_deployment_on_requests_in_flight():
    objects = render(profile_values("gpt-oss-120b-tp8"))
    hpa = only(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": only(objects, "Deployment")["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"] == {"name": "dflash_requests_in_flight"}
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "32"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)


def test_hpa_scales_down_slowly_because_engines_load_slowly():
    hpa = only(render(profile_values("default", {"autoscaling": {"enabled": True}})), "HorizontalPodAutoscaler")
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600


def _adapter_rules(readme):
    blocks = re.findall(r"```yaml\n(.*?)```", readme.read_text(), flags=re.S)
    return [rule for block in blocks if "seriesQuery" in block for rule in yaml.safe_load(block)["rules"]["custom"]]


def test_readmes_give_the_adapter_rule_for_the_metric_the_hpa_uses():
    metric = yaml.safe_load((CHART / "values.yaml").read_text())["autoscaling"]["metricName"]
    for readme in (CHART / "README.md", CHART.parents[1] / "README.md"):
        (rule,) = _adapter_rules(readme)
        assert rule["seriesQuery"].startswith(metric + "{"), readme
        assert rule["name"]["as"] == metric
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
