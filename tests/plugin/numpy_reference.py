"""Independent NumPy reference of DFlashAttention (float64 maths, angles rounded to fp32 as the spec does)."""

from __future__ import annotations

import math

import numpy as np


def inverse_frequencies(head_dim: int, theta: float, yarn: dict | None) -> tuple[np.ndarray, float]:
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv = 1.0 / theta ** exponents
    if not yarn:
        return inv, 1.0
    factor, original = yarn["factor"], yarn["original_max_position_embeddings"]

    def corr(rot: float) -> float:
        return head_dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(corr(yarn["beta_fast"])), 0), min(math.ceil(corr(yarn["beta_slow"])), head_dim - 1)
    ramp = np.clip((np.arange(head_dim // 2) - low) / max(high - low, 1e-3), 0, 1)
    inv = inv / factor * ramp + inv * (1 - ramp)
    return inv, 0.1 * math.log(factor) + 1.0


def rope(x: np.ndarray, positions: np.ndarray, inv: np.ndarray, scale: float) -> np.ndarray:
    """x [..., N, D] rotated at positions [N]."""
    angles = (positions.astype(np.float32)[:, None] * inv.astype(np.float32)[None, :]).astype(np.float64)
    cos, sin = np.cos(angles) * scale, np.sin(angles) * scale
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def draft_attention(inputs: dict, head_dim: int, theta: float, yarn: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """Returns (out [B,S,Hq,D], updated cache_k [B,Hkv,Cmax,D])."""
    x = {name: t.double().numpy().copy() for name, t in inputs.items()}
    inv, scale = inverse_frequencies(head_dim, theta, yarn)
    batch, block, heads, _ = x["q"].shape
    kv_heads = x["k"].shape[2]
    group = heads // kv_heads
    out = np.zeros_like(x["q"])
    for b in range(batch):
        start, count = int(x["cache_lens"][b]), int(x["ctx_lens"][b])
        total = start + count
        ctx_k = rope(x["ctx_k"][b, :count].transpose(1, 0, 2), np.arange(start, total), inv, scale)
        x["cache_k"][b, :, start:total] = ctx_k
        x["cache_v"][b, :, start:total] = x["ctx_v"][b, :count].transpose(1, 0, 2)
        slots = np.arange(total, total + block)
        q = rope(x["q"][b].transpose(1, 0, 2), slots, inv, scale)  # [Hq,S,D]
        k = rope(x["k"][b].transpose(1, 0, 2), slots, inv, scale)
        keys = np.concatenate([x["cache_k"][b, :, :total], k], axis=1)  # [Hkv,L,D]
        values = np.concatenate([x["cache_v"][b, :, :total], x["v"][b].transpose(1, 0, 2)], axis=1)
        for h in range(heads):
            scores = q[h] @ keys[h // group].T / math.sqrt(head_dim)
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            weights /= weights.sum(axis=-1, keepdims=True)
            out[b, :, h] = weights @ values[h // group]
    return out, x["cache_k"]
