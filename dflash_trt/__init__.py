"""dflash-trt: build, serve and deploy DFlash speculative decoding.

The public surface is small and imported lazily, so `import dflash_trt` stays cheap. The decoding engine
lives in dflash_trt.decoding (its layers: api > scheduler > step > model > kernels).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DFlashDrafter": "dflash_trt.decoding.reference",
    "DFlash2Drafter": "dflash_trt.decoding.reference",
    "load_drafter": "dflash_trt.decoding.model.drafters",
    "save_drafter": "dflash_trt.decoding.model.drafters",
    "DrafterConfig": "dflash_trt.decoding.model.config",
    "TargetModel": "dflash_trt.decoding.model.target",
    "load_target": "dflash_trt.decoding.model.target",
    "SamplingParams": "dflash_trt.decoding.step.sampling",
    "generate": "dflash_trt.decoding.api",
    "stream_generate": "dflash_trt.decoding.api",
    "Scheduler": "dflash_trt.decoding.scheduler.scheduler",
    "SchedulerLimits": "dflash_trt.decoding.scheduler.scheduler",
    "GenerationResult": "dflash_trt.decoding.step.results",
    "DFlashError": "dflash_trt.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dflash_trt' has no attribute {name!r}")
