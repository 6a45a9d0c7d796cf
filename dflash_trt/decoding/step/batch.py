"""The state of a decoding batch: per-request bookkeeping and the tensors the rows share.

The target's KV cache (kv_cache.BatchKVCache) keeps every row left-aligned at its own length, in
preallocated buffers, so each row computes what it would alone and a step writes only its new tokens.
Reshaping the batch between steps is cheap too: a newcomer's rows are written after the running rows
(`merge`); a leaving row's place is taken by the rows behind it (`select`); capacity no remaining row can
reach is given back (`trim`).
"""

from __future__ import annotations

import time
from typing import Hashable, Sequence

import torch

from dflash_trt.decoding.model.kv_cache import BatchKVCache, Room
from dflash_trt.decoding.step.results import GenerationResult, StepOutput
from dflash_trt.decoding.step.sampling import SamplingParams, new_seed
from dflash_trt.errors import DFlashError


class Request:
    """One generation: prompt, parameters, committed tokens, stop rules, statistics."""

    def __init__(self, request_id: Hashable, prompt: Sequence[int], params: SamplingParams, max_block_size: int,
                 verify_slots: int | None = None):
        """verify_slots: KV slots one verify step may write (default max_block_size; a tree writes budget + 1)."""
        if not prompt:
            raise DFlashError(f"prompt {request_id} is empty")
        self.request_id, self.prompt, self.params = request_id, list(prompt), params
        # The sampling stream of the request (sampling.choose_keyed); greedy requests never use it.
        self.seed = params.seed if params.seed is not None else new_seed()
        # A generator for drafters that sample their drafts and for rejection sampling against their q
        # (DFlash2 at T > 0); created on first use, seeded from the request's stream.
        self._generator: torch.Generator | None = None
        self.result = GenerationResult(token_ids=[], finish_reason="", block_size=max_block_size)
        self.verify_slots = max(max_block_size, verify_slots or 0)
        self.reserved_tokens = len(self.prompt) + params.max_new_tokens + self.verify_slots  # KV slots at most
        self.decode_start = 0.0
        self.prefix_hit = None  # the scheduler's prefix-cache lookup, until the prefill copied it
        # With a prefix cache: the target features of every committed position (prompt, then each step's kept
        # slots), so that the finished request's answer can be cached too; None: not recorded.
        self.history_features: list[torch.Tensor] | None = None

    @property
    def is_finished(self) -> bool:
        return bool(self.result.finish_reason)

    @property
    def generator(self) -> torch.Generator | None:
        if self._generator is None and not self.params.is_greedy:
            self._generator = torch.Generator().manual_seed(self.seed)
        return self._generator

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.result.token_ids)

    def commit(self, tokens: list[int]) -> list[int]:
        """Append tokens up to a stop token (included) or max_new_tokens; returns those appended."""
        committed = []
        for token in tokens:
            committed.append(token)
            self.result.token_ids.append(token)
            if token in self.params.stop_token_ids:
                self.finish("stop")
            elif len(self.result.token_ids) >= self.params.max_new_tokens:
                self.finish("length")
            if self.is_finished:
                break
        return committed

    def finish(self, reason: str) -> None:
        if not self.is_finished:
            self.result.finish_reason = reason
            self.result.decode_s = max(time.perf_counter() - self.decode_start, 0.0) if self.decode_start else 0.0

    def step_output(self, tokens: list[int], acceptance_length: int | None,
                    num_draft_tokens: int | None = None, num_accepted_drafts: int | None = None) -> StepOutput:
        done = self.is_finished
        return StepOutput(self.request_id, tokens, acceptance_length, done, self.result if done else None,
                          num_draft_tokens, num_accepted_drafts, self.result.num_cached_tokens)


class PendingFeatures:
    """Target features of the context rows the drafter has not taken in yet, per batch row and in order.

    Kept as references to the tensors they came from (a prefill's features, each step's verify features), never
    copied until the drafter takes them: appending a step's rows, reordering rows (`select`) and adding newcomers
    (`merge`) cost O(rows), however long the backlog of a batch that decodes plain grows. `rows()` builds the
    left-aligned [B, width, F] tensor the drafter takes, without a copy when every row's pending rows are one slice
    of one tensor (a batch that drafted the step before, or a fresh prefill)."""

    def __init__(self, features: torch.Tensor | None, lens: torch.Tensor):
        self.device = lens.device  # the batch's
        counts = lens.tolist()
        # parts[b]: (tensor [*, N, F], its row, rows taken from its start), in context order.
        self.parts: list[list[tuple[torch.Tensor, int, int]]] = [
            [(features, b, n)] if features is not None and n else [] for b, n in enumerate(counts)]
        self.counts = counts if features is not None else [0] * len(counts)  # pending rows per batch row
        self.empty = None if features is None else features[:, :0]  # what rows() returns with nothing pending

    @property
    def lens(self) -> torch.Tensor:
        """[B] pending rows per batch row, on the batch's device. Built when a draft call reads it, not kept up to date
        on every step: a plain step of a loaded batch would pay a host-to-device copy for nothing."""
        return torch.tensor(self.counts, dtype=torch.int64, device=self.device)

    @property
    def width(self) -> int:
        return max(self.counts, default=0)

    def append(self, new: torch.Tensor, new_counts: list[int]) -> None:
        """Add new[b, :new_counts[b]] after row b's pending rows."""
        if self.empty is None:
            self.empty = new[:, :0]
        for row, count in enumerate(new_counts):
            if count:
                self.parts[row].append((new, row, count))
                self.counts[row] += count

    def select(self, rows: list[int]) -> None:
        self.parts = [self.parts[r] for r in rows]
        self.counts = [self.counts[r] for r in rows]

    def merge(self, other: "PendingFeatures") -> None:
        self.parts, self.counts = self.parts + other.parts, self.counts + other.counts

    def clear(self) -> None:
        self.parts = [[] for _ in self.parts]
        self.counts = [0] * len(self.counts)

    def rows(self) -> torch.Tensor | None:
        """[B, width, F]: row b's pending features left-aligned (columns past its count: zeros or other rows,
        masked by lens); None without features (no drafter)."""
        width = self.width
        if width == 0:
            return None if self.empty is None else self.empty.new_zeros(len(self.parts), 0, self.empty.shape[2])
        sources = {id(part[0][0]) for part in self.parts if part}
        if sources and all(len(part) <= 1 for part in self.parts) and len(sources) == 1:
            source = next(part[0][0] for part in self.parts if part)
            if source.shape[0] == len(self.parts) and source.shape[1] >= width and all(
                    part[0][1] == b for b, part in enumerate(self.parts) if part):
                return source[:, :width]  # each row's pending rows are its own row of one tensor
        first = next(part[0][0] for part in self.parts if part)
        out = first.new_zeros(len(self.parts), width, first.shape[2])
        for b, part in enumerate(self.parts):
            start = 0
            for tensor, row, count in part:
                out[b, start:start + count] = tensor[row, :count]
                start += count
        return out


class RunningBatch:
    """Tensors shared by the rows; row b belongs to requests[b].

    cache: the target's KV cache (kv_cache.BatchKVCache), row b holding positions 0 .. next_pos[b] - 1.
    next_pos[b]: position of last_token[b], the newest committed token, which is not in the cache yet
    (the cache's row length, kept by the cache alone). pending: the target features [K*D] of context rows the
    drafter has not seen (PendingFeatures), ctx_lens[b] of them for row b; features: None without a drafter.
    draft_cache: the drafter's context cache (protocols.DraftCache; None without a drafter).
    """

    def __init__(self, requests: list[Request], cache: BatchKVCache, last_token: torch.Tensor,
                 features: torch.Tensor | None, ctx_lens: torch.Tensor, draft_cache):
        """features [B, C, K*D]: the pending context rows, left-aligned, ctx_lens[b] valid in row b (None: no
        drafter)."""
        self.requests, self.cache, self.last_token = requests, cache, last_token
        self.pending = PendingFeatures(features, ctx_lens)
        self.draft_cache = draft_cache

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def width(self) -> int:
        """KV slots of the longest row."""
        return self.cache.width

    @property
    def next_pos(self) -> torch.Tensor:
        return self.cache.lengths

    @property
    def ctx_lens(self) -> torch.Tensor:
        """[B] pending context rows per row."""
        return self.pending.lens

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order); the others' memory is released."""
        index = torch.tensor(rows, dtype=torch.long, device=self.last_token.device)
        self.requests = [self.requests[r] for r in rows]
        self.cache.select(rows)
        self.last_token = self.last_token[index]
        self.pending.select(rows)
        if self.draft_cache is not None:
            self.draft_cache.select(index)
        self.trim()

    def drop_finished(self) -> None:
        """Finished rows leave; the last running rows take their places (the fewest rows move)."""
        active = [row for row, request in enumerate(self.requests) if not request.is_finished]
        if len(active) != len(self.requests):
            self.select(fill_from_the_end(active))

    def trim(self) -> None:
        """Give back the target's KV capacity no remaining row can reach. The drafter's is given back before the drafter
        next runs (trim_draft_cache): while the batch decodes plain nothing reads it, and shrinking it as long rows
        leave, then growing it as newcomers join, moved its buffers back and forth at every request on a loaded server
        that had drafted once."""
        if self.requests:
            self.cache.release(max(r.reserved_tokens for r in self.requests))

    def trim_draft_cache(self) -> None:
        """Give back the drafter's context capacity no remaining row can reach (a runtime that attends over all of it,
        onnx, then computes no more than the rows need)."""
        if self.draft_cache is not None and self.requests:
            self.draft_cache.shrink(max(r.reserved_tokens for r in self.requests))

    def plan_room(self, room: Room) -> None:
        """What the target's KV cache makes room for when it must grow (BatchKVCache.plan_room)."""
        self.cache.plan_room(room)

    def merge(self, other: "RunningBatch") -> None:
        """Append the rows of `other` (a batch of newcomers) after this batch's rows."""
        self.cache.merge(other.cache)
        self.requests = self.requests + other.requests
        self.last_token = torch.cat((self.last_token, other.last_token))
        self.pending.merge(other.pending)
        if self.draft_cache is not None:
            self.draft_cache.concat(other.draft_cache)

    def append_features(self, new: torch.Tensor, new_counts: list[int]) -> None:
        """Add new context rows new[b, :new_counts[b]] after each row's pending ones (kept by reference)."""
        self.pending.append(new, new_counts)

    @property
    def pending_features(self) -> int:
        """Context rows the drafter has not taken in yet, in the longest row."""
        return self.pending.width

    @property
    def pending_context_rows(self) -> int:
        """Context rows a draft call would compute now: every row padded to the longest (batch x pending)."""
        return len(self.requests) * self.pending.width

    def pending_feature_rows(self) -> torch.Tensor | None:
        """The pending features, left-aligned: [B, pending_features, K*D] (None: none pending)."""
        return self.pending.rows()

    def take_pending_features(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(pending_feature_rows(), ctx_lens), which the drafter takes in now: none are pending after."""
        rows, lens = self.pending.rows(), self.pending.lens
        self.pending.clear()
        return rows, lens


def fill_from_the_end(active: list[int]) -> list[int]:
    """An order of the rows `active` (ascending) in which rows keep their place where they can and the
    last ones fill the places of the others: [0, 2, 3, 5] -> [0, 5, 2, 3]."""
    keep = len(active)
    stay = {row for row in active if row < keep}
    movers = iter(row for row in reversed(active) if row >= keep)
    return [row if row in stay else next(movers) for row in range(keep)]
