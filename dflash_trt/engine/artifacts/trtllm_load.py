"""How the LLM-API options reach TensorRT-LLM: one conversion for the server and for the build-time check.

`trtllm-serve --config` and NVIDIA's Triton llmapi model turn the YAML's nested sections into TensorRT-LLM's
config objects with `tensorrt_llm.llmapi.llm_utils.update_llm_args_with_extra_dict` (speculative_config
through DecodingBaseConfig.from_dict, which picks DFlashDecodingConfig by decoding_type and rejects unknown
fields), then build the LLM, whose TorchLlmArgs validates the rest. The trtllm runtime loads the options
with `llm_kwargs`, and `validate_options` runs the same two calls, so what the check accepts is exactly
what the server will load.
"""

from __future__ import annotations

import copy
from typing import Any

from dflash_trt.engine.artifacts.trtllm_schema import MIN_TRTLLM_VERSION
from dflash_trt.errors import ConfigError


def llm_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """LLM(**kwargs) from the engine's options (`model` included), converted as trtllm-serve converts them.

    env_overrides is left out: the trtllm runtime sets those variables itself before the LLM starts."""
    options = copy.deepcopy(dict(options))  # TensorRT-LLM replaces the sections in place
    options.pop("env_overrides", None)
    try:
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
    except ImportError:
        return options
    model = options.pop("model")
    return update_llm_args_with_extra_dict({"model": model}, options)


def validate_options(options: dict[str, Any]) -> str:
    """Check the options with the installed TensorRT-LLM; returns its version, raises ConfigError."""
    import tensorrt_llm
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    from dflash_trt.engine.versions import version_key

    version = tensorrt_llm.__version__
    if version_key(version) < version_key(MIN_TRTLLM_VERSION):
        raise ConfigError(f"TensorRT-LLM {version} is too old for these options: it needs >= {MIN_TRTLLM_VERSION} "
                          "(filled acceptance counters, admission refusals under speculation, DFlash 1.4 fields)")
    try:
        TorchLlmArgs(**llm_kwargs(options))
    except Exception as exc:  # pydantic's ValidationError and TensorRT-LLM's own checks
        raise ConfigError(f"TensorRT-LLM {version} rejects the options: {' '.join(str(exc).split())[:400]}") from None
    return version


def speculative_fields() -> frozenset[str]:
    """The fields of the installed TensorRT-LLM's DFlashDecodingConfig (empty when it has none)."""
    try:
        from tensorrt_llm.llmapi import DFlashDecodingConfig
    except ImportError:
        return frozenset()
    return frozenset(getattr(DFlashDecodingConfig, "model_fields", {}))
