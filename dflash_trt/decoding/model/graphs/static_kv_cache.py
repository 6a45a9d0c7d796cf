"""The verify step with static shapes: what lets GraphedVerifier capture it in CUDA graphs.

A BatchKVCache forward's shapes follow the rows' lengths: its masks and key views end at the longest row. A
`StaticForward` over a `StaticKVCache` has every tensor shaped by (bucket of the batch, tokens per row, cache
capacity) only, and reads nothing on the host:
- the batch is padded to a bucket (graphs.drafter.BUCKETS); the cache's rows are allocated in buckets too;
- the tokens' keys and values are scattered to their positions (a device tensor [bucket, q]), slot == position as
  in every BatchKVCache row;
- attention runs over the whole capacity, with masks computed from those positions into buffers of their own, in
  place (causal, and the sliding window where the target has sliding layers), boolean or additive as the target's
  attention takes them;
- padded rows sit at positions 0 .. q-1 of spare rows, attending to their own block only: no live row reads them.

A tree verify (step/verify/tree.py) runs as a `StaticTreeForward`: its width is padded by the tree method to a
bucket of node counts (powers of two up to the budget, `tree_nodes_bucket`), its nodes sit at depth-based positions
while their keys and values are written at slots lengths[b] + t, and the ancestor mask is an input buffer of the
forward: the attention masks are computed from (write slots, positions, ancestor mask) in place, host-free, by the
same rule the eager cache uses (kv_cache.explicit_masks). The accepted path's keys and values are then moved into
place by BatchKVCache.keep (one gather per layer). Padding nodes see only themselves, and no node sees them.

Slots past a row's length (stale, or zeros) are masked exactly as in BatchKVCache, so the static forward emits the
tokens the eager one does. When the buffers move (capacity growth, a merge beyond the spare rows, a release), the
static forwards built on them are dropped: a captured graph holds their addresses.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dflash_trt.decoding.model.graphs.drafter import bucket_for
from dflash_trt.decoding.model.kv_cache import BatchKVCache, explicit_masks


def tree_nodes_bucket(nodes: int, budget: int) -> int:
    """The node count a tree of `nodes` nodes is padded to on the static path: the next power of two, at most the
    budget (so a budget of B captures about log2(B) verify widths, and never writes more than B + 1 slots)."""
    return max(nodes, min(1 << max(nodes - 1, 0).bit_length(), budget))


class StaticKVCache(BatchKVCache):
    """A BatchKVCache (same layout, same batch reshaping) whose forwards run as StaticForward (module docstring).

    forwards: the StaticForward of each (bucket, tokens per row, feature layers, tree or chain) run on the current
    buffers.
    """

    static_shapes = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.forwards: dict[tuple[int, int, tuple[int, ...], bool], StaticForward] = {}
        self.prepared_tokens: int | None = None  # what the last prepare made room for, until a forward uses it
        self.block_mask: torch.Tensor | None = None  # the prepared forward's ancestor mask [B, T, T] (a tree)

    @torch.inference_mode()
    def prepare(self, num_new: int, positions: torch.Tensor | None = None, block_mask: torch.Tensor | None = None
                ) -> None:
        """Make room for num_new more tokens in every row, and for the batch's bucket of rows. The masks are the
        static forward's own (a chain: causal over consecutive positions; a tree: from `block_mask`, kept until
        the forward takes it, and the forward's own positions), so there is nothing to return."""
        if positions is not None and block_mask is None:
            raise NotImplementedError("the static verify takes explicit positions with an ancestor mask only (a tree)")
        self._ensure_capacity(self.width + num_new)
        if self.allocated_rows < bucket_for(len(self)):
            self._reallocate(len(self), self.capacity)
        self._write_index, self.prepared_tokens, self.block_mask = None, num_new, block_mask

    def take_preparation(self, num_new: int) -> torch.Tensor | None:
        """Check that prepare made room for this forward's num_new tokens (a slot past the capacity would be a
        device-side fault, not an error), and use that preparation up; returns its ancestor mask (None: a chain)."""
        if self.prepared_tokens != num_new:
            raise RuntimeError(f"StaticKVCache.prepare({num_new}) must precede each forward")  # internal invariant
        self.prepared_tokens = None
        block_mask, self.block_mask = self.block_mask, None
        return block_mask

    def begin_static_forward(self, slots: torch.Tensor) -> None:
        """The next layer updates write the tokens at `slots` [bucket, q] (a chain: their positions) and attend to
        the whole capacity."""
        self._write_index, self._view_width = slots, self.capacity

    def _reallocate(self, rows: int, capacity: int) -> None:
        super()._reallocate(bucket_for(max(rows, 1)), capacity)
        self.forwards.clear()


class StaticForward:
    """The static-shape target forward of one (bucket, q, feature layers) on one StaticKVCache: its input and mask
    buffers, `load` (copy a batch in) and `run` (the forward on the buffers, what a CUDA graph captures).

    graph, outputs and calls belong to GraphedVerifier (the captured graph, its output tensors, eager runs so far).
    The cache is passed to `run`, not kept: the cache keeps its forwards, and no cycle delays freeing its buffers.
    """

    def __init__(self, target, cache: StaticKVCache, rows: int, num_new: int, feature_layer_ids: Sequence[int]):
        device = cache.lengths.device
        self.target, self.spec, self.layer_ids = target, cache.spec, tuple(feature_layer_ids)
        self.rows, self.num_new, self.capacity = rows, num_new, cache.capacity
        self.tokens = torch.zeros(rows, num_new, dtype=torch.long, device=device)
        self.steps = torch.arange(num_new, device=device)
        self.positions = self.steps.repeat(rows, 1)
        self.slots = torch.arange(cache.capacity, device=device)
        spec = self.spec
        kinds = ["full_attention"] + (["sliding_attention"] if spec.sliding_window is not None else [])
        shape = (rows, 1, num_new, cache.capacity)
        self.allowed = {kind: torch.zeros(shape, dtype=torch.bool, device=device) for kind in kinds}
        self.masks = ({kind: torch.zeros(shape, dtype=spec.dtype, device=device) for kind in kinds}
                      if spec.additive else self.allowed)
        self.graph = None
        self.outputs: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.calls = 0

    def load(self, token_ids: torch.Tensor, position_ids: torch.Tensor) -> None:
        """The batch's tokens and positions [n, q] into the first n rows; the padded rows at positions 0 .. q-1."""
        n = token_ids.shape[0]
        self.tokens[:n].copy_(token_ids)
        self.tokens[n:].zero_()
        self.positions[:n].copy_(position_ids)
        self.positions[n:].copy_(self.steps.expand(self.rows - n, -1))

    def refresh_masks(self) -> None:
        """Every mask row from the positions, in place: slot s is seen from position p when s <= p (and, on
        sliding layers, p - s < window)."""
        query = self.positions[:, None, :, None]  # [rows, 1, q, 1]
        full = self.allowed["full_attention"]
        torch.le(self.slots, query, out=full)
        if "sliding_attention" in self.allowed:
            sliding = self.allowed["sliding_attention"]
            torch.gt(self.slots, query - self.spec.sliding_window, out=sliding)
            sliding.logical_and_(full)
        if self.spec.additive:
            lowest = torch.finfo(self.spec.dtype).min
            for kind, mask in self.masks.items():
                mask.fill_(lowest).masked_fill_(self.allowed[kind], 0.0)

    def run(self, cache: StaticKVCache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward on the buffers and `cache` (the one it was made for): (logits [rows, q, V] in the model's
        dtype, features [rows, q, K*D])."""
        self.refresh_masks()
        cache.begin_static_forward(self.positions)
        masks = self.masks if self.spec.as_mapping else self.masks["full_attention"]
        return self.target.run_model(self.tokens, self.positions, masks, cache, self.layer_ids)


class StaticTreeForward(StaticForward):
    """The static-shape verify of a tree (module docstring): a StaticForward whose tokens are written at slots
    lengths[b] + t, not at their (depth-based) positions, under an ancestor mask that is an input buffer."""

    def __init__(self, target, cache: StaticKVCache, rows: int, num_new: int, feature_layer_ids: Sequence[int]):
        super().__init__(target, cache, rows, num_new, feature_layer_ids)
        device = cache.lengths.device
        self.write_slots = self.steps.repeat(rows, 1)
        self.causal = torch.ones(num_new, num_new, dtype=torch.bool, device=device).tril()
        self.block_mask = self.causal.repeat(rows, 1, 1)

    def load_tree(self, token_ids: torch.Tensor, position_ids: torch.Tensor, lengths: torch.Tensor,
                  block_mask: torch.Tensor) -> None:
        """The batch's tree into the first n rows: tokens and positions [n, q], the rows' committed lengths [n]
        (where their new slots start) and ancestor mask [n, q, q]; padded rows are causal chains at slots 0 .. q-1."""
        n = token_ids.shape[0]
        self.load(token_ids, position_ids)
        self.write_slots[:n].copy_(lengths[:, None] + self.steps)
        self.write_slots[n:].copy_(self.steps.expand(self.rows - n, -1))
        self.block_mask[:n].copy_(block_mask)
        self.block_mask[n:].copy_(self.causal)

    def refresh_masks(self) -> None:
        """Every mask row from (write slots, positions, ancestor mask), in place: committed slots and allowed new
        slots are seen (and, on sliding layers, within the window measured between positions)."""
        seen, distance = explicit_masks(self.slots, self.write_slots[:, 0], self.positions, self.block_mask)
        full = self.allowed["full_attention"]
        full.copy_(seen[:, None])
        if "sliding_attention" in self.allowed:
            sliding = self.allowed["sliding_attention"]
            torch.lt(distance[:, None], self.spec.sliding_window, out=sliding)
            sliding.logical_and_(full)
        if self.spec.additive:
            lowest = torch.finfo(self.spec.dtype).min
            for kind, mask in self.masks.items():
                mask.fill_(lowest).masked_fill_(self.allowed[kind], 0.0)

    def run(self, cache: StaticKVCache) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.refresh_masks()
        cache.begin_static_forward(self.write_slots)
        masks = self.masks if self.spec.as_mapping else self.masks["full_attention"]
        return self.target.run_model(self.tokens, self.positions, masks, cache, self.layer_ids)
