"""ctypes binding of the CPU library (libdflash_attention_cpu.so): field validation, RoPE tables and the CPU twin."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import torch

from dflash_trt.decoding.kernels.plugin.build import (CPU_TARGET, LIBRARY_DIR_ENV, PLUGIN_SOURCE_DIR, build_plugins,
                                                      library_path)
from dflash_trt.decoding.kernels.plugin.fields import FIELD_NAMES, AttentionFields
from dflash_trt.errors import ConfigError, DFlashError

_MESSAGE_CAPACITY = 1024
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class _CFields(ctypes.Structure):
    """Mirror of the C struct dflash::DflashAttentionFields."""

    _fields_ = [(name, ctypes.c_int32 if name in (
        "num_heads", "num_kv_heads", "head_dim", "rope_type", "yarn_original_max_position_embeddings",
        "yarn_truncate") else ctypes.c_float) for name in FIELD_NAMES]


def _c_fields(fields: AttentionFields) -> _CFields:
    return _CFields(*(getattr(fields, name) for name in FIELD_NAMES))


@functools.lru_cache(maxsize=None)
def load_library(path: str | None = None) -> ctypes.CDLL:
    """Load the CPU library; without an explicit path, first bring the build tree up to date (incremental)."""
    lib_path = Path(path) if path else library_path(CPU_TARGET)
    if path is None and not os.environ.get(LIBRARY_DIR_ENV) and (PLUGIN_SOURCE_DIR / "CMakeLists.txt").exists():
        build_plugins((CPU_TARGET,))
    lib = ctypes.CDLL(str(lib_path))
    for name in ("dflash_attention_plugin_name", "dflash_attention_plugin_version", "dflash_attention_onnx_domain",
                 "dflash_attention_field_names"):
        getattr(lib, name).restype = ctypes.c_char_p
    msg = ctypes.c_char_p
    lib.dflash_attention_validate.argtypes = [ctypes.POINTER(_CFields), msg, ctypes.c_size_t]
    lib.dflash_attention_rope_table.argtypes = [ctypes.POINTER(_CFields), ctypes.POINTER(ctypes.c_float),
                                                ctypes.POINTER(ctypes.c_float), msg, ctypes.c_size_t]
    lib.dflash_attention_cpu.argtypes = ([ctypes.POINTER(_CFields)] + [ctypes.c_int32] * 5 + [ctypes.c_void_p] * 10
                                         + [msg, ctypes.c_size_t])
    return lib


def plugin_identity() -> tuple[str, str, str]:
    """(plugin name = ONNX op_type, plugin version, ONNX domain), as compiled into the library."""
    lib = load_library()
    return (lib.dflash_attention_plugin_name().decode(), lib.dflash_attention_plugin_version().decode(),
            lib.dflash_attention_onnx_domain().decode())


def library_field_names() -> tuple[str, ...]:
    """Field names as the C++ code spells them (must equal fields.FIELD_NAMES)."""
    return tuple(load_library().dflash_attention_field_names().decode().split(","))


def validation_error(fields: AttentionFields) -> str | None:
    """The message the plugin creator would reject these fields with, or None when they are valid."""
    message = ctypes.create_string_buffer(_MESSAGE_CAPACITY)
    c_fields = _c_fields(fields)
    if load_library().dflash_attention_validate(ctypes.byref(c_fields), message, _MESSAGE_CAPACITY):
        return message.value.decode()
    return None


def check_fields(fields: AttentionFields) -> None:
    """Raise ConfigError with the plugin's own message when the fields would be rejected."""
    error = validation_error(fields)
    if error:
        raise ConfigError(error)


def rope_table(fields: AttentionFields) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim // 2] fp32, attention factor) as the plugin computes them."""
    inv_freq = np.zeros(max(fields.head_dim // 2, 1), dtype=np.float32)
    factor = ctypes.c_float()
    message = ctypes.create_string_buffer(_MESSAGE_CAPACITY)
    c_fields = _c_fields(fields)
    if load_library().dflash_attention_rope_table(
            ctypes.byref(c_fields), inv_freq.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ctypes.byref(factor),
            message, _MESSAGE_CAPACITY):
        raise ConfigError(message.value.decode())
    return inv_freq, factor.value


def _checked(t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if t.dtype != dtype or tuple(t.shape) != shape or t.device.type != "cpu":
        raise DFlashError(f"{name}: expected {dtype} {list(shape)} on cpu, got {t.dtype} {list(t.shape)} "
                          f"on {t.device}")
    return t.contiguous()


def cpu_draft_attention(fields: AttentionFields, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        ctx_k: torch.Tensor, ctx_v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                        cache_lens: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
    """Run the C++ CPU twin; same contract as dflash_trt.decoding.kernels.attention.draft_attention.

    q [B,S,Hq,Dh]; k, v [B,S,Hkv,Dh]; ctx_k, ctx_v [B,C,Hkv,Dh]; cache_k, cache_v [B,Hkv,Cmax,Dh] (contiguous,
    updated in place); cache_lens, ctx_lens [B] (any integer dtype). Returns out [B,S,Hq,Dh] in q's dtype.
    """
    if q.dtype not in _DTYPE_CODES:
        raise DFlashError(f"DFlashAttention: unsupported dtype {q.dtype}")
    batch, block, heads, dim = q.shape
    kv_heads, ctx_rows, capacity = k.shape[2], ctx_k.shape[1], cache_k.shape[2]
    dtype = q.dtype
    k = _checked(k, "k", dtype, (batch, block, kv_heads, dim))
    v = _checked(v, "v", dtype, (batch, block, kv_heads, dim))
    ctx_k = _checked(ctx_k, "ctx_k", dtype, (batch, ctx_rows, kv_heads, dim))
    ctx_v = _checked(ctx_v, "ctx_v", dtype, (batch, ctx_rows, kv_heads, dim))
    for name, cache in (("cache_k", cache_k), ("cache_v", cache_v)):
        _checked(cache, name, dtype, (batch, kv_heads, capacity, dim))
        if not cache.is_contiguous():
            raise DFlashError(f"{name} must be contiguous: it is updated in place")
    q = q.contiguous()
    lens = [torch.as_tensor(x, dtype=torch.int32).contiguous() for x in (cache_lens, ctx_lens)]
    out = torch.empty_like(q)
    message = ctypes.create_string_buffer(_MESSAGE_CAPACITY)
    c_fields = _c_fields(fields)
    status = load_library().dflash_attention_cpu(
        ctypes.byref(c_fields), _DTYPE_CODES[dtype], batch, block, ctx_rows, capacity,
        *(t.data_ptr() for t in (q, k, v, ctx_k, ctx_v, cache_k, cache_v, lens[0], lens[1], out)),
        message, _MESSAGE_CAPACITY)
    if status:
        raise DFlashError(message.value.decode())
    return out
