"""Linear layers over GGUF-style weight blocks, for CPU inference at a quantized target's shipped precision.

A quantized GGUF target (Q4_0, Q4_1, Q8_0) is read as it ships instead of dequantized to float32: the demo's
SmolLM2-135M moves ~80 MB per step instead of ~540 MB, and a CPU decoding step is bound by those bytes.

The matmul (native/cpu_kernels.cpp, `block_matmul`) follows llama.cpp's CPU arithmetic: each activation row is
quantized per block of 32 to int8 (scale amax / 127), block dot products run in int32 with AVX512-VNNI, and
    y[m, n] = sum_b d[n, b] * dx[m, b] * sum_j c[n, j] * q[m, j]  +  o[n, b] * dx[m, b] * sum_j q[m, j]
for weights w = d * c + o (codes c unsigned: 4 bits, or 8 bits for Q8_0 as c = q + 128).

Lossless speculative decoding needs each row's result to be independent of how many rows are computed together
(a verify forward of 8 tokens against a one-token step): every output is one thread's fixed sequence of
operations on its own row, whatever the row count or thread count (tests/core/test_core_block_quant.py checks it
bit for bit). Sixteen output rows share each vector instruction, and extra activation rows reuse each unpacked
weight block from registers, so 8 rows cost far less than 8 times one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from dflash_trt.decoding.kernels import native

# Weights per scale (the GGUF block size of Q4_0, Q4_1 and Q8_0).
GROUP = 32
# Output rows per kernel vector (16 float32 lanes of AVX512).
LANES = 16


@dataclass
class QuantBlocks:
    """w[n, k] = codes[n, k] * scale[n, k // 32] + offset[n, k // 32], codes unsigned, below 2 ** bits."""

    codes: torch.Tensor  # [N, K] uint8
    scale: torch.Tensor  # [N, K / 32] float32, each a float16 value
    offset: torch.Tensor  # [N, K / 32] float32, each a float16 value
    bits: int  # 4 or 8

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K] these blocks stand for."""
        return (self.codes.float() * self.scale.repeat_interleave(GROUP, 1)
                + self.offset.repeat_interleave(GROUP, 1))

    def rows(self, order: torch.Tensor) -> "QuantBlocks":
        """The same blocks with output rows taken in `order`."""
        return QuantBlocks(self.codes[order], self.scale[order], self.offset[order], self.bits)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's int8 activations, bit for bit: (q [M, K] int8, dx [M, K/32], dx * sum(q) [M, K/32]).

    Per block of 32: amax = max |x|, q = round_half_even(x * (127 / amax)), dx = amax / 127 (all zero when amax
    is 0). Used by the tests' reference matmul."""
    rows = x.reshape(-1, x.shape[-1]).float()
    blocks = rows.reshape(rows.shape[0], -1, GROUP)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse)
    dx = (amax / 127.0).squeeze(-1)
    return q.to(torch.int8).reshape(rows.shape), dx, dx * q.sum(dim=-1)


def reference_matmul(x: torch.Tensor, blocks: QuantBlocks) -> torch.Tensor:
    """The kernel's formula in float64 (integer dot products exact): what block_matmul computes, up to its
    float32 accumulation."""
    q, dx, sx = quantize_activations(x)
    rows, n = q.shape[0], blocks.codes.shape[0]
    dots = torch.einsum("mbj,nbj->mnb", q.double().reshape(rows, -1, GROUP),
                        blocks.codes.double().reshape(n, -1, GROUP))
    out = (dots * blocks.scale.double()[None] * dx.double()[:, None]).sum(-1) + sx.double() @ blocks.offset.double().T
    return out.reshape(*x.shape[:-1], n)


class BlockQuantLinear(nn.Module):
    """A bias-free linear layer over QuantBlocks: float32 in, float32 out."""

    def __init__(self, blocks: QuantBlocks):
        super().__init__()
        if blocks.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {blocks.bits}")
        self.out_features, self.in_features = blocks.codes.shape
        if self.in_features % GROUP:
            raise ValueError(f"in_features {self.in_features} is not a multiple of the group size {GROUP}")
        if int(blocks.codes.max()) >= 1 << blocks.bits:
            raise ValueError(f"codes above {(1 << blocks.bits) - 1} in a {blocks.bits}-bit layer")
        scale, offset = blocks.scale.to(torch.float16), blocks.offset.to(torch.float16)
        if not (torch.equal(scale.float(), blocks.scale.float()) and torch.equal(offset.float(), blocks.offset.float())):
            raise ValueError("block scales and offsets must be float16 values (as a GGUF stores them)")
        self.bits = blocks.bits
        codes, scale, offset = interleave(blocks.codes, scale, offset, blocks.bits)
        self.register_buffer("codes", codes, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("offset", offset, persistent=False)
        native.load()  # build the kernels now, not in the first forward

    @classmethod
    def stacked(cls, layers: Sequence["BlockQuantLinear"]) -> "BlockQuantLinear":
        """One layer computing `layers` side by side (their outputs concatenated), so that one kernel call does the
        work of several (q/k/v, gate/up). Each output is computed from its own weight row and the input alone, so
        every output has the bits its own layer gives. The layers must share bits and input width, and all but the
        last fill whole groups of LANES rows (no padding rows in between); afterwards their buffers are views of
        the stacked ones, so the weights are held once."""
        if len({(layer.bits, layer.in_features) for layer in layers}) != 1:
            raise ValueError("stacked layers need the same bits and in_features")
        if any(layer.out_features % LANES for layer in layers[:-1]):
            raise ValueError(f"every stacked layer but the last needs a multiple of {LANES} output rows")
        stacked = cls.__new__(cls)
        nn.Module.__init__(stacked)
        stacked.bits, stacked.in_features = layers[0].bits, layers[0].in_features
        stacked.out_features = sum(layer.out_features for layer in layers)
        for name in ("codes", "scale", "offset"):
            stacked.register_buffer(name, torch.cat([getattr(layer, name) for layer in layers]), persistent=False)
        start = 0
        for layer in layers:
            groups = layer.codes.shape[0]
            for name in ("codes", "scale", "offset"):
                setattr(layer, name, getattr(stacked, name)[start:start + groups])
            start += groups
        return stacked

    def weight_bytes(self) -> int:
        """Bytes one forward reads: packed codes plus float16 scales and offsets."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.offset))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The op itself, not a wrapper: a decoding step of the demo target makes ~200 of these calls.
        out = native.BLOCK_MATMUL(x if x.dtype == torch.float32 else x.float(), self.codes, self.scale, self.offset,
                                  self.bits, self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}"


def interleave(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's layout (cpu_kernels.cpp, "Weight layout"): output rows in groups of LANES, each block of a
    group as vectors of 64 bytes whose byte 4l + i is row l's code 4v + i; 4-bit codes v and v + 4 share a byte
    (low and high nibble). Rows are padded to a multiple of LANES with zero weights."""
    rows, features = codes.shape
    groups, blocks = -(-rows // LANES), features // GROUP
    pad = groups * LANES - rows
    codes = nn.functional.pad(codes, (0, 0, 0, pad)).reshape(groups, LANES, blocks, GROUP // 4, 4)
    codes = codes.permute(0, 2, 3, 1, 4)  # [group, block, v, lane, i]
    if bits == 4:
        codes = codes[:, :, :4] | (codes[:, :, 4:] << 4)
    scale, offset = (nn.functional.pad(t, (0, 0, 0, pad)).reshape(groups, LANES, blocks).transpose(1, 2)
                     for t in (scale, offset))
    return codes.contiguous().reshape(groups, -1), scale.contiguous(), offset.contiguous()
