"""The PyTorch drafter with static caches and CUDA graphs for the draft step (the torch runtime on CUDA).

A draft step after prefill has shapes fixed by (batch, block width): the block [B, W, D] and at most
max(S, W) new context rows (the tokens the last verify committed; S the drafter's block size). `GraphedDrafter`
pads the new rows to that width and the batch to a bucket (1, 2, 4, 8, ...) and, on CUDA, replays one CUDA graph
per (bucket, block width): the whole drafter (every layer's projections, the draft-attention kernel, the MLPs)
becomes one launch. Padded rows have no context and add none (lengths 0), so they never disturb the live rows.

The caches (`StaticDraftCache`) keep their rows in buffers of a bucket of rows that stay put while the batch
changes: leaving sequences are compacted in place (the last rows take their places), newcomers are written into
spare rows. Only when the buffers must move (a join past the spare rows, a longer reservation, or memory given
back: rows beyond twice the batch, capacity no row can reach) are they reallocated, and the draft steps built on
them dropped (a captured graph holds their addresses). As in GraphedVerifier, a step's first run is eager and its
second captures it, so shapes seen once (a prefilled group's drafted first step before it joins) never pay a capture.

What runs eagerly on the same caches: a prefill or a context backlog wider than the padding, and a ragged batch
(a row's shortened last block, `block_lens`): the CUDA kernels take full blocks only. Without CUDA (or with
graphs=False) every step runs the same static code eagerly, which is how it is tested on CPU.
What cannot be captured, and is refused (graphs=True) or left eager (graphs=None), by `capture_blockers`: any
draft attention that is not the project's CUDA kernels (sliding-window or causal layers, a head_dim the kernels do
not cover, DFLASH_DRAFT_ATTENTION=torch): PyTorch's reference appends context rows in a loop over lengths read on
the host.
"""

from __future__ import annotations

import os
import warnings

import torch

from dflash_trt.decoding.kernels import attention
from dflash_trt.decoding.model.graphs.capture import GraphPool
from dflash_trt.errors import CompatibilityError

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_for(batch: int) -> int:
    for size in BUCKETS:
        if size >= batch:
            return size
    raise ValueError(f"batch {batch} exceeds the largest bucket {BUCKETS[-1]}")


def capture_blockers(config) -> list[str]:
    """Why a CUDA graph cannot capture this drafter's forward (empty: it can), from its DrafterConfig."""
    from dflash_trt.decoding.kernels.plugin.cuda_op import HEAD_DIMS

    blockers = []
    if not config.is_plain_attention:
        blockers.append("sliding-window or causal draft layers run PyTorch's windowed attention, which reads "
                        "lengths on the host")
    if config.head_dim not in HEAD_DIMS:
        blockers.append(f"the CUDA draft-attention kernels cover head_dim {HEAD_DIMS}, not {config.head_dim}")
    if os.environ.get(attention.BACKEND_ENV) == "torch":
        blockers.append(f"{attention.BACKEND_ENV}=torch: PyTorch's reference attention reads lengths on the host")
    return blockers


class _CacheView:
    """The first `rows` rows of a StaticDraftCache, in the shape the draft layers take (k, v lists, lens)."""

    def __init__(self, cache: "StaticDraftCache", rows: int):
        self.k = [t[:rows] for t in cache.k]
        self.v = [t[:rows] for t in cache.v]
        self.lens = cache.all_lens[:rows]


class StaticDraftCache:
    """Context K/V of every draft layer, in buffers of a bucket of rows; the first `size` rows are live.

    k[i], v[i] [allocated rows, Hkv, rows_i, Dh] as in DraftCache (a sliding layer keeps window - 1 rows);
    all_lens [allocated rows], zero past `size`. steps: the DraftStep of each (bucket, block width) on the current
    buffers, dropped when they move. Every method runs in inference mode (the buffers are inference tensors).
    """

    @torch.inference_mode()
    def __init__(self, config, batch_size: int, capacity: int, dtype: torch.dtype, device):
        self._windows = list(config.layer_windows)
        self._head_shape = (config.num_key_value_heads, config.head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.size, self._capacity = batch_size, capacity
        self.k = [self._buffer(bucket_for(max(batch_size, 1)), capacity, w) for w in self._windows]
        self.v = [self._buffer(bucket_for(max(batch_size, 1)), capacity, w) for w in self._windows]
        self.all_lens = torch.zeros(bucket_for(max(batch_size, 1)), dtype=torch.int64, device=device)
        self.steps: dict[tuple[int, int], DraftStep] = {}

    def _buffer(self, rows: int, capacity: int, window: int | None) -> torch.Tensor:
        kept = capacity if window is None else min(capacity, window - 1)
        return torch.zeros(rows, self._head_shape[0], kept, self._head_shape[1], dtype=self.dtype, device=self.device)

    @property
    def capacity(self) -> int:
        """Context positions the cache can cover (full-attention layers hold that many rows)."""
        return self._capacity

    @property
    def allocated_rows(self) -> int:
        return self.all_lens.shape[0]

    @property
    def lens(self) -> torch.Tensor:
        return self.all_lens[:self.size]

    @lens.setter
    @torch.inference_mode()
    def lens(self, value: torch.Tensor) -> None:
        self.all_lens[:self.size].copy_(value)

    def _width(self) -> int:
        """Context rows in use: the longest live row."""
        return int(self.lens.max()) if self.size else 0

    @torch.inference_mode()
    def select(self, indices) -> None:
        """Keep only the sequences at `indices`, in that order, in the first rows: rows that change place are
        moved, the others stay (the buffers stay put)."""
        rows = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        moved = [i for i, row in enumerate(rows) if row != i]
        width = self._width()
        if moved and width:
            target = torch.tensor(moved, device=self.device)
            source = torch.tensor([rows[i] for i in moved], device=self.device)
            for buffer in self.k + self.v:
                buffer[target, :, :width] = buffer[source, :, :width]  # the source is read before writing
        kept = self.all_lens[torch.tensor(rows, dtype=torch.long, device=self.device)]
        self.all_lens.zero_()  # rows past the batch are padding: no context
        self.all_lens[:len(rows)] = kept
        self.size = len(rows)

    @torch.inference_mode()
    def concat(self, other: "StaticDraftCache") -> None:
        """Append the sequences of `other` (a group joining this batch) in the spare rows; the buffers move only
        when there are too few spare rows or `other` reserves more capacity."""
        mine, theirs = self.size, other.size
        if self.allocated_rows < mine + theirs or self.capacity < other.capacity:
            self._reallocate(bucket_for(mine + theirs), max(self.capacity, other.capacity))
        width = other._width()
        for buffer, source in zip(self.k + self.v, other.k + other.v):
            buffer[mine:mine + theirs, :, :width] = source[:theirs, :, :width].to(buffer.device)
        self.all_lens[mine:mine + theirs] = other.lens.to(self.device)
        self.size = mine + theirs

    @torch.inference_mode()
    def shrink(self, capacity: int) -> None:
        """Give back memory no remaining sequence can use: capacity beyond `capacity` (the longest reservation),
        rows allocated beyond twice the batch."""
        if self.capacity > max(capacity, self._width()) or self.allocated_rows > 2 * max(self.size, 1):
            self._reallocate(bucket_for(max(self.size, 1)), max(min(self.capacity, capacity), self._width()))

    def _reallocate(self, rows: int, capacity: int) -> None:
        keep_rows, width = min(self.size, rows), min(self._width(), capacity)

        def moved(buffer: torch.Tensor, window: int | None) -> torch.Tensor:
            fresh = self._buffer(rows, capacity, window)
            fresh[:keep_rows, :, :width] = buffer[:keep_rows, :, :width]
            return fresh

        self.k = [moved(t, w) for t, w in zip(self.k, self._windows)]
        self.v = [moved(t, w) for t, w in zip(self.v, self._windows)]
        lens = torch.zeros(rows, dtype=torch.int64, device=self.device)
        lens[:keep_rows] = self.all_lens[:keep_rows]
        self.all_lens, self._capacity = lens, capacity
        self.steps.clear()


def _forward(drafter, embeds, features, ctx_lens, view: _CacheView, block_lens=None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """DrafterBase.forward without its host-side capacity check (a graph cannot synchronise): hidden, new lens."""
    ctx = drafter.fuse_context(features.to(embeds.dtype))
    x = embeds
    for layer, cache_k, cache_v in zip(drafter.layers, view.k, view.v):
        x = layer(x, ctx, cache_k, cache_v, view.lens, ctx_lens, drafter.rope, block_lens)
    return drafter.norm(x), view.lens + ctx_lens


class DraftStep:
    """The static draft forward of one (bucket, block width) on one StaticDraftCache: its input buffers, `load`
    (copy a batch in) and `run` (the forward on the buffers, what a CUDA graph captures).

    graph, outputs and calls belong to GraphedDrafter. The cache is passed to `run`, not kept: the cache keeps its
    steps, and no cycle delays freeing its buffers.
    """

    def __init__(self, config, cache: StaticDraftCache, rows: int, width: int):
        d, device, dtype = config.hidden_size, cache.device, cache.dtype
        self.rows, self.width = rows, width
        self.context = max(config.block_size, width)  # new context rows a step brings at most (the last block)
        self.embeds = torch.zeros(rows, width, d, dtype=dtype, device=device)
        self.features = torch.zeros(rows, self.context, config.num_target_features * d, dtype=dtype, device=device)
        self.ctx_lens = torch.zeros(rows, dtype=torch.int64, device=device)
        self.graph = None
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self.calls = 0

    def load(self, block_embeds: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor) -> None:
        """The batch's block embeddings, new context rows and their counts into the first rows; padded rows and
        columns are zeros (no context)."""
        n, columns = block_embeds.shape[0], features.shape[1]
        self.embeds[:n].copy_(block_embeds)
        self.embeds[n:].zero_()
        self.features.zero_()
        self.features[:n, :columns].copy_(features)
        self.ctx_lens.zero_()
        self.ctx_lens[:n].copy_(ctx_lens)

    def run(self, drafter, cache: StaticDraftCache) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward on the buffers and `cache` (the one it was made for): (hidden [rows, W, D], new lens)."""
        return _forward(drafter, self.embeds, self.features, self.ctx_lens, _CacheView(cache, self.rows))


class GraphedDrafter:
    """A PyTorch drafter whose decode-time draft steps run static-shape, replaying one CUDA graph per (bucket,
    block width) on CUDA (module docstring). It implements protocols.Drafter."""

    static_block_size = None  # one graph per block width: any size drafts
    absorb_block = 1  # the wrapped drafter takes in context with the anchor alone
    proposes_top_k = True  # the wrapped drafter's family ranks each slot's candidates from the graph's states

    def __init__(self, drafter, graphs: bool | None = None):
        self.drafter = drafter
        self.config = drafter.config
        param = next(drafter.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.blockers = capture_blockers(self.config)
        if graphs and self.blockers:
            raise CompatibilityError("draft steps cannot be captured in CUDA graphs: " + "; ".join(self.blockers))
        self.use_graphs = (self.device.type == "cuda" and not self.blockers) if graphs is None else graphs
        if self.use_graphs:  # a host-to-device copy of the rotary table cannot be captured: keep it on the device
            drafter.rope.inv_freq = drafter.rope.inv_freq.to(self.device)
        self._graphs = GraphPool()

    @property
    def samples_drafts(self) -> bool:
        return self.drafter.samples_drafts

    def new_cache(self, batch_size: int, capacity: int) -> StaticDraftCache:
        return StaticDraftCache(self.config, batch_size, capacity, self.dtype, self.device)

    @torch.inference_mode()
    def __call__(self, block_embeds, features, ctx_lens, cache: StaticDraftCache, block_lens=None) -> torch.Tensor:
        """One draft forward (DrafterBase.forward's contract) on the live rows of `cache`; returns hidden [B,W,D]."""
        n, width = block_embeds.shape[:2]
        if n != cache.size:
            raise RuntimeError(f"a draft of {n} rows over a cache of {cache.size}")  # internal invariant
        if cache.capacity < int((cache.lens + ctx_lens).max()):  # checked here: on the device a write past the
            raise ValueError("draft cache too small for the context")  # capacity would be a fault, not an error
        if features.shape[1] > max(self.config.block_size, width) or block_lens is not None:
            hidden, lens = _forward(self.drafter, block_embeds, features, ctx_lens, _CacheView(cache, n), block_lens)
            cache.lens = lens
            return hidden
        key = (bucket_for(n), width)
        step = cache.steps.get(key)
        if step is None:
            step = cache.steps[key] = DraftStep(self.config, cache, key[0], width)
        step.load(block_embeds, features, ctx_lens)
        hidden, lens = self._run(step, cache)
        cache.lens = lens[:n]
        return hidden[:n].clone()  # another graph's replay may reuse the output's memory

    def _run(self, step: DraftStep, cache: StaticDraftCache) -> tuple[torch.Tensor, torch.Tensor]:
        if self.use_graphs and step.graph is None and step.calls > 0 and attention._cuda_unavailable:
            warnings.warn("draft steps stay eager: the CUDA draft-attention kernels are unavailable", RuntimeWarning,
                          stacklevel=3)
            self.use_graphs = False
        return self._graphs.run(step, lambda: step.run(self.drafter, cache), self.use_graphs)

    @torch.inference_mode()
    def propose(self, target, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: StaticDraftCache, block_lens: torch.Tensor | None = None, sampling=None, top_k: int = 0):
        """The Proposal for block slots 1..W-1, as the wrapped drafter's propose (its family chooses the drafts,
        and with top_k > 0 each slot's top-K candidates for a tree)."""
        hidden = self(self.drafter.embed_block(target, block), features, ctx_lens, cache, block_lens)
        return self.drafter.choose_drafts(target, hidden[:, 1:], block[:, 0], sampling, block_lens, top_k)

    def parameters(self):
        return self.drafter.parameters()
