"""manifest.json: hashes written at build time are checked at load time."""

from __future__ import annotations

import json

import pytest

from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.loader import load_engine
from dflash_trt.engine.manifest import EngineError, read_manifest


@pytest.fixture
def engine_dir(tiny_preset, tiny_pair_dir, tmp_path):
    out = tmp_path / "engine"
    build_engine(BuildRequest(model=str(tiny_preset), target=tiny_pair_dir / "target",
                              drafter=tiny_pair_dir / "drafter", out=out), log=lambda line: None)
    return out


def test_manifest_records_models_layout_hashes_and_tools(engine_dir, tiny_pair_dir):
    manifest = read_manifest(engine_dir)
    assert manifest["target"]["id"] == "test/tiny-target" and manifest["drafter"]["id"] == "test/tiny-drafter"
    drafter_config = json.loads((tiny_pair_dir / "drafter" / "config.json").read_text())
    assert manifest["target_layer_ids"] == drafter_config["dflash_config"]["target_layer_ids"]
    assert manifest["mask_token_id"] == drafter_config["dflash_config"]["mask_token_id"]
    assert (manifest["tp"], manifest["ep"], manifest["quant"], manifest["dtype"]) == (1, 1, "none", "float32")
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())
    assert {"python", "torch", "transformers", "dflash-trt"} <= set(manifest["tools"])


def test_corrupted_file_is_rejected_at_load(engine_dir):
    weights = engine_dir / "drafter" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one flipped byte
    weights.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="drafter/model.safetensors does not match its manifest hash"):
        load_engine(engine_dir)


def test_deleted_file_is_rejected_at_load(engine_dir):
    (engine_dir / "drafter" / "config.json").unlink()
    with pytest.raises(EngineError, match="drafter/config.json is listed in the manifest but missing"):
        load_engine(engine_dir)


def test_changed_linked_checkpoint_is_rejected_at_load(engine_dir, tiny_pair_dir, tmp_path):
    config = tiny_pair_dir / "target" / "config.json"
    original = config.read_text()
    try:
        config.write_text(original.replace("{", '{"edited": true,', 1))
        with pytest.raises(EngineError, match="linked target checkpoint .* changed since the build"):
            load_engine(engine_dir, load_models=False)
    finally:
        config.write_text(original)


def test_directory_without_manifest_is_not_an_engine(tmp_path):
    with pytest.raises(EngineError, match="no manifest.json, not a built engine"):
        load_engine(tmp_path)


def test_load_without_models_reads_only_the_manifest(engine_dir):
    engine = load_engine(engine_dir, load_models=False)
    assert engine.target is None and engine.drafter is None
    assert engine.drafter_config.block_size == 8 and engine.target_path == engine_dir / "target"
