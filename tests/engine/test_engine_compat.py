"""Compatibility checks on the published configs (fixtures) and on broken pairs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.compat import check_compatible, check_pair
from dflash_trt.engine.presets import SHIPPED_CONFIGS, load_preset
from dflash_trt.errors import CompatibilityError

FIXTURES = SHIPPED_CONFIGS
PAIRS = ["gpt-oss-120b", "gpt-oss-20b", "qwen3-8b", "llama-3.1-8b-instruct"]


def target(model_id: str) -> TargetArch:
    return TargetArch.from_config(json.loads((FIXTURES / model_id / "config.json").read_text()))


def drafter(model_id: str, **changes) -> DrafterConfig:
    data = json.loads((FIXTURES / model_id / "config.json").read_text())
    data.update(changes)
    return DrafterConfig.from_dict(data)


@pytest.mark.parametrize("name", PAIRS)
def test_published_pairs_are_compatible(name):
    preset = load_preset(name)
    report = check_pair(target(preset.target.id), drafter(preset.drafter.id), preset.block_size, preset.max_seq_len)
    assert report.errors == []


def test_gpt_oss_arch_reads_sliding_layers_and_mxfp4():
    arch = target("openai/gpt-oss-120b")
    assert (arch.num_layers, arch.num_sliding_layers, arch.num_full_layers, arch.sliding_window) == (36, 18, 18, 128)
    assert arch.quant_method == "mxfp4" and arch.num_experts == 128 and arch.rope_scaling["rope_type"] == "yarn"


@pytest.mark.parametrize("changes, message", [
    ({"vocab_size": 151936}, "vocab_size 151936 != target vocab_size 201088"),
    ({"hidden_size": 4096}, "hidden_size 4096 != target hidden_size 2880"),
    ({"num_target_layers": 34}, "trained on a 34-layer target"),
    ({"dflash_config": {"mask_token_id": 201088, "target_layer_ids": [1, 9, 17, 25, 33]}},
     "mask_token_id 201088 is outside the target embedding"),
    ({"rope_theta": 10000}, "rope_theta 10000 != target rope_theta 150000"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}},
     "YaRN factor: drafter 8.0 != target 32.0"),
])
def test_rejects_incompatible_pair(changes, message):
    with pytest.raises(CompatibilityError, match=message):
        check_compatible(target("openai/gpt-oss-120b"), drafter("z-lab/gpt-oss-120b-DFlash", **changes), 10, "pair")


def test_the_20b_drafter_does_not_fit_the_120b_target():
    with pytest.raises(CompatibilityError) as info:
        check_compatible(target("openai/gpt-oss-120b"), drafter("z-lab/gpt-oss-20b-DFlash"), 8, "pair")
    assert "24-layer target" in str(info.value) and "\n" not in str(info.value)


def test_layer_ids_beyond_a_shallower_target_are_rejected():
    shallow = dataclasses.replace(target("Qwen/Qwen3-8B"), num_layers=30)
    report = check_pair(shallow, drafter("z-lab/Qwen3-8B-DFlash-b16"), 16)
    assert any("target_layer_ids [33] are outside the target's layers 0..29" in e for e in report.errors)


def test_block_larger_than_trained_is_an_error_and_smaller_a_warning():
    pair = target("Qwen/Qwen3-8B"), drafter("z-lab/Qwen3-8B-DFlash-b16")
    assert any("larger than the drafter's trained block_size 16" in e for e in check_pair(*pair, 17).errors)
    report = check_pair(*pair, 8)
    assert report.errors == [] and any("smaller than the drafter's trained 16" in w for w in report.warnings)


def test_several_problems_are_reported_in_one_line():
    with pytest.raises(CompatibilityError) as info:
        check_compatible(target("Qwen/Qwen3-8B"), drafter("z-lab/gpt-oss-20b-DFlash"), 8, "pair")
    assert "and 4 more" in str(info.value) and "\n" not in str(info.value)
