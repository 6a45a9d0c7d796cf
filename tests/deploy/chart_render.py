"""Render the dflash-triton chart offline with the Helm library (helm-python-sdk) for the tests.

A uniquely named helper module rather than conftest.py: test modules import from it, and several
test directories have a conftest.py of their own.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import helm_python as helm  # helm-python-sdk, the deploy extra
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "dflash-triton"
KUBE_VERSION = "1.37.0"  # the newest Kubernetes whose schemas kubernetes-validate 1.37.0 ships
PROFILES = {
    "default": [],
    "gpt-oss-120b-tp8": ["values-gpt-oss-120b-tp8.yaml"],
    "cpu": ["values-cpu.yaml"],
}


def merge(base: dict, override: dict) -> dict:
    """Helm's merge of user value files: maps merge key by key, anything else is replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def profile_values(profile: str, extra: dict | None = None) -> dict:
    """User values of a profile (its overlay files, like `-f`) plus `extra` (like `--set`)."""
    values: dict = {}
    for name in PROFILES[profile]:
        values = merge(values, yaml.safe_load((CHART / name).read_text()))
    return merge(values, extra or {})


@lru_cache(maxsize=None)
def _chart():
    return helm.Chart.load(CHART)


@lru_cache(maxsize=None)
def _render(values_json: str) -> tuple[tuple[str, str], ...]:
    rendered = _chart().render(json.loads(values_json), name="dflash", namespace="serving", is_install=True)
    return tuple(sorted(rendered.items()))


def render_files(values: dict) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included)."""
    return dict(_render(json.dumps(values, sort_keys=True)))


def render(values: dict) -> list[dict]:
    """Every Kubernetes object the chart renders for these user values."""
    objects = []
    for path, text in render_files(values).items():
        if path.endswith(".txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def only(objects: list[dict], kind: str) -> dict:
    matches = [obj for obj in objects if obj["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def kinds(objects: list[dict]) -> list[str]:
    return sorted(obj["kind"] for obj in objects)


def pod_spec(objects: list[dict]) -> dict:
    return only(objects, "Deployment")["spec"]["template"]["spec"]


def container(objects: list[dict], name: str = "triton") -> dict:
    spec = pod_spec(objects)
    (found,) = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    return found


def chart():
    """The loaded chart, shared by all tests."""
    return _chart()
