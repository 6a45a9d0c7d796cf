"""values.schema.json accepts the shipped value sets and rejects bad values at install time."""

import json

import pytest
import yaml
from chart_render import CHART, PROFILES, helm, profile_values

BAD_VALUES = {
    "tensorParallel 3": ({"tensorParallel": 3}, "tensorParallel"),
    "tensorParallel 16": ({"tensorParallel": 16}, "tensorParallel"),
    "tensorParallel as text": ({"tensorParallel": "8"}, "tensorParallel"),
    "negative shm size": ({"shm": {"sizeLimit": "-1Gi"}}, "shm"),
    "shm size without digits": ({"shm": {"sizeLimit": "lots"}}, "shm"),
    "negative emptyDir size": ({"storage": {"emptyDirSizeLimit": "-200Gi"}}, "emptyDirSizeLimit"),
    "negative memory request": ({"resources": {"requests": {"memory": "-1Gi"}}}, "memory"),
    "unknown top-level key": ({"tensorParallelism": 8}, "tensorParallelism"),
    "unknown nested key": ({"probes": {"startup": {"failureTreshold": 10}}}, "failureTreshold"),
    "zero failure threshold": ({"probes": {"startup": {"failureThreshold": 0}}}, "failureThreshold"),
    "port out of range": ({"server": {"httpPort": 70000}}, "httpPort"),
    "unknown storage mode": ({"storage": {"mode": "s3"}}, "mode"),
    "pvc mode without claim": ({"storage": {"mode": "pvc"}}, "existingClaim"),
    "gpu count in resources": ({"resources": {"limits": {"nvidia.com/gpu": 4}}}, "nvidia.com/gpu"),
    "tensor parallel without gpus": ({"gpu": {"enabled": False}}, "tensorParallel"),
    "both pdb bounds": ({"podDisruptionBudget": {"minAvailable": 1}}, "podDisruptionBudget"),
    "unknown pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    "bad metric name": ({"autoscaling": {"metricName": "requests in flight"}}, "metricName"),
    "unknown launcher": ({"server": {"launcher": "srun"}}, "launcher"),
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_schema_rejects_bad_values(chart, name):
    values, mentioned = BAD_VALUES[name]
    with pytest.raises(helm.HelmValuesError) as error:
        chart.render(values, name="dflash")
    assert mentioned in str(error.value)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_schema_accepts_the_shipped_value_sets(chart, profile):
    chart.validate_schema(chart.merge_values(profile_values(profile)))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_schema_accepts_every_supported_tensor_parallel_size(chart, tp):
    chart.validate_schema(chart.merge_values({"tensorParallel": tp}))


def test_template_refuses_max_replicas_below_min(chart):
    with pytest.raises(helm.HelmRenderError, match="maxReplicas"):
        chart.render({"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 2}}, name="dflash")


def _schema():
    return json.loads((CHART / "values.schema.json").read_text())


def test_schema_describes_exactly_the_keys_of_values_yaml():
    schema, values = _schema(), yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(values)
    for key, value in values.items():
        node = schema["properties"][key]
        if isinstance(value, dict) and node.get("additionalProperties") is False:
            assert set(value) <= set(node["properties"]), key


def test_every_schema_property_has_a_description():
    def walk(node, path):
        for key, child in node.get("properties", {}).items():
            if isinstance(child, dict) and "$ref" not in child and "properties" not in child:
                assert child.get("description"), f"{path}{key}"
            if isinstance(child, dict):
                walk(child, f"{path}{key}.")

    walk(_schema(), "")


FREE_FORM = {"resources", "strategy", "nodeSelector", "tolerations", "podSecurityContext", "securityContext"}


def test_every_key_of_values_yaml_is_commented():
    parents: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    previous = ""
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if not stripped.startswith("#") and ":" in stripped:
            key = stripped.lstrip("- ").split(":")[0]
            parents = [(i, k) for i, k in parents if i < indent]
            if not any(k in FREE_FORM for _, k in parents):  # entries of free-form maps belong to their key
                assert previous.startswith("#"), f"values.yaml line {number}: {stripped} has no comment above"
            parents.append((indent, key))
        previous = stripped
