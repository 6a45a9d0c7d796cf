"""DFlash (`DFlashDraftModel`): pre-norm attention and MLP layers; each draft is the argmax of its slot."""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.drafters.base import (MLP, DraftAttention, DrafterBase, RMSNorm, global_shapes,
                                                     layer_shapes, ranked_top_k)
from dflash_trt.decoding.model.drafters.registry import register
from dflash_trt.decoding.model.protocols import Proposal


class DraftLayer(nn.Module):
    def __init__(self, config: DrafterConfig, index: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope, block_lens=None):
        return self.compute(x, lambda h: self.self_attn(h, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope,
                                                        block_lens))

    def compute(self, x: torch.Tensor, attend) -> torch.Tensor:
        """The layer on block states x [B,S,D], with `attend(h)` as its attention (the exported graph passes
        the plugin op)."""
        x = x + attend(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


@register
class DFlashDrafter(DrafterBase):
    """The DFlash drafter: one forward drafts the block; slot k's draft is its most likely token."""

    layer_class = DraftLayer
    family = "dflash"

    def choose_drafts(self, target, hidden, anchors, sampling, block_lens, top_k: int = 0) -> Proposal:
        # A one-hot draft: verification accepts on exact match with the target's own choice (lossless).
        logits = self.draft_logits(target, hidden)
        drafts = native.argmax(logits)
        if top_k <= 0:
            return Proposal(drafts)
        # A tree: each slot's marginal top-K (slot j does not see slot j-1's pick, so one ranking per slot). Ranked
        # on the logits themselves, so rank 0 is exactly the argmax draft.
        ids, _ = ranked_top_k(logits, top_k)
        return Proposal(drafts, topk_ids=ids, topk_logprobs=torch.log_softmax(logits, dim=-1).gather(-1, ids))

    @staticmethod
    def expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
        shapes = global_shapes(config)
        for i in range(config.num_hidden_layers):
            shapes.update(layer_shapes(config, i))
        return shapes
