"""Batch-invariant attention for a target at its GGUF precision: each query row attends on its own.

torch's SDPA computes a verify forward's 8 queries as one matrix product and a decoding step's one query as
another; their reductions are ordered differently, so the same query gets outputs ~1e-7 apart. In float32 that
noise stays far below the logits' gaps, but a GGUF-precision target quantizes every linear layer's input to int8
per block of 32 (block_quant.py), and a value near a rounding boundary turns the noise into a whole quantization
step: near-tied greedy choices flip and DFlash would no longer equal plain decoding. `rowwise_attention`
(native/cpu_kernels.cpp) gives every (batch row, head, query) one fixed sequence of operations over the keys its
mask allows, in key order, so a query's output does not depend on which other queries run with it.

It plugs into transformers' attention interface as ROWWISE, with the boolean masks of "sdpa" (both the masks
transformers builds and those BatchKVCache.prepare builds).
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.kernels import native

ROWWISE = "dflash_rowwise"


def rowwise_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                 dropout: float = 0.0, scaling: float | None = None, is_causal=None, **kwargs):
    """transformers' attention signature: query [B, Hq, T, D], key/value [B, Hkv, L, D]; returns [B, T, Hq, D]."""
    if getattr(module, "sinks", None) is not None:
        raise NotImplementedError("rowwise attention has no attention sinks (gpt-oss); use --weights float")
    batch, _, length, dim = query.shape
    keys = key.shape[2]
    if attention_mask is None:  # causal, no padding: query t is key keys - length + t
        mask = torch.ones(length, keys, dtype=torch.bool).tril(keys - length)[None, None]
    elif attention_mask.dtype == torch.bool:
        mask = attention_mask
    else:  # additive: 0 where visible, the dtype's minimum where not
        mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    mask = mask[..., :keys].expand(batch, -1, length, keys)
    out = native.rowwise_attention(query.float(), key.float(), value.float(), mask,
                                   dim ** -0.5 if scaling is None else float(scaling))
    return out.transpose(1, 2).contiguous().to(query.dtype), None


def register_rowwise_attention() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ROWWISE, rowwise_sdpa)
    AttentionMaskInterface.register(ROWWISE, sdpa_mask)
