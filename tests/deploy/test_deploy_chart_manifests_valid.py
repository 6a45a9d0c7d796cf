"""Every rendered manifest is valid for a current Kubernetes (kubernetes-validate, strict: no unknown fields)."""

import pytest
from chart_render import KUBE_VERSION, PROFILES, profile_values, render

utils = pytest.importorskip("kubernetes_validate.utils")

# Kinds from CRDs have no schema in kubernetes-validate; they get a structural check below instead.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
EXTRA = {
    "all-options": {"openai": {"enabled": True}, "autoscaling": {"enabled": True}, "serviceMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True},
                    "checkpoints": {"existingClaim": "hf-cache"}, "imagePullSecrets": [{"name": "registry"}],
                    "runtimeClassName": "nvidia", "podDisruptionBudget": {"maxUnavailable": None, "minAvailable": 1}},
    "pvc": {"storage": {"mode": "pvc", "existingClaim": "engines", "subPath": "dflash"}},
}
CASES = [(profile, None) for profile in sorted(PROFILES)] + [("default", name) for name in sorted(EXTRA)]


def _objects(profile, extra):
    return render(profile_values(profile, EXTRA.get(extra)))


def test_validates_against_the_newest_kubernetes_the_package_knows():
    assert utils.latest_version() == KUBE_VERSION


@pytest.mark.parametrize("profile, extra", CASES)
def test_rendered_manifests_are_valid_kubernetes(profile, extra):
    for obj in _objects(profile, extra):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        assert utils.validate(obj, KUBE_VERSION, strict=True) == "1.37", obj["kind"]


@pytest.mark.parametrize("profile, extra", CASES)
def test_every_object_is_named_and_labelled_for_the_release(profile, extra):
    for obj in _objects(profile, extra):
        metadata = obj["metadata"]
        assert metadata["name"].startswith("dflash-dflash-triton") and len(metadata["name"]) <= 63
        assert metadata["labels"]["app.kubernetes.io/instance"] == "dflash"


def test_service_monitor_scrapes_the_metrics_port_of_the_service():
    objects = _objects("default", "all-options")
    (monitor,) = [obj for obj in objects if obj["kind"] == "ServiceMonitor"]
    (service,) = [obj for obj in objects if obj["kind"] == "Service"]
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]} and endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"


def test_validator_rejects_a_broken_manifest():
    deployment = next(obj for obj in _objects("default", None) if obj["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["portt"] = 8000
    with pytest.raises(utils.ValidationError):
        utils.validate(deployment, KUBE_VERSION, strict=True)
