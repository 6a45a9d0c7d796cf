"""Small kernel calls for compute-sanitizer (`python -m dflash_trt.gpu_check.small_case`): every dtype, both head
dims, ragged lengths over two context splits; exit 0 when every output and cache matches the reference."""

from __future__ import annotations

import sys

import torch

from dflash_trt.gpu_check.kernel_checks import compare, kernel, make_case, reference

SHAPES = (("d128", 8, 2, 128, 1e6, None), ("d64-yarn", 16, 2, 64, 150000.0,
          {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}))


def main() -> int:
    failures = []
    for shape in SHAPES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            inputs = make_case(shape, 2, 700, seed=3, dtype=dtype)
            ours, ours_in = kernel(shape, inputs)
            ref, ref_in = reference(shape, inputs)
            errors = compare(shape, inputs, ours, ours_in, ref, ref_in)
            failures += [f"{shape[0]} {dtype}: {e}" for e in errors if e]
    torch.cuda.synchronize()
    print("\n".join(failures) if failures else "small cases: all match")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
