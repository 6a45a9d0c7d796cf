"""The engine builder: presets, checkpoint resolution, compatibility checks, parallelism planning,
quantization, per-runtime artifacts and the manifest that runtimes load engines through."""

from __future__ import annotations

from typing import Any

__all__ = ["BuildRequest", "build_engine", "load_engine", "Engine", "load_preset", "plan_parallelism"]

_EXPORTS = {
    "BuildRequest": ".build", "build_engine": ".build", "load_engine": ".loader", "Engine": ".loader",
    "load_preset": ".presets", "plan_parallelism": ".planner",
}


def __getattr__(name: str) -> Any:
    # Lazy: `dflash_trt.engine.load_engine` must not import torch-heavy modules for a manifest read.
    if name not in _EXPORTS:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
