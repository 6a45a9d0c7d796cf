"""What runs on the host around an exported drafter graph (the onnx and tensorrt runtimes).

The graph maps block embeddings to final-normed block states. Before it: the drafter's `embed_block` (the
target's embeddings, times input_embedding_scale). After it: the drafter's `choose_drafts` (the argmax of
the draft logits for DFlash; DFlash2's candidate-selector walk, a short sequential loop that samples at
T > 0). Both are the torch drafter's own code, so an exported drafter drafts what the torch one drafts. A tree's
per-slot top-K comes from the same host part (DFlash: each slot's marginal top-K of the draft logits; DFlash2:
the selector's lattice), so the graph exports nothing more and its trees equal the torch drafter's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from dflash_trt.decoding.model.drafters import DrafterBase, load_drafter
from dflash_trt.decoding.model.exported.ragged_blocks import propose_by_length
from dflash_trt.decoding.model.protocols import Proposal, RowSampling


def draft_head(drafter: DrafterBase) -> DrafterBase:
    """`drafter` without what the graph runs (its layers and its context fusion): embeddings and selector."""
    drafter.layers = nn.ModuleList()
    drafter.fc = None
    return drafter


def load_draft_head(drafter_dir: str | Path, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> DrafterBase:
    return draft_head(load_drafter(drafter_dir, dtype=dtype, device=device))


class ExportedDrafter:
    """propose() of a drafter whose forward is an exported graph: subclasses implement
    `__call__(block_embeds, features, ctx_lens, cache) -> hidden [B,S,D]` and set `head`."""

    head: DrafterBase
    proposes_top_k = True  # the host part ranks each slot's candidates (module docstring)

    @property
    def config(self):
        return self.head.config

    @property
    def samples_drafts(self) -> bool:
        return self.head.samples_drafts

    @property
    def static_block_size(self) -> int | None:
        """The one block size the graph drafts, or None when its block length is dynamic."""
        return None

    @torch.inference_mode()
    def propose(self, target, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor, cache,
                block_lens: torch.Tensor | None = None,
                sampling: Sequence[RowSampling] | None = None, top_k: int = 0) -> Proposal:
        """Drafts for block slots 1..S-1, as DrafterBase.propose (top_k > 0: each slot's top-K candidates too).

        The graph has no block mask, so rows whose (shortened last) block is shorter run as their own
        batch on their own block length: each row drafts exactly what it would alone.
        """
        return propose_by_length(partial(self._drafts, target, top_k), block, features, ctx_lens, cache, block_lens,
                                 sampling)

    def _drafts(self, target, top_k, block, features, ctx_lens, cache, sampling):
        hidden = self(self.head.embed_block(target, block), features, ctx_lens, cache)
        hidden = hidden.to(block.device, next(self.head.parameters()).dtype)
        return self.head.choose_drafts(target, hidden[:, 1:], block[:, 0], sampling, None, top_k)
