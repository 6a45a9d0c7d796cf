import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt.decoding.model.drafters import load_drafter, save_drafter
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.errors import CheckpointError, CompatibilityError, ConfigError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

YARN = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False}


@pytest.fixture(scope="module")
def target():
    return make_tiny_target("llama")


def _drafter_dir(tmp_path, target, **kwargs):
    directory = tmp_path / "drafter"
    drafter = make_tiny_drafter(target.config, directory, **kwargs)
    return directory, drafter


@pytest.mark.parametrize("kwargs", [{}, {"attention_bias": True, "rope_scaling": YARN}])
def test_published_format_round_trips(tmp_path, target, kwargs):
    directory, drafter = _drafter_dir(tmp_path, target, **kwargs)
    tensors = load_file(directory / "model.safetensors")
    assert "fc.weight" in tensors and not any(name.startswith("model.") for name in tensors)
    assert ("layers.0.self_attn.q_proj.bias" in tensors) == bool(kwargs)
    loaded = load_drafter(directory)
    assert loaded.config == drafter.config
    for name, value in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0)
    save_drafter(loaded, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == \
        json.loads((directory / "config.json").read_text())


def test_loads_sharded_checkpoints(tmp_path, target):
    directory, drafter = _drafter_dir(tmp_path, target)
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, directory / shard)
        weight_map.update({n: shard for n in shard_names})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_drafter(directory)
    torch.testing.assert_close(loaded.fc.weight, drafter.fc.weight)


def test_loads_bfloat16_checkpoints_into_the_requested_dtype(tmp_path, target):
    directory = tmp_path / "bf16"
    save_drafter(make_tiny_drafter(target.config), directory, dtype=torch.bfloat16)
    assert load_drafter(directory).fc.weight.dtype == torch.float32


def _rewrite(directory, edit):
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file(tensors, directory / "model.safetensors")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("layers.1.mlp.up_proj.weight"), "tensor 'layers.1.mlp.up_proj.weight' is missing"),
    (lambda t: t.update({"lm_head.weight": torch.zeros(2, 2)}), "unknown tensor 'lm_head.weight'"),
    (lambda t: t.update({"fc.weight": torch.zeros(3, 3)}), "tensor 'fc.weight' has shape [3, 3]"),
])
def test_rejects_bad_tensors_naming_file_and_tensor(tmp_path, target, edit, message):
    directory, _ = _drafter_dir(tmp_path, target)
    _rewrite(directory, edit)
    with pytest.raises(CheckpointError) as info:
        load_drafter(directory)
    assert message in str(info.value) and "model.safetensors" in str(info.value)


def test_rejects_a_missing_directory_and_missing_weights(tmp_path, target):
    with pytest.raises(ConfigError, match="drafter directory not found"):
        load_drafter(tmp_path / "nope")
    directory, _ = _drafter_dir(tmp_path, target)
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_drafter(directory)


def test_sliding_window_layers_load_with_their_window_and_causality(tmp_path, target):
    directory, _ = _drafter_dir(tmp_path, target)
    config = json.loads((directory / "config.json").read_text())
    config.update(layer_types=["sliding_attention", "full_attention"], sliding_window=6, use_sliding_window=True)
    (directory / "config.json").write_text(json.dumps(config))
    loaded = load_drafter(directory)
    # Without is_causal, a sliding layer is causal (as in the reference); full layers never are.
    assert loaded.config.layer_windows == (6, None) and loaded.config.layer_causal == (True, False)
    cache = loaded.new_cache(2, 100)
    assert [k.shape[2] for k in cache.k] == [5, 100]  # the sliding layer keeps window - 1 rows
    config["is_causal"] = False
    (directory / "config.json").write_text(json.dumps(config))
    assert load_drafter(directory).config.layer_causal == (False, False)


@pytest.mark.parametrize("other_target, kwargs, message", [
    (dict(hidden_size=96), {}, "hidden_size 64 != target hidden_size 96"),
    (dict(vocab_size=300), {}, "vocab_size 256 != target vocabulary 300"),
    (dict(num_layers=4), {}, "trained for 6 target layers, target has 4"),
    (dict(), {"mask_token_id": 300}, "mask_token_id 300 is outside the target embedding (256 rows)"),
])
def test_rejects_a_target_that_does_not_fit(target, other_target, kwargs, message):
    drafter = make_tiny_drafter(target.config, **kwargs)
    with pytest.raises(CompatibilityError, match=re.escape(message)):
        TargetModel(make_tiny_target("llama", **other_target)).check_drafter(drafter.config)


def test_rejects_layer_ids_outside_the_target(target):
    drafter = make_tiny_drafter(target.config, target_layer_ids=[1, 5])
    small = make_tiny_target("llama", num_layers=4)
    config = drafter.config.__class__.from_dict({**drafter.config.to_dict(), "num_target_layers": 6})
    object.__setattr__(config, "num_target_layers", 4)  # as if the config lied about its target
    with pytest.raises(CompatibilityError, match=r"target_layer_ids \[5\] outside"):
        TargetModel(small).check_drafter(config)
