"""Tolerances of the CUDA op against the PyTorch reference, shared by the GPU tests and `make gpu-check`.

Tolerances are elementwise, |kernel - ref| <= rtol |ref| + atol max|ref|, plus a bound on the mean error: the
tensor-core kernels round the softmax weights P to the I/O type for the P V product (as FlashAttention does), so a
16-bit output may differ from the fp32-accumulated reference by about one unit in its last place; a wrong fragment
layout, a missed key or a wrong split merge is off by far more. Cache values must be bit-identical (a copy), cache
keys within one unit in the last place (one rounding of the same RoPE'd value) plus a few fp32 ulps of their rotated
pair's norm (the kernel's sincosf and torch's cos/sin may differ by an fp32 ulp, which a cancellation in
x1 cos - x2 sin turns into many ulps of a small result), and cache rows outside the appended ones untouched.
"""

from __future__ import annotations

import torch

# dtype: (rtol, atol as a fraction of max|ref|, mean error as a fraction of mean|ref|). For 16-bit types rtol is two
# half-units of the last place (output rounding) and atol about 8 standard deviations of the error that rounding P
# adds (for inputs ~ N(0, 1)); fp32 allows the sum-order differences of ~1e3-key softmaxes.
TOLERANCES = {torch.bfloat16: (2.0 ** -7, 2.0 ** -8, 2.0 ** -7), torch.float16: (2.0 ** -10, 2.0 ** -11, 2.0 ** -10),
              torch.float32: (1e-4, 1e-5, 2e-5)}
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -22}


def output_error(ours: torch.Tensor, ref: torch.Tensor) -> str | None:
    """None when the output is within tolerance, else a one-line description of the worst element."""
    rtol, atol, mean_tol = TOLERANCES[ref.dtype]
    o, r = ours.float(), ref.float()
    diff = (o - r).abs()
    bound = rtol * r.abs() + atol * r.abs().max()
    bad = (diff > bound) | diff.isnan()
    if bad.any():
        i = int(torch.argmax((diff - bound).flatten().nan_to_num(float("inf"))))
        return (f"{int(bad.sum())} of {diff.numel()} outputs out of tolerance; worst |{o.flatten()[i]:.6g} - "
                f"{r.flatten()[i]:.6g}|")
    if diff.mean() > mean_tol * r.abs().mean():
        return f"mean error {diff.mean():.3g} > {mean_tol:.3g} x mean |ref| {r.abs().mean():.3g}"
    return None


def cache_error(name: str, ours: torch.Tensor, ref: torch.Tensor, before: torch.Tensor, cache_lens,
                ctx_lens, pair_slack: float = 0.0) -> str | None:
    """Appended rows: identical values; keys within one ulp of their own value plus `pair_slack` times the norm of
    their rotated pair (x_i, x_{i + Dh/2}), the absolute error two fp32 cos/sin implementations leave after a
    cancellation; every other row: unchanged."""
    for b, (start, count) in enumerate(zip(cache_lens.tolist(), ctx_lens.tolist())):
        appended = slice(start, start + count)
        o, r = ours[b, :, appended].float(), ref[b, :, appended].float()
        if name == "cache_v":
            wrong = (o != r).any()
        else:
            half = r.shape[-1] // 2
            pair_norm = torch.hypot(r[..., :half], r[..., half:]).repeat(1, 1, 2)
            bound = ULP[ref.dtype] * torch.maximum(o.abs(), r.abs()) + pair_slack * pair_norm
            wrong = ((o - r).abs() > bound).any()
        if wrong:
            return f"{name}: appended rows of sequence {b} differ from the reference"
        keep = torch.ones(ours.shape[2], dtype=torch.bool, device=ours.device)
        keep[appended] = False
        if not torch.equal(ours[b, :, keep], before[b, :, keep]):
            return f"{name}: rows outside the appended ones of sequence {b} changed"
    return None
