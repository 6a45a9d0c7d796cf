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
from dflash_trt.engine.artifacts.trtllm_schema import SCHEMA, TRTLLM_SOURCE, TRTLLM_VERSION, schema_problems
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


def test_schema_cites_a_tensorrt_llm_version_with_native_dflash():
    major, minor = (int(x) for x in TRTLLM_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 3)
    assert TRTLLM_SOURCE == "tensorrt_llm/llmapi/llm_args.py"
    assert set(SCHEMA["speculative_config"]) == {"decoding_type", "max_draft_len", "speculative_model",
                                                 "mask_token_id", "target_layer_ids", "attention_backend"}


def test_gpt_oss_120b_options_follow_the_schema_and_the_recipe():
    options = options_for("gpt-oss-120b")
    assert schema_problems(options) == []
    spec = options["speculative_config"]
    assert spec == {"decoding_type": "DFlash", "max_draft_len": 9,
                    "speculative_model": str(FIXTURES / "z-lab/gpt-oss-120b-DFlash"),
                    "target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 200000, "attention_backend": "VANILLA"}
    assert (options["tensor_parallel_size"], options["moe_expert_parallel_size"]) == (8, 1)
    assert options["moe_config"] == {"backend": "TRTLLM"}
    assert options["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.9,
                                          "enable_block_reuse": False}  # the latency profile's
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


def test_trtllm_draft_attention_needs_blackwell():
    assert options_for("gpt-oss-120b", draft_attention_backend="TRTLLM")["speculative_config"]["attention_backend"] \
        == "TRTLLM"
    with pytest.raises(ConfigError, match="needs a Blackwell GPU"):
        options_for("gpt-oss-120b", draft_attention_backend="TRTLLM", gpu="h200")


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


def test_options_are_checked_with_tensorrt_llm_where_it_is_installed(monkeypatch, tmp_path):
    seen = {}

    class TorchLlmArgs:  # stand-in for TensorRT-LLM's pydantic model (cannot be installed here)
        def __init__(self, **kwargs):
            seen.update(kwargs)

    fake = types.ModuleType("tensorrt_llm")
    fake.__version__ = "1.3.0"
    llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    llm_args.TorchLlmArgs = TorchLlmArgs
    monkeypatch.setitem(sys.modules, "tensorrt_llm", fake)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", types.ModuleType("tensorrt_llm.llmapi"))
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", llm_args)
    monkeypatch.setattr(trtllm, "has_module", lambda name: True)
    options = options_for("gpt-oss-120b")
    assert trtllm.check_with_trtllm(options, tmp_path) == "1.3.0"
    assert seen["model"] == str(tmp_path) and seen["speculative_config"]["decoding_type"] == "DFlash"


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


def test_a_tensorrt_llm_without_dflash_is_refused_before_checking(monkeypatch, tmp_path):
    fake = types.ModuleType("tensorrt_llm")
    fake.__version__ = "1.3.0rc12"  # the last release before DFlash (PR #12794)
    llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    llm_args.TorchLlmArgs = lambda **kwargs: None
    monkeypatch.setitem(sys.modules, "tensorrt_llm", fake)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", types.ModuleType("tensorrt_llm.llmapi"))
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", llm_args)
    monkeypatch.setattr(trtllm, "has_module", lambda name: True)
    with pytest.raises(ConfigError, match="TensorRT-LLM 1.3.0rc12 has no DFlash: it needs >= 1.3.0rc13"):
        trtllm.check_with_trtllm(options_for("gpt-oss-120b"), tmp_path)
