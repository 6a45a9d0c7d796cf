"""Loading DFlash2 checkpoints as published: config lookup order, tensor names, one-line errors."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.drafters import DFlash2Drafter, DFlashDrafter, expected_shapes, load_drafter
from dflash_trt.errors import CheckpointError, ConfigError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

# The published Qwen3.8-27B-DFlash2 config (shapes only matter here).
QWEN38_DFLASH2 = {
    "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "attention_bias": False, "vocab_size": 248320, "num_target_layers": 64,
    "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default"},
    "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048, "use_sliding_window": True, "is_causal": False,
    "dflash_config": {"block_size": 8, "mask_token_id": 248070, "target_layer_ids": [5, 19, 33, 47, 61],
                      "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16},
}


def test_the_published_config_parses_with_its_geometry_and_parameter_count():
    config = DrafterConfig.from_dict(QWEN38_DFLASH2)
    assert (config.family, config.block_size, config.mask_token_id) == ("dflash2", 8, 248070)
    assert config.layer_windows == (2048,) * 5 and config.layer_causal == (False,) * 5
    assert config.rope_theta == 1e7
    shapes = expected_shapes(config)
    assert len(shapes) == 81  # 15 per layer + 6 global
    assert sum(math.prod(s) for s in shapes.values()) == 1_924_404_480


def test_settings_are_read_from_dflash_config_first_then_the_top_level():
    data = json.loads(json.dumps(QWEN38_DFLASH2))
    data["block_size"] = 16  # a top-level value loses against dflash_config's
    assert DrafterConfig.from_dict(data).block_size == 8
    del data["dflash_config"]["block_size"]
    assert DrafterConfig.from_dict(data).block_size == 16
    data["selector_top_k"] = 4
    del data["dflash_config"]["selector_top_k"]
    assert DrafterConfig.from_dict(data).selector_top_k == 4


@pytest.mark.parametrize("change, message", [
    (lambda d: d["dflash_config"].pop("selector_rank"), "needs dflash_config.selector_rank, which is missing"),
    (lambda d: d["dflash_config"].update(conv_group_size=3), "conv_group_size 3 does not divide hidden_size 5120"),
    (lambda d: d["dflash_config"].update(selector_top_k=0), "'dflash_config.selector_top_k' must be a positive"),
    (lambda d: d.update(architectures=["DFlash3DraftModel"]), "is not a DFlash drafter"),
    (lambda d: d["dflash_config"].pop("block_size"), "field 'block_size' is missing"),
])
def test_a_missing_or_inconsistent_field_is_named_in_one_line(change, message):
    data = json.loads(json.dumps(QWEN38_DFLASH2))
    change(data)
    with pytest.raises(ConfigError, match=message) as info:
        DrafterConfig.from_dict(data)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def target():
    return make_tiny_target("llama")


@pytest.mark.parametrize("suffix", ["", ".weight"])
def test_codebooks_load_under_bare_and_weight_suffixed_names(tmp_path, target, suffix):
    drafter = make_tiny_drafter(target.config, tmp_path, family="dflash2")
    tensors = load_file(tmp_path / "model.safetensors")
    assert "candidate_selector.predecessor_codebook" in tensors  # saved as published: bare
    if suffix:
        tensors = {(k + suffix if k.endswith("_codebook") else k): v for k, v in tensors.items()}
        save_file(tensors, tmp_path / "model.safetensors")
    loaded = load_drafter(tmp_path)
    assert isinstance(loaded, DFlash2Drafter)
    for name, value in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0)


def test_a_missing_dflash2_tensor_is_named(tmp_path, target):
    make_tiny_drafter(target.config, tmp_path, family="dflash2")
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["layers.1.mlp_conv.base_kernel"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="tensor 'layers.1.mlp_conv.base_kernel' is missing"):
        load_drafter(tmp_path)


def test_a_v1_config_with_dflash2_tensors_is_refused(tmp_path, target):
    make_tiny_drafter(target.config, tmp_path, family="dflash2")
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["DFlashDraftModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unknown tensor"):
        load_drafter(tmp_path)


def test_v1_reads_its_settings_from_dflash_config_too(tmp_path, target):
    make_tiny_drafter(target.config, tmp_path, block_size=8)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["block_size"]
    config["dflash_config"]["block_size"] = 6
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_drafter(tmp_path)
    assert isinstance(loaded, DFlashDrafter) and loaded.config.block_size == 6
