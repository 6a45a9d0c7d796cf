"""The trtllm runtime's artifact: TensorRT-LLM LLM-API options (YAML) with native DFlash speculation.

The file is the `--config` of `trtllm-serve <target>` and the keyword arguments of `LLM(model=<target>,
**options)`; the target path itself lives in the manifest. TensorRT-LLM (>= MIN_TRTLLM_VERSION, the first release with DFlash) builds nothing
ahead of time for the PyTorch backend: it loads the checkpoints when the server starts, so the only step that
needs TensorRT-LLM here is checking the options against the installed version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.errors import ConfigError
from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.needs import StepUnavailable, has_module
from dflash_trt.engine.moe import BLACKWELL, resolve_moe
from dflash_trt.engine.presets import Preset
from dflash_trt.engine.recipes import apply_profile, profile_sources
from dflash_trt.engine.artifacts.trtllm_schema import MIN_TRTLLM_VERSION, TRTLLM_SOURCE, TRTLLM_VERSION, schema_problems

OPTIONS_NAME = "trtllm/llm_api_options.yaml"


def trtllm_options(preset: Preset, arch: TargetArch, drafter: DrafterConfig, drafter_path: Path,
                   target_path: Path | None = None) -> dict[str, Any]:
    """LLM-API keyword arguments for the pair (field names of TensorRT-LLM TRTLLM_VERSION).

    The MoE backend and EP follow the GPU rule of engine/moe.py; the preset's profile adds NVIDIA's
    recipe settings (engine/recipes.py).
    """
    preset = resolve_moe(preset, arch)
    if preset.draft_attention_backend != "VANILLA" and preset.gpu not in BLACKWELL:
        raise ConfigError(f"draft_attention_backend {preset.draft_attention_backend} needs a Blackwell GPU "
                          f"(b200, b300), the plan is for {preset.gpu}; use VANILLA")
    options: dict[str, Any] = {
        "tensor_parallel_size": preset.tp,
        "dtype": preset.dtype,
        "max_batch_size": preset.max_batch_size,
        "max_seq_len": preset.max_seq_len,
        "kv_cache_config": {
            # "auto" keeps the model dtype (bf16); fp8 halves the cache.
            "dtype": "fp8" if preset.kv_dtype == "fp8" else "auto",
            "free_gpu_memory_fraction": float(preset.memory_fraction),
        },
        "cuda_graph_config": {
            "batch_sizes": [b for b in preset.cuda_graph_batch_sizes if b <= preset.max_batch_size],
            "enable_padding": True,
        },
        "speculative_config": {
            "decoding_type": "DFlash",
            # A block is [last committed token, MASK x (block_size - 1)]: block_size - 1 drafts per step.
            "max_draft_len": preset.max_draft_len,
            "speculative_model": str(drafter_path),
            "target_layer_ids": list(drafter.target_layer_ids),
            "mask_token_id": drafter.mask_token_id,
            "attention_backend": preset.draft_attention_backend,
        },
    }
    if arch.is_moe:
        options["moe_expert_parallel_size"] = preset.ep
        options["moe_config"] = {"backend": preset.moe_backend}
    apply_profile(options, preset.profile)
    if options.get("num_postprocess_workers") and target_path is not None:
        options["postprocess_tokenizer_dir"] = str(target_path)  # the workers detokenize with the target's
    problems = schema_problems(options)
    if problems:  # a bug here, not a user error: the options must always fit the schema
        raise AssertionError(f"trtllm options break the {TRTLLM_VERSION} schema: {problems}")
    return options


def write_options(options: dict[str, Any], path: Path, target: str, profile: str = "none") -> None:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# TensorRT-LLM LLM-API options (fields of TensorRT-LLM {TRTLLM_VERSION}, {TRTLLM_SOURCE}).\n"
              f"# Serve: trtllm-serve {target} --backend pytorch --config {path.name}\n")
    if profile != "none":
        header += f"# Profile {profile}, NVIDIA/TensorRT-LLM recipe settings:\n"
        header += "".join(f"#   {line}\n" for line in profile_sources(profile))
    path.write_text(header + yaml.safe_dump(options, sort_keys=False))


def check_with_trtllm(options: dict[str, Any], target: Path) -> str:
    """Validate the options with the installed TensorRT-LLM; returns its version."""
    if not has_module("tensorrt_llm"):
        raise StepUnavailable("trtllm-check", f"TensorRT-LLM >= {MIN_TRTLLM_VERSION}")
    import tensorrt_llm
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    from dflash_trt.engine.versions import version_key

    if version_key(tensorrt_llm.__version__) < version_key(MIN_TRTLLM_VERSION):
        raise ConfigError(f"TensorRT-LLM {tensorrt_llm.__version__} has no DFlash: it needs >= {MIN_TRTLLM_VERSION}")

    try:
        TorchLlmArgs(model=str(target), **options)
    except Exception as exc:  # pydantic's ValidationError and TensorRT-LLM's own checks
        raise ConfigError(f"TensorRT-LLM {tensorrt_llm.__version__} rejects the options: "
                          f"{' '.join(str(exc).split())[:400]}") from None
    return tensorrt_llm.__version__
