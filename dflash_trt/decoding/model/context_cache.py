"""The drafter's context cache in one class, for every runtime that keeps it as tensors (torch, onnx, tensorrt).

k[i], v[i] [B, Hkv, rows_i, Dh] hold draft layer i's projected context rows, left-aligned per sequence; lens [B]
counts the rows each sequence holds. Only context rows persist: a block's own K/V are never written, so nothing
needs cropping after a draft. A full-attention layer keeps every row (rows_i = capacity); a sliding-window layer
(window w) keeps only the newest w - 1 rows, so its memory is bounded whatever the context length.
Invariant kept by the decoding loop: lens[b] + new context rows == the position the block starts at.

The CUDA-graph drafter keeps its own static buffers (graphs.drafter.StaticDraftCache) with the same methods.
"""

from __future__ import annotations

import copy
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
        shape = (config.num_key_value_heads, config.head_dim)
        shapes = [(batch_size, shape[0], self._rows(w, capacity), shape[1]) for w in self._windows]
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.lens = torch.zeros(batch_size, dtype=torch.int64, device=device)

    @staticmethod
    def _rows(window: int | None, capacity: int) -> int:
        return capacity if window is None else min(capacity, window - 1)

    @property
    def capacity(self) -> int:
        """Context positions the cache can cover (full-attention layers hold that many rows)."""
        return self._capacity

    def select(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at `indices`, in that order (finished sequences leave the batch)."""
        indices = torch.as_tensor(indices, device=self.lens.device)
        self.k = [t[indices] for t in self.k]
        self.v = [t[indices] for t in self.v]
        self.lens = self.lens[indices]

    def part(self, indices: torch.Tensor) -> "ContextCache":
        """A copy holding the sequences at `indices` only (write it back with `update`)."""
        part = copy.copy(self)
        part.select(indices)
        return part

    def update(self, indices: torch.Tensor, part: "ContextCache") -> None:
        """Write back a `part` taken at `indices` (after a draft forward ran on it)."""
        indices = torch.as_tensor(indices, device=self.lens.device)
        for whole, new in zip(self.k + self.v, part.k + part.v):
            whole[indices] = new.to(whole.device)
        self.lens[indices] = part.lens.to(self.lens.device)

    def concat(self, other: "ContextCache") -> None:
        """Append the sequences of `other` (a batch joining this one); capacity becomes the larger one.

        Rows are left-aligned in every layer (a sliding layer's kept rows in order), so padding on the
        right never moves a row."""
        capacity = max(self._capacity, other._capacity)

        def cat(a: torch.Tensor, b: torch.Tensor, rows: int) -> torch.Tensor:
            pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[2]))  # noqa: E731
            return torch.cat((pad(a), pad(b.to(a.device))))

        self.k = [cat(a, b, self._rows(w, capacity)) for a, b, w in zip(self.k, other.k, self._windows)]
        self.v = [cat(a, b, self._rows(w, capacity)) for a, b, w in zip(self.v, other.v, self._windows)]
        self.lens = torch.cat((self.lens, other.lens.to(self.lens.device)))
        self._capacity = capacity

    def shrink(self, capacity: int) -> None:
        """Release full-attention rows no sequence can reach any more (sliding layers are bounded already)."""
        if capacity >= self._capacity:
            return
        self.k = [t if w is not None else t[:, :, :capacity] for t, w in zip(self.k, self._windows)]
        self.v = [t if w is not None else t[:, :, :capacity] for t, w in zip(self.v, self._windows)]
        self._capacity = capacity
