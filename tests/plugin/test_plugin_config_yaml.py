"""The plugin's YAML description and README stay in step with the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from dflash_trt.decoding.kernels.plugin.fields import FIELD_NAMES, AttentionFields
from dflash_trt.decoding.kernels.plugin.onnx_node import INPUT_NAMES, INT_FIELDS, OUTPUT_NAMES

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "dflashAttention"


def config() -> dict:
    return yaml.safe_load((PLUGIN_DIR / "DflashAttention_PluginConfig.yaml").read_text())["versions"]["1"]


def test_yaml_lists_the_io_and_fields_of_the_code():
    version = config()
    assert tuple(version["inputs"]) == INPUT_NAMES and tuple(version["outputs"]) == OUTPUT_NAMES
    assert tuple(version["attributes"]) == FIELD_NAMES
    assert {n for n, t in version["attribute_types"].items() if t == "int32"} == INT_FIELDS


def test_yaml_defaults_equal_the_python_defaults():
    defaults = {f.name: f.default for f in dataclasses.fields(AttentionFields)
                if f.default is not dataclasses.MISSING}
    for name, value in config()["attribute_defaults"].items():
        assert defaults[name] == value, name


def test_readme_documents_every_field_and_the_fixed_sections():
    readme = (PLUGIN_DIR / "README.md").read_text()
    for section in ("## Description", "## IO", "## Parameters", "## Changelog", "## Known issues"):
        assert section in readme
    for name in FIELD_NAMES:
        assert f"`{name}`" in readme, name
