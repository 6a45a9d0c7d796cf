"""Which runtime can run which drafter: one table, so every path refuses the same way, in one line.

- torch: every family and attention pattern (this package is the reference implementation).
- onnx / tensorrt: the exported graph runs either family's layers around the attention plugin, which
  attends to every context row without a mask, so sliding or causal drafters are refused. DFlash2's
  candidate selector runs on the host (exported.head).
- trtllm: TensorRT-LLM's DFlash (tensorrt_llm/_torch/speculative/dflash.py, models/modeling_dflash.py)
  builds the draft layers from the target's own architecture and has no grouped convolution or
  candidate selector, so DFlash2 drafters are refused.
"""

from __future__ import annotations

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.errors import ConfigError


def unsupported_reason(runtime: str, config: DrafterConfig) -> str | None:
    """Why `runtime` cannot run a drafter of `config`, or None when it can."""
    if runtime in ("onnx", "tensorrt"):
        if not config.is_plain_attention:
            return (f"runtime {runtime}'s attention plugin attends to every context row; this drafter has "
                    "sliding-window or causal layers; use --runtime torch")
    if runtime == "trtllm" and config.family != "dflash":
        return (f"runtime trtllm: TensorRT-LLM's DFlash runs DFlashDraftModel drafters only, not "
                f"{config.architecture} (no grouped convolutions or candidate selector); use --runtime torch")
    return None


def check_runtime(runtime: str, config: DrafterConfig) -> None:
    reason = unsupported_reason(runtime, config)
    if reason:
        raise ConfigError(reason)
