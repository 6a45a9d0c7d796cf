"""The MoE backend and expert parallelism per GPU architecture (engine/moe.py), and NVIDIA's recipe profiles."""

from __future__ import annotations

import pytest
import yaml

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import read_target_arch
from dflash_trt.engine.artifacts import trtllm
from dflash_trt.engine.artifacts.trtllm_schema import schema_problems
from dflash_trt.engine.moe import resolve_moe
from dflash_trt.engine.presets import SHIPPED_CONFIGS, load_preset
from dflash_trt.engine.recipes import RECIPES, STREAMING_PROFILES
from dflash_trt.errors import ConfigError


def options_for(name, target_path=None, **overrides):
    preset = load_preset(name).with_overrides(**overrides)
    drafter_dir = SHIPPED_CONFIGS / preset.drafter.id
    return trtllm.trtllm_options(preset, read_target_arch(SHIPPED_CONFIGS / preset.target.id),
                                 DrafterConfig.from_file(drafter_dir / "config.json"), drafter_dir, target_path)


def moe_of(options):
    return options["moe_config"]["backend"], options["tensor_parallel_size"], options["moe_expert_parallel_size"]


@pytest.mark.parametrize("gpu, expected", [("b200", ("TRTLLM", 8, 1)), ("b300", ("TRTLLM", 8, 1)),
                                           ("h200", ("CUTLASS", 8, 1)), ("h100", ("CUTLASS", 8, 1))])
def test_gpt_oss_120b_gets_the_backend_nvidia_lists_for_the_gpu(gpu, expected):
    options = options_for("gpt-oss-120b", gpu=gpu)
    assert moe_of(options) == expected
    assert schema_problems(options) == []


def test_gpt_oss_20b_on_one_h200_runs_cutlass():
    assert moe_of(options_for("gpt-oss-20b")) == ("CUTLASS", 1, 1)
    assert moe_of(options_for("gpt-oss-20b", gpu="b200")) == ("TRTLLM", 1, 1)


def test_trtllm_moe_backend_on_hopper_is_refused_with_the_alternatives():
    with pytest.raises(ConfigError, match="TRTLLM cannot run MXFP4 experts on h200 .*CUTLASS or TRITON"):
        options_for("gpt-oss-120b", gpu="h200", moe_backend="TRTLLM")


@pytest.mark.parametrize("gpu", ["b200", "b300"])
def test_deprecated_triton_is_never_written_for_blackwell(gpu):
    with pytest.raises(ConfigError, match=f"TRITON cannot run MXFP4 experts on {gpu} .*deprecated.*#19035.*"
                                          "TRTLLM or CUTLASS"):
        options_for("gpt-oss-120b", gpu=gpu, moe_backend="TRITON", ep=8)


def test_explicit_triton_on_hopper_is_accepted_with_a_deprecation_warning():
    preset = load_preset("gpt-oss-120b").with_overrides(gpu="h200", moe_backend="TRITON", ep=8)
    lines = []
    resolved = resolve_moe(preset, read_target_arch(SHIPPED_CONFIGS / preset.target.id), log=lines.append)
    assert (resolved.moe_backend, resolved.ep) == ("TRITON", 8)
    assert any("warning: moe_backend TRITON is deprecated" in line for line in lines)


def test_cutlass_keeps_the_presets_tensor_parallel_experts_on_hopper():
    assert moe_of(options_for("gpt-oss-120b", gpu="h200", moe_backend="CUTLASS")) == ("CUTLASS", 8, 1)


def test_explicit_triton_needs_expert_parallelism_over_all_ranks():
    with pytest.raises(ConfigError, match="expert parallelism only: set ep = tp"):
        options_for("gpt-oss-120b", gpu="h200", moe_backend="TRITON", ep=2)
    assert moe_of(options_for("gpt-oss-120b", gpu="h200", moe_backend="TRITON", ep=8)) == ("TRITON", 8, 8)


def test_dense_targets_and_local_runtimes_are_left_alone():
    preset = load_preset("qwen3-8b").with_overrides(gpu="h200")
    assert resolve_moe(preset, read_target_arch(SHIPPED_CONFIGS / preset.target.id)) == preset
    local = load_preset("gpt-oss-120b").with_overrides(runtime="torch", tp=1, gpu="h200")
    assert resolve_moe(local, read_target_arch(SHIPPED_CONFIGS / local.target.id)) == local


def test_plan_command_budgets_the_layout_the_moe_rule_writes(tmp_path, monkeypatch, capsys):
    from dflash_trt.cli import main

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert main(["plan", "--model", "gpt-oss-120b", "--gpu", "h200"]) == 0  # CUTLASS keeps TP inside the experts
    assert "TP=8, EP=1" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt-oss-120b", "--gpu", "h200", "--ep", "8"]) == 0
    assert "TP=8, EP=8" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt-oss-120b", "--gpu", "b200"]) == 0
    assert "TP=8, EP=1" in capsys.readouterr().out


def test_latency_profile_adds_nvidias_settings_as_nvidia_writes_them(tmp_path):
    options = options_for("gpt-oss-120b", target_path=tmp_path / "target")
    assert (options["max_num_tokens"], options["num_postprocess_workers"]) == (16384, 4)
    assert options["env_overrides"] == {"TRTLLM_ENABLE_PDL": 1, "NCCL_GRAPH_REGISTER": 0}  # integers, as NVIDIA's
    assert options["postprocess_tokenizer_dir"] == str(tmp_path / "target")  # the workers need a tokenizer
    assert schema_problems(options) == []


@pytest.mark.parametrize("profile", STREAMING_PROFILES)
def test_profiles_for_interactive_streaming_never_batch_responses(profile):
    # stream_interval 20 would deliver DFlash streams in chunks of up to 20 x block_size tokens.
    assert "stream_interval" not in options_for("gpt-oss-120b", profile=profile)
    assert all(setting.path != "stream_interval" for setting in RECIPES[profile])


def test_throughput_profile_batches_responses_and_none_adds_nothing():
    throughput = options_for("gpt-oss-120b", profile="throughput")
    assert throughput["stream_interval"] == 20 and "throughput" not in STREAMING_PROFILES
    plain = options_for("gpt-oss-120b", profile="none")
    for key in ("max_num_tokens", "stream_interval", "num_postprocess_workers", "env_overrides"):
        assert key not in plain


def test_every_recipe_setting_names_an_nvidia_config_file():
    for settings in RECIPES.values():
        for setting in settings:
            assert setting.source.startswith("examples/configs/") and setting.source.endswith(".yaml")
            assert "gpt-oss-120b" in setting.source


def test_options_file_header_lists_the_profile_sources(tmp_path):
    options = options_for("gpt-oss-120b")
    path = tmp_path / "options.yaml"
    trtllm.write_options(options, path, "/models/gpt-oss-120b", "latency")
    text = path.read_text()
    assert "# Profile latency" in text and "max_num_tokens = 16384  (examples/configs/curated/gpt-oss-120b-latency" in text
    assert yaml.safe_load(text) == options


def test_unknown_profile_is_a_preset_error():
    with pytest.raises(ConfigError, match="profile 'fast' is not one of none, latency, throughput"):
        load_preset("gpt-oss-120b").with_overrides(profile="fast")
