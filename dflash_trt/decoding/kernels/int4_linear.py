"""Weight-only int4 linear layers for CPU inference, in groups of 32 along the input dimension.

A quantized GGUF target (Q4_0, Q4_1, Q8_0) is read at its shipped precision instead of dequantized to
float32: the demo's SmolLM2-135M moves ~90 MB per step instead of ~540 MB, and a CPU decoding step is
bound by those bytes. The matmul is PyTorch's own CPU int4 kernel (`_weight_int4pack_mm_for_cpu`), which
computes `(code - 8) * scale + zero` per group of 32 weights. Its bf16 path is the fast one (the float32
path is not vectorized), so activations go in as bf16 and come out as bf16, then back to float32.

Lossless speculative decoding needs each row's result to be independent of how many rows are computed
together (a verify forward of 8 tokens against a one-token step): this kernel reduces each row in a fixed
order, whatever the row count or thread count (tests/core/test_int4_linear.py checks it bit for bit).

A weight is one or more int4 *planes* that add up: Q4_0 and Q4_1 are one plane; Q8_0's signed 8-bit codes
are split exactly into a high and a low nibble (q + 128 = 16 * high + low), two planes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# Weights per scale (the GGUF block size of Q4_0, Q4_1 and Q8_0; one of the kernel's group sizes).
GROUP = 32


def int4_available() -> bool:
    """True where this PyTorch build has the CPU weight-only int4 kernel."""
    return (hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
            and hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"))


@dataclass
class Int4Plane:
    """w[n, k] = codes[n, k] * scale[n, k // 32] + offset[n, k // 32], codes in 0..15 (uint8)."""

    codes: torch.Tensor  # [N, K] uint8
    scale: torch.Tensor  # [N, K / 32] float32
    offset: torch.Tensor  # [N, K / 32] float32

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K] this plane stands for."""
        return (self.codes.float() * self.scale.repeat_interleave(GROUP, 1)
                + self.offset.repeat_interleave(GROUP, 1))

    def kernel_weight(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by: scale and zero point (offset + 8 * scale) in bf16."""
        scale = self.scale.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
        zero = (self.offset + 8 * self.scale).to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
        return (self.codes.float() - 8) * scale + zero


class Int4Linear(nn.Module):
    """A bias-free linear layer over int4 planes: float32 in, float32 out, bf16 inside the matmul."""

    def __init__(self, planes: list[Int4Plane]):
        super().__init__()
        if not planes:
            raise ValueError("Int4Linear needs at least one plane")
        self.out_features, self.in_features = planes[0].codes.shape
        if self.in_features % GROUP:
            raise ValueError(f"in_features {self.in_features} is not a multiple of the group size {GROUP}")
        self._packed: list[tuple[torch.Tensor, torch.Tensor]] = []
        for plane in planes:
            if tuple(plane.codes.shape) != (self.out_features, self.in_features):
                raise ValueError(f"plane of shape {tuple(plane.codes.shape)} in a {self.out_features} x "
                                 f"{self.in_features} layer")
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(plane.codes.to(torch.int32).contiguous(), 1)
            # The kernel's zero point is the weight at code 8: offset + 8 * scale. Layout [K / 32, N, 2].
            scale_zero = torch.stack([plane.scale, plane.offset + 8 * plane.scale], dim=-1)
            self._packed.append((packed, scale_zero.transpose(0, 1).contiguous().to(torch.bfloat16)))

    def weight_bytes(self) -> int:
        """Bytes one forward reads: packed codes plus bf16 scales and zero points."""
        return sum(codes.numel() * codes.element_size() + sz.numel() * sz.element_size()
                   for codes, sz in self._packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        out = None
        for codes, scale_zero in self._packed:
            part = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, codes, GROUP, scale_zero).float()
            out = part if out is None else out + part
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
