"""The CUDA kernels' launch plan (host functions, no GPU): shared memory, fixed context splits, exact workspace and
the cross-input shape check every face of the op runs."""

from __future__ import annotations

import math

import pytest
import torch

from dflash_trt.decoding.kernels.plugin.fields import AttentionFields
from dflash_trt.decoding.kernels.plugin.kernel_plan import kernel_plan, num_splits, shape_error, workspace_layout

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QWEN3_8B = AttentionFields(num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1e6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_shared_memory_fits_every_supported_architecture(cpu_library, dtype, head_dim):
    plan = kernel_plan(dtype, head_dim)
    assert plan.max_shared_bytes == 99 * 1024  # sm_120/121, the smallest opt-in limit of the targets
    assert 0 < plan.shared_bytes <= plan.max_shared_bytes


def test_tensor_core_tiles_are_shared_by_the_whole_qwen3_group(cpu_library):
    # 4 query heads per KV head x 16 block slots = 64 rows: one CTA reads each K/V tile once for all of them.
    assert kernel_plan(torch.bfloat16, 128).rows_per_cta >= 4 * 16


def test_splits_hold_a_fixed_number_of_keys(cpu_library):
    keys = kernel_plan(torch.bfloat16, 128).keys_per_split
    assert keys == kernel_plan(torch.float32, 64).keys_per_split  # one split size for every dtype and head dim
    for n in (1, keys - 1, keys, keys + 1, 8 * keys + 17, 32768 + 16):
        assert num_splits(n) == max(1, math.ceil(n / keys))


def test_split_of_a_sequence_does_not_depend_on_the_batch(cpu_library):
    # The workspace for a bigger batch or capacity has room for more splits, but a sequence's split count is a
    # function of its own key count only (num_splits takes nothing else), so the same sequence drafts the same
    # tokens in any batch: the workspace's max_splits is that of the longest possible sequence, not of the batch.
    for batch in (1, 8, 32):
        assert workspace_layout(batch, 16, 32, 8, 128, 8192, torch.bfloat16).max_splits == num_splits(8192 + 16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_workspace_is_exactly_what_the_kernels_use(cpu_library, dtype):
    e = 4 if dtype == torch.float32 else 2
    b, s, hq, hkv, d, cap = 3, 16, 32, 8, 128, 4000
    w = workspace_layout(b, s, hq, hkv, d, cap, dtype)
    splits = math.ceil((cap + s) / 512)
    align = lambda n: -(-n // 256) * 256  # noqa: E731
    assert w.max_splits == splits
    assert (w.roped_q, w.roped_k) == (0, align(b * s * hq * d * e))
    assert w.partial_acc == w.roped_k + align(b * hkv * s * d * e)
    assert w.partial_stats == w.partial_acc + align(4 * splits * b * s * hq * d)
    assert w.total_bytes == w.partial_stats + align(4 * splits * b * s * hq * 2)


def test_workspace_has_no_partials_when_every_sequence_fits_one_split(cpu_library):
    w = workspace_layout(32, 16, 32, 8, 128, 512 - 16, torch.bfloat16)
    assert w.max_splits == 1 and w.total_bytes == w.partial_acc  # RoPE'd q and k only


def test_workspace_grows_with_capacity_not_a_fixed_split_count(cpu_library):
    small = workspace_layout(1, 16, 32, 8, 128, 1024, torch.bfloat16).total_bytes
    large = workspace_layout(1, 16, 32, 8, 128, 32768, torch.bfloat16).total_bytes
    assert small < large < 40 * small


def shapes(b=2, s=16, c=5, cap=1024, **override):
    base = {"q": (b, s, 32, 128), "k": (b, s, 8, 128), "v": (b, s, 8, 128), "ctx_k": (b, c, 8, 128),
            "ctx_v": (b, c, 8, 128), "cache_k": (b, 8, cap, 128), "cache_v": (b, 8, cap, 128),
            "cache_lens": (b,), "ctx_lens": (b,)}
    return {**base, **override}


def test_consistent_shapes_pass_and_unknown_dims_match_anything(cpu_library):
    assert shape_error(QWEN3_8B, shapes()) is None
    assert shape_error(QWEN3_8B, shapes(b=-1, cap=-1)) is None


@pytest.mark.parametrize("name,shape,words", [
    ("cache_v", (3, 8, 1024, 128), ["cache_v", "batch"]),
    ("cache_v", (2, 8, 512, 128), ["cache_v", "capacity"]),
    ("ctx_v", (2, 4, 8, 128), ["ctx_v", "context rows"]),
    ("v", (2, 8, 8, 128), ["v dim 1", "block"]),
    ("k", (2, 16, 4, 128), ["k dim 2", "num_kv_heads"]),
    ("cache_lens", (3,), ["cache_lens", "batch"]),
    ("q", (2, 16, 32, 64), ["q dim 3", "head_dim"]),
    ("ctx_lens", (2, 1), ["ctx_lens", "1-D"]),
])
def test_mismatched_inputs_are_rejected_naming_the_input(cpu_library, name, shape, words):
    error = shape_error(QWEN3_8B, shapes(**{name: shape}))
    assert error is not None and all(w in error for w in words), error
