"""Drafting a ragged batch (a shortened last block) with a drafter graph that has no block mask.

The ONNX and TensorRT drafters run one block length per call, so rows whose last block is shorter run as their
own sub-batch on their own length: each row drafts exactly what it would alone (and a sampling row draws the
same numbers, since its generator travels with it). Their caches provide `part(indices)` (a copy holding those
rows) and `update(indices, part)` (write it back).
"""

from __future__ import annotations

from typing import Callable

import torch

from dflash_trt.decoding.model.protocols import Proposal


def propose_by_length(drafts: Callable, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                      cache, block_lens: torch.Tensor | None, sampling=None) -> Proposal:
    """The Proposal for slots 1..S-1 (with candidates and q when the drafter samples through a selector).

    `drafts(block, features, ctx_lens, cache, sampling)` drafts one batch of full-width rows.
    """
    if block_lens is None or bool((block_lens == block.shape[1]).all()):
        return drafts(block, features, ctx_lens, cache, sampling)
    batch, slots = block.shape[0], block.shape[1] - 1
    drafted = torch.zeros(batch, slots, dtype=torch.long, device=block.device)
    candidates = q = None
    for length in sorted(set(block_lens.tolist())):
        rows = torch.nonzero(block_lens == length).flatten()
        part = cache.part(rows)
        row_sampling = None if sampling is None else [sampling[r] for r in rows.tolist()]
        result = drafts(block[rows, :length], features[rows], ctx_lens[rows], part, row_sampling)
        cache.update(rows, part)
        drafted[rows, :length - 1] = result.drafts
        if result.q is not None:
            if q is None:  # padding slots keep q = 0: acceptance reads a row's real slots only
                k = result.q.shape[-1]
                candidates = torch.zeros(batch, slots, k, dtype=torch.long, device=block.device)
                q = torch.zeros(batch, slots, k, dtype=result.q.dtype, device=block.device)
            candidates[rows, :length - 1] = result.candidates
            q[rows, :length - 1] = result.q
    return Proposal(drafted, candidates, q)
