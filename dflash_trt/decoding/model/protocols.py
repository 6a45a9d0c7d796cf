"""The contracts the decoding step and the scheduler rely on, stated once.

Every runtime implements them with its own classes: the torch target (target.TargetModel) and its CUDA-graph
verifier (graphs.verifier.GraphedVerifier); drafters in torch (drafters/), under CUDA graphs
(graphs.drafter.GraphedDrafter), as ONNX or TensorRT graphs (exported/). Code above this layer calls these
methods and reads these attributes only: no probing with hasattr.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch

from dflash_trt.decoding.model.config import DrafterConfig

# Per-row draft sampling for drafters that draw their drafts: (temperature, generator); 0 = greedy.
RowSampling = tuple[float, "torch.Generator | None"]


@dataclass
class Proposal:
    """A drafter's proposal for block slots 1..S-1.

    drafts [B, S-1]: the drafted tokens. candidates / q [B, S-1, K] (families with a candidate
    selector): the K candidate ids of each slot and the selector's probability of each, the q of
    lossless rejection sampling. None means a deterministic (one-hot) draft.

    For tree verification (propose(..., top_k=K)): topk_ids / topk_logprobs [B, S-1, K] are each slot's K most
    likely tokens and their log-probabilities, best first (ties by ascending id), rank 0 being the chain's draft.
    children (DFlash2): children(row, slot, parent_token) -> (ids, logprobs), the slot's candidates ranked for
    that parent (the selector's lattice); None means the slots are marginals, the same for every parent.
    """

    drafts: torch.Tensor
    candidates: torch.Tensor | None = None
    q: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    children: Callable[[int, int, int], tuple[list[int], list[float]]] | None = None


@runtime_checkable
class DraftCache(Protocol):
    """The drafter's context cache of a batch: context rows per sequence, left-aligned.

    lens [B]: context rows each sequence holds (== the position its next block starts at).
    """

    lens: torch.Tensor

    def select(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at `indices`, in that order."""

    def concat(self, other: "DraftCache") -> None:
        """Append the sequences of `other` (a group joining the batch)."""

    def shrink(self, capacity: int) -> None:
        """Release context capacity beyond `capacity` positions (no sequence can reach it any more)."""


@runtime_checkable
class Drafter(Protocol):
    """Proposes a block of drafts from the target's features (KV injection) in one forward.

    samples_drafts: whether `propose` draws its drafts (it then needs each row's sampling and returns q).
    static_block_size: the one block size the drafter can draft (an exported graph), or None for any.
    proposes_top_k: whether `propose(..., top_k=K)` gives each slot's top-K candidates (tree verification).
    absorb_block (optional, default 2): the block width of a draft call that only takes in context (step.absorb_context);
    1 where the drafter runs the anchor alone, without drafts or output head.
    """

    config: DrafterConfig
    samples_drafts: bool
    static_block_size: int | None
    proposes_top_k: bool

    def new_cache(self, batch_size: int, capacity: int) -> DraftCache:
        """An empty context cache for `batch_size` sequences of at most `capacity` positions."""

    def propose(self, target: "Target", block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: DraftCache, block_lens: torch.Tensor | None = None,
                sampling: Sequence[RowSampling] | None = None, top_k: int = 0) -> Proposal:
        """Drafts for slots 1..S-1 of block [B,S] = [last committed token, MASK...], after taking in the new
        context rows features[b, :ctx_lens[b]] (appended to `cache`). block_lens [B]: real slots per row.
        top_k > 0 (only where proposes_top_k): the proposal also carries each slot's top-K candidates."""


@runtime_checkable
class Target(Protocol):
    """The model being served: verify forwards over a batch KV cache, and the pieces a drafter borrows."""

    device: torch.device
    max_context: int | None
    takes_explicit_masks: bool  # whether a forward may run an explicit block mask (a tree); static caches cannot

    lean: object | None  # the native decoder (model/lean_llama.py) where it applies: prefill runs it too

    def new_cache(self):
        """A cache for a prefill group (left-padded rows) through the model's own forward."""

    def empty_batch_cache(self, rows: int, capacity: int, capacity_limit: int):
        """An empty decoding cache, which a prefill through the native decoder writes (right-padded rows)."""

    def batch_cache(self, prefill_cache, lengths: torch.Tensor, capacity_limit: int):
        """The decoding cache of a prefilled group (rows left-aligned, room for capacity_limit slots)."""

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache,
                feature_layer_ids: Sequence[int] = (), last_only: bool = False,
                logits_at: torch.Tensor | None = None):
        """Logits [B,T,V] (fp32) and the features of `feature_layer_ids` [B,T,K*D] of new tokens [B,T]; last_only:
        the last column's logits only; logits_at [B] (the native decoder): one column's per row."""

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (the drafter's block embeddings)."""

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output-head logits of drafter states."""

    def check_drafter(self, config: DrafterConfig) -> None:
        """Raise a clear error when a drafter of `config` cannot run with this target."""
