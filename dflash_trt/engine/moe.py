"""Which MoE backend (and expert parallelism) TensorRT-LLM runs, chosen per GPU architecture.

The rule, for MXFP4 experts (gpt-oss, as shipped):

| GPU                    | activations | AUTO writes | also allowed         | experts split by           |
|------------------------|-------------|-------------|----------------------|----------------------------|
| Blackwell (b200, b300) | MXFP8       | TRTLLM      | CUTLASS              | the preset's ep (TP or EP) |
| Hopper (h100, h200)    | BF16        | CUTLASS     | TRITON (deprecated)  | CUTLASS: the preset's ep;  |
|                        |             |             |                      | TRITON: ep = tp (EP only)  |

Sources (NVIDIA/TensorRT-LLM):
- Blackwell: the gpt-oss deployment guide (docs/source/deployment-guide/deployment-guide-for-gpt-oss-on-trtllm.md,
  "MoE Backend Support Matrix") lists TRTLLM for B200/GB200/B300/GB300, its quick-start recipe CUTLASS for
  max throughput; the curated gpt-oss-120b configs set TRTLLM. Nothing else is listed for Blackwell.
- TRITON: deprecated since 1.3, removal announced (PR #19035). It is never written for Blackwell; on Hopper,
  where the guide still names it as TensorRT-LLM's AUTO choice, it is accepted only when asked for by name.
- Hopper: TRTLLM's MXFP4 MoE kernels are Blackwell-only; CUTLASS runs MXFP4 experts with BF16 activations and
  keeps the experts' tensor parallelism, so it is what AUTO writes there (TensorRT-LLM's own AUTO would pick
  the deprecated TRITON).
TRITON (OpenAI's Triton kernels) has no tensor parallelism inside the experts, so with TRITON the experts are
split by expert parallelism alone (ep = tp) (examples/models/core/gpt_oss/README.md, "MoE Support Matrix").
`moe_backend: AUTO` in a preset means "apply this rule"; an explicit backend is checked against it.
Targets without MXFP4 experts keep the preset's backend as written (AUTO lets TensorRT-LLM choose).
"""

from __future__ import annotations

import dataclasses

from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.presets import Preset
from dflash_trt.errors import ConfigError

BLACKWELL = ("b200", "b300")
HOPPER = ("h100", "h200")
AUTO = "AUTO"
# What runs MXFP4 experts on each architecture, the backend AUTO writes first.
MXFP4_BACKENDS = {"blackwell": ("TRTLLM", "CUTLASS"), "hopper": ("CUTLASS", "TRITON")}
DEPRECATED_BACKENDS = {"TRITON": "deprecated since TensorRT-LLM 1.3, removal announced (NVIDIA/TensorRT-LLM #19035)"}
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
            why = f" ({DEPRECATED_BACKENDS[backend]})" if backend in DEPRECATED_BACKENDS else ""
            raise ConfigError(f"moe_backend {backend} cannot run MXFP4 experts on {preset.gpu} "
                              f"({architecture(preset.gpu)}){why}; use {' or '.join(allowed)} (or AUTO: {allowed[0]})")
    if backend in DEPRECATED_BACKENDS and log is not None:
        log(f"  warning: moe_backend {backend} is {DEPRECATED_BACKENDS[backend]}")
    if backend in EP_ONLY_BACKENDS and ep != preset.tp:
        if preset.moe_backend != AUTO:
            raise ConfigError(f"moe_backend {backend} splits experts by expert parallelism only: set ep = tp "
                              f"({preset.tp}), got ep {ep}")
        ep = preset.tp
    if log is not None and (backend, ep) != (preset.moe_backend, preset.ep):
        log(f"  MoE on {preset.gpu}: backend {backend}, EP {ep} (rule in dflash_trt/engine/moe.py)")
    return dataclasses.replace(preset, moe_backend=backend, ep=ep)
