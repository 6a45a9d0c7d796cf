"""The CUDA kernels' launch plan as the C++ code computes it (dflashAttentionPlan.h, through the CPU library).

Shared memory, rows per CTA, the fixed split of the context and the workspace layout are host functions, so they are
tested here without a GPU, and the torch extension sizes its workspace with the same numbers.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from dflash_trt.decoding.kernels.plugin.fields import AttentionFields
from dflash_trt.decoding.kernels.plugin.library import (_DTYPE_CODES, _MESSAGE_CAPACITY, _c_fields, _CFields,
                                                        load_library)
from dflash_trt.errors import DFlashError

INPUT_ORDER = ("q", "k", "v", "ctx_k", "ctx_v", "cache_k", "cache_v", "cache_lens", "ctx_lens")


@dataclass(frozen=True)
class KernelPlan:
    shared_bytes: int       # dynamic shared memory of the attention kernel
    rows_per_cta: int       # query rows (block slots x heads of a group) sharing each K/V tile
    keys_per_split: int     # fixed keys of one context split
    max_shared_bytes: int   # the budget every supported architecture allows (sm_120/121: 99 KB)


@dataclass(frozen=True)
class WorkspaceLayout:
    max_splits: int
    roped_q: int
    roped_k: int
    partial_acc: int
    partial_stats: int
    total_bytes: int


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    lib = load_library()
    size_p, int_p = ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int32)
    lib.dflash_attention_kernel_plan.argtypes = [ctypes.c_int32, ctypes.c_int32, size_p, int_p, int_p, size_p]
    lib.dflash_attention_kernel_plan.restype = None
    lib.dflash_attention_num_splits.argtypes = [ctypes.c_int32]
    lib.dflash_attention_num_splits.restype = ctypes.c_int32
    lib.dflash_attention_workspace_layout.argtypes = [ctypes.c_int32] * 7 + [ctypes.POINTER(ctypes.c_uint64)]
    lib.dflash_attention_workspace_layout.restype = None
    lib.dflash_attention_check_dims.argtypes = [ctypes.POINTER(_CFields), ctypes.POINTER(ctypes.c_int32),
                                                ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_size_t]
    return lib


def dtype_code(dtype: torch.dtype) -> int:
    if dtype not in _DTYPE_CODES:
        raise DFlashError(f"DFlashAttention: unsupported dtype {dtype}")
    return _DTYPE_CODES[dtype]


def kernel_plan(dtype: torch.dtype, head_dim: int) -> KernelPlan:
    shared, budget = ctypes.c_size_t(), ctypes.c_size_t()
    rows, keys = ctypes.c_int32(), ctypes.c_int32()
    _lib().dflash_attention_kernel_plan(dtype_code(dtype), head_dim, ctypes.byref(shared), ctypes.byref(rows),
                                        ctypes.byref(keys), ctypes.byref(budget))
    return KernelPlan(shared.value, rows.value, keys.value, budget.value)


def num_splits(num_keys: int) -> int:
    """Context splits of one sequence attending to num_keys keys (its cache rows + the block)."""
    return _lib().dflash_attention_num_splits(num_keys)


def workspace_layout(batch: int, block: int, heads: int, kv_heads: int, head_dim: int, capacity: int,
                     dtype: torch.dtype) -> WorkspaceLayout:
    out = (ctypes.c_uint64 * 6)()
    _lib().dflash_attention_workspace_layout(batch, block, heads, kv_heads, head_dim, capacity, dtype_code(dtype), out)
    return WorkspaceLayout(*(int(x) for x in out))


def shape_error(fields: AttentionFields, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """The plugin's cross-input shape check on {input name: shape} (-1 = unknown); None when consistent."""
    nb = (ctypes.c_int32 * 9)(*(len(shapes[name]) for name in INPUT_ORDER))
    dims = (ctypes.c_int64 * 36)()
    for i, name in enumerate(INPUT_ORDER):
        for axis, size in enumerate(shapes[name][:4]):
            dims[4 * i + axis] = size
    message = ctypes.create_string_buffer(_MESSAGE_CAPACITY)
    c_fields = _c_fields(fields)
    if _lib().dflash_attention_check_dims(ctypes.byref(c_fields), nb, dims, message, _MESSAGE_CAPACITY):
        return message.value.decode()
    return None
