"""Security defaults of the chart off loopback: a NetworkPolicy, a bounded /tmp, and updates without an outage
where a surge pod fits (the CPU profile)."""

import pytest
from chart_render import helm, kinds, only, pod_spec, profile_values, render


def policy(extra: dict | None = None, profile: str = "default") -> dict:
    return only(render(profile_values(profile, extra)), "NetworkPolicy")


def ports(rule: dict) -> list:
    return [p["port"] for p in rule["ports"]]


def test_the_network_policy_admits_only_the_serving_ports_and_no_egress_by_default():
    objects = render(profile_values("default"))
    spec = only(objects, "NetworkPolicy")["spec"]
    assert spec["podSelector"]["matchLabels"] == only(objects, "Service")["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert [ports(rule) for rule in spec["ingress"]] == [["http", "grpc"], ["metrics"]]
    assert all("from" not in rule for rule in spec["ingress"])  # any source, on those ports only
    assert spec["egress"] == []
    # The named ports are the container's own.
    names = {p["name"] for p in only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {"http", "grpc", "metrics"} <= names


def test_the_openai_port_is_admitted_when_the_gateway_runs():
    spec = policy({"openai": {"enabled": True}})["spec"]
    assert ports(spec["ingress"][0]) == ["http", "grpc", "openai"]


def test_sources_and_egress_come_from_the_values():
    clients = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}]
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    dns = [{"ports": [{"port": 53, "protocol": "UDP"}]}]
    spec = policy({"networkPolicy": {"from": clients, "metricsFrom": monitoring, "egress": dns}})["spec"]
    assert spec["ingress"][0]["from"] == clients and spec["ingress"][1]["from"] == monitoring
    assert spec["egress"] == dns


def test_the_network_policy_can_be_turned_off():
    assert "NetworkPolicy" not in kinds(render(profile_values("default", {"networkPolicy": {"enabled": False}})))


@pytest.mark.parametrize("profile", ["default", "cpu", "gpt-oss-120b-tp8"])
def test_tmp_is_a_size_limited_emptydir(profile):
    volumes = {v["name"]: v for v in pod_spec(render(profile_values(profile)))["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "2Gi"}
    resized = pod_spec(render(profile_values(profile, {"tmp": {"sizeLimit": "500Mi"}})))["volumes"]
    assert {v["name"]: v for v in resized}["tmp"]["emptyDir"] == {"sizeLimit": "500Mi"}


def test_the_cpu_profile_surges_a_new_pod_before_stopping_the_old_one():
    strategy = only(render(profile_values("cpu")), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # GPU profiles keep replacing in place: a surge pod would need a spare node of GPUs.
    default = only(render(profile_values("default")), "Deployment")["spec"]["strategy"]
    assert default["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


@pytest.mark.parametrize("values, mentioned", [
    ({"tmp": {"sizeLimit": "-1Gi"}}, "tmp"),
    ({"networkPolicy": {"from": "everyone"}}, "from"),
    ({"networkPolicy": {"ingress": []}}, "ingress"),
])
def test_the_schema_rejects_bad_hardening_values(chart, values, mentioned):
    with pytest.raises(helm.HelmValuesError) as error:
        chart.render(values, name="dflash")
    assert mentioned in str(error.value)
