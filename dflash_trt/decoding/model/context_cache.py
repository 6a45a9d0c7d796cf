"""The drafter's context cache in one class, for every runtime that keeps it as tensors (torch, onnx, tensorrt).

k[i], v[i] [B, Hkv, rows_i, Dh] hold draft layer i's projected context rows, left-aligned per sequence; lens [B]
counts the rows each sequence holds. Only context rows persist: a block's own K/V are never written, so nothing
needs cropping after a draft. A full-attention layer keeps every row (rows_i = capacity); a sliding-window layer
(window w) keeps only the newest w - 1 rows, so its memory is bounded whatever the context length.
Invariant kept by the decoding loop: lens[b] + new context rows == the position the block starts at.

Reshaping the batch costs what the target's KV cache (kv_cache.BatchKVCache) costs, not a copy of every row: the
buffers hold spare rows, a leaving row's place is taken by a row from the end (`select` moves only those), and a
joining group is written into spare rows (`concat`). The buffers are allocated when a draft forward first reads them:
a batch that only ever decodes plain (a loaded server, scheduler.py) never allocates or moves any.

The CUDA-graph drafter keeps its own static buffers (graphs.drafter.StaticDraftCache) with the same methods.
"""

from __future__ import annotations

from typing import Sequence

import torch


class ContextCache:
    """Context K/V of every draft layer of a batch (module docstring); implements protocols.DraftCache."""

    def __init__(self, config, batch_size: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", windows: Sequence[int | None] | None = None):
        """config: the drafter's (heads, head_dim, layer windows); windows: override the config's per-layer
        windows (exported graphs attend to every context row: all None)."""
        self._capacity = capacity
        self._windows = list(config.layer_windows if windows is None else windows)
        self._head_shape = (config.num_key_value_heads, config.head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.lens = torch.zeros(batch_size, dtype=torch.int64, device=device)
        # Buffers [allocated rows >= batch, Hkv, rows_i, Dh]; None until a forward first reads them (all lens 0).
        self._k: list[torch.Tensor] | None = None
        self._v: list[torch.Tensor] | None = None

    @staticmethod
    def _rows(window: int | None, capacity: int) -> int:
        return capacity if window is None else min(capacity, window - 1)

    @property
    def capacity(self) -> int:
        """Context positions the cache can cover (full-attention layers hold that many rows)."""
        return self._capacity

    @property
    def size(self) -> int:
        """Sequences in the batch."""
        return self.lens.shape[0]

    @property
    def allocated_rows(self) -> int:
        """Sequences the buffers have room for (0: not allocated yet)."""
        return self._k[0].shape[0] if self._k else 0

    @property
    def k(self) -> list[torch.Tensor]:
        """Per layer [B, Hkv, rows_i, Dh]: the live rows of the buffers (views; a forward writes into them)."""
        self._allocate()
        return [t[:self.size] for t in self._k]

    @k.setter
    def k(self, tensors: Sequence[torch.Tensor]) -> None:  # a runtime that returns new caches (onnx)
        self._k = list(tensors)

    @property
    def v(self) -> list[torch.Tensor]:
        self._allocate()
        return [t[:self.size] for t in self._v]

    @v.setter
    def v(self, tensors: Sequence[torch.Tensor]) -> None:
        self._v = list(tensors)

    def _allocate(self) -> None:
        if self._k is None:
            self._reallocate(self.size, self._capacity)

    def _buffer(self, rows: int, capacity: int, window: int | None) -> torch.Tensor:
        return torch.zeros(rows, self._head_shape[0], self._rows(window, capacity), self._head_shape[1],
                           dtype=self.dtype, device=self.device)

    def _width(self) -> int:
        """Context rows in use: the longest live row."""
        return int(self.lens.max()) if self.size else 0

    @torch.no_grad()
    @torch.inference_mode(False)
    def _reallocate(self, rows: int, capacity: int) -> None:
        """Buffers of `rows` rows and `capacity` positions, keeping the live rows (zeros without buffers). Normal
        tensors even when a draft forward in inference mode allocates them: training runs the forward without it."""
        keep_rows, width = min(self.size, rows), min(self._width(), capacity)

        def moved(buffers: list[torch.Tensor] | None) -> list[torch.Tensor]:
            fresh = [self._buffer(rows, capacity, w) for w in self._windows]
            for new, old in zip(fresh, buffers or []):
                kept = min(width, new.shape[2])
                new[:keep_rows, :, :kept] = old[:keep_rows, :, :kept]
            return fresh

        self._k, self._v = moved(self._k), moved(self._v)
        self._capacity = capacity

    @torch.inference_mode()
    def select(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at `indices`, in that order (finished sequences leave the batch): rows that
        change place are moved, the others stay."""
        rows = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        moved = [i for i, row in enumerate(rows) if row != i]
        width = self._width()
        if self._k is not None and moved and width:
            target = torch.tensor(moved, device=self.device)
            source = torch.tensor([rows[i] for i in moved], device=self.device)
            for buffer in self._k + self._v:
                kept = min(width, buffer.shape[2])
                buffer[target, :, :kept] = buffer[source, :, :kept]  # the source is read before writing
        self.lens = self.lens[torch.as_tensor(rows, dtype=torch.long, device=self.lens.device)]

    @torch.inference_mode()
    def part(self, indices: torch.Tensor) -> "ContextCache":
        """A copy holding the sequences at `indices` only (write it back with `update`)."""
        indices = torch.as_tensor(indices, device=self.lens.device)
        part = ContextCache.__new__(ContextCache)
        part.__dict__.update(self.__dict__)
        part.lens = self.lens[indices]
        if self._k is not None:
            part._k = [t[indices] for t in self._k]
            part._v = [t[indices] for t in self._v]
        return part

    @torch.inference_mode()
    def update(self, indices: torch.Tensor, part: "ContextCache") -> None:
        """Write back a `part` taken at `indices` (after a draft forward ran on it)."""
        indices = torch.as_tensor(indices, device=self.lens.device)
        if part._k is not None:
            for whole, new in zip(self.k + self.v, part.k + part.v):
                whole[indices] = new.to(whole.device)
        self.lens[indices] = part.lens.to(self.lens.device)

    @torch.inference_mode()
    def concat(self, other: "ContextCache") -> None:
        """Append the sequences of `other` (a batch joining this one) in spare rows; capacity becomes the larger
        one. The buffers move only when there are too few spare rows or `other` reserves more capacity.

        Rows are left-aligned in every layer (a sliding layer's kept rows in order), so more capacity on the
        right never moves a row."""
        mine, theirs = self.size, other.size
        capacity = max(self._capacity, other._capacity)
        if self._k is None and other._k is None:  # neither was read by a forward yet: nothing to copy
            self._capacity = capacity
            self.lens = torch.cat((self.lens, other.lens.to(self.lens.device)))
            return
        if self.allocated_rows < mine + theirs or self._capacity < capacity:
            self._reallocate(max(mine + theirs, 2 * mine), capacity)
        width = other._width()
        sources = other._k + other._v if other._k is not None else [None] * (2 * len(self._k))
        for buffer, source in zip(self._k + self._v, sources):
            rows = buffer[mine:mine + theirs]
            rows.zero_()
            if source is not None and width:
                kept = min(width, source.shape[2])
                rows[:, :, :kept] = source[:theirs, :, :kept].to(buffer.device)
        self.lens = torch.cat((self.lens, other.lens.to(self.lens.device)))

    def shrink(self, capacity: int) -> None:
        """Release memory no sequence can reach any more: full-attention rows beyond `capacity` (sliding layers are
        bounded already), rows allocated beyond twice the batch."""
        if capacity >= self._capacity and self.allocated_rows <= 2 * max(self.size, 1):
            return
        capacity = max(min(capacity, self._capacity), self._width())
        if self._k is None:
            self._capacity = capacity
        else:
            self._reallocate(max(self.size, 1), capacity)
