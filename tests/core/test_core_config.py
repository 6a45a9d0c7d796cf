import json

import pytest

from dflash_trt.decoding.model.config import DrafterConfig, default_target_layer_ids
from dflash_trt.errors import ConfigError
from dflash_trt.testing import make_tiny_target, tiny_drafter_config


@pytest.mark.parametrize("num_target_layers, num_draft_layers, expected", [
    (36, 5, [1, 9, 17, 25, 33]),
    (32, 5, [1, 8, 15, 22, 29]),
    (24, 5, [1, 6, 11, 16, 21]),
    (48, 5, [1, 12, 23, 34, 45]),
    (64, 8, [1, 10, 18, 27, 35, 44, 52, 61]),
    (30, 1, [15]),
])
def test_default_target_layer_ids_match_reference_vectors(num_target_layers, num_draft_layers, expected):
    assert default_target_layer_ids(num_target_layers, num_draft_layers) == expected


def _config_dict(**changes):
    data = tiny_drafter_config(make_tiny_target("llama").config).to_dict()
    data.update(changes)
    return data


def test_config_round_trips_unknown_keys():
    data = _config_dict(auto_map={"AutoModel": "dflash.DFlashDraftModel"}, torch_dtype="bfloat16")
    again = DrafterConfig.from_dict(data).to_dict()
    assert again["auto_map"] == data["auto_map"] and again["torch_dtype"] == "bfloat16"
    assert again["dflash_config"] == data["dflash_config"]


def test_missing_layer_ids_use_the_default_formula():
    data = _config_dict(num_hidden_layers=5, num_target_layers=36)
    data["dflash_config"] = {"mask_token_id": 3}
    assert DrafterConfig.from_dict(data).target_layer_ids == (1, 9, 17, 25, 33)


def test_explicit_layer_ids_win_over_the_formula():
    data = _config_dict(num_hidden_layers=8, num_target_layers=36)
    data["dflash_config"] = {"mask_token_id": 3, "target_layer_ids": [1, 9, 17, 25, 33]}
    assert DrafterConfig.from_dict(data).target_layer_ids == (1, 9, 17, 25, 33)


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": None}, "'hidden_size' must be a positive integer"),
    ({"block_size": 0}, "'block_size' must be a positive integer"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "['chunked_attention'] are not supported"),
    ({"layer_types": ["full_attention"]}, "one type per layer (2)"),
    ({"is_causal": "no"}, "is_causal must be true or false"),
    ({"use_sliding_window": True, "sliding_window": 0}, "'sliding_window' must be a positive integer"),
    ({"architectures": ["LlamaForCausalLM"]}, "is not a DFlash drafter"),
    ({"architectures": ["DFlash2DraftModel"]}, "DFlash2DraftModel needs dflash_config.conv_kernel_size"),
    ({"final_logit_softcapping": "20"}, "'final_logit_softcapping' must be a number"),
    ({"output_multiplier": 0}, "'output_multiplier' must be a positive number"),
    ({"dflash_config": {"target_layer_ids": [1, 2]}}, "mask_token_id is missing"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [1, 99]}}, "[99] outside the target"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [3, 1]}}, "strictly ascending"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2}}, "'longrope' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2}}, "original_max_position_embeddings is missing"),
])
def test_rejects_bad_config_with_the_field_named(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config_dict(**change)))
    with pytest.raises(ConfigError) as info:
        DrafterConfig.from_file(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_reads_rope_parameters_of_transformers_5():
    data = _config_dict(rope_theta=None, rope_scaling=None)
    del data["rope_theta"], data["rope_scaling"]
    data["rope_parameters"] = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                               "rope_theta": 150000.0}
    config = DrafterConfig.from_dict(data)
    assert config.rope_theta == 150000.0 and config.rope_scaling["factor"] == 32.0
