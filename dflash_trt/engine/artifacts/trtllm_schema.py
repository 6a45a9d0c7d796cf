"""The TensorRT-LLM LLM-API fields this project writes, with their types and allowed values.

Version: TensorRT-LLM 1.4.0rc4 (PyTorch backend).
Source file: tensorrt_llm/llmapi/llm_args.py — classes TorchLlmArgs / BaseLlmArgs (top-level keys),
DFlashDecodingConfig (speculative_config, fields of DecodingBaseConfig included), KvCacheConfig, MoeConfig,
DecodeCudaGraphConfig.
API reference: https://nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/DFlashDecodingConfig.html
(and MoeConfig.html, KvCacheConfig.html, DecodeCudaGraphConfig.html next to it).

Only the subset we emit or an operator may add is listed; like TensorRT-LLM's StrictBaseModel, unknown
keys are rejected. Where TensorRT-LLM is installed the options are checked by TensorRT-LLM itself
(trtllm_load.py), through the call the server uses to load them.
"""

from __future__ import annotations

from typing import Any

TRTLLM_VERSION = "1.4.0rc4"
# The oldest release this project runs on. DFlash entered with PR #12794 (after 1.3.0rc12), but the
# behaviour the serving path relies on came later: filled acceptance counters (spec_dec_totals, #17082),
# admission refusals under one-model speculation instead of silently dropped options (penalties without
# speculative_config.enable_penalty #17701; min_tokens/bad_words/min_p/embedding bias/logprobs #17955,
# #19161, #18401), and the drafter's context cache counted inside free_gpu_memory_fraction (#18343).
# No release tag containing all of them could be confirmed from NVIDIA's sources, so the floor is the
# newest documented release, 1.4.0rc4 (its DFlashDecodingConfig has every field written here).
# Used by `check-runtime`, the GPU image build (deploy/docker/gpu.Dockerfile) and the docs.
MIN_TRTLLM_VERSION = "1.4.0rc4"
TRTLLM_SOURCE = "tensorrt_llm/llmapi/llm_args.py"

INT, FLOAT, BOOL, STR = "int", "float", "bool", "str"
# An environment flag as NVIDIA's configs write it: `TRTLLM_ENABLE_PDL: 1` (an integer) or "1" (a string).
ENV_FLAG = "env_flag"

MOE_BACKENDS = ("AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON",
                "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL")  # MoeConfig.backend

SCHEMA: dict[str, Any] = {
    # BaseLlmArgs / TorchLlmArgs
    "tensor_parallel_size": INT,
    "pipeline_parallel_size": INT,
    "moe_expert_parallel_size": INT,
    "moe_tensor_parallel_size": INT,
    "dtype": ("auto", "float16", "bfloat16", "float32"),
    "max_batch_size": INT,
    "max_seq_len": INT,
    "max_num_tokens": INT,
    "trust_remote_code": BOOL,
    "enable_attention_dp": BOOL,
    "disable_overlap_scheduler": BOOL,
    "stream_interval": INT,
    "num_postprocess_workers": INT,
    "postprocess_tokenizer_dir": STR,
    "print_iter_log": BOOL,
    # Environment set before the workers start; NVIDIA's gpt-oss-120b configs
    # (examples/configs/database/openai/gpt-oss-120b/*) write TRTLLM_ENABLE_PDL: 1 and NCCL_GRAPH_REGISTER: 0.
    "env_overrides": {"TRTLLM_ENABLE_PDL": ENV_FLAG, "NCCL_GRAPH_REGISTER": ENV_FLAG},
    "kv_cache_config": {  # KvCacheConfig
        "dtype": ("auto", "float16", "bfloat16", "float32", "fp8", "fp8_ds_mla", "nvfp4"),
        "free_gpu_memory_fraction": FLOAT,
        "enable_block_reuse": BOOL,
        "max_tokens": INT,
    },
    "moe_config": {  # MoeConfig
        "backend": MOE_BACKENDS,
        "tactic": STR,
        "max_num_tokens": INT,
    },
    "cuda_graph_config": {  # DecodeCudaGraphConfig
        "batch_sizes": [INT],
        "max_batch_size": INT,
        "enable_padding": BOOL,
    },
    "speculative_config": {  # DFlashDecodingConfig (discriminated by decoding_type)
        "decoding_type": ("DFlash",),
        "max_draft_len": INT,
        "speculative_model": STR,
        "mask_token_id": INT,
        "target_layer_ids": [INT],
        # VANILLA: FlashAttention, contiguous cache; TRTLLM: SM100/SM103 + FlashInfer; FA4: SM90.
        "attention_backend": ("VANILLA", "TRTLLM", "FA4"),
        # DecodingBaseConfig, one-model speculation: off by default in TensorRT-LLM.
        "enable_penalty": BOOL,  # allocates the occurrence-count workspace; else penalty requests are refused
        "use_rejection_sampling": BOOL,  # T > 0: rejection sampling instead of exact-match acceptance
        # DFlashDecodingConfig fields of 1.4
        "moe_backend": MOE_BACKENDS,  # the drafter's MoE backend (None: the target's)
        "moe_tactic": STR,
        "spec_dec_variant": INT,
        "context_recompute_tail": INT,  # prompt tokens recomputed after a prefix-cache hit (drafter context)
        "skip_ctx_buffer_budget_check": BOOL,
    },
}

_TYPES = {INT: int, FLOAT: (int, float), BOOL: bool, STR: str}


def schema_problems(config: Any, schema: dict[str, Any] = SCHEMA, where: str = "") -> list[str]:
    """Every way `config` departs from the schema, as 'path: problem' strings (empty when valid)."""
    if not isinstance(config, dict):
        return [f"{where or '<root>'}: expected a mapping"]
    problems = []
    for key, value in config.items():
        path = f"{where}.{key}" if where else key
        if key not in schema:
            problems.append(f"{path}: not a field of TensorRT-LLM {TRTLLM_VERSION}")
        else:
            problems += _check(value, schema[key], path)
    return problems


def _check(value: Any, rule: Any, path: str) -> list[str]:
    if isinstance(rule, dict):
        return schema_problems(value, rule, path)
    if isinstance(rule, tuple):
        return [] if value in rule else [f"{path}: {value!r} is not one of {', '.join(map(str, rule))}"]
    if isinstance(rule, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [p for i, item in enumerate(value) for p in _check(item, rule[0], f"{path}[{i}]")]
    if rule == ENV_FLAG:
        ok = (isinstance(value, int) and not isinstance(value, bool) and value in (0, 1)) or value in ("0", "1")
        return [] if ok else [f"{path}: {value!r} is not 0 or 1 (an integer or a string)"]
    expected = _TYPES[rule]
    ok = isinstance(value, expected) and not (rule != BOOL and isinstance(value, bool))
    return [] if ok else [f"{path}: expected {rule}, got {type(value).__name__}"]
