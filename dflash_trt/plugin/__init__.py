"""The DFlashAttention plugin from Python: fields, the C++ CPU twin (ctypes), and the build of the libraries."""

from __future__ import annotations

from .fields import AttentionFields

__all__ = ["AttentionFields"]
