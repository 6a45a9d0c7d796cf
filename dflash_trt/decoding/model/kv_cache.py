"""The target's KV cache of a decoding batch: preallocated, rows left-aligned, written in place.

Slot s of row b holds position s of that row's request: rows are left-aligned with no padding, and row b
is valid below lengths[b]. A verify forward writes each row's block at its own length, in place, and
acceptance then only sets the lengths (the rejected slots become stale and are overwritten next step), so
no row is ever shifted and nothing is concatenated. Because slot == position in every row, the causal
and sliding-window masks are functions of (lengths, slot): `prepare` builds them once per forward as
explicit 4D masks (a {layer type: mask} mapping for targets with sliding-window layers), which Hugging
Face models take as they are.

Per layer, keys and values live in buffers [rows, heads, capacity, head_dim] of the model's dtype and
device, with room to spare, so a step costs a write of the new tokens, not a copy of the cache. Leaving rows are
replaced by moving the rows behind them; newcomers are written into spare rows when there is room. Growing
copies every layer's keys and values, so the cache grows rarely (`_grow`): at least geometrically, and at once
to the `Room` the scheduler plans, the rows and longest reservation of every request in sight (a burst of
arrivals then reallocates once, not at every join and again as rows get longer), within max_batch_size rows and
max_kv_tokens rows x slots. Every method runs in inference mode (the buffers are inference tensors, like the
prefill's). Buffers start zeroed, so stale slots always hold finite values, which the masks then exclude
exactly.

The object speaks the part of Hugging Face's Cache protocol that decoder layers use (`update`,
`get_seq_length`). Forwards over it run sdpa targets through `grouped_sdpa` (the GROUPED_SDPA attention
implementation): Hugging Face's sdpa repeats every key/value head for grouped-query attention whenever a
mask is given (a copy of the whole cache per layer and step); grouped_sdpa folds the query heads of each
key/value head into rows of one attention instead, which reads the cache in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_trt.errors import CompatibilityError

# Attention implementations whose masks `prepare` can build: boolean (True = attend) or additive floats.
MASK_FORMATS = {"sdpa": "bool", "eager": "additive"}
GROUPED_SDPA = "dflash_grouped_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                 **kwargs):
    """torch SDPA over query heads [B, Hq, T, D] and key/value heads [B, Hkv, W, D] (Hq a multiple of Hkv),
    with the explicit mask of BatchKVCache.prepare: the same attention as Hugging Face's sdpa, without
    materializing repeated key/value heads."""
    batch, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    if attention_mask is not None and groups > 1 and attention_mask.shape[1] == 1:
        # The query heads of one key/value head become rows of one attention (head j*groups + g is row
        # g*T + t): plain SDPA over the cache views as they are. torch's GQA path copies strided keys and
        # values on CPU, which cost as much as the attention itself in batched decoding.
        rows = query.reshape(batch, key.shape[1], groups * length, dim)
        mask = attention_mask.unsqueeze(2).expand(-1, -1, groups, -1, -1).reshape(batch, 1, groups * length, -1)
        out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, dropout_p=dropout,
                                                               scale=scaling)
        return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None
    causal = attention_mask is None and length > 1 and is_causal is not False
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=causal,
                                                           enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register_grouped_sdpa() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


@dataclass(frozen=True)
class Room:
    """What the scheduler expects a batch to hold soon: `rows` rows of up to `tokens` slots; never more than
    max_rows rows or max_tokens rows x slots beyond what the batch's own rows need (None: no bound)."""

    rows: int = 0
    tokens: int = 0
    max_rows: int | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class MaskSpec:
    """How a target's attention masks look: sliding window of its sliding layers (None: none), whether
    the masks go as a {layer type: mask} mapping, boolean or additive, and the model's dtype."""

    sliding_window: int | None
    as_mapping: bool
    additive: bool
    dtype: torch.dtype

    @classmethod
    def from_config(cls, config, dtype: torch.dtype) -> "MaskSpec":
        implementation = getattr(config, "_attn_implementation", None) or "eager"
        if implementation not in MASK_FORMATS:
            raise CompatibilityError(f"batched decoding builds attention masks for {' and '.join(MASK_FORMATS)} "
                                     f"attention, not {implementation!r}")
        layer_types = list(getattr(config, "layer_types", None) or [])
        sliding = "sliding_attention" in layer_types
        window = getattr(config, "sliding_window", None) if sliding else None
        if sliding and not window:
            raise CompatibilityError("the target has sliding-attention layers but no sliding_window")
        return cls(window, sliding, MASK_FORMATS[implementation] == "additive", dtype)


class BatchKVCache:
    """Per-layer KV buffers of a batch, row b valid below lengths[b] (module docstring)."""

    static_shapes = False  # StaticKVCache: a forward's shapes must come from a few buckets (a tree's width too)

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor, spec: MaskSpec,
                 capacity_limit: int):
        self.keys, self.values = keys, values  # [rows allocated, H, capacity, D] each
        self.lengths = lengths  # [B] long, on the buffers' device
        self.spec, self.capacity_limit = spec, capacity_limit
        self.room = Room()  # what to make room for when the buffers must grow (plan_room)
        self._write_index: torch.Tensor | None = None  # [B, T] slots of the tokens of the forward in progress
        self._view_width = 0

    @classmethod
    @torch.inference_mode()
    def from_left_padded(cls, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor,
                         spec: MaskSpec, capacity_limit: int) -> "BatchKVCache":
        """Take over a prefill's layers [B, H, W, D], whose row b holds its lengths[b] tokens at the end
        (left padding), realigned to the left."""
        width = keys[0].shape[2] if keys else 0
        capacity = min(max(capacity_limit, width), max(2 * width, 1))
        pad = width - lengths
        source = (torch.arange(width, device=lengths.device)[None, :] + pad[:, None]).clamp(max=max(width - 1, 0))

        def realign(tensor: torch.Tensor) -> torch.Tensor:
            buffer = tensor.new_zeros(tensor.shape[0], tensor.shape[1], capacity, tensor.shape[3])
            index = source[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
            buffer[:, :, :width] = torch.gather(tensor, 2, index)
            return buffer

        return cls([realign(k) for k in keys], [realign(v) for v in values], lengths.clone(), spec, capacity_limit)

    def __len__(self) -> int:
        return self.lengths.shape[0]

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def allocated_rows(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def width(self) -> int:
        """Slots in use: the longest row."""
        return int(self.lengths.max()) if len(self) else 0

    # -- a forward ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prepare(self, num_new: int, positions: torch.Tensor | None = None, block_mask: torch.Tensor | None = None):
        """Get ready for a forward over num_new tokens per row, written at slots lengths[b] + t; returns the
        attention masks to pass as the model's attention_mask.

        positions [B, T]: the tokens' positions (default lengths[b] + t, a chain). block_mask [B, T, T] (bool):
        which new tokens each new token attends to (default causal); a tree passes its ancestor mask, and its
        tokens' positions are their depths, so sliding windows are measured between positions, not slots.
        """
        device = self.lengths.device
        width = self.width + num_new
        self._ensure_capacity(width)
        write = self.lengths[:, None] + torch.arange(num_new, device=device)[None, :]  # [B, T] slots
        if block_mask is None and positions is None:
            slots = torch.arange(width, device=device)
            distance = write[:, :, None] - slots[None, None, :]  # [B, T, W]: slot == position in a chain
            seen = distance >= 0
        else:
            positions = write if positions is None else positions
            seen, distance = self._explicit_masks(num_new, width, positions, block_mask)
        masks = {"full_attention": seen}
        if self.spec.sliding_window is not None:
            masks["sliding_attention"] = seen & (distance < self.spec.sliding_window)
        masks = {kind: self._format(mask) for kind, mask in masks.items()}
        self._write_index, self._view_width = write, width
        return masks if self.spec.as_mapping else masks["full_attention"]

    def _explicit_masks(self, num_new: int, width: int, positions: torch.Tensor, block_mask: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(seen [B, T, W], position distance [B, T, W]) for new tokens at `positions` under `block_mask`."""
        device = self.lengths.device
        if block_mask is None:
            block_mask = torch.ones(num_new, num_new, dtype=torch.bool, device=device).tril()[None].expand(
                len(self), -1, -1)
        return explicit_masks(torch.arange(width, device=device), self.lengths, positions, block_mask)

    def _format(self, allowed: torch.Tensor) -> torch.Tensor:
        allowed = allowed[:, None]  # [B, 1, T, W]: the same for every head
        if not self.spec.additive:
            return allowed
        zero = torch.zeros((), dtype=self.spec.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(self.spec.dtype).min)

    @torch.inference_mode()
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs=None):
        """Write the new tokens [B, H, T, D] of a layer at each row's slots; returns that layer's keys and
        values up to the forward's width (views of the buffers, no copy)."""
        if self._write_index is None or key_states.shape[2] != self._write_index.shape[1]:
            raise RuntimeError("BatchKVCache.prepare must announce each forward's tokens")  # internal invariant
        rows = self._write_index.shape[0]  # the batch's rows (StaticKVCache: its bucket, spare rows included)
        index = self._write_index[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        keys, values = self.keys[layer_idx][:rows], self.values[layer_idx][:rows]
        keys.scatter_(2, index, key_states.to(keys.dtype))
        values.scatter_(2, index, value_states.to(values.dtype))
        return keys[:, :, :self._view_width], values[:, :, :self._view_width]

    def forward_slots(self) -> tuple[torch.Tensor, int]:
        """(slots [B, T], width) of the forward `prepare` announced: where its tokens go, and how many slots each row
        attends over. For a forward that writes the buffers itself (model/lean_llama.py) instead of calling update."""
        if self._write_index is None:
            raise RuntimeError("BatchKVCache.prepare must announce each forward's tokens")  # internal invariant
        return self._write_index, self._view_width

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width

    def set_lengths(self, lengths: torch.Tensor) -> None:
        """After a forward: row b keeps its first lengths[b] slots (the accepted part of its block)."""
        self.lengths = lengths.to(self.lengths.device)
        self._write_index = None

    @torch.inference_mode()
    def keep(self, counts: torch.Tensor, slots: torch.Tensor | None = None) -> None:
        """After a forward: row b keeps counts[b] of its new tokens, those at new-token indices slots[b, :counts[b]]
        (in that order), or its first counts[b] when slots is None (a chain: nothing moves). Kept tokens are
        moved into place with one gather per layer."""
        if slots is not None:
            device = self.lengths.device
            steps = torch.arange(slots.shape[1], device=device)[None, :]
            source = self.lengths[:, None] + slots.to(device)  # [B, K] slots to read
            destination = self.lengths[:, None] + steps  # [B, K] where they go
            rows = self._write_index.shape[0] if self._write_index is not None else len(self)
            for buffer in self.keys + self.values:
                live = buffer[:rows]
                index = source[:, None, :, None].expand(-1, live.shape[1], -1, live.shape[3])
                moved = torch.gather(live, 2, index)
                live.scatter_(2, destination[:, None, :, None].expand_as(index), moved)
        self.set_lengths(self.lengths + counts.to(self.lengths.device))

    # -- reshaping the batch --------------------------------------------------------------------------
    @torch.inference_mode()
    def select(self, rows: list[int]) -> None:
        """Keep only `rows`, in that order: rows that change place are moved, the others stay."""
        moved = [i for i, row in enumerate(rows) if row != i]
        width = self.width
        if moved and width:
            device = self.lengths.device
            target = torch.tensor(moved, device=device)
            source = torch.tensor([rows[i] for i in moved], device=device)
            for buffer in self.keys + self.values:
                buffer[target, :, :width] = buffer[source, :, :width]  # the source is read before writing
        self.lengths = self.lengths[torch.tensor(rows, dtype=torch.long, device=self.lengths.device)]
        self._write_index = None

    @torch.inference_mode()
    def release(self, capacity_limit: int) -> None:
        """Lower the capacity limit to what the remaining rows reserve; memory no row can use any more is
        given back once it is more than the rows need twice over (rows allocated beyond twice the batch and its
        planned room, capacity beyond twice the limit and the planned reservation). Giving back copies the whole
        cache, and in a served batch the longest-reserving row leaves and a newcomer brings the capacity back up
        every few steps: each such copy is a step of 0.1-2 s at 32 requests in flight on the demo pair."""
        self.capacity_limit = capacity_limit
        rows = len(self)
        rows_over = self.allocated_rows > 2 * max(rows, self.room.rows)
        if rows_over or self.capacity > 2 * max(capacity_limit, self.width, self.room.tokens):
            self._reallocate(rows if rows_over else self.allocated_rows,
                             max(min(self.capacity, capacity_limit), self.width))

    def plan_room(self, room: Room) -> None:
        """What to make room for the next time the buffers must grow (`_grow`); `release` keeps it too."""
        self.room = room

    @torch.inference_mode()
    def merge(self, other: "BatchKVCache") -> None:
        """Append the rows of `other` after this cache's rows."""
        if other.num_layers != self.num_layers:
            raise RuntimeError("caches of different layer counts cannot merge")  # internal invariant
        mine, theirs = len(self), len(other)
        self.capacity_limit = max(self.capacity_limit, other.capacity_limit)
        width, needed = other.width, mine + theirs
        if self.allocated_rows < needed or self.capacity < width:
            self._grow(needed, width)
        for buffer, source in zip(self.keys + self.values, other.keys + other.values):
            buffer[mine:mine + theirs, :, :width] = source[:theirs, :, :width]
        self.lengths = torch.cat((self.lengths, other.lengths.to(self.lengths.device)))
        self._write_index = None

    def _ensure_capacity(self, width: int) -> None:
        if width > self.capacity:
            self._grow(len(self), width)

    def _grow(self, rows: int, width: int) -> None:
        """Reallocate for at least `rows` rows of `width` slots, with room to spare: a reallocation copies every
        layer's keys and values (0.7 GB for 40 rows of the demo target at 373 slots: 0.1 s alone, up to 1.5 s in a
        loaded server on a small CPU), so each should be the last for a while.

        Rows at least double, up to the planned rows, within max_rows. Capacity at least doubles up to the longest
        reservation, and goes to the planned reservation at once, except in a static cache, whose forwards attend
        over the whole capacity. Rows give way to stay within max_tokens, never below the `rows` needed."""
        room, grown_rows = self.room, self.allocated_rows
        if grown_rows < rows:
            grown_rows = max(room.rows, 2 * grown_rows)
            grown_rows = max(rows, grown_rows if room.max_rows is None else min(grown_rows, room.max_rows))
        capacity = max(width, self.capacity)
        if self.capacity < width:
            capacity = max(capacity, min(2 * self.capacity, self.capacity_limit))
        if not self.static_shapes:
            capacity = max(capacity, room.tokens)
        if room.max_tokens is not None:
            grown_rows = max(rows, min(grown_rows, room.max_tokens // max(capacity, 1)))
        self._reallocate(grown_rows, capacity)

    def _reallocate(self, rows: int, capacity: int) -> None:
        keep_rows, keep_width = min(len(self), rows), min(self.width, capacity)

        def moved(buffer: torch.Tensor) -> torch.Tensor:
            fresh = buffer.new_zeros(rows, buffer.shape[1], capacity, buffer.shape[3])
            fresh[:keep_rows, :, :keep_width] = buffer[:keep_rows, :, :keep_width]
            return fresh

        self.keys = [moved(k) for k in self.keys]
        self.values = [moved(v) for v in self.values]


def explicit_masks(slots: torch.Tensor, lengths: torch.Tensor, positions: torch.Tensor, block_mask: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(seen [B, T, W], position distance [B, T, W]) of T new tokens per row written at slots lengths[b] + t, at
    `positions` [B, T], attending to the new tokens `block_mask` [B, T, T] allows and to every committed slot.

    slots [W]: the slot indices attended over. Host-free and shaped by its inputs only, so the static verify
    (graphs/static_kv_cache.py) computes its tree masks with it too.
    """
    num_new = positions.shape[1]
    slots = slots[None, :]  # [1, W]
    new_index = slots - lengths[:, None]  # [B, W]: which new token a slot holds (< 0: committed)
    is_new = (new_index >= 0) & (new_index < num_new)
    new_index = new_index.clamp(0, num_new - 1)
    # A committed slot's position is its index; a new slot's is its token's position.
    slot_positions = torch.where(is_new, positions.gather(1, new_index), slots)
    distance = positions[:, :, None] - slot_positions[:, None, :]  # [B, T, W]
    committed = (slots < lengths[:, None])[:, None, :]
    among_new = block_mask.gather(2, new_index[:, None, :].expand(-1, num_new, -1))
    seen = committed | (is_new[:, None, :] & among_new)
    return seen, distance
