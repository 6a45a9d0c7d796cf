"""trtllm runtime: the LLM-API options against TensorRT-LLM's field schema, and the build on a machine without it."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import yaml

from dflash_trt.cli import main
from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import read_target_arch
from dflash_trt.engine.artifacts import trtllm
from dflash_trt.engine.artifacts.trtllm_schema import (MIN_TRTLLM_VERSION, SCHEMA, TRTLLM_SOURCE, TRTLLM_VERSION,
                                                       schema_problems)
from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.loader import load_engine
from dflash_trt.engine.needs import StepUnavailable
from dflash_trt.engine.presets import SHIPPED_CONFIGS, load_preset
from dflash_trt.errors import ConfigError

FIXTURES = SHIPPED_CONFIGS


def options_for(name: str, **overrides):
    preset = load_preset(name).with_overrides(**overrides)
    drafter_dir = FIXTURES / preset.drafter.id
    return trtllm.trtllm_options(preset, read_target_arch(FIXTURES / preset.target.id),
                                 DrafterConfig.from_file(drafter_dir / "config.json"), drafter_dir)


# DFlashDecodingConfig of TensorRT-LLM 1.4.0rc4 (its API reference), DecodingBaseConfig's fields included.
DFLASH_FIELDS_1_4 = frozenset({
    "max_draft_len", "max_total_draft_tokens", "speculative_model", "moe_backend", "moe_tactic", "max_concurrency",
    "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
    "spec_dec_variant", "mask_token_id", "target_layer_ids", "context_recompute_tail", "decoding_type",
    "attention_backend", "skip_ctx_buffer_budget_check"})


def test_schema_cites_the_tensorrt_llm_release_of_its_fields():
    major, minor = (int(x) for x in TRTLLM_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 4) and TRTLLM_VERSION == MIN_TRTLLM_VERSION
    assert TRTLLM_SOURCE == "tensorrt_llm/llmapi/llm_args.py"
    assert set(SCHEMA["speculative_config"]) <= DFLASH_FIELDS_1_4
    assert {"enable_penalty", "use_rejection_sampling", "moe_backend", "moe_tactic", "spec_dec_variant",
            "context_recompute_tail", "skip_ctx_buffer_budget_check"} <= set(SCHEMA["speculative_config"])


def test_schema_takes_nvidias_own_value_types():
    # NVIDIA's gpt-oss-120b configs write the environment flags as integers.
    assert schema_problems({"env_overrides": {"TRTLLM_ENABLE_PDL": 1, "NCCL_GRAPH_REGISTER": 0}}) == []
    assert schema_problems({"env_overrides": {"TRTLLM_ENABLE_PDL": "1"}}) == []
    assert schema_problems({"speculative_config": {"spec_dec_variant": 2, "context_recompute_tail": 64,
                                                   "skip_ctx_buffer_budget_check": False, "moe_backend": "CUTLASS",
                                                   "moe_tactic": "auto"}}) == []
    problems = schema_problems({"env_overrides": {"TRTLLM_ENABLE_PDL": 2, "NCCL_GRAPH_REGISTER": True}})
    assert problems == ["env_overrides.TRTLLM_ENABLE_PDL: 2 is not 0 or 1 (an integer or a string)",
                        "env_overrides.NCCL_GRAPH_REGISTER: True is not 0 or 1 (an integer or a string)"]


def test_gpt_oss_120b_options_follow_the_schema_and_the_recipe():
    options = options_for("gpt-oss-120b")
    assert schema_problems(options) == []
    spec = options["speculative_config"]
    assert spec == {"decoding_type": "DFlash", "max_draft_len": 9,
                    "speculative_model": str(FIXTURES / "z-lab/gpt-oss-120b-DFlash"),
                    "target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 200000, "attention_backend": "VANILLA",
                    "enable_penalty": True, "use_rejection_sampling": True}
    assert (options["tensor_parallel_size"], options["moe_expert_parallel_size"]) == (8, 1)
    assert options["moe_config"] == {"backend": "TRTLLM"}
    assert options["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.9,
                                          "enable_block_reuse": False}  # the preset's kv_block_reuse
    assert options["cuda_graph_config"] == {"batch_sizes": [1, 2, 4, 8, 16, 32, 64], "enable_padding": True}


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-8b", "llama-3.1-8b-instruct"])
def test_every_trtllm_preset_writes_schema_valid_options(name):
    options = options_for(name)
    assert schema_problems(options) == []
    assert options["speculative_config"]["max_draft_len"] == load_preset(name).block_size - 1


def test_dense_targets_get_no_moe_fields():
    assert "moe_config" not in options_for("qwen3-8b") and "moe_expert_parallel_size" not in options_for("qwen3-8b")


def test_schema_rejects_unknown_fields_and_values():
    problems = schema_problems({"speculative_config": {"decoding_type": "Eagle3", "num_draft_tokens": 3},
                                "kv_cache_config": {"free_gpu_memory_fraction": "most"}, "tp": 8})
    assert any("decoding_type: 'Eagle3' is not one of DFlash" in p for p in problems)
    assert any("speculative_config.num_draft_tokens: not a field" in p for p in problems)
    assert any("free_gpu_memory_fraction: expected float" in p for p in problems)
    assert any(p.startswith("tp: not a field of TensorRT-LLM") for p in problems)


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200", "b300"])
def test_gpt_oss_120b_options_follow_nvidias_rules_on_every_gpu(gpu):
    options = options_for("gpt-oss-120b", gpu=gpu)
    assert schema_problems(options) == []
    blackwell = gpu.startswith("b")
    # MoE: TRTLLM on Blackwell (the gpt-oss guide), CUTLASS on Hopper; never the deprecated TRITON (#19035).
    assert options["moe_config"]["backend"] == ("TRTLLM" if blackwell else "CUTLASS")
    spec = options["speculative_config"]
    assert spec["attention_backend"] == "VANILLA" and gpu in trtllm.DRAFT_ATTENTION_GPUS["VANILLA"]
    assert spec["enable_penalty"] is True  # else every penalty request is refused at admission (#17701)
    assert spec["use_rejection_sampling"] is True  # else sampled drafts are accepted by exact match only
    assert options["kv_cache_config"]["enable_block_reuse"] is False  # DFlash acceptance needs the prefix's states
    assert "stream_interval" not in options  # the latency profile serves interactive streams
    assert options["env_overrides"] == {"TRTLLM_ENABLE_PDL": 1, "NCCL_GRAPH_REGISTER": 0}


@pytest.mark.parametrize("backend, gpu, ok", [
    ("TRTLLM", "b200", True), ("TRTLLM", "b300", True), ("TRTLLM", "h200", False), ("TRTLLM", "h100", False),
    ("FA4", "h100", True), ("FA4", "h200", True), ("FA4", "b200", False), ("FA4", "b300", False),
    ("VANILLA", "h200", True), ("VANILLA", "b200", True)])
def test_draft_attention_backend_is_checked_per_gpu(backend, gpu, ok):
    if ok:
        assert options_for("gpt-oss-120b", draft_attention_backend=backend, gpu=gpu)[
            "speculative_config"]["attention_backend"] == backend
    else:
        with pytest.raises(ConfigError, match=f"draft_attention_backend {backend} runs on .* only, the plan is for "
                                              f"{gpu}; use VANILLA"):
            options_for("gpt-oss-120b", draft_attention_backend=backend, gpu=gpu)


def test_kv_block_reuse_is_a_preset_switch_off_by_default():
    for name in ("gpt-oss-120b", "gpt-oss-20b", "qwen3-8b", "llama-3.1-8b-instruct"):
        assert load_preset(name).kv_block_reuse is False
        assert options_for(name)["kv_cache_config"]["enable_block_reuse"] is False
    assert options_for("qwen3-8b", kv_block_reuse=True)["kv_cache_config"]["enable_block_reuse"] is True
    with pytest.raises(ConfigError, match="kv_block_reuse must be true or false, got 'yes'"):
        load_preset("qwen3-8b").with_overrides(kv_block_reuse="yes")


def test_build_without_tensorrt_llm_writes_everything_then_fails_one_step(published_checkpoints, tmp_path):
    out = tmp_path / "engine"
    with pytest.raises(StepUnavailable) as info:
        build_engine(BuildRequest(model="gpt-oss-120b", checkpoints_dir=published_checkpoints, out=out),
                     log=lambda line: None)
    assert info.value.step == "trtllm-check" and "TensorRT-LLM" in str(info.value)
    assert "gpu.Dockerfile" in str(info.value) and "\n" not in str(info.value)
    written = yaml.safe_load((out / trtllm.OPTIONS_NAME).read_text())
    assert schema_problems(written) == []
    assert f"TensorRT-LLM {TRTLLM_VERSION}" in (out / trtllm.OPTIONS_NAME).read_text().splitlines()[0]
    engine = load_engine(out)  # the check is not blocking: the options are complete
    assert engine.llm_options["model"] == str((published_checkpoints / "openai/gpt-oss-120b").resolve())
    assert engine.llm_options["speculative_config"]["max_draft_len"] == 9
    manifest = engine.manifest
    assert (manifest["tp"], manifest["block_size"], manifest["mask_token_id"]) == (8, 10, 200000)
    assert manifest["pending_steps"][0]["step"] == "trtllm-check" and not manifest["pending_steps"][0]["blocking"]
    assert set(manifest["external"]) == {"target", "drafter"}


def test_cli_reports_the_missing_tool_in_one_line_and_exits_non_zero(published_checkpoints, tmp_path, capsys):
    code = main(["engine", "--model", "qwen3-8b", "--checkpoints-dir", str(published_checkpoints),
                 "--out", str(tmp_path / "engine")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: step 'trtllm-check' needs TensorRT-LLM")


def install_fake_tensorrt_llm(monkeypatch, version="1.4.0rc4", fields=DFLASH_FIELDS_1_4):
    """Stand-ins of TensorRT-LLM's documented loading path (it cannot be installed here):
    update_llm_args_with_extra_dict converts speculative_config with DecodingBaseConfig.from_dict, which picks
    the class by decoding_type and, being a StrictBaseModel, rejects unknown fields; TorchLlmArgs validates
    the top level. Returns the calls they saw."""
    seen = {"converted": [], "validated": []}

    class DFlashDecodingConfig:
        model_fields = dict.fromkeys(fields)

        def __init__(self, **values):
            extra = sorted(set(values) - set(fields))
            if extra:
                raise ValueError(f"1 validation error for DFlashDecodingConfig {extra[0]} Extra inputs are not permitted")
            self.values = values

    def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
        seen["converted"].append(llm_args_dict)
        if "speculative_config" in llm_args_dict:
            llm_args_dict["speculative_config"] = DFlashDecodingConfig(**llm_args_dict["speculative_config"])
        return {**llm_args, **llm_args_dict}

    class TorchLlmArgs:
        def __init__(self, **kwargs):
            seen["validated"].append(kwargs)

    modules = {"tensorrt_llm": types.ModuleType("tensorrt_llm"),
               "tensorrt_llm.llmapi": types.ModuleType("tensorrt_llm.llmapi"),
               "tensorrt_llm.llmapi.llm_utils": types.ModuleType("tensorrt_llm.llmapi.llm_utils"),
               "tensorrt_llm.llmapi.llm_args": types.ModuleType("tensorrt_llm.llmapi.llm_args")}
    modules["tensorrt_llm"].__version__ = version
    modules["tensorrt_llm.llmapi"].DFlashDecodingConfig = DFlashDecodingConfig
    modules["tensorrt_llm.llmapi.llm_utils"].update_llm_args_with_extra_dict = update_llm_args_with_extra_dict
    modules["tensorrt_llm.llmapi.llm_args"].TorchLlmArgs = TorchLlmArgs
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(trtllm, "has_module", lambda name: True)
    return seen


def test_options_are_checked_through_the_call_the_server_loads_them_with(monkeypatch, tmp_path):
    seen = install_fake_tensorrt_llm(monkeypatch)
    options = options_for("gpt-oss-120b")
    assert trtllm.check_with_trtllm(options, tmp_path) == "1.4.0rc4"
    (converted,), (validated,) = seen["converted"], seen["validated"]
    assert converted["speculative_config"].values["enable_penalty"] is True  # went through the conversion
    assert validated["model"] == str(tmp_path) and "env_overrides" not in validated
    assert options["speculative_config"]["decoding_type"] == "DFlash"  # the caller's options are left as they were

    from dflash_trt.serving.trtllm_runtime import llm_kwargs  # what the runtime hands LLM(**kwargs)

    llm_kwargs({"model": str(tmp_path), **options})
    assert len(seen["converted"]) == 2 and seen["converted"][0].keys() == seen["converted"][1].keys()


def test_a_field_the_installed_release_lacks_is_reported_by_tensorrt_llm(monkeypatch, tmp_path):
    # A 1.4.0rc1-like release: its DFlashDecodingConfig has no moe_tactic yet.
    install_fake_tensorrt_llm(monkeypatch, fields=DFLASH_FIELDS_1_4 - {"moe_tactic"})
    options = options_for("gpt-oss-120b")
    options["speculative_config"]["moe_tactic"] = "auto"
    with pytest.raises(ConfigError, match="TensorRT-LLM 1.4.0rc4 rejects the options: .*moe_tactic Extra inputs"):
        trtllm.check_with_trtllm(options, tmp_path)


@pytest.mark.parametrize("version", ["1.4.0rc3", "1.3.0rc27", "1.3.0rc13"])
def test_a_tensorrt_llm_older_than_the_floor_is_refused_before_checking(monkeypatch, tmp_path, version):
    seen = install_fake_tensorrt_llm(monkeypatch, version=version)
    with pytest.raises(ConfigError, match=f"TensorRT-LLM {version} is too old for these options: it needs >= 1.4.0rc4"):
        trtllm.check_with_trtllm(options_for("gpt-oss-120b"), tmp_path)
    assert seen["converted"] == []


def test_fp8_for_tensorrt_llm_needs_gpus_and_blocks_the_engine(published_checkpoints, tmp_path):
    from dflash_trt.engine.manifest import EngineError

    out = tmp_path / "engine"
    with pytest.raises(StepUnavailable, match="step 'quantize' needs CUDA GPUs"):
        build_engine(BuildRequest(model="qwen3-8b", quant="fp8", checkpoints_dir=published_checkpoints, out=out),
                     log=lambda line: None)
    steps = {p["step"]: p for p in yaml.safe_load((out / "manifest.json").read_text())["pending_steps"]}
    assert steps["quantize"]["blocking"] and "trtllm-check" in steps
    with pytest.raises(EngineError, match="incomplete trtllm engine, step 'quantize'"):
        load_engine(out)


def test_quantized_checkpoint_for_tensorrt_llm_becomes_the_engine_target(published_checkpoints, tmp_path,
                                                                         monkeypatch):
    from dflash_trt.engine import quantize

    def fake_export(quant, target_dir, out_dir, dtype, log):  # ModelOpt's GPU export cannot run here
        out_dir.mkdir()
        (out_dir / "config.json").write_text((target_dir / "config.json").read_text())
        (out_dir / "model.safetensors").write_bytes(b"fp8 weights")
        return out_dir

    monkeypatch.setattr(quantize, "export_for_trtllm", fake_export)
    out = tmp_path / "engine"
    with pytest.raises(StepUnavailable, match="trtllm-check"):
        build_engine(BuildRequest(model="qwen3-8b", quant="fp8", checkpoints_dir=published_checkpoints, out=out),
                     log=lambda line: None)
    engine = load_engine(out)
    assert not (out / "target").is_symlink() and "target/model.safetensors" in engine.manifest["files"]
    assert engine.llm_options["model"] == str((out / "target").resolve())
    assert engine.manifest["quant_scheme"].startswith("fp8 weights and activations")


def test_the_engine_command_switches_kv_block_reuse(published_checkpoints, tmp_path):
    out = tmp_path / "engine"
    assert main(["engine", "--model", "qwen3-8b", "--checkpoints-dir", str(published_checkpoints), "--out", str(out),
                 "--kv-block-reuse"]) == 2  # the trtllm-check step needs TensorRT-LLM; the options are written
    assert yaml.safe_load((out / trtllm.OPTIONS_NAME).read_text())["kv_cache_config"]["enable_block_reuse"] is True
