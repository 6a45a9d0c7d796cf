"""Drafting a ragged batch (a shortened last block) with a drafter graph that has no block mask.

The ONNX and TensorRT drafters run one block length per call, so rows whose last block is shorter run as their
own sub-batch on their own length: each row drafts exactly what it would alone. Their caches provide
`part(indices)` (a copy holding those rows) and `update(indices, part)` (write it back).
"""

from __future__ import annotations

from typing import Callable

import torch


def propose_by_length(drafts: Callable, target, block: torch.Tensor, features: torch.Tensor,
                      ctx_lens: torch.Tensor, cache, block_lens: torch.Tensor | None) -> torch.Tensor:
    """Draft tokens [B, S-1]; `drafts(target, block, features, ctx_lens, cache)` drafts one full-width batch."""
    if block_lens is None or bool((block_lens == block.shape[1]).all()):
        return drafts(target, block, features, ctx_lens, cache)
    out = torch.zeros(block.shape[0], block.shape[1] - 1, dtype=torch.long, device=block.device)
    for length in sorted(set(block_lens.tolist())):
        rows = torch.nonzero(block_lens == length).flatten()
        part = cache.part(rows)
        out[rows, :length - 1] = drafts(target, block[rows, :length], features[rows], ctx_lens[rows], part)
        cache.update(rows, part)
    return out
