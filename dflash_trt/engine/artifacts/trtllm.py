"""The trtllm runtime's artifact: TensorRT-LLM LLM-API options (YAML) with native DFlash speculation.

The file is the `--config` of `trtllm-serve <target>` and the keyword arguments of `LLM(model=<target>,
**options)`; the target path itself lives in the manifest. TensorRT-LLM (>= MIN_TRTLLM_VERSION) builds
nothing ahead of time for the PyTorch backend: it loads the checkpoints when the server starts, so the only
step that needs TensorRT-LLM here is checking the options against the installed version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.artifacts.trtllm_schema import MIN_TRTLLM_VERSION, TRTLLM_SOURCE, TRTLLM_VERSION, schema_problems
from dflash_trt.engine.moe import BLACKWELL, HOPPER, resolve_moe
from dflash_trt.engine.needs import StepUnavailable, has_module
from dflash_trt.engine.presets import Preset
from dflash_trt.engine.recipes import apply_profile, profile_sources
from dflash_trt.errors import ConfigError

OPTIONS_NAME = "trtllm/llm_api_options.yaml"

# GPUs each DFlash draft-attention backend runs on (DFlashDecodingConfig.attention_backend, TensorRT-LLM 1.4):
# TRTLLM (TRTLLM-gen FMHA, private paged context cache) needs FlashInfer and SM100/SM103, i.e. B200/B300;
# FA4 targets SM90 only (NVIDIA/TensorRT-LLM #18553: "FA4 targets SM90 only, so FA4 is not tested on B200");
# VANILLA (FlashAttention, contiguous cache) runs everywhere.
# gpt-oss-120b keeps VANILLA on every GPU: NVIDIA validated the TRTLLM draft attention on B200 for
# Qwen3.6-35B-A3B's drafter only (#16914, #18553, test_nvfp4_dflash with TRTLLM and VANILLA), not for the
# gpt-oss drafters; TRTLLM stays an opt-in on Blackwell (draft_attention_backend in the preset).
DRAFT_ATTENTION_GPUS = {"VANILLA": BLACKWELL + HOPPER, "TRTLLM": BLACKWELL, "FA4": HOPPER}


def trtllm_options(preset: Preset, arch: TargetArch, drafter: DrafterConfig, drafter_path: Path,
                   target_path: Path | None = None) -> dict[str, Any]:
    """LLM-API keyword arguments for the pair (field names of TensorRT-LLM TRTLLM_VERSION).

    The MoE backend and EP follow the GPU rule of engine/moe.py; the preset's profile adds NVIDIA's
    recipe settings (engine/recipes.py).
    """
    preset = resolve_moe(preset, arch)
    gpus = DRAFT_ATTENTION_GPUS[preset.draft_attention_backend]
    if preset.gpu not in gpus:
        raise ConfigError(f"draft_attention_backend {preset.draft_attention_backend} runs on {', '.join(gpus)} only, "
                          f"the plan is for {preset.gpu}; use VANILLA (any GPU) or "
                          f"{'FA4' if preset.gpu in HOPPER else 'TRTLLM'} ({preset.gpu})")
    options: dict[str, Any] = {
        "tensor_parallel_size": preset.tp,
        "dtype": preset.dtype,
        "max_batch_size": preset.max_batch_size,
        "max_seq_len": preset.max_seq_len,
        "kv_cache_config": {
            # "auto" keeps the model dtype (bf16); fp8 halves the cache.
            "dtype": "fp8" if preset.kv_dtype == "fp8" else "auto",
            "free_gpu_memory_fraction": float(preset.memory_fraction),
            # Written either way: TensorRT-LLM reuses blocks by default (see Preset.kv_block_reuse).
            "enable_block_reuse": preset.kv_block_reuse,
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
            # Without it TensorRT-LLM refuses every request with a repetition/presence/frequency penalty under
            # one-model speculation (#17701); with it, it allocates a [sequence slots, vocab] count workspace.
            "enable_penalty": True,
            # T > 0: lossless rejection sampling instead of exact-match acceptance of the drafts (#15775).
            # Its non-dynamic-tree one-model path needs FlashInfer (NVIDIA's release images ship it).
            "use_rejection_sampling": True,
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
    """Validate the options with the installed TensorRT-LLM, the way the server loads them; returns its version."""
    if not has_module("tensorrt_llm"):
        raise StepUnavailable("trtllm-check", f"TensorRT-LLM >= {MIN_TRTLLM_VERSION}")
    from dflash_trt.engine.artifacts.trtllm_load import validate_options

    return validate_options({"model": str(target), **options})
