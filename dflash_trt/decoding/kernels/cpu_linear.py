"""Prepacked linear layers for CPU inference (oneDNN).

A verify forward multiplies every weight matrix by a block of B rows (B = block size) instead of one.
On a GPU that is almost free: decoding is bound by reading the weights, and B rows read them once.
On a CPU, PyTorch's default GEMM repacks the whole weight matrix on every call, so 8 rows cost about
1.7x one row for SmolLM2-135M on one core, and DFlash loses most of its advantage. Packing each
weight once into oneDNN's blocked layout (what a TensorRT engine build does for its kernels) brings
8 rows to about 1.1x one row. `make bench` shows the effect side by side (both modes use the packed
target, so the comparison stays fair).

`PackedLinear` is an `nn.Linear`: same parameters, same state_dict, tied weights untouched. Only its
forward differs, and only for inference on CPU float32 inputs; anything else (autograd, other
devices or dtypes) takes the ordinary path.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# Rows the packed layout is tuned for (the default block size); any row count works.
ROWS_HINT = 8


def packing_available() -> bool:
    """True where this PyTorch build has oneDNN's prepacked linear (x86 CPU builds)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Linear):
    """nn.Linear whose inference forward on CPU float32 uses a weight packed once for oneDNN."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._packed, self._packed_version = None, -1

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "PackedLinear":
        packed = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        packed.weight, packed.bias = linear.weight, linear.bias  # shared, not copied
        packed.repack()
        return packed

    def repack(self) -> None:
        """Re-pack after the weight changed (in place or by assignment)."""
        self._packed = None
        if self.weight.device.type == "cpu" and self.weight.dtype == torch.float32:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), ROWS_HINT)
        self._packed_version = self.weight._version

    def _apply(self, fn, *args, **kwargs):  # .to(), .float(), ...: the packed copy follows the weight
        result = super()._apply(fn, *args, **kwargs)
        self.repack()
        return result

    def __deepcopy__(self, memo):
        copy = PackedLinear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        memo[id(self)] = copy
        copy.weight = nn.Parameter(self.weight.detach().clone(), requires_grad=self.weight.requires_grad)
        if self.bias is not None:
            copy.bias = nn.Parameter(self.bias.detach().clone(), requires_grad=self.bias.requires_grad)
        copy.train(self.training)
        copy.repack()
        return copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        usable = (self._packed is not None and x.device.type == "cpu" and x.dtype == torch.float32
                  and self._packed_version == self.weight._version
                  and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)))
        if not usable:
            return F.linear(x, self.weight, self.bias)
        return _packed_linear(x, self._packed, None if self.bias is None else self.bias.detach(), self.out_features)


def pack_linear_layers(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` with a PackedLinear; returns how many were replaced.

    A no-op (0) where oneDNN packing is unavailable or the weights are not CPU float32.
    """
    if not packing_available():
        return 0
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, PackedLinear):
            continue
        if isinstance(child, nn.Linear):
            if child.weight.device.type == "cpu" and child.weight.dtype == torch.float32:
                setattr(module, name, PackedLinear.from_linear(child))
                count += 1
        else:
            count += pack_linear_layers(child)
    return count


def bf16_packing_available() -> bool:
    """True where oneDNN computes bf16 natively on this CPU (AVX512-BF16 or AMX)."""
    return packing_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class BF16Head(nn.Module):
    """A bf16, packed copy of an output head, for drafting only.

    Drafted tokens need no exactness: the target verifies every one of them, so a draft computed in
    bf16 can only change how many are accepted, never the output. For SmolLM2-135M the head is a
    49152 x 576 matrix; read in bf16 it costs ~5 ms per draft on one core instead of ~13 ms.
    """

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.out_features = weight.shape[0]
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16), ROWS_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _packed_linear(x.to(torch.bfloat16), self._packed, None, self.out_features)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., in] @ a weight packed by _reorder_linear_weight (oneDNN takes 2-D inputs only)."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out_features)
