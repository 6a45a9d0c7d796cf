"""Rotary position embedding (rotate-half / NeoX style), default or YaRN-scaled.

The YaRN maths mirrors Hugging Face transformers (`_compute_yarn_parameters`) so a drafter trained there
sees the same angles here, in the C++ plugin and in TensorRT-LLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class YarnParams:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    @classmethod
    def from_scaling(cls, scaling: dict[str, Any]) -> "YarnParams":
        return cls(
            factor=float(scaling["factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            beta_fast=float(scaling.get("beta_fast") or 32.0),
            beta_slow=float(scaling.get("beta_slow") or 1.0),
            mscale=scaling.get("mscale"),
            mscale_all_dim=scaling.get("mscale_all_dim"),
            attention_factor=scaling.get("attention_factor"),
            truncate=bool(scaling.get("truncate", True)),
        )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(yarn: YarnParams) -> float:
    """Factor by which YaRN scales cos and sin (and so the attention logits)."""
    if yarn.attention_factor is not None:
        return float(yarn.attention_factor)
    if yarn.mscale and yarn.mscale_all_dim:
        return _yarn_mscale(yarn.factor, yarn.mscale) / _yarn_mscale(yarn.factor, yarn.mscale_all_dim)
    return _yarn_mscale(yarn.factor)


def inverse_frequencies(head_dim: int, theta: float, yarn: YarnParams | None = None) -> torch.Tensor:
    """Per-pair rotation speeds [head_dim // 2] (fp32)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    pos_freqs = theta ** exponents
    if yarn is None:
        return 1.0 / pos_freqs

    # YaRN: interpolate the slow (long-wavelength) pairs by `factor`, keep the fast ones, ramp in between.
    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(yarn.original_max_position_embeddings / (num_rotations * 2 * math.pi))
                / (2 * math.log(theta)))

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1 = extrapolate (original speed), 0 = interpolate (slowed by factor)
    return (1.0 / (yarn.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


class RotaryEmbedding:
    """cos/sin tables for absolute positions, and their application to query/key heads."""

    def __init__(self, head_dim: int, theta: float, yarn: YarnParams | None = None):
        self.head_dim = head_dim
        self.theta = theta
        self.yarn = yarn
        self.inv_freq = inverse_frequencies(head_dim, theta, yarn)
        self.attention_factor = yarn_attention_factor(yarn) if yarn else 1.0

    @classmethod
    def from_config(cls, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> "RotaryEmbedding":
        return cls(head_dim, theta, YarnParams.from_scaling(scaling) if scaling else None)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [...] (int) -> cos, sin [..., head_dim] in fp32."""
        freqs = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq.to(positions.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [..., head_dim] by angles broadcastable to it; computed in fp32, returned in x's dtype."""
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)
