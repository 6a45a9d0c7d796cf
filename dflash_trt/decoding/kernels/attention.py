"""Reference KV-injected draft attention: the semantics the C++/CUDA plugin implements.

One call covers steps 3-5 of a draft layer (see the plugin README): RoPE at absolute positions, append the
new context K/V to the persistent per-sequence cache, then non-causal GQA attention of the block's queries
over [cached context ; block].
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

from dflash_trt.decoding.kernels.rope import RotaryEmbedding

# Which implementation runs for CUDA tensors: "auto" (the CUDA kernels, falling back to this reference with a warning
# when they cannot be built), "cuda" (the kernels or an error) or "torch" (always this reference).
BACKEND_ENV = "DFLASH_DRAFT_ATTENTION"
_cuda_unavailable: str | None = None


@functools.lru_cache(maxsize=64)
def _fields(rope: RotaryEmbedding, num_heads: int, num_kv_heads: int, head_dim: int) -> list[float]:
    from dflash_trt.decoding.kernels.plugin.cuda_op import rope_fields

    return rope_fields(rope, num_heads, num_kv_heads, head_dim)


def _cuda_backend(q: torch.Tensor, k: torch.Tensor, rope: RotaryEmbedding):
    """The in-place CUDA op and its fields when it should run for these tensors, else None."""
    global _cuda_unavailable
    backend = os.environ.get(BACKEND_ENV, "auto")
    if not q.is_cuda or backend == "torch" or (_cuda_unavailable and backend == "auto"):
        return None
    from dflash_trt.decoding.kernels.plugin import cuda_op, torch_op

    if q.shape[3] not in cuda_op.HEAD_DIMS:  # a model the kernels do not cover: the reference runs it
        if backend == "cuda":
            raise cuda_op.CudaOpUnavailable(f"head_dim {q.shape[3]}: the kernels support {cuda_op.HEAD_DIMS}")
        return None
    try:
        fields = _fields(rope, q.shape[2], k.shape[2], q.shape[3])
        cuda_op.load_cuda_op()
    except cuda_op.CudaOpUnavailable as exc:
        if backend == "cuda":
            raise
        _cuda_unavailable = str(exc)
        warnings.warn(f"draft attention falls back to PyTorch on CUDA: {exc}", RuntimeWarning, stacklevel=3)
        return None
    return torch_op.draft_attention_inplace, fields


def _rope_at_positions(q, k, ctx_k, cache_lens, ctx_lens, rope: RotaryEmbedding):
    """RoPE of the new context keys (positions cache_lens + i) and of the block's queries and keys (positions
    cache_lens + ctx_lens + j); returns them with those positions [B,C] and [B,S]."""
    device = q.device
    ctx_pos = cache_lens[:, None] + torch.arange(ctx_k.shape[1], device=device)[None, :]
    block_pos = (cache_lens + ctx_lens)[:, None] + torch.arange(q.shape[1], device=device)[None, :]
    cos, sin = rope.cos_sin(ctx_pos)
    ctx_k = rope.apply(ctx_k, cos[:, :, None, :], sin[:, :, None, :])
    cos, sin = rope.cos_sin(block_pos)
    q = rope.apply(q, cos[:, :, None, :], sin[:, :, None, :])
    k = rope.apply(k, cos[:, :, None, :], sin[:, :, None, :])
    return q, k, ctx_k, ctx_pos, block_pos


def draft_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx_k: torch.Tensor,
    ctx_v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    cache_lens: torch.Tensor,
    ctx_lens: torch.Tensor,
    rope: RotaryEmbedding,
    block_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of a draft block over its sequence's context.

    q [B,S,Hq,Dh] block queries (after q_norm, before RoPE); k, v [B,S,Hkv,Dh] block keys/values;
    ctx_k, ctx_v [B,C,Hkv,Dh] new context rows (rows >= ctx_lens[b] are padding);
    cache_k, cache_v [B,Hkv,Cmax,Dh] RoPE'd context keys/values, written in place at rows
    [cache_lens[b], cache_lens[b] + ctx_lens[b]); cache_lens, ctx_lens [B] int64.
    Context row i of sequence b sits at position cache_lens[b] + i; block slot j at cache_lens[b] +
    ctx_lens[b] + j. block_lens [B] (default S): slots >= block_lens[b] are padding, hidden as keys (a
    shortened last block). Returns [B,S,Hq,Dh] in q's dtype.
    On CUDA tensors the project's CUDA kernels run instead (see BACKEND_ENV), with the same contract, for full
    blocks (block_lens None); a shortened last block runs this reference.
    """
    cuda = _cuda_backend(q, k, rope) if block_lens is None else None
    if cuda is not None:
        op, fields = cuda
        return op(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, fields)
    batch, block_size, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    device = q.device
    total_lens = cache_lens + ctx_lens

    q, k, ctx_k, _, _ = _rope_at_positions(q, k, ctx_k, cache_lens, ctx_lens, rope)

    for b in range(batch):  # ragged append: each sequence has its own cache length
        start, count = int(cache_lens[b]), int(ctx_lens[b])
        if count:
            cache_k[b, :, start:start + count] = ctx_k[b, :count].transpose(0, 1).to(cache_k.dtype)
            cache_v[b, :, start:start + count] = ctx_v[b, :count].transpose(0, 1).to(cache_v.dtype)

    num_cached = int(total_lens.max()) if batch else 0
    keys = torch.cat((cache_k[:, :, :num_cached].float(), k.transpose(1, 2).float()), dim=2)
    values = torch.cat((cache_v[:, :, :num_cached].float(), v.transpose(1, 2).float()), dim=2)
    group = num_heads // num_kv_heads
    keys = keys.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
    values = values.repeat_interleave(group, dim=1)

    scores = torch.matmul(q.transpose(1, 2).float(), keys.transpose(-1, -2)) * head_dim ** -0.5
    cached_valid = torch.arange(num_cached, device=device)[None, :] < total_lens[:, None]
    valid = torch.cat((cached_valid, _block_valid(batch, block_size, block_lens, device)), dim=1)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), values)  # [B,Hq,S,Dh]
    return out.transpose(1, 2).to(q.dtype)


def windowed_draft_attention(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, rope,
                             window: int | None, causal: bool, block_lens: torch.Tensor | None = None
                             ) -> torch.Tensor:
    """draft_attention for a sliding-window and/or causal layer, over a bounded context cache.

    A query at absolute position P sees a key at p iff |P - p| < window (no limit when None) and, when
    causal, p <= P. cache_k [B,Hkv,R,Dh] keeps only the LAST min(cache_lens[b], R) context rows of each
    sequence (R = window - 1 suffices: no later block slot can see older rows), so memory stays bounded
    at any context length. The new context rows are appended and the oldest dropped, in place.
    """
    batch, block_size, num_heads, head_dim = q.shape
    num_ctx, room = ctx_k.shape[1], cache_k.shape[2]
    device = q.device
    stored = cache_lens.clamp(max=room)  # rows kept per sequence, at positions cache_lens - stored ...

    slots = torch.arange(room, device=device)[None, :]
    cache_pos = cache_lens[:, None] - stored[:, None] + slots
    q, k, ctx_k, ctx_pos, block_pos = _rope_at_positions(q, k, ctx_k, cache_lens, ctx_lens, rope)

    keys = torch.cat((cache_k.float(), ctx_k.transpose(1, 2).float(), k.transpose(1, 2).float()), dim=2)
    values = torch.cat((cache_v.float(), ctx_v.transpose(1, 2).float(), v.transpose(1, 2).float()), dim=2)
    group = num_heads // k.shape[2]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    key_pos = torch.cat((cache_pos, ctx_pos, block_pos), dim=1)  # [B, R + C + S]
    valid = torch.cat((slots < stored[:, None], torch.arange(num_ctx, device=device)[None, :] < ctx_lens[:, None],
                       _block_valid(batch, block_size, block_lens, device)), dim=1)
    visible = valid[:, None, :].expand(-1, block_size, -1)  # [B, S, keys]
    distance = block_pos[:, :, None] - key_pos[:, None, :]  # P - p
    if window is not None:
        visible = visible & (distance.abs() < window)
    if causal:
        visible = visible & (distance >= 0)
    scores = torch.matmul(q.transpose(1, 2).float(), keys.transpose(-1, -2)) * head_dim ** -0.5
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    # A padding slot of a shortened block can see nothing (its window holds only padding): its softmax row would
    # be NaN, and NaN values reach the real slots of the next layer even through zero weights. Zero it instead.
    probs = torch.softmax(scores, dim=-1).masked_fill(~visible.any(-1)[:, None, :, None], 0.0)
    out = torch.matmul(probs, values).transpose(1, 2).to(q.dtype)

    for b in range(batch):  # keep the newest `room` context rows of each sequence
        count = int(ctx_lens[b])
        if not count or not room:
            continue
        rows_k = torch.cat((cache_k[b, :, :int(stored[b])], ctx_k[b, :count].transpose(0, 1).to(cache_k.dtype)), 1)
        rows_v = torch.cat((cache_v[b, :, :int(stored[b])], ctx_v[b, :count].transpose(0, 1).to(cache_v.dtype)), 1)
        keep = min(rows_k.shape[1], room)
        cache_k[b, :, :keep] = rows_k[:, -keep:]
        cache_v[b, :, :keep] = rows_v[:, -keep:]
    return out


def _block_valid(batch: int, block_size: int, block_lens: torch.Tensor | None, device) -> torch.Tensor:
    slots = torch.arange(block_size, device=device)[None, :].expand(batch, -1)
    return slots >= 0 if block_lens is None else slots < block_lens[:, None]
