"""Drafting a ragged batch (a shortened last block) with a drafter graph that has no block mask.

The ONNX and TensorRT drafters run one block length per call, so rows whose last block is shorter run as their
own sub-batch on their own length: each row drafts exactly what it would alone (and a sampling row draws the
same numbers, since its generator travels with it). Their caches provide `part(indices)` (a copy holding those
rows) and `update(indices, part)` (write it back). A tree's candidates are merged the same way: each row's
top-K (or, for DFlash2, its lattice) is the one its sub-batch ranked for it.
"""

from __future__ import annotations

from typing import Callable

import torch

from dflash_trt.decoding.model.protocols import Proposal


def propose_by_length(drafts: Callable, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                      cache, block_lens: torch.Tensor | None, sampling=None) -> Proposal:
    """The Proposal for slots 1..S-1 (with candidates and q when the drafter samples through a selector, and each
    slot's top-K or lattice when a tree asked for them).

    `drafts(block, features, ctx_lens, cache, sampling)` drafts one batch of full-width rows.
    """
    if block_lens is None or bool((block_lens == block.shape[1]).all()):
        return drafts(block, features, ctx_lens, cache, sampling)
    batch, slots = block.shape[0], block.shape[1] - 1
    drafted = torch.zeros(batch, slots, dtype=torch.long, device=block.device)
    candidates = q = topk_ids = topk_logprobs = None
    lattices: dict[int, tuple] = {}  # row -> (its sub-batch's children, its row there)
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
        if result.topk_ids is not None:
            if topk_ids is None:  # padding slots are never read: a row's tree stops at its own length
                k = result.topk_ids.shape[-1]
                topk_ids = torch.zeros(batch, slots, k, dtype=torch.long, device=block.device)
                topk_logprobs = torch.zeros(batch, slots, k, dtype=result.topk_logprobs.dtype, device=block.device)
            topk_ids[rows, :length - 1] = result.topk_ids
            topk_logprobs[rows, :length - 1] = result.topk_logprobs
        if result.children is not None:
            lattices.update({row: (result.children, local) for local, row in enumerate(rows.tolist())})
    return Proposal(drafted, candidates, q, topk_ids, topk_logprobs, _merged_lattice(lattices) if lattices else None)


def _merged_lattice(lattices: dict[int, tuple]) -> Callable:
    """children(row, slot, parent_token) of the whole batch from each sub-batch's lattice."""
    def children(row: int, slot: int, parent_token: int):
        lattice, local = lattices[row]
        return lattice(local, slot, parent_token)
    return children
