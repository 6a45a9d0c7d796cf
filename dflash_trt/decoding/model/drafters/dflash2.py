"""DFlash2 (`DFlash2DraftModel`): grouped dynamic causal convolutions around attention and MLP, and a
candidate selector that walks one path through the top-K candidates of every block slot.

The convolutions act along the block axis only (never on the context); the selector scores a candidate
by its logit plus a low-rank "previous token -> this token" term. At temperature T > 0 each draft is a
sample of softmax(scores / T) over the K candidates: that q is what lossless rejection checks against.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.drafters.base import (MLP, DraftAttention, DrafterBase, RMSNorm, global_shapes,
                                                     layer_shapes)
from dflash_trt.decoding.model.drafters.registry import register
from dflash_trt.decoding.model.protocols import Proposal, RowSampling

CODEBOOKS = ("predecessor_codebook", "successor_codebook")


class GroupedDynamicConv(nn.Module):
    """conv(u)[i, c] = sum_t (base[t, c] + delta[i, t, c // group_size]) * u[i - t, c], u[j < 0] = 0.

    One projection of the sublayer's normed input gives the dynamic coefficients of both sides
    (pre: before the sublayer, post: after it); base_kernel[0] is the pre side, [1] the post side.
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def coefficients(self, h: torch.Tensor) -> torch.Tensor:
        """[..., L, D] -> [..., L, 2, T, G]: rows are read side-major, then tap, then group."""
        return self.kernel_projection(h).view(*h.shape[:-1], 2, self.kernel_size, self.groups)

    def apply(self, u: torch.Tensor, coefficients: torch.Tensor, side: int) -> torch.Tensor:
        """Convolve u [..., L, D] along L with side 0 (pre) or 1 (post) of `coefficients`.

        u is zero-padded on the left by kernel_size - 1 slots and each tap reads a shifted window of it,
        so the graph has no branch on L (a block shorter than the kernel exports and runs the same).
        """
        length = u.shape[-2]
        grouped = u.view(*u.shape[:-1], self.groups, self.group_size)
        delta = coefficients[..., side, :, :, None]  # [..., L, T, G, 1]: indexed by the OUTPUT slot
        base = self.base_kernel[side].view(self.kernel_size, self.groups, self.group_size).to(u.dtype)
        padded = nn.functional.pad(grouped, (0, 0, 0, 0, self.kernel_size - 1, 0))
        out = torch.zeros_like(grouped)
        for tap in range(self.kernel_size):
            start = self.kernel_size - 1 - tap
            shifted = padded[..., start:start + length, :, :]
            out = out + base[tap] * shifted + delta[..., tap, :, :] * shifted
        return out.view_as(u)


class DFlash2Layer(nn.Module):
    def __init__(self, config: DrafterConfig, index: int = 0):
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.self_attn = DraftAttention(config, index)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.mlp = MLP(config)
        self.attention_conv = GroupedDynamicConv(d, config.conv_kernel_size, config.conv_group_size)
        self.mlp_conv = GroupedDynamicConv(d, config.conv_kernel_size, config.conv_group_size)

    def forward(self, x, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope, block_lens=None):
        return self.compute(x, lambda h: self.self_attn(h, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope,
                                                        block_lens))

    def compute(self, x: torch.Tensor, attend) -> torch.Tensor:
        """The layer on block states x [B,S,D], with `attend(h)` as its attention (the exported graph passes
        the plugin op)."""
        h = self.input_layernorm(x)
        delta = self.attention_conv.coefficients(h)
        x = x + self.attention_conv.apply(attend(self.attention_conv.apply(h, delta, 0)), delta, 1)
        m = self.post_attention_layernorm(x)
        delta = self.mlp_conv.coefficients(m)
        return x + self.mlp_conv.apply(self.mlp(self.mlp_conv.apply(m, delta, 0)), delta, 1)


class CandidateSelector(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.top_k = config.selector_top_k
        self.hidden_projection = nn.Linear(config.hidden_size, config.selector_rank, bias=False)
        # Stored bare (no `.weight`), as in published checkpoints.
        self.predecessor_codebook = nn.Parameter(torch.zeros(config.vocab_size, config.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(config.vocab_size, config.selector_rank))

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-K (values, ids) per slot, ordered by value descending, then id ascending (exact ties)."""
        values, ids = torch.topk(logits, self.top_k, dim=-1)
        ids, order = ids.sort(dim=-1)
        values = values.gather(-1, order)
        values, order = values.sort(dim=-1, descending=True, stable=True)
        return values, ids.gather(-1, order)

    def transition(self, previous: torch.Tensor, projected: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """sum_r A[previous, r] * P[r] * B[candidate, r]: [B] ids, [B, r], [B, K] ids -> [B, K]."""
        left = self.predecessor_codebook[previous] * projected
        return torch.einsum("br,bkr->bk", left, self.successor_codebook[candidates])

    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchors: torch.Tensor,
             sampling: Sequence[RowSampling] | None, block_lens: torch.Tensor | None = None) -> Proposal:
        """One path from the anchor through slots 1..L-1; hidden [B,L-1,D], logits [B,L-1,V].

        A row draws from its own generator only for its real slots (< block_lens - 1), so a row's random
        stream is the same in a batch as alone.
        """
        unary, candidates = self.candidates(logits)
        projected = self.hidden_projection(hidden)
        batch, slots, k = candidates.shape
        temperatures = [0.0] * batch if sampling is None else [t for t, _ in sampling]
        real_slots = [slots] * batch if block_lens is None else [int(n) - 1 for n in block_lens]
        previous = anchors
        drafts = torch.zeros(batch, slots, dtype=torch.long, device=logits.device)
        q = torch.zeros(batch, slots, k, dtype=torch.float32, device=logits.device)
        rows = torch.arange(batch, device=logits.device)
        for j in range(slots):
            scores = (unary[:, j] + self.transition(previous, projected[:, j], candidates[:, j])).float()
            chosen = torch.argmax(scores, dim=-1)
            q[rows, j, chosen] = 1.0  # greedy rows: a one-hot q
            for row, temperature in enumerate(temperatures):
                if temperature > 0 and j < real_slots[row]:
                    q[row, j] = torch.softmax(scores[row] / temperature, dim=-1)
                    chosen[row] = torch.multinomial(q[row, j], 1, generator=sampling[row][1])[0]
            previous = candidates[rows, j, chosen]
            drafts[:, j] = previous
        return Proposal(drafts, candidates, q)

    def lattice(self, hidden: torch.Tensor, logits: torch.Tensor, top_k: int):
        """children(row, slot, parent_token) -> (ids, logprobs) for tree verification: slot `slot`'s candidates
        scored as the walk scores them after `parent_token` (unary + transition), best first, at most top_k.

        In a tree each node is the previous token of its own children, so every parent gets its own ranking;
        rank 0 after the chain's tokens is the chain's greedy draft (the same argmax, ties to the earlier
        candidate), so the tree's greedy spine is DFlash2's chain. Rankings are computed on demand (a tree of B
        nodes asks for at most B of them) and remembered.
        """
        unary, candidates = self.candidates(logits)
        projected = self.hidden_projection(hidden)
        k = min(top_k, candidates.shape[-1])
        known: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}

        def children(row: int, slot: int, parent_token: int) -> tuple[list[int], list[float]]:
            key = (row, slot, parent_token)
            if key not in known:
                previous = torch.tensor([parent_token], device=candidates.device)
                slot_candidates = candidates[row:row + 1, slot]
                scores = (unary[row:row + 1, slot]
                          + self.transition(previous, projected[row:row + 1, slot], slot_candidates)).float()[0]
                order = torch.sort(scores, descending=True, stable=True).indices[:k]
                logprobs = torch.log_softmax(scores, dim=-1)[order]
                known[key] = (slot_candidates[0, order].tolist(), logprobs.tolist())
            return known[key]

        return children


@register
class DFlash2Drafter(DrafterBase):
    """The DFlash2 drafter: convolutions inside the layers, a candidate selector after the head."""

    layer_class = DFlash2Layer
    family = "dflash2"
    samples_drafts = True

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.candidate_selector = CandidateSelector(config)

    def choose_drafts(self, target, hidden, anchors, sampling, block_lens, top_k: int = 0) -> Proposal:
        logits = self.draft_logits(target, hidden)
        proposal = self.candidate_selector.walk(hidden, logits, anchors, sampling, block_lens)
        if top_k > 0:  # a tree: the selector's lattice ranks each node's own children
            proposal.children = self.candidate_selector.lattice(hidden, logits, top_k)
        return proposal

    def init_as_dflash(self) -> None:
        """Identity convolutions and a zero successor codebook: the drafter then behaves like DFlash.

        Training starts here (the predecessor codebook and projection keep their random init, so the
        transition term gets gradients as soon as the successor codebook moves).
        """
        with torch.no_grad():
            for layer in self.layers:
                for conv in (layer.attention_conv, layer.mlp_conv):
                    conv.base_kernel.zero_()
                    conv.base_kernel[:, 0] = 1.0
                    conv.kernel_projection.weight.zero_()
            self.candidate_selector.successor_codebook.zero_()
            self.candidate_selector.predecessor_codebook.normal_(0, 0.02)
            self.candidate_selector.hidden_projection.weight.normal_(0, 0.02)

    @staticmethod
    def expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
        d, taps, rank = config.hidden_size, config.conv_kernel_size, config.selector_rank
        groups = d // config.conv_group_size
        shapes = global_shapes(config)
        for i in range(config.num_hidden_layers):
            shapes.update(layer_shapes(config, i))
            for conv in ("attention_conv", "mlp_conv"):
                shapes[f"layers.{i}.{conv}.base_kernel"] = (2, taps, d)
                shapes[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * taps * groups, d)
        shapes["candidate_selector.hidden_projection.weight"] = (rank, d)
        for name in CODEBOOKS:
            shapes[f"candidate_selector.{name}"] = (config.vocab_size, rank)
        return shapes

    @staticmethod
    def checkpoint_aliases() -> dict[str, str]:
        """Other names published checkpoints use -> this module's name (`.weight`-suffixed codebooks)."""
        return {f"candidate_selector.{n}.weight": f"candidate_selector.{n}" for n in CODEBOOKS}
