"""The TensorRT-LLM LLM-API fields this project writes, with their types and allowed values.

Version: TensorRT-LLM 1.3.0rc27 (PyTorch backend; DFlash is native from 1.3).
Source file: tensorrt_llm/llmapi/llm_args.py — classes TorchLlmArgs / BaseLlmArgs (top-level keys),
DFlashDecodingConfig (speculative_config), KvCacheConfig, MoeConfig, DecodeCudaGraphConfig.
API reference: https://nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/DFlashDecodingConfig.html
(and MoeConfig.html, KvCacheConfig.html, DecodeCudaGraphConfig.html next to it).

Only the subset we emit is listed; like TensorRT-LLM's StrictBaseModel, unknown keys are rejected.
"""

from __future__ import annotations

from typing import Any

TRTLLM_VERSION = "1.3.0rc27"
# The first release with DFlashDecodingConfig, DFlash on gpt-oss included: DFlash entered TensorRT-LLM with
# NVIDIA/TensorRT-LLM PR #12794 ("Support DFlash in one-model spec dec", merged late April 2026, with gpt-oss-20b
# accuracy tests), after the 1.3.0rc12 tag; 1.3.0rc13 is the next release. Used by `check-runtime`, the GPU
# image build (deploy/docker/gpu.Dockerfile) and the docs.
MIN_TRTLLM_VERSION = "1.3.0rc13"
TRTLLM_SOURCE = "tensorrt_llm/llmapi/llm_args.py"

INT, FLOAT, BOOL, STR = "int", "float", "bool", "str"

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
    # Environment set before the workers start (NVIDIA's gpt-oss configs set TRTLLM_ENABLE_PDL with it).
    "env_overrides": {"TRTLLM_ENABLE_PDL": ("0", "1")},
    "kv_cache_config": {  # KvCacheConfig
        "dtype": ("auto", "float16", "bfloat16", "float32", "fp8", "fp8_ds_mla", "nvfp4"),
        "free_gpu_memory_fraction": FLOAT,
        "enable_block_reuse": BOOL,
        "max_tokens": INT,
    },
    "moe_config": {  # MoeConfig
        "backend": ("AUTO", "CUTLASS", "CUTEDSL", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON", "MARLIN",
                    "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL"),
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
        "attention_backend": ("VANILLA", "TRTLLM", "FA4"),
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
    expected = _TYPES[rule]
    ok = isinstance(value, expected) and not (rule != BOOL and isinstance(value, bool))
    return [] if ok else [f"{path}: expected {rule}, got {type(value).__name__}"]
