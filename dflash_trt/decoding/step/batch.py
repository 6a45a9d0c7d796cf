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

from dflash_trt.decoding.model.kv_cache import BatchKVCache
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


class RunningBatch:
    """Tensors shared by the rows; row b belongs to requests[b].

    cache: the target's KV cache (kv_cache.BatchKVCache), row b holding positions 0 .. next_pos[b] - 1.
    next_pos[b]: position of last_token[b], the newest committed token, which is not in the cache yet
    (the cache's row length, kept by the cache alone). features [B, C, K*D]:
    target features of context rows the drafter has not seen, left-aligned, ctx_lens[b] valid per row.
    draft_cache: the drafter's context cache (protocols.DraftCache; None without a drafter).
    """

    def __init__(self, requests: list[Request], cache: BatchKVCache, last_token: torch.Tensor,
                 features: torch.Tensor | None, ctx_lens: torch.Tensor, draft_cache):
        self.requests, self.cache, self.last_token = requests, cache, last_token
        self.features, self.ctx_lens, self.draft_cache = features, ctx_lens, draft_cache

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def width(self) -> int:
        """KV slots of the longest row."""
        return self.cache.width

    @property
    def next_pos(self) -> torch.Tensor:
        return self.cache.lengths

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order); the others' memory is released."""
        index = torch.tensor(rows, dtype=torch.long, device=self.last_token.device)
        self.requests = [self.requests[r] for r in rows]
        self.cache.select(rows)
        self.last_token = self.last_token[index]
        self.ctx_lens = self.ctx_lens[index]
        if self.features is not None:
            self.features = self.features[index]
        if self.draft_cache is not None:
            self.draft_cache.select(index)
        self.trim()

    def drop_finished(self) -> None:
        """Finished rows leave; the last running rows take their places (the fewest rows move)."""
        active = [row for row, request in enumerate(self.requests) if not request.is_finished]
        if len(active) != len(self.requests):
            self.select(fill_from_the_end(active))

    def trim(self) -> None:
        """Give back KV capacity no remaining row can reach (target and drafter), cut unused feature columns."""
        if not self.requests:
            return
        longest = max(r.reserved_tokens for r in self.requests)
        self.cache.release(longest)
        if self.features is not None:
            width = int(self.ctx_lens.max())
            self.features = self.features[:, :width]
        if self.draft_cache is not None:
            self.draft_cache.shrink(longest)

    def merge(self, other: "RunningBatch") -> None:
        """Append the rows of `other` (a batch of newcomers) after this batch's rows."""
        self.cache.merge(other.cache)
        self.requests = self.requests + other.requests
        self.last_token = torch.cat((self.last_token, other.last_token))
        self.ctx_lens = torch.cat((self.ctx_lens, other.ctx_lens))
        if self.features is not None:
            columns = max(self.features.shape[1], other.features.shape[1])
            self.features = torch.cat((_pad_right(self.features, columns), _pad_right(other.features, columns)))
        if self.draft_cache is not None:
            self.draft_cache.concat(other.draft_cache)

    def append_features(self, new: torch.Tensor, new_lens: torch.Tensor) -> None:
        """Add new context rows (new[b, :new_lens[b]]) after each row's pending ones (no draft this step).

        Written in place into spare columns, grown by doubling: plain steps append a row each, and copying the
        whole backlog every step would cost more than the step."""
        if self.features is None or not bool(self.ctx_lens.any()):
            self.features, self.ctx_lens = new, new_lens
            return
        rows, width = new.shape[0], int((self.ctx_lens + new_lens).max())
        if width > self.features.shape[1]:
            grown = self.features.new_zeros(rows, max(width, 2 * self.features.shape[1]), new.shape[2])
            grown[:, :self.features.shape[1]] = self.features
            self.features = grown
        columns = self.ctx_lens[:, None] + torch.arange(new.shape[1], device=new.device)[None, :]
        keep = torch.arange(new.shape[1], device=new.device)[None, :] < new_lens[:, None]
        row_index = torch.arange(rows, device=new.device)[:, None].expand_as(columns)
        self.features[row_index[keep], columns[keep]] = new[keep]
        self.ctx_lens = self.ctx_lens + new_lens

    @property
    def pending_features(self) -> int:
        """Context rows the drafter has not taken in yet, in the longest row."""
        return int(self.ctx_lens.max()) if self.features is not None and len(self.ctx_lens) else 0

    def pending_feature_rows(self) -> torch.Tensor | None:
        """The pending features without spare columns: [B, pending_features, K*D]."""
        return None if self.features is None else self.features[:, :self.pending_features]


def fill_from_the_end(active: list[int]) -> list[int]:
    """An order of the rows `active` (ascending) in which rows keep their place where they can and the
    last ones fill the places of the others: [0, 2, 3, 5] -> [0, 5, 2, 3]."""
    keep = len(active)
    stay = {row for row in active if row < keep}
    movers = iter(row for row in reversed(active) if row >= keep)
    return [row if row in stay else next(movers) for row in range(keep)]


def _pad_right(tensor: torch.Tensor, width: int, dim: int = 1) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat((tensor, tensor.new_zeros(shape)), dim=dim)
