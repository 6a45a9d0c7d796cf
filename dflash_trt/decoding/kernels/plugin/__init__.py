"""The DFlashAttention plugin from Python: fields, the C++ CPU twin (ctypes), and the build of the libraries."""

from __future__ import annotations

from dflash_trt.decoding.kernels.plugin.fields import AttentionFields

__all__ = ["AttentionFields"]
