"""The Service exposes Triton's three ports (and the OpenAI gateway when enabled) to the server pods only, and
keeps a client on one pod when session affinity is on (its conversation's prefix cache is there)."""

import pytest
from chart_render import helm, only, pod_spec, profile_values, render


def _ports(service):
    return {port["name"]: (port["port"], port["targetPort"]) for port in service["spec"]["ports"]}


def test_service_ports_are_http_8000_grpc_8001_metrics_8002():
    service = only(render(profile_values("default")), "Service")
    assert _ports(service) == {"http": (8000, "http"), "grpc": (8001, "grpc"), "metrics": (8002, "metrics")}
    assert service["spec"]["type"] == "ClusterIP"


def test_service_adds_openai_9000_when_the_gateway_is_enabled():
    service = only(render(profile_values("default", {"openai": {"enabled": True}})), "Service")
    assert _ports(service)["openai"] == (9000, "openai")


def test_service_selects_the_server_pods_but_not_the_test_pod():
    objects = render(profile_values("default"))
    selector = only(objects, "Service")["spec"]["selector"].items()
    server_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    test_pod_labels = only(objects, "Pod")["metadata"]["labels"].items()
    assert selector <= server_labels
    assert not selector <= test_pod_labels


def test_helm_test_pod_checks_readiness_through_the_service():
    objects = render(profile_values("cpu"))
    test_pod = only(objects, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (health,) = test_pod["spec"]["containers"]
    service = only(objects, "Service")["metadata"]["name"]
    assert health["args"][:2] == ["health", f"--url=http://{service}:8000/v2/health/ready"]
    assert "nodeSelector" not in test_pod["spec"] and "nodeSelector" not in pod_spec(objects)


def test_service_spreads_requests_by_default():
    spec = only(render(profile_values("default")), "Service")["spec"]
    assert "sessionAffinity" not in spec and "sessionAffinityConfig" not in spec


def test_client_ip_affinity_keeps_a_client_on_one_pod_for_the_timeout():
    values = {"service": {"sessionAffinity": "ClientIP", "sessionAffinityTimeoutSeconds": 1800}}
    spec = only(render(profile_values("cpu", values)), "Service")["spec"]
    assert spec["sessionAffinity"] == "ClientIP"
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 1800}}


@pytest.mark.parametrize("service", [{"sessionAffinity": "Header"}, {"sessionAffinityTimeoutSeconds": 0},
                                     {"sessionAffinityTimeoutSeconds": 86401}])
def test_schema_refuses_an_unknown_affinity_or_a_timeout_out_of_range(chart, service):
    with pytest.raises(helm.HelmValuesError, match="sessionAffinity"):
        chart.render({"service": service}, name="dflash")
