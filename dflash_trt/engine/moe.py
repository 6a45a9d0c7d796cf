"""Which MoE backend (and expert parallelism) TensorRT-LLM runs, chosen per GPU architecture.

The rule, for MXFP4 experts (gpt-oss, as shipped), follows NVIDIA's gpt-oss guide
(NVIDIA/TensorRT-LLM docs/source/deployment-guide/deployment-guide-for-gpt-oss-on-trtllm.md, "MoE Backend
Support Matrix") and the model's README (examples/models/core/gpt_oss/README.md, "MoE Support Matrix"):

| GPU                        | activations | AUTO picks | also allowed | experts split by           |
|----------------------------|-------------|------------|--------------|----------------------------|
| Blackwell (b200, b300)     | MXFP8       | TRTLLM     | CUTLASS      | the preset's ep (TP or EP) |
| Hopper (h100, h200)        | BF16        | TRITON     | CUTLASS      | TRITON: ep = tp (EP only)  |

TRTLLM's MXFP4 MoE kernels exist on Blackwell only; TRITON (OpenAI's Triton kernels) has no tensor
parallelism inside the experts, so with TRITON the experts are split by expert parallelism alone (ep = tp).
`moe_backend: AUTO` in a preset means "apply this rule"; an explicit backend is checked against it.
Targets without MXFP4 experts keep the preset's backend as written (AUTO lets TensorRT-LLM choose).
"""

from __future__ import annotations

import dataclasses

from dflash_trt.errors import ConfigError
from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.presets import Preset

BLACKWELL = ("b200", "b300")
HOPPER = ("h100", "h200")
AUTO = "AUTO"
# What runs MXFP4 experts on each architecture, the recommended backend first.
MXFP4_BACKENDS = {"blackwell": ("TRTLLM", "CUTLASS", "TRITON"), "hopper": ("TRITON", "CUTLASS")}
# Backends without tensor parallelism inside the experts (examples/models/core/gpt_oss/README.md).
EP_ONLY_BACKENDS = ("TRITON",)


def architecture(gpu: str) -> str:
    if gpu in BLACKWELL:
        return "blackwell"
    if gpu in HOPPER:
        return "hopper"
    raise ConfigError(f"no MoE backend rule for GPU '{gpu}' (known: {', '.join(BLACKWELL + HOPPER)})")


def resolve_moe(preset: Preset, arch: TargetArch, log=None) -> Preset:
    """The preset with a concrete moe_backend (and ep) for its GPU; unchanged for dense targets and
    for runtimes other than trtllm. Raises ConfigError for a backend the GPU cannot run."""
    if preset.runtime != "trtllm" or not arch.is_moe:
        return preset
    backend, ep = preset.moe_backend, preset.ep
    if preset.quant == "mxfp4":
        allowed = MXFP4_BACKENDS[architecture(preset.gpu)]
        if backend == AUTO:
            backend = allowed[0]
        elif backend not in allowed:
            raise ConfigError(f"moe_backend {backend} cannot run MXFP4 experts on {preset.gpu} "
                              f"({architecture(preset.gpu)}); use {' or '.join(allowed)} (or AUTO: {allowed[0]})")
    if backend in EP_ONLY_BACKENDS and ep != preset.tp:
        if preset.moe_backend != AUTO:
            raise ConfigError(f"moe_backend {backend} splits experts by expert parallelism only: set ep = tp "
                              f"({preset.tp}), got ep {ep}")
        ep = preset.tp
    if log is not None and (backend, ep) != (preset.moe_backend, preset.ep):
        log(f"  MoE on {preset.gpu}: backend {backend}, EP {ep} (rule in dflash_trt/engine/moe.py)")
    return dataclasses.replace(preset, moe_backend=backend, ep=ep)
