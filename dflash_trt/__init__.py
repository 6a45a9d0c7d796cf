"""dflash-trt: build, serve and deploy DFlash speculative decoding.

The public surface is small and imported lazily, so `import dflash_trt` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DFlashDrafter": "dflash_trt.drafter",
    "DFlash2Drafter": "dflash_trt.drafter",
    "load_drafter": "dflash_trt.drafter",
    "save_drafter": "dflash_trt.drafter",
    "DrafterConfig": "dflash_trt.config",
    "TargetModel": "dflash_trt.target",
    "load_target": "dflash_trt.target",
    "SamplingParams": "dflash_trt.sampling",
    "generate": "dflash_trt.decoding",
    "stream_generate": "dflash_trt.decoding",
    "GenerationResult": "dflash_trt.results",
    "DFlashError": "dflash_trt.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dflash_trt' has no attribute {name!r}")
