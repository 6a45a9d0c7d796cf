"""The PyTorch drafter with static caches and CUDA graphs for the draft step (the torch runtime on CUDA).

A draft step after prefill always has the same shapes for a given batch: the block [B, S, D] and at most S new
context rows (the tokens the last verify committed), so `GraphedDrafter` pads the new rows to S, pads the batch to a
bucket (1, 2, 4, 8, ...) and replays one CUDA graph per bucket: the whole drafter (every layer's projections, the
draft-attention kernel, the MLPs) becomes one launch. The caches are allocated once at the largest bucket
(`StaticDraftCache`), so their addresses never change: finished sequences are compacted in place, not re-indexed.
Padded rows have no context and add none (ctx_lens 0), so they never disturb the live rows. A prefill (more new
rows than S) runs eagerly on the same caches.

`GraphedDrafter` offers what the decoding loop uses of a drafter (config, new_cache, propose). Without CUDA (or with
graphs=False) the bucketed static-buffer path runs eagerly, which is how it is tested on CPU.
"""

from __future__ import annotations

import torch

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_for(batch: int) -> int:
    for size in BUCKETS:
        if size >= batch:
            return size
    raise ValueError(f"batch {batch} exceeds the largest bucket {BUCKETS[-1]}")


class _CacheView:
    """The first `rows` rows of a StaticDraftCache, in the shape DraftLayer expects (k, v lists, lens)."""

    def __init__(self, cache: "StaticDraftCache", rows: int):
        self.k = [t[:rows] for t in cache.k]
        self.v = [t[:rows] for t in cache.v]
        self.lens = cache.all_lens[:rows]


class StaticDraftCache:
    """Context K/V of every draft layer with `max_batch` rows allocated once; the first `size` rows are live."""

    def __init__(self, config, batch_size: int, capacity: int, dtype: torch.dtype, device):
        max_batch = bucket_for(batch_size)
        shape = (max_batch, config.num_key_value_heads, capacity, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.all_lens = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.size = batch_size
        self.graphs: dict[int, "_Graph"] = {}

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    @property
    def lens(self) -> torch.Tensor:
        return self.all_lens[:self.size]

    @lens.setter
    def lens(self, value: torch.Tensor) -> None:
        self.all_lens[:self.size].copy_(value)

    def select(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at `indices`, moved to the first rows in place (addresses stay)."""
        indices = indices.to(self.all_lens.device)
        n = len(indices)
        for t in (*self.k, *self.v):
            t[:n].copy_(t[indices])  # advanced indexing gathers into a new tensor first: no overlap
        kept = self.all_lens[indices]
        self.all_lens.zero_()
        self.all_lens[:n].copy_(kept)
        self.size = n


def _forward(drafter, embeds, features, ctx_lens, view: _CacheView, block_lens=None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlashDrafter.forward without its host-side capacity check (a graph cannot synchronise): hidden, new lens."""
    ctx = drafter.fuse_context(features.to(embeds.dtype))
    x = embeds
    for layer, cache_k, cache_v in zip(drafter.layers, view.k, view.v):
        x = layer(x, ctx, cache_k, cache_v, view.lens, ctx_lens, drafter.rope, block_lens)
    return drafter.norm(x), view.lens + ctx_lens


class _Graph:
    """Static inputs of one bucket and the captured (or, without CUDA, eagerly run) draft forward on them."""

    def __init__(self, drafter, cache: StaticDraftCache, rows: int, use_graph: bool):
        config, device, dtype = drafter.config, cache.all_lens.device, cache.k[0].dtype
        s, d = config.block_size, config.hidden_size
        self.embeds = torch.zeros(rows, s, d, dtype=dtype, device=device)
        self.features = torch.zeros(rows, s, config.num_target_features * d, dtype=dtype, device=device)
        self.ctx_lens = torch.zeros(rows, dtype=torch.int64, device=device)
        self.view = _CacheView(cache, rows)
        self.run = lambda: _forward(drafter, self.embeds, self.features, self.ctx_lens, self.view)
        self.graph = None
        if use_graph:
            self._capture(cache)

    def _capture(self, cache: StaticDraftCache) -> None:
        # Warm-up on a side stream (builds the kernels, sets their limits), then capture. ctx_lens is still zero
        # here, so neither run appends to the caches.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.run()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self.run()

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.graph is None:
            return self.run()
        self.graph.replay()
        return self.outputs


class GraphedDrafter:
    """A DFlashDrafter whose decode-time draft steps replay one CUDA graph per batch bucket."""

    def __init__(self, drafter, graphs: bool | None = None):
        self.drafter = drafter
        self.config = drafter.config
        param = next(drafter.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.use_graphs = (self.device.type == "cuda") if graphs is None else graphs

    @property
    def samples_drafts(self) -> bool:
        return getattr(self.drafter, "samples_drafts", False)

    def new_cache(self, batch_size: int, capacity: int) -> StaticDraftCache:
        return StaticDraftCache(self.config, batch_size, capacity, self.dtype, self.device)

    @torch.inference_mode()
    def __call__(self, block_embeds, features, ctx_lens, cache: StaticDraftCache, block_lens=None) -> torch.Tensor:
        """One draft forward (DFlashDrafter.forward's contract); returns hidden [B,S,D]."""
        n, s = block_embeds.shape[0], self.config.block_size
        # Prefill (shapes vary) and a shortened last block (block_lens) run eagerly on the live rows.
        if features.shape[1] > s or block_lens is not None or block_embeds.shape[1] != s:
            hidden, lens = _forward(self.drafter, block_embeds, features, ctx_lens, _CacheView(cache, n), block_lens)
            cache.lens = lens
            return hidden
        rows = bucket_for(n)
        if rows not in cache.graphs:
            cache.graphs[rows] = _Graph(self.drafter, cache, rows, self.use_graphs)
        graph = cache.graphs[rows]
        graph.embeds[:n].copy_(block_embeds)
        graph.features.zero_()
        graph.features[:n, :features.shape[1]].copy_(features)
        graph.ctx_lens.zero_()
        graph.ctx_lens[:n].copy_(ctx_lens)
        hidden, lens = graph()
        cache.lens = lens[:n]
        return hidden[:n].clone()

    @torch.inference_mode()
    def propose(self, target, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: StaticDraftCache, block_lens: torch.Tensor | None = None, sampling=None):
        """Drafts for block slots 1..S-1, as the wrapped drafter's propose (its family chooses the drafts)."""
        hidden = self(self.drafter.embed_block(target, block), features, ctx_lens, cache, block_lens)
        return self.drafter.choose_drafts(target, hidden[:, 1:], block[:, 0], sampling, block_lens)

    def parameters(self):
        return self.drafter.parameters()
