"""Engine-builder fixtures: preset files for the tiny random pair, checkpoint dirs built from the published configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from dflash_trt.engine.presets import SHIPPED_CONFIGS

FIXTURES = SHIPPED_CONFIGS


@pytest.fixture
def tiny_preset(tmp_path, tiny_pair_dir):
    """A preset file for the tiny random llama pair of tests/conftest.py (torch runtime, fp32)."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "target": {"id": "test/tiny-target"}, "drafter": {"id": "test/tiny-drafter"},
        "block_size": 8, "dtype": "float32", "max_seq_len": 512, "max_batch_size": 4}))
    return path


@pytest.fixture(scope="session")
def tiny_pair_hd64(tmp_path_factory):
    """A tiny random llama pair with head_dim 64 (the plugin's DFlashAttention takes head_dim 64 or 128)."""
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("tiny-pair-hd64")
    model = make_tiny_target("llama", root / "target", hidden_size=256, num_layers=6)
    make_tiny_drafter(model.config, root / "drafter", block_size=8)
    return root


@pytest.fixture
def published_checkpoints(tmp_path):
    """The published configs laid out as a --checkpoints-dir, each with a stand-in weights file."""
    root = tmp_path / "checkpoints"
    shutil.copytree(FIXTURES, root)
    for config in root.rglob("config.json"):
        (config.parent / "model.safetensors").write_bytes(b"stand-in: the real weights are not needed here")
    return root


@pytest.fixture
def smollm2_drafter_config(tmp_path):
    """A config-only drafter directory shaped for SmolLM2-135M (enough for planning and dry runs)."""
    target = json.loads((FIXTURES / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "config.json").read_text())
    directory = tmp_path / "smollm2-drafter"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 2, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": target["vocab_size"], "block_size": 8, "num_target_layers": target["num_hidden_layers"],
        "rope_theta": target["rope_theta"], "max_position_embeddings": 8192,
        "dflash_config": {"target_layer_ids": [1, 28], "mask_token_id": 0}}))
    return directory
